# The libtorch parts: model, graph, train, the starling binary, their tests and benchmarks.
# Debian's libtorch-dev by default; a CUDA libtorch via -DCMAKE_PREFIX_PATH=/path/to/libtorch.
find_package(Torch REQUIRED)

add_library(starling STATIC
  src/starling/common/safetensors.cpp
  src/starling/common/cpu_runtime.cpp
  src/starling/common/dir_lock.cpp
  src/starling/common/device.cpp
  src/starling/model/config.cpp
  src/starling/model/build.cpp
  src/starling/model/describe.cpp
  src/starling/model/hf_layout.cpp
  src/starling/model/hf_import.cpp
  src/starling/model/hf_export.cpp
  src/starling/model/hf_config.cpp
  src/starling/model/ops/attention.cpp
  src/starling/model/ops/embedding.cpp
  src/starling/model/ops/head.cpp
  src/starling/model/ops/loss.cpp
  src/starling/model/ops/mlp.cpp
  src/starling/model/ops/norm.cpp
  src/starling/graph/autocast.cpp
  src/starling/graph/dag.cpp
  src/starling/graph/executor.cpp
  src/starling/graph/param_store.cpp
  src/starling/train/config.cpp
  src/starling/train/adamw.cpp
  src/starling/train/loss_scaler.cpp
  src/starling/train/precision.cpp
  src/starling/train/schedule.cpp
  src/starling/train/checkpoint.cpp
  src/starling/train/metrics.cpp
  src/starling/train/session.cpp
  src/starling/train/evaluate.cpp
  src/starling/train/step_runner.cpp
  src/starling/train/step_reporter.cpp
  src/starling/train/trainer.cpp
  src/starling/train/sampler.cpp
  src/starling/train/sample_checkpoint.cpp
  src/starling/train/export_checkpoint.cpp
  src/starling/train/eval_checkpoint.cpp
  src/starling/train/checkpoint_model.cpp
  src/starling/train/compute_bench.cpp
  src/starling/train/trace_profiler.cpp
  src/starling/net/c10d_group.cpp
  src/starling/net/gloo_backend.cpp
  src/starling/net/nccl_backend.cpp
  src/starling/strategy/strategy_config.cpp
  src/starling/strategy/flat.cpp
  src/starling/strategy/staging.cpp
  src/starling/strategy/state_tensors.cpp
  src/starling/strategy/state_stream.cpp
  src/starling/strategy/data_redeal.cpp
  src/starling/strategy/root_choice.cpp
  src/starling/strategy/swarm_strategy.cpp
  src/starling/strategy/robust_aggregate.cpp
  src/starling/strategy/fault_injection.cpp
  src/starling/strategy/ddp.cpp
  src/starling/strategy/localsgd.cpp
  src/starling/strategy/diloco.cpp
  src/starling/strategy/co2.cpp
  src/starling/strategy/co2_outer.cpp
  src/starling/strategy/outer_vector.cpp
  src/starling/strategy/progress_board.cpp
  src/starling/strategy/atom.cpp
  src/starling/strategy/pipeline_config.cpp
  src/starling/strategy/pipeline_layout.cpp
  src/starling/strategy/tensor_message.cpp
  src/starling/compress/topk.cpp
  src/starling/strategy/pipeline_runner.cpp
  src/starling/strategy/shared_copies.cpp
  src/starling/strategy/pipeline_admission.cpp
  src/starling/strategy/auto_pipeline.cpp
  src/starling/strategy/pipeline_auto_peer.cpp
  src/starling/strategy/plan_trials.cpp
  src/starling/strategy/pipeline_peer.cpp
  src/starling/strategy/peer.cpp
  src/starling/strategy/replica_role.cpp
  src/starling/swap/swap_config.cpp
  src/starling/swap/tier.cpp
  src/starling/swap/host_tier.cpp
  src/starling/swap/pinned_tier.cpp
  src/starling/swap/disk_tier.cpp
  src/starling/swap/buffer_pool.cpp
  src/starling/swap/swap_slot.cpp
  src/starling/swap/swap_plan.cpp
  src/starling/swap/profile.cpp
  src/starling/sched/workload.cpp
  src/starling/swap/swapper.cpp
  src/starling/swap/op_pump.cpp
  src/starling/swap/swap_optimizer.cpp
  src/starling/swap/swap_rows_first.cpp
  src/starling/swap/swap_runner.cpp
)
# liburing: the swap disk tier's asynchronous O_DIRECT transfers.
pkg_check_modules(LIBURING REQUIRED IMPORTED_TARGET liburing)
target_link_libraries(starling PUBLIC starling_data starling_net starling_sched starling_config
                      ${TORCH_LIBRARIES})
target_link_libraries(starling PRIVATE PkgConfig::LIBURING)
target_compile_options(starling PUBLIC ${TORCH_CXX_FLAGS})
# A CUDA libtorch (pip's torch, or the libtorch archive) brings torch_cuda; only then does
# common/device.cpp compile its CUDA branch (synchronisation, memory statistics).
if(TARGET torch_cuda OR "${TORCH_LIBRARIES}" MATCHES "torch_cuda")
  message(STATUS "Starling: CUDA libtorch ${Torch_VERSION}")
  set_source_files_properties(src/starling/common/device.cpp PROPERTIES
    COMPILE_DEFINITIONS STARLING_WITH_CUDA=1)
  if(CUDAToolkit_INCLUDE_DIRS)
    target_include_directories(starling PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
  endif()
  # The CUDA runtime itself: device.cpp reads the card's memory (cudaMemGetInfo) for
  # train.device_memory.
  if(TARGET CUDA::cudart)
    target_link_libraries(starling PRIVATE CUDA::cudart)
  endif()
  # c10d's NCCL process group, where the libtorch ships it (pip's CUDA torch does): the `nccl`
  # collective backend (net/nccl_backend.cpp; without it, asking for it is a clear error).
  find_file(STARLING_NCCL_HEADER torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp
            PATHS ${TORCH_INCLUDE_DIRS} NO_DEFAULT_PATH)
  if(STARLING_NCCL_HEADER)
    message(STATUS "Starling: NCCL collective backend")
    set_source_files_properties(src/starling/net/nccl_backend.cpp PROPERTIES
      COMPILE_DEFINITIONS STARLING_WITH_NCCL=1)
  endif()
else()
  message(STATUS "Starling: CPU libtorch ${Torch_VERSION}")
endif()
# libtorch's headers cost ~15 s per translation unit on these machines; one precompiled header
# shared by every torch target brings that to a couple of seconds.
target_precompile_headers(starling PRIVATE src/starling/common/torch_pch.h)
# Each translation unit still instantiates and compiles the libtorch templates it uses, about
# ten seconds of the ~15 most of these files take. Compiled eight to a batch (CMake's unity
# builds) that work is done once per batch: the torch targets build in less than half the time
# on two cores. A change to one file recompiles its batch; -DSTARLING_UNITY_BUILD=OFF compiles
# every file alone. The lighter targets gain nothing from batches and compile file by file.
option(STARLING_UNITY_BUILD "Compile the libtorch targets' sources in batches" ON)
function(starling_unity_build target)
  set_target_properties(${target} PROPERTIES UNITY_BUILD ${STARLING_UNITY_BUILD}
                                             UNITY_BUILD_BATCH_SIZE 8)
endfunction()
starling_unity_build(starling)

add_executable(starling_cli
  src/starling/cli/main.cpp
  src/starling/cli/data_command.cpp
  src/starling/cli/train_command.cpp
  src/starling/cli/sample_command.cpp
  src/starling/cli/export_command.cpp
  src/starling/cli/eval_command.cpp
  src/starling/cli/model_command.cpp
  src/starling/cli/bench_command.cpp
  src/starling/cli/net_command.cpp
  src/starling/cli/peer_command.cpp
  src/starling/cli/local_swarm.cpp
  src/starling/cli/cpu_quota.cpp
  src/starling/cli/peer_sets.cpp
  src/starling/cli/number_list.cpp
  src/starling/cli/plan_command.cpp
)
set_target_properties(starling_cli PROPERTIES OUTPUT_NAME starling)
starling_unity_build(starling_cli)
target_link_libraries(starling_cli PRIVATE starling starling_netlab CLI11::CLI11)

add_executable(starling_tests
  tests/graph/executor_test.cpp
  tests/compress/topk_test.cpp
  tests/model/config_test.cpp
  tests/model/oracle_test.cpp
  tests/model/hf_gpt2_test.cpp
  tests/model/hf_export_test.cpp
  tests/model/hf_config_test.cpp
  tests/model/build_part_test.cpp
  tests/common/safetensors_test.cpp
  tests/common/cpu_runtime_test.cpp
  tests/common/dir_lock_test.cpp
  tests/train/config_test.cpp
  tests/train/checkpoint_test.cpp
  tests/train/step_runner_test.cpp
  tests/net/gloo_backend_test.cpp
  tests/net/nccl_backend_test.cpp
  tests/strategy/co2_test.cpp
  tests/strategy/data_redeal_test.cpp
  tests/strategy/root_choice_test.cpp
  tests/strategy/progress_board_test.cpp
  tests/strategy/robust_aggregate_test.cpp
  tests/strategy/replica_role_test.cpp
  tests/strategy/state_stream_test.cpp
  tests/strategy/pipeline_test.cpp
  tests/train/precision_test.cpp
  tests/train/cuda_test.cpp
  tests/swap/buffer_pool_test.cpp
  tests/swap/op_pump_test.cpp
  tests/swap/swap_test.cpp
  tests/swap/swapper_state_test.cpp
  tests/swap/swapper_loss_scale_test.cpp
)
target_link_libraries(starling_tests PRIVATE starling starling_netlab GTest::gtest_main)
target_precompile_headers(starling_tests REUSE_FROM starling)
starling_unity_build(starling_tests)
target_compile_definitions(starling_tests PRIVATE
  STARLING_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
  STARLING_CLI_PATH="$<TARGET_FILE:starling_cli>"
  STARLING_PYTHON="${STARLING_PYTHON}")
add_dependencies(starling_tests starling_cli)
# Tests that measure how peers share this machine's cores run alone: a test beside them slows
# the reference profile they compare against, not only the peers (the swap slowdown probe's test
# compares a sleeping neighbour with spinning ones, and a busy test beside it blurs the two).
set(STARLING_CORE_SHARING_TESTS "PipelineRunTest.AutoStagesWeigh*:SwapProfile.TheSlowdownProbe*")
gtest_discover_tests(starling_tests DISCOVERY_TIMEOUT 120
  TEST_FILTER "-${STARLING_CORE_SHARING_TESTS}"
  PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=2")
gtest_discover_tests(starling_tests DISCOVERY_TIMEOUT 120
  TEST_FILTER "${STARLING_CORE_SHARING_TESTS}" TEST_LIST starling_core_sharing_tests
  PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=2" RUN_SERIAL TRUE)

# No binary may take a C++ standard library symbol from libtorch (see add_link_options in
# CMakeLists.txt).
add_test(NAME bindings.starling
  COMMAND ${CMAKE_SOURCE_DIR}/scripts/check-bindings.sh $<TARGET_FILE:starling_cli> --version)
add_test(NAME bindings.starling_tests
  COMMAND ${CMAKE_SOURCE_DIR}/scripts/check-bindings.sh $<TARGET_FILE:starling_tests>
          --gtest_list_tests)

# The chaos harness, short: a swarm of five trains 30 s with each of two strategies while peers
# are killed, restarted and stopped, and every invariant is checked (docs/reliability.md). Alone,
# because its stall limit (two peer timeouts) assumes the peers get the CPU they ask for.
add_test(NAME ChaosTest.QuickRun
  COMMAND ${STARLING_PYTHON} ${CMAKE_SOURCE_DIR}/bench/chaos/run.py
          --starling $<TARGET_FILE:starling_cli> --strategies ddp diloco --seconds 30 --seed 3)
set_tests_properties(ChaosTest.QuickRun PROPERTIES RUN_SERIAL TRUE TIMEOUT 400)
# atom with every peer swapped through a budget on disk: its exchange goes a node's gradients at
# a time, and its fingerprint reads the weights back from the tier after every step.
add_test(NAME ChaosTest.QuickRunSwappedAtom
  COMMAND ${STARLING_PYTHON} ${CMAKE_SOURCE_DIR}/bench/chaos/run.py
          --starling $<TARGET_FILE:starling_cli> --strategies atom-swapped --seconds 30 --seed 3)
set_tests_properties(ChaosTest.QuickRunSwappedAtom PROPERTIES RUN_SERIAL TRUE TIMEOUT 400)
# The same with link cuts in a network lab (half the acts cut a minority off, then mend): the
# swarm must heal to one state. Needs root; skipped (exit 77) where labs cannot be built.
add_test(NAME ChaosTest.QuickRunWithCuts
  COMMAND ${STARLING_PYTHON} ${CMAKE_SOURCE_DIR}/bench/chaos/run.py
          --starling $<TARGET_FILE:starling_cli> --strategies ddp --seconds 30 --seed 3 --lab
          --cut-share 0.5)
set_tests_properties(ChaosTest.QuickRunWithCuts PROPERTIES RUN_SERIAL TRUE TIMEOUT 400
  SKIP_RETURN_CODE 77)

# Bus bandwidth of Starling's all-reduce against Gloo's (bench/allreduce/run.py drives it). Built
# by default so `make bench-allreduce` needs nothing more than `make build`.
# The disk tier's bandwidth from small against huge pages (bench/swap/tier_pages.cpp).
add_executable(starling_tier_pages bench/swap/tier_pages.cpp)
target_link_libraries(starling_tier_pages PRIVATE starling CLI11::CLI11)

add_executable(starling_allreduce_peer bench/allreduce/allreduce_peer.cpp)
target_link_libraries(starling_allreduce_peer PRIVATE starling CLI11::CLI11)
target_precompile_headers(starling_allreduce_peer REUSE_FROM starling)

# End-to-end tests of the binary; torch-free, so they compile in seconds.
add_executable(starling_cli_tests
  tests/cli/cli_test.cpp
  tests/cli/net_cli_test.cpp
  tests/cli/swarm_cli_test.cpp
  tests/cli/swap_cli_test.cpp
)
target_link_libraries(starling_cli_tests PRIVATE starling_net starling_netlab GTest::gtest_main
                      PkgConfig::HTTPLIB)
target_compile_definitions(starling_cli_tests PRIVATE
  STARLING_SOURCE_DIR="${CMAKE_SOURCE_DIR}"
  STARLING_CLI_PATH="$<TARGET_FILE:starling_cli>"
  STARLING_NET_WORKER="$<TARGET_FILE:starling_net_worker>")
add_dependencies(starling_cli_tests starling_cli starling_net_worker)
gtest_discover_tests(starling_cli_tests DISCOVERY_TIMEOUT 60
  PROPERTIES ENVIRONMENT "OMP_NUM_THREADS=1")
