// Hugging Face config.json -> [model]: what hf_export writes reads back as the same model for
// every preset; GPT-2's and TinyLLaMA's published configs read as the models they are (their
// fields as the Hub serves them); what Starling cannot build is refused naming the field; and the
// printed table parses into the same model.
#include "starling/model/hf_config.h"

#include <gtest/gtest.h>

#include <string>

#include "../data/test_util.h"
#include "starling/common/error.h"
#include "starling/model/hf_export.h"
#include "starling/train/config.h"

namespace starling {
namespace {

using data::testing::TempDir;
using data::testing::write_text;

void expect_same_model(const model::ModelConfig& a, const model::ModelConfig& b) {
  EXPECT_TRUE(model::hf_model_differences(a, b).empty());
  EXPECT_EQ(a.arch, b.arch);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.seq_len, b.seq_len);
  EXPECT_EQ(a.n_layer, b.n_layer);
  EXPECT_EQ(a.n_head, b.n_head);
  EXPECT_EQ(a.kv_heads(), b.kv_heads());
  EXPECT_EQ(a.d_model, b.d_model);
  EXPECT_EQ(a.ff_dim(), b.ff_dim());
  EXPECT_EQ(a.norm_eps, b.norm_eps);
  if (a.arch == model::Arch::kLlama) {
    EXPECT_EQ(a.rope_theta, b.rope_theta);
  }
  EXPECT_EQ(a.tie_embeddings, b.tie_embeddings);
}

TEST(HfConfig, WhatTheExportWritesReadsBackAsTheSameModel) {
  TempDir dir;
  for (const auto& name : model::preset_names()) {
    SCOPED_TRACE(name);
    auto c = model::preset(name);
    if (c.arch == model::Arch::kLlama) c.tie_embeddings = !c.tie_embeddings;  // both ways
    write_text(dir / "config.json", model::hf_config(c).dump(2));
    expect_same_model(model::model_from_hf_config(dir.path()), c);
  }
}

TEST(HfConfig, PublishedConfigsReadAsTheirModels) {
  TempDir dir;
  // GPT-2 small as the Hub serves it (no n_inner, no tie_word_embeddings: the defaults).
  write_text(dir / "gpt2.json", R"({"activation_function": "gelu_new",
    "architectures": ["GPT2LMHeadModel"], "attn_pdrop": 0.1, "bos_token_id": 50256,
    "embd_pdrop": 0.1, "eos_token_id": 50256, "initializer_range": 0.02,
    "layer_norm_epsilon": 1e-05, "model_type": "gpt2", "n_ctx": 1024, "n_embd": 768,
    "n_head": 12, "n_layer": 12, "n_positions": 1024, "resid_pdrop": 0.1, "vocab_size": 50257})");
  auto gpt2 = model::preset("gpt2-124m");
  gpt2.vocab_size = 50257;
  expect_same_model(model::model_from_hf_config(dir / "gpt2.json"), gpt2);

  // TinyLlama-1.1B: grouped-query attention (4 of 32 heads), untied head.
  write_text(dir / "tiny.json", R"({"architectures": ["LlamaForCausalLM"], "bos_token_id": 1,
    "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02,
    "intermediate_size": 5632, "max_position_embeddings": 2048, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 22, "num_key_value_heads": 4,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null, "rope_theta": 10000.0,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
    "vocab_size": 32000})");
  const auto tiny = model::model_from_hf_config(dir / "tiny.json");
  EXPECT_EQ(tiny.arch, model::Arch::kLlama);
  EXPECT_EQ(tiny.kv_heads(), 4);
  EXPECT_EQ(tiny.ff_dim(), 5632);
  EXPECT_FALSE(tiny.tie_embeddings);
  EXPECT_NEAR(static_cast<double>(tiny.num_params()), 1.1e9, 0.01e9);

  // The printed table is a [model] a config takes as it is.
  for (const auto& c : {gpt2, tiny}) {
    const auto run =
        train::parse_run_config(model::model_table(c) + "[data]\ndir = \"-\"\n", "table", {});
    expect_same_model(run.model, c);
  }
}

TEST(HfConfig, WhatStarlingCannotBuildIsNamed) {
  TempDir dir;
  const auto refused = [&](const std::string& json, const std::string& says) {
    write_text(dir / "config.json", json);
    try {
      model::model_from_hf_config(dir.path());
      ADD_FAILURE() << "accepted: " << json;
    } catch (const ConfigError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find((dir / "config.json").string()), std::string::npos) << what;
      EXPECT_NE(what.find(says), std::string::npos) << what;
    }
  };
  const std::string llama =
      R"("model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
         "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 100)";
  refused(R"({"model_type": "bert", "hidden_size": 768})", "\"model_type\" is \"bert\"");
  refused("{" + llama + R"(, "hidden_act": "gelu"})", "\"hidden_act\" is \"gelu\"");
  refused("{" + llama + R"(, "attention_bias": true})", "biases");
  refused("{" + llama + R"(, "rope_scaling": {"type": "linear", "factor": 2.0}})", "rope_scaling");
  refused("{" + llama + R"(, "head_dim": 32})", "head_dim");
  refused("{" + llama + R"(, "num_key_value_heads": 3})", "cannot build");
  refused(R"({"model_type": "llama", "hidden_size": 64})", "missing \"vocab_size\"");
  refused(R"({"model_type": "gpt2", "n_embd": "768", "n_layer": 2, "n_head": 2,
              "vocab_size": 10})",
          "\"n_embd\" must be a whole number");
  refused(R"({"model_type": "gpt2", "activation_function": "relu", "n_embd": 8, "n_layer": 1,
              "n_head": 2, "vocab_size": 10})",
          "gelu_new");
  refused("[1]", "not a JSON object");
  refused("{", "not valid JSON");
}

TEST(HfConfig, DifferencesNameTheKeyAndBothValues) {
  auto hf = model::preset("llama-tiny");
  hf.n_kv_head = 1;
  auto run = hf;
  run.n_kv_head = 0;
  run.seq_len = hf.seq_len * 2;  // rotary: any length
  auto d = model::hf_model_differences(run, hf);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0],
            "model.n_kv_head = " + std::to_string(run.n_head) + ", the model's config.json says 1");
  auto gpt2 = model::preset("gpt2-tiny");
  auto longer = gpt2;
  longer.seq_len = gpt2.seq_len + 1;  // learned positions: none for the last token
  d = model::hf_model_differences(longer, gpt2);
  ASSERT_EQ(d.size(), 1u);
  EXPECT_NE(d[0].find("model.seq_len"), std::string::npos) << d[0];
  d = model::hf_model_differences(hf, gpt2);  // another architecture: nothing else compared
  ASSERT_EQ(d.size(), 1u);
  EXPECT_NE(d[0].find("model.arch"), std::string::npos) << d[0];
}

}  // namespace
}  // namespace starling
