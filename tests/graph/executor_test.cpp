// The executor's node-by-node autodiff must give exactly what one monolithic autograd pass over
// the same ops gives, with and without recomputation, for both architectures.
#include "starling/graph/executor.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include "starling/model/build.h"

namespace starling {
namespace {

model::ModelConfig tiny(model::Arch arch) {
  auto c = model::preset(arch == model::Arch::kGpt2 ? "gpt2-tiny" : "llama-tiny");
  c.n_layer = 2;
  c.seq_len = 16;
  return c;
}

std::vector<at::Tensor> batch(const model::ModelConfig& c, int64_t b, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto tokens = at::randint(c.vocab_size, {b, c.seq_len + 1}, gen, at::kLong);
  return {tokens.narrow(1, 0, c.seq_len).contiguous(), tokens.narrow(1, 1, c.seq_len).contiguous()};
}

// Runs every op on undetached tensors: one autograd graph through the whole model.
double monolithic(graph::OpDag& dag, const std::vector<at::Tensor>& in) {
  std::vector<at::Tensor> out(dag.size());
  for (int i = 0; i < dag.size(); ++i) {
    std::vector<at::Tensor> args;
    for (const auto& s : dag.nodes()[i].inputs)
      args.push_back(s.kind == graph::Source::Kind::kNode ? out[s.index] : in[s.index]);
    out[i] = dag.nodes()[i].op->forward(args);
  }
  out.back().backward();
  return out.back().item<double>();
}

std::vector<at::Tensor> grads(graph::OpDag& dag) {
  std::vector<at::Tensor> g;
  for (auto& p : dag.params().params()) g.push_back(p.value.grad().clone());
  return g;
}

class ExecutorTest : public ::testing::TestWithParam<std::tuple<model::Arch, bool>> {};

TEST_P(ExecutorTest, MatchesMonolithicAutograd) {
  const auto [arch, recompute] = GetParam();
  const auto c = tiny(arch);
  auto in = batch(c, 3, 7);

  auto reference = model::build_model(c, 42);
  const double ref_loss = monolithic(*reference, in);
  auto ref_grads = grads(*reference);

  auto dag = model::build_model(c, 42);
  graph::Executor exec(*dag, {.recompute = recompute});
  const double loss = exec.forward_backward(in).item<double>();
  auto got = grads(*dag);

  EXPECT_NEAR(loss, ref_loss, 1e-6);
  ASSERT_EQ(got.size(), ref_grads.size());
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_TRUE(at::allclose(got[i], ref_grads[i], 1e-5, 1e-7))
        << dag->params().params()[i].name << " max diff "
        << (got[i] - ref_grads[i]).abs().max().item<double>();
  }
}

TEST_P(ExecutorTest, LossScaleScalesGradientsAndAccumulates) {
  const auto [arch, recompute] = GetParam();
  const auto c = tiny(arch);
  auto in = batch(c, 2, 9);
  auto dag = model::build_model(c, 1);
  graph::Executor exec(*dag, {.recompute = recompute});
  exec.forward_backward(in, 1.0);
  auto once = grads(*dag);
  dag->params().zero_grad();
  exec.forward_backward(in, 0.5);
  exec.forward_backward(in, 0.5);
  auto twice_half = grads(*dag);
  for (size_t i = 0; i < once.size(); ++i)
    EXPECT_TRUE(at::allclose(once[i], twice_half[i], 1e-5, 1e-7)) << dag->params().params()[i].name;
}

INSTANTIATE_TEST_SUITE_P(Archs, ExecutorTest,
                         ::testing::Combine(::testing::Values(model::Arch::kGpt2,
                                                              model::Arch::kLlama),
                                            ::testing::Bool()));

TEST(Executor, ForwardMatchesTrainingLoss) {
  const auto c = tiny(model::Arch::kGpt2);
  auto in = batch(c, 2, 3);
  auto dag = model::build_model(c, 5);
  graph::Executor exec(*dag);
  const double eval = exec.forward(in).item<double>();
  const double train = exec.forward_backward(in).item<double>();
  EXPECT_NEAR(eval, train, 1e-6);
  auto logits = exec.forward({in[0], at::Tensor()}, model::logits_node(*dag));
  EXPECT_EQ(logits.sizes(), (at::IntArrayRef{2, c.seq_len, c.vocab_size}));
}

TEST(Executor, TiedEmbeddingGetsGradientFromBothReaders) {
  const auto c = tiny(model::Arch::kGpt2);
  auto dag = model::build_model(c, 5);
  EXPECT_FALSE(dag->params().contains("head.weight"));
  const int embed = dag->find("embed"), head = dag->find("head");
  EXPECT_EQ(dag->nodes()[embed].op->param_names()[0], "embed.tok.weight");
  EXPECT_EQ(dag->nodes()[head].op->param_names()[0], "embed.tok.weight");
}

}  // namespace
}  // namespace starling
