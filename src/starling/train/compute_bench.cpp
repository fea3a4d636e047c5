#include "starling/train/compute_bench.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include "starling/common/device.h"
#include "starling/common/error.h"
#include "starling/graph/executor.h"
#include "starling/model/build.h"
#include "starling/train/adamw.h"
#include "starling/train/loss_scaler.h"
#include "starling/train/metrics.h"
#include "starling/train/precision.h"
#include "starling/train/trace_profiler.h"

namespace starling::train {

void check_device(const std::string& device, const std::string& what) {
  // libtorch's own words for "tpu" or "cuda:-1" name neither the flag nor what would do.
  const c10::Device d = [&] {
    try {
      return c10::Device(device);
    } catch (const c10::Error&) {
      throw ConfigError(what + " = \"" + device +
                        "\": not a device (\"cpu\", \"cuda\" or \"cuda:N\")");
    }
  }();
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

ComputeBenchResult run_compute_bench(const model::ModelConfig& config,
                                     const ComputeBenchOptions& o) {
  check_device(o.device, "--device");
  check_dtype(o.device, o.dtype, "--dtype");
  configure_matmul_precision(o.device, o.tf32);
  const c10::Device d(o.device);
  auto dag = model::build_model(config, 1337, d);
  graph::Executor exec(*dag,
                       {.recompute = o.recompute, .autocast = parse_dtype(o.dtype, "--dtype")});
  AdamW opt(dag->params(), {});
  LossScaler scaler;
  const bool fp16 = o.dtype == "fp16";
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1);
  at::Tensor tokens =
      at::randint(config.vocab_size, {o.batch, config.seq_len + 1}, gen, at::kLong).to(d);
  std::vector<at::Tensor> in{tokens.narrow(1, 0, config.seq_len).contiguous(),
                             tokens.narrow(1, 1, config.seq_len).contiguous()};
  // The step of train::train(): nothing here waits for the device except fp16's overflow check.
  auto step = [&] {
    dag->params().zero_grad();
    exec.forward_backward(in, fp16 ? scaler.scale() : 1.0);
    if (fp16 && scaler.update(scaler.unscale(dag->params()))) return;
    clip_grad_norm(dag->params(), 1.0);
    opt.step(1e-4);
  };
  for (int64_t i = 0; i < o.warmup; ++i) step();
  synchronize(d);
  reset_peak_memory(d);
  std::optional<TraceProfiler> trace;
  if (!o.profile.empty()) trace.emplace(d.is_cuda());
  const double t0 = now_s();
  for (int64_t i = 0; i < o.steps; ++i) step();
  synchronize(d);  // the last update must have finished before the clock is read
  if (trace) trace->save(o.profile);
  const double dt = (now_s() - t0) / static_cast<double>(std::max<int64_t>(o.steps, 1));
  ComputeBenchResult r;
  r.step_ms = dt * 1e3;
  r.tokens_per_s = static_cast<double>(o.batch * config.seq_len) / dt;
  r.peak_memory = peak_memory_bytes(d);
  r.fused_adamw = opt.fused();
  r.peak_gflops = measure_peak_gflops(o.device, o.dtype);
  r.tflops = r.tokens_per_s * config.train_flops_per_token() / 1e12;
  r.mfu = r.tflops * 1e3 / r.peak_gflops;
  return r;
}

}  // namespace starling::train
