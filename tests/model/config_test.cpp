// Model configs: every preset is consistent, num_params() agrees with published counts and with
// the parameters build_model actually creates, and validate() names the field at fault.
#include "starling/model/config.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>

#include "starling/common/error.h"
#include "starling/model/build.h"

namespace starling {
namespace {

// `f` must throw ConfigError whose message contains every one of `parts`.
template <class F>
void expect_config_error(F&& f, std::initializer_list<std::string> parts) {
  try {
    f();
    ADD_FAILURE() << "expected ConfigError";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    for (const auto& p : parts)
      EXPECT_NE(what.find(p), std::string::npos) << "\"" << p << "\" not in: " << what;
  }
}

TEST(ModelConfig, PresetsExistAndValidate) {
  const auto names = model::preset_names();
  for (const char* expected :
       {"gpt2-tiny", "gpt2-mini", "llama-tiny", "llama-mini", "gpt2-124m", "gpt2-350m", "gpt2-774m",
        "gpt2-1558m", "gpt3-125m", "gpt3-13b", "llama-1.1b", "llama-7b"})
    EXPECT_NE(std::find(names.begin(), names.end(), expected), names.end()) << expected;
  for (const auto& name : names) {
    SCOPED_TRACE(name);
    const auto c = model::preset(name);
    EXPECT_EQ(c.name, name);
    EXPECT_NO_THROW(c.validate());
    EXPECT_GT(c.num_params(), 0);
    EXPECT_GT(c.train_flops_per_token(),
              6.0 * c.num_params() - 6.0 * c.vocab_size * c.d_model - 6.0 * c.seq_len * c.d_model);
    EXPECT_EQ(c.tie_embeddings, c.arch == model::Arch::kGpt2);
  }
}

TEST(ModelConfig, Gpt2SmallHasHuggingFaceParameterCount) {
  const auto c = model::preset("gpt2-124m");
  EXPECT_EQ(c.vocab_size, 50257);
  EXPECT_EQ(c.seq_len, 1024);
  // GPT2Model from Hugging Face: sum(p.numel() for p in model.parameters()) with the LM head tied.
  EXPECT_EQ(c.num_params(), 124'439'808);
  auto untied = c;
  untied.tie_embeddings = false;
  EXPECT_EQ(untied.num_params(), 124'439'808 + 50257 * 768);
}

TEST(ModelConfig, TyingTheHeadChangesParametersNotCompute) {
  // The LM head matmul costs the same whether or not its weight is the token embedding.
  for (const char* name : {"gpt2-124m", "llama-125m"}) {
    auto tied = model::preset(name), untied = tied;
    tied.tie_embeddings = true;
    untied.tie_embeddings = false;
    EXPECT_DOUBLE_EQ(tied.train_flops_per_token(), untied.train_flops_per_token()) << name;
  }
  // GPT-2 small: 6 FLOPs per matmul parameter (85M in the blocks + the 38.6M head) plus
  // 12 * n_layer * seq_len * d_model for attention (PaLM's count, causal mask counted as full).
  const auto c = model::preset("gpt2-124m");
  const double blocks = 124'439'808.0 - 50257.0 * 768 - 1024.0 * 768;
  EXPECT_DOUBLE_EQ(c.train_flops_per_token(),
                   6 * (blocks + 50257.0 * 768) + 12.0 * 12 * 1024 * 768);
}

TEST(ModelConfig, FfDimDefaults) {
  auto g = model::preset("gpt2-tiny");
  EXPECT_EQ(g.ff_dim(), 4 * g.d_model);
  auto l = model::preset("llama-tiny");
  // 8/3 * 128 = 341.3, rounded up to a multiple of 64.
  EXPECT_EQ(l.ff_dim(), 384);
  l.d_ff = 100;
  EXPECT_EQ(l.ff_dim(), 100);
  EXPECT_EQ(model::preset("llama-7b").ff_dim(), 11008);
}

void expect_count_matches_build(const model::ModelConfig& c) {
  ASSERT_NO_THROW(c.validate());
  auto dag = model::build_model(c, 3);
  EXPECT_EQ(dag->params().numel(), c.num_params());
  EXPECT_EQ(dag->params().contains("head.weight"), !c.tie_embeddings);
}

TEST(ModelConfig, NumParamsMatchesBuiltGpt2) {
  expect_count_matches_build(model::preset("gpt2-tiny"));
  auto c = model::preset("gpt2-tiny");
  c.n_layer = 2;
  c.tie_embeddings = false;
  c.d_ff = 200;
  expect_count_matches_build(c);
}

TEST(ModelConfig, NumParamsMatchesBuiltLlama) {
  auto tiny = model::preset("llama-tiny");
  EXPECT_LT(tiny.kv_heads(), tiny.n_head);
  expect_count_matches_build(tiny);
  model::ModelConfig c;
  c.arch = model::Arch::kLlama;
  c.n_layer = 2;
  c.d_model = 96;
  c.n_head = 6;
  c.n_kv_head = 2;  // grouped-query attention: 3 query heads per key/value head
  c.d_ff = 160;
  c.tie_embeddings = false;
  c.vocab_size = 300;
  c.seq_len = 32;
  expect_count_matches_build(c);
  c.tie_embeddings = true;
  expect_count_matches_build(c);
}

TEST(ModelConfig, ValidateNamesTheField) {
  auto c = model::preset("gpt2-tiny");
  c.d_model = 130;  // 4 heads
  expect_config_error([&] { c.validate(); }, {"model.d_model", "model.n_head", "130"});

  auto l = model::preset("llama-tiny");
  l.n_kv_head = 3;  // 4 heads
  expect_config_error([&] { l.validate(); }, {"model.n_head", "model.n_kv_head"});

  l = model::preset("llama-tiny");
  l.d_model = 12;  // head size 3: rotary positions need pairs
  l.n_head = 4;
  l.n_kv_head = 0;
  expect_config_error([&] { l.validate(); }, {"d_model/n_head", "even"});
  // The same shape is fine for gpt2.
  c = model::preset("gpt2-tiny");
  c.d_model = 12;
  EXPECT_NO_THROW(c.validate());

  c = model::preset("gpt2-tiny");
  c.vocab_size = 0;
  expect_config_error([&] { c.validate(); }, {"model.vocab_size"});
  c = model::preset("gpt2-tiny");
  c.n_layer = -1;
  expect_config_error([&] { c.validate(); }, {"model.n_layer"});
  c = model::preset("gpt2-tiny");
  c.n_kv_head = 2;
  expect_config_error([&] { c.validate(); }, {"model.n_kv_head"});
  c = model::preset("gpt2-tiny");
  c.norm_eps = 0;
  expect_config_error([&] { c.validate(); }, {"model.norm_eps"});
}

TEST(ModelConfig, UnknownPresetListsKnownOnes) {
  std::vector<std::string> parts = {"gpt2-huge"};
  for (const auto& n : model::preset_names()) parts.push_back(n);
  try {
    model::preset("gpt2-huge");
    ADD_FAILURE() << "expected ConfigError";
  } catch (const ConfigError& e) {
    for (const auto& p : parts)
      EXPECT_NE(std::string(e.what()).find(p), std::string::npos) << p << " not in " << e.what();
  }
}

TEST(ModelConfig, ParseArch) {
  EXPECT_EQ(model::parse_arch("gpt2"), model::Arch::kGpt2);
  EXPECT_EQ(model::parse_arch("llama"), model::Arch::kLlama);
  EXPECT_EQ(model::to_string(model::Arch::kLlama), "llama");
  expect_config_error([] { model::parse_arch("GPT2"); }, {"model.arch", "GPT2"});
}

}  // namespace
}  // namespace starling
