// Compute throughput of one training step (forward, backward, AdamW) on random tokens, for
// `starling bench compute` and the MFU denominator.
#pragma once

#include <cstdint>
#include <string>

#include "starling/model/config.h"

namespace starling::train {

// Sustained fp32 matmul GFLOP/s of this process's CPU threads (a ~0.3 s probe of square
// matmuls): the "peak" that MFU is measured against on CPUs, which publish no useful peak.
// `device` is "cpu", "cuda" or "cuda:N".
double measure_peak_gflops(const std::string& device = "cpu");

struct ComputeBenchResult {
  double tokens_per_s = 0;
  double step_ms = 0;
  double mfu = 0;
  double peak_gflops = 0;
};

// Trains `config` for warmup + steps steps of batch x seq_len random tokens; times the last
// `steps`. Uses the current thread setting.
ComputeBenchResult run_compute_bench(const model::ModelConfig& config, int64_t batch, int64_t steps,
                                     int64_t warmup, bool recompute,
                                     const std::string& device = "cpu");

// ConfigError unless `device` can run here (a CUDA device needs a CUDA libtorch and a GPU).
void check_device(const std::string& device, const std::string& what);

}  // namespace starling::train
