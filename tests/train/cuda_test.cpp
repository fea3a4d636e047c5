// The GPU path against the CPU path. Each test skips (saying why) without a CUDA libtorch and a
// GPU; on one they check that the same model gives the same loss and gradients on both devices,
// that the fused multi-tensor AdamW is torch's arithmetic, and that bf16/fp16 steps train.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <iostream>

#include "starling/common/device.h"
#include "starling/graph/executor.h"
#include "starling/model/build.h"
#include "starling/train/adamw.h"
#include "starling/train/loss_scaler.h"
#include "starling/train/precision.h"

namespace starling::train {
namespace {

#define SKIP_WITHOUT_CUDA()                                                                 \
  if (!at::hasCUDA())                                                                       \
  GTEST_SKIP() << "no CUDA: this libtorch has no CUDA support or no GPU is visible (build " \
                  "against a CUDA libtorch, scripts/build-cuda.sh)"

model::ModelConfig small(const std::string& preset) {
  auto c = model::preset(preset);
  c.n_layer = 2;
  c.seq_len = 64;
  return c;
}

std::vector<at::Tensor> batch(const model::ModelConfig& c, const c10::Device& d) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  auto seq = at::randint(c.vocab_size, {4, c.seq_len + 1}, gen, at::kLong);
  return {seq.narrow(1, 0, c.seq_len).contiguous().to(d),
          seq.narrow(1, 1, c.seq_len).contiguous().to(d)};
}

double rel_err(const at::Tensor& got, const at::Tensor& want) {
  const at::Tensor g = got.to(at::kCPU, at::kDouble), w = want.to(at::kCPU, at::kDouble);
  return (g - w).norm().item<double>() / (w.norm().item<double>() + 1e-12);
}

class CudaPath : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaPath, Fp32GradientsEqualTheCpuPath) {
  SKIP_WITHOUT_CUDA();
  configure_matmul_precision("cuda", /*tf32=*/false);
  const auto c = small(GetParam());
  auto cpu = model::build_model(c, 11, c10::Device("cpu"));
  auto gpu = model::build_model(c, 11, c10::Device("cuda"));
  graph::Executor ec(*cpu), eg(*gpu);
  const double lc = ec.forward_backward(batch(c, c10::Device("cpu"))).item<double>();
  const double lg = eg.forward_backward(batch(c, c10::Device("cuda"))).item<double>();
  EXPECT_NEAR(lc, lg, 1e-4);
  for (size_t i = 0; i < cpu->params().params().size(); ++i) {
    const auto& pc = cpu->params().params()[i];
    const auto& pg = gpu->params().params()[i];
    EXPECT_LT(rel_err(pg.value.grad(), pc.value.grad()), 1e-4) << pc.name;
  }
  configure_matmul_precision("cuda", /*tf32=*/true);
}

// The same gradients, fed to the fused kernel and to the per-parameter ops on the same GPU, must
// move every parameter the same way (compared on the update, not the value: a zero-initialised
// bias is all update).
TEST_P(CudaPath, FusedAdamWMatchesTheSingleTensorUpdate) {
  SKIP_WITHOUT_CUDA();
  const auto c = small(GetParam());
  auto a = model::build_model(c, 3, c10::Device("cuda"));
  auto b = model::build_model(c, 3, c10::Device("cuda"));
  AdamW fused(a->params(), {}), single(b->params(), {.fused = false});
  EXPECT_TRUE(fused.fused());
  EXPECT_FALSE(single.fused());
  std::vector<at::Tensor> start;
  for (const auto& p : a->params().params()) start.push_back(p.value.detach().clone());
  graph::Executor exec(*a);
  for (int step = 0; step < 3; ++step) {
    a->params().zero_grad();
    exec.forward_backward(batch(c, c10::Device("cuda")));
    clip_grad_norm(a->params(), 1.0);
    for (size_t i = 0; i < start.size(); ++i)
      b->params().params()[i].value.mutable_grad() = a->params().params()[i].value.grad().clone();
    fused.step(1e-3);
    single.step(1e-3);
  }
  for (size_t i = 0; i < start.size(); ++i) {
    const auto& pa = a->params().params()[i];
    const auto& pb = b->params().params()[i];
    EXPECT_LT(rel_err(pa.value - start[i], pb.value - start[i]), 1e-4) << pa.name;
  }
}

TEST_P(CudaPath, LowPrecisionStepsTrain) {
  SKIP_WITHOUT_CUDA();
  const auto c = small(GetParam());
  for (const std::string dtype : {"bf16", "fp16"}) {
    auto dag = model::build_model(c, 9, c10::Device("cuda"));
    graph::Executor exec(*dag, {.autocast = parse_dtype(dtype, "dtype")});
    AdamW opt(dag->params(), {});
    LossScaler scaler;
    const auto in = batch(c, c10::Device("cuda"));
    double first = 0, last = 0;
    for (int i = 0; i < 30; ++i) {
      dag->params().zero_grad();
      const double scale = dtype == "fp16" ? scaler.scale() : 1.0;
      const double loss = exec.forward_backward(in, scale).item<double>();
      if (i == 0) first = loss;
      last = loss;
      if (dtype == "fp16" && scaler.update(scaler.unscale(dag->params()))) continue;
      clip_grad_norm(dag->params(), 1.0);
      opt.step(3e-3);
    }
    EXPECT_LT(last, first - 0.5) << dtype;
    EXPECT_EQ(scaler.skipped(), 0) << dtype;
    for (const auto& p : dag->params().params())
      EXPECT_EQ(p.value.scalar_type(), at::kFloat) << dtype << " " << p.name;
  }
}

// Fused attention's backward accumulates its key blocks with atomics unless determinism is asked
// for, so a sequence long enough to span several blocks can give other bits on every run.
// train.deterministic must make two runs of the same step agree to the bit.
TEST_P(CudaPath, DeterministicModeRepeatsTheGradientsBitForBit) {
  SKIP_WITHOUT_CUDA();
  auto c = small(GetParam());
  c.seq_len = 1024;
  const c10::Device d("cuda");
  auto grads_of_one_step = [&] {
    auto dag = model::build_model(c, 11, d);
    graph::Executor e(*dag);
    e.forward_backward(batch(c, d));
    std::vector<at::Tensor> g;
    for (const auto& p : dag->params().params()) g.push_back(p.value.grad().clone());
    return g;
  };
  auto differing = [&](const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
    int n = 0;
    for (size_t i = 0; i < a.size(); ++i) n += at::equal(a[i], b[i]) ? 0 : 1;
    return n;
  };
  const int by_default = differing(grads_of_one_step(), grads_of_one_step());
  configure_determinism("cuda", true);
  const auto first = grads_of_one_step();
  const auto second = grads_of_one_step();
  at::globalContext().setDeterministicAlgorithms(false, false);
  EXPECT_EQ(differing(first, second), 0) << "of " << first.size() << " gradients";
  std::cout << "[ info     ] without train.deterministic " << by_default << " of " << first.size()
            << " gradients differed between two runs\n";
}

TEST(CudaDevice, PeakMemoryIsReported) {
  SKIP_WITHOUT_CUDA();
  ASSERT_TRUE(built_with_cuda());
  const c10::Device d("cuda");
  reset_peak_memory(d);
  at::Tensor t = at::empty({64 << 20}, at::TensorOptions(at::kByte).device(d));
  synchronize(d);
  EXPECT_GE(peak_memory_bytes(d), int64_t{64} << 20);
}

INSTANTIATE_TEST_SUITE_P(Archs, CudaPath, ::testing::Values("gpt2-tiny", "llama-tiny"),
                         [](const auto& info) {
                           std::string n = info.param;
                           for (auto& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

}  // namespace
}  // namespace starling::train
