// Compute throughput of one training step (forward, backward, clipping, AdamW) on random tokens,
// for `starling bench compute` and bench/compute.
#pragma once

#include <cstdint>
#include <string>

#include "starling/model/config.h"

namespace starling::train {

struct ComputeBenchOptions {
  int64_t batch = 8;
  int64_t steps = 10;  // timed steps
  int64_t warmup = 3;  // untimed steps first
  bool recompute = false;
  std::string device = "cpu";  // "cpu", "cuda" or "cuda:N"
  std::string dtype = "fp32";  // "fp32", "bf16" or "fp16" (as train.dtype)
  bool tf32 = true;            // as train.tf32
  std::string profile;         // when set, a Chrome trace of the timed steps goes to this file
};

struct ComputeBenchResult {
  double tokens_per_s = 0;
  double step_ms = 0;
  double tflops = 0;        // achieved model TFLOP/s (train_flops_per_token * tokens/s)
  double mfu = 0;           // tflops against peak_gflops
  double peak_gflops = 0;   // measured matmul peak of the device in the bench's dtype
  int64_t peak_memory = 0;  // bytes held by the CUDA caching allocator at most (0 on CPUs)
  bool fused_adamw = false;
};

// Trains `config` for warmup + steps steps of batch x seq_len random tokens; times the last
// `steps` together (one wait for the device at the end, as a training run would). Uses the
// current thread setting. With `profile`, the timed steps are also traced (which slows them).
ComputeBenchResult run_compute_bench(const model::ModelConfig& config,
                                     const ComputeBenchOptions& options);

// ConfigError unless `device` can run here (a CUDA device needs a CUDA libtorch and a GPU).
void check_device(const std::string& device, const std::string& what);

}  // namespace starling::train
