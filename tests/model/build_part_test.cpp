// A peer that runs part of a model (a pipeline stage) builds only the parameters its nodes read:
// the values must be the whole model's, the rest only named, and the part must run its own nodes
// and load a whole model's weights, while refusing to run a node it does not hold.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <set>
#include <string>

#include "starling/common/error.h"
#include "starling/common/safetensors.h"
#include "starling/graph/executor.h"
#include "starling/model/build.h"
#include "starling/train/checkpoint.h"

namespace starling {
namespace {

model::ModelConfig tiny(const char* preset) {
  auto c = model::preset(preset);
  c.n_layer = 3;
  c.seq_len = 16;
  return c;
}

std::set<std::string> read_by(const graph::OpDag& dag, int first, int last) {
  std::set<std::string> names;
  for (int i = first; i <= last; ++i)
    for (const auto& n : dag.nodes()[static_cast<size_t>(i)].op->param_names()) names.insert(n);
  return names;
}

class ModelPart : public ::testing::TestWithParam<const char*> {};

TEST_P(ModelPart, HoldsOnlyWhatItsNodesReadWithTheWholeModelsValues) {
  const auto c = tiny(GetParam());
  const auto whole = model::build_model(c, 7, c10::kCPU);
  const int n = whole->size();
  // A first part, a middle one (whose draws come after skipped ones) and a last one (which, in
  // GPT-2, also reads the tied token embedding).
  for (const auto& [first, last] : {std::pair{0, 2}, std::pair{3, 5}, std::pair{6, n - 1}}) {
    const auto part = model::build_model_part(c, 7, c10::kCPU, [&](const graph::OpDag& d) {
      EXPECT_EQ(d.size(), n);
      return graph::StageRange{first, last};
    });
    ASSERT_EQ(part->size(), n);
    const std::set<std::string> want = read_by(*whole, first, last);
    std::set<std::string> held;
    for (const auto& p : part->params().params()) {
      held.insert(p.name);
      EXPECT_TRUE(at::equal(p.value, whole->params().get(p.name).value))
          << p.name << " in part [" << first << ", " << last << "]";
      EXPECT_EQ(p.decay, whole->params().get(p.name).decay) << p.name;
    }
    EXPECT_EQ(held, want) << "part [" << first << ", " << last << "]";
    // Everything else is named as held elsewhere, and nothing is both.
    EXPECT_EQ(part->params().params().size() + part->params().elsewhere().size(),
              whole->params().params().size());
    for (const auto& name : part->params().elsewhere()) {
      EXPECT_FALSE(part->params().contains(name)) << name;
      EXPECT_TRUE(whole->params().contains(name)) << name;
    }
    EXPECT_LT(part->params().bytes(), whole->params().bytes());
  }
}

TEST_P(ModelPart, RunsItsOwnNodesAndLoadsTheWholeModelsWeights) {
  const auto c = tiny(GetParam());
  const auto whole = model::build_model(c, 7, c10::kCPU);
  const int n = whole->size();
  auto part = model::build_model_part(c, 3, c10::kCPU, [&](const graph::OpDag&) {
    return graph::StageRange{0, 2};
  });
  // The whole model's weights (another seed's) load into the part: its tensors are taken, the
  // other stages' skipped.
  SafetensorsFile file;
  file.file = "whole.safetensors";
  for (const auto& p : whole->params().params())
    file.tensors.emplace_back(p.name, p.value.detach());
  train::load_params(file, part->params());
  for (const auto& p : part->params().params())
    EXPECT_TRUE(at::equal(p.value, whole->params().get(p.name).value)) << p.name;
  // A tensor that is no parameter of the model at all is still an error.
  file.tensors.emplace_back("layers.99.attn.qkv.weight", at::zeros({1}));
  EXPECT_THROW(train::load_params(file, part->params()), CheckpointError);

  // Its own nodes run and match the whole model's; a node of another part is refused.
  graph::Executor mine(*part), all(*whole);
  const at::Tensor tokens = at::randint(c.vocab_size, {2, c.seq_len}, at::kLong);
  const auto a = mine.forward_stage({tokens, at::Tensor()}, {0, 2});
  const auto b = all.forward_stage({tokens, at::Tensor()}, {0, 2});
  ASSERT_EQ(a.outputs().size(), b.outputs().size());
  for (const auto& [node, t] : a.outputs()) EXPECT_TRUE(at::equal(t, b.outputs().at(node)));
  EXPECT_THROW(mine.forward_stage({tokens, at::Tensor()}, {0, n - 1}), std::logic_error);
}

INSTANTIATE_TEST_SUITE_P(Presets, ModelPart, ::testing::Values("gpt2-tiny", "llama-tiny"),
                         [](const auto& info) {
                           return std::string(info.param[0] == 'g' ? "Gpt2" : "Llama");
                         });

}  // namespace
}  // namespace starling
