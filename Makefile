# Starling: `make demo` trains the embedded default, `make test` runs the test suite.
# Each target installs missing packages, configures and builds first (all idempotent).
BUILD_DIR ?= build
JOBS ?= 2
CMAKE_ARGS ?=

.PHONY: all deps configure build test demo bench bench-allreduce format clean

all: build

deps:
	@scripts/install-deps.sh

$(BUILD_DIR)/build.ninja: CMakeLists.txt cmake/torch.cmake
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

configure: deps $(BUILD_DIR)/build.ninja

build: configure
	cmake --build $(BUILD_DIR) -j$(JOBS)

test: build
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j$(JOBS)

demo: build
	scripts/demo.sh $(BUILD_DIR)

bench: build
	/usr/bin/python3 bench/compute/run.py --starling $(BUILD_DIR)/starling

# Starling's all-reduce against Gloo on loopback and on shaped links (needs root for the labs).
bench-allreduce: build
	/usr/bin/python3 bench/allreduce/run.py --peer $(BUILD_DIR)/starling_allreduce_peer \
		--json $(BUILD_DIR)/bench/allreduce-results.json

format:
	clang-format -i $$(git ls-files '*.cpp' '*.h')

clean:
	rm -rf $(BUILD_DIR)
