#include "starling/train/compute_bench.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <chrono>

#include "starling/graph/executor.h"
#include "starling/model/build.h"
#include "starling/train/adamw.h"

namespace starling::train {
namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

double measure_peak_gflops() {
  at::NoGradGuard no_grad;
  const int64_t n = 1024;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
  at::Tensor a = at::randn({n, n}, gen), b = at::randn({n, n}, gen), c = at::empty({n, n});
  at::mm_out(c, a, b);  // warm up the BLAS pool
  double best = 0;
  const double start = now_s();
  while (now_s() - start < 0.3) {
    const double t0 = now_s();
    at::mm_out(c, a, b);
    best = std::max(best, 2.0 * n * n * n / (now_s() - t0) / 1e9);
  }
  return best;
}

ComputeBenchResult run_compute_bench(const model::ModelConfig& config, int64_t batch,
                                     int64_t steps, int64_t warmup, bool recompute) {
  auto dag = model::build_model(config, 1337);
  graph::Executor exec(*dag, {.recompute = recompute});
  AdamW opt(dag->params(), {});
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  at::Tensor tokens = at::randint(config.vocab_size, {batch, config.seq_len + 1}, gen, at::kLong);
  std::vector<at::Tensor> in{tokens.narrow(1, 0, config.seq_len).contiguous(),
                             tokens.narrow(1, 1, config.seq_len).contiguous()};
  auto step = [&] {
    dag->params().zero_grad();
    exec.forward_backward(in);
    clip_grad_norm(dag->params(), 1.0);
    opt.step(1e-4);
  };
  for (int64_t i = 0; i < warmup; ++i) step();
  const double t0 = now_s();
  for (int64_t i = 0; i < steps; ++i) step();
  const double dt = (now_s() - t0) / static_cast<double>(std::max<int64_t>(steps, 1));
  ComputeBenchResult r;
  r.step_ms = dt * 1e3;
  r.tokens_per_s = static_cast<double>(batch * config.seq_len) / dt;
  r.peak_gflops = measure_peak_gflops();
  r.mfu = r.tokens_per_s * config.train_flops_per_token() / (r.peak_gflops * 1e9);
  return r;
}

}  // namespace starling::train
