#include "starling/train/precision.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <torch/version.h>

#include <algorithm>
#include <cstdlib>

#include "starling/common/device.h"
#include "starling/common/error.h"
#include "starling/graph/autocast.h"
#include "starling/train/metrics.h"

namespace starling::train {

c10::ScalarType parse_dtype(const std::string& name, const std::string& what) {
  if (name == "fp32") return at::kFloat;
  if (name == "bf16") return at::kBFloat16;
  if (name == "fp16") return at::kHalf;
  throw ConfigError(what + " = \"" + name + "\": expected \"fp32\", \"bf16\" or \"fp16\"");
}

void check_dtype(const std::string& device, const std::string& dtype, const std::string& what) {
  const c10::Device d(device);
  if (!graph::autocast_supported(d.type(), parse_dtype(dtype, what)))
    throw ConfigError(what + " = \"" + dtype + "\" is not supported on " + device +
                      " by this libtorch (" + TORCH_VERSION + "); use \"bf16\" or \"fp32\"");
}

void configure_matmul_precision(const std::string& device, bool tf32) {
  if (!c10::Device(device).is_cuda()) return;
  at::globalContext().setFloat32MatmulPrecision(tf32 ? "high" : "highest");
}

void configure_determinism(const std::string& device, bool deterministic) {
  if (!deterministic || !c10::Device(device).is_cuda()) return;
  // ":4096:8": eight 4 MB workspaces, the larger of the two settings cuBLAS documents as
  // deterministic. Left alone if the user's environment chose already.
  ::setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
}

double measure_peak_gflops(const std::string& device, const std::string& dtype) {
  at::NoGradGuard no_grad;
  const c10::Device d(device);
  const c10::ScalarType t = parse_dtype(dtype, "dtype");
  // A GPU needs large matmuls to reach its peak (tensor cores most of all); a CPU reaches it at
  // 1024.
  const int64_t n = d.is_cuda() ? (t == at::kFloat ? 4096 : 8192) : 1024;
  const int reps = d.is_cuda() ? 10 : 1;  // matmuls between two waits for the device
  auto gen = at::make_generator<at::CPUGeneratorImpl>(0);
  at::Tensor a = at::randn({n, n}, gen).to(d, t), b = at::randn({n, n}, gen).to(d, t);
  at::Tensor c = at::empty({n, n}, a.options());
  at::mm_out(c, a, b);  // warm up the BLAS pool / GPU kernels
  synchronize(d);
  double best = 0;
  const double start = now_s();
  while (now_s() - start < 0.3) {
    const double t0 = now_s();
    for (int i = 0; i < reps; ++i) at::mm_out(c, a, b);
    synchronize(d);
    best = std::max(best, 2.0 * n * n * n * reps / (now_s() - t0) / 1e9);
  }
  return best;
}

}  // namespace starling::train
