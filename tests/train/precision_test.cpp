// Mixed-precision pieces that run on any machine: dtype names, the autocast scope, the fp16 loss
// scaler's rule, and that a bf16 step trains fp32 master weights.
#include "starling/train/precision.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <gtest/gtest.h>

#include "starling/common/error.h"
#include "starling/graph/autocast.h"
#include "starling/graph/executor.h"
#include "starling/model/build.h"
#include "starling/train/adamw.h"
#include "starling/train/loss_scaler.h"

namespace starling::train {
namespace {

TEST(Precision, DtypeNames) {
  EXPECT_EQ(parse_dtype("fp32", "train.dtype"), at::kFloat);
  EXPECT_EQ(parse_dtype("bf16", "train.dtype"), at::kBFloat16);
  EXPECT_EQ(parse_dtype("fp16", "train.dtype"), at::kHalf);
  try {
    parse_dtype("float8", "train.dtype");
    FAIL() << "float8 accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("train.dtype"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(check_dtype("cpu", "bf16", "train.dtype"));
}

TEST(Autocast, ScopeCastsMatmulsAndRestoresState) {
  at::Tensor a = at::randn({4, 4}), b = at::randn({4, 4});
  {
    graph::AutocastScope scope(c10::DeviceType::CPU, at::kBFloat16);
    EXPECT_EQ(at::mm(a, b).scalar_type(), at::kBFloat16);
    EXPECT_EQ(at::softmax(a, -1).scalar_type(), at::kFloat);  // kept in fp32 by autocast's lists
  }
  EXPECT_EQ(at::mm(a, b).scalar_type(), at::kFloat);
  {
    graph::AutocastScope off(c10::DeviceType::CPU, at::kFloat);  // fp32: a no-op
    EXPECT_EQ(at::mm(a, b).scalar_type(), at::kFloat);
  }
}

TEST(LossScaler, BacksOffOnOverflowAndGrowsAfterCleanSteps) {
  graph::ParamStore ps;
  at::Tensor w = ps.add("w", at::ones({3}), true);
  w.mutable_grad() = at::full({3}, 1024.0);
  LossScaler s(1024.0, /*growth_interval=*/2);
  EXPECT_TRUE(s.unscale(ps));
  EXPECT_TRUE(at::allclose(w.grad(), at::ones({3})));  // divided by the scale
  EXPECT_FALSE(s.update(true));
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), 2048.0);  // two clean steps: doubled
  w.mutable_grad() = at::tensor({1.0f, INFINITY, 0.0f});
  EXPECT_FALSE(s.unscale(ps));
  EXPECT_TRUE(s.update(false));  // skip this step
  EXPECT_EQ(s.scale(), 1024.0);
  EXPECT_EQ(s.skipped(), 1);
}

TEST(MixedPrecision, Bf16StepsKeepFp32MasterWeightsAndLearn) {
  auto c = model::preset("gpt2-tiny");
  c.n_layer = 2;
  c.seq_len = 32;
  auto dag = model::build_model(c, 7);
  graph::Executor exec(*dag, {.autocast = at::kBFloat16});
  AdamW opt(dag->params(), {});
  EXPECT_FALSE(opt.fused());  // the fused kernel is for CUDA
  auto seq = at::randint(c.vocab_size, {4, c.seq_len + 1}, at::kLong);
  std::vector<at::Tensor> in{seq.narrow(1, 0, c.seq_len).contiguous(),
                             seq.narrow(1, 1, c.seq_len).contiguous()};
  double first = 0, last = 0;
  for (int i = 0; i < 20; ++i) {
    dag->params().zero_grad();
    const double loss = exec.forward_backward(in).item<double>();
    if (i == 0) first = loss;
    last = loss;
    clip_grad_norm(dag->params(), 1.0);
    opt.step(3e-3);
  }
  EXPECT_LT(last, first - 0.5) << "a repeated batch must be learned";
  for (const auto& p : dag->params().params()) {
    EXPECT_EQ(p.value.scalar_type(), at::kFloat) << p.name;
    EXPECT_EQ(p.value.grad().scalar_type(), at::kFloat) << p.name;
  }
}

}  // namespace
}  // namespace starling::train
