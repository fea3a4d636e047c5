// The numeric side of a run's device: compute dtype (train.dtype), TF32 (train.tf32), and the peak
// that MFU is measured against.
#pragma once

#include <c10/core/ScalarType.h>

#include <string>

namespace starling::train {

// "fp32" -> Float, "bf16" -> BFloat16, "fp16" -> Half; ConfigError naming `what` otherwise.
c10::ScalarType parse_dtype(const std::string& name, const std::string& what);

// ConfigError (naming `what`) unless this libtorch can autocast `dtype` on `device`.
void check_dtype(const std::string& device, const std::string& dtype, const std::string& what);

// CUDA only: lets fp32 matrix products use TF32 tensor cores (torch.backends.cuda.matmul.
// allow_tf32) or forbids it. CPUs are left alone.
void configure_matmul_precision(const std::string& device, bool tf32);

// CUDA only, when `deterministic`: only kernels that give the same bits on every run
// (torch.use_deterministic_algorithms(True)): fused attention's backward takes its one-pass form
// instead of accumulating key blocks with atomics, and cuBLAS a fixed workspace
// (CUBLAS_WORKSPACE_CONFIG, unless the environment already sets it; it must precede the first
// cuBLAS call, so call this before any GPU work). An op without a deterministic kernel then stops
// the run with libtorch's error naming it. CPUs are left alone: their kernels give the same bits
// for a fixed thread count already.
void configure_determinism(const std::string& device, bool deterministic);

// Sustained matmul GFLOP/s of `device` in `dtype` (a ~0.3 s probe of square matmuls, best
// repetition): the "peak" MFU is measured against. fp32 on a CPU is what its BLAS reaches with
// this process's threads; bf16/fp16 on a GPU is the tensor-core rate (n = 8192).
double measure_peak_gflops(const std::string& device = "cpu", const std::string& dtype = "fp32");

}  // namespace starling::train
