#include "starling/train/compute_bench.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <chrono>

#include "starling/common/error.h"
#include "starling/graph/executor.h"
#include "starling/model/build.h"
#include "starling/train/adamw.h"

namespace starling::train {
namespace {
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

void check_device(const std::string& device, const std::string& what) {
  const c10::Device d(device);
  if (d.is_cuda()) {
    if (!at::hasCUDA())
      throw ConfigError(
          what + " = \"" + device +
          "\": this build's libtorch has no CUDA support or no GPU is visible; build "
          "against a CUDA libtorch (-DCMAKE_PREFIX_PATH=/path/to/libtorch) or use \"cpu\"");
    const int64_t count = static_cast<int64_t>(at::detail::getCUDAHooks().getNumGPUs());
    if (d.has_index() && d.index() >= count)
      throw ConfigError(what + " = \"" + device + "\": only " + std::to_string(count) +
                        " CUDA device(s) visible");
  }
}

double measure_peak_gflops(const std::string& device) {
  at::NoGradGuard no_grad;
  const c10::Device d(device);
  // A GPU needs larger matmuls to reach its peak; a CPU reaches it at 1024.
  const int64_t n = d.is_cuda() ? 4096 : 1024;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
  at::Tensor a = at::randn({n, n}, gen).to(d), b = at::randn({n, n}, gen).to(d);
  at::Tensor c = at::empty({n, n}, a.options());
  // Reading one element back waits for the device, so the timing covers the whole matmul.
  auto sync = [&] { return c[0][0].item<float>(); };
  at::mm_out(c, a, b);  // warm up the BLAS pool / GPU kernels
  sync();
  double best = 0;
  const double start = now_s();
  while (now_s() - start < 0.3) {
    const double t0 = now_s();
    at::mm_out(c, a, b);
    sync();
    best = std::max(best, 2.0 * n * n * n / (now_s() - t0) / 1e9);
  }
  return best;
}

ComputeBenchResult run_compute_bench(const model::ModelConfig& config, int64_t batch, int64_t steps,
                                     int64_t warmup, bool recompute, const std::string& device) {
  check_device(device, "--device");
  const c10::Device d(device);
  auto dag = model::build_model(config, 1337, d);
  graph::Executor exec(*dag, {.recompute = recompute});
  AdamW opt(dag->params(), {});
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  at::Tensor tokens =
      at::randint(config.vocab_size, {batch, config.seq_len + 1}, gen, at::kLong).to(d);
  std::vector<at::Tensor> in{tokens.narrow(1, 0, config.seq_len).contiguous(),
                             tokens.narrow(1, 1, config.seq_len).contiguous()};
  auto step = [&] {
    dag->params().zero_grad();
    exec.forward_backward(in);
    clip_grad_norm(dag->params(), 1.0);
    opt.step(1e-4);
    // The optimizer's last update must have finished before the clock is read.
    dag->params().params().back().value.sum().item<float>();
  };
  for (int64_t i = 0; i < warmup; ++i) step();
  const double t0 = now_s();
  for (int64_t i = 0; i < steps; ++i) step();
  const double dt = (now_s() - t0) / static_cast<double>(std::max<int64_t>(steps, 1));
  ComputeBenchResult r;
  r.step_ms = dt * 1e3;
  r.tokens_per_s = static_cast<double>(batch * config.seq_len) / dt;
  r.peak_gflops = measure_peak_gflops(device);
  r.mfu = r.tokens_per_s * config.train_flops_per_token() / (r.peak_gflops * 1e9);
  return r;
}

}  // namespace starling::train
