#include "starling/model/hf_export.h"

#include <ATen/ATen.h>

#include <fstream>

#include "starling/common/error.h"
#include "starling/common/safetensors.h"
#include "starling/model/hf_layout.h"

namespace starling::model {
namespace fs = std::filesystem;

nlohmann::json hf_config(const ModelConfig& c) {
  // A byte-level or SentencePiece vocabulary has no GPT-2 end-of-text token: no special ids.
  const bool gpt2_vocab = c.vocab_size == 50257;
  if (c.arch == Arch::kGpt2) {
    nlohmann::json j = {{"architectures", {"GPT2LMHeadModel"}},
                        {"model_type", "gpt2"},
                        {"vocab_size", c.vocab_size},
                        {"n_positions", c.seq_len},
                        {"n_ctx", c.seq_len},
                        {"n_embd", c.d_model},
                        {"n_layer", c.n_layer},
                        {"n_head", c.n_head},
                        {"n_inner", c.ff_dim()},
                        {"activation_function", "gelu_new"},
                        {"layer_norm_epsilon", c.norm_eps},
                        {"tie_word_embeddings", c.tie_embeddings},
                        {"resid_pdrop", 0.0},
                        {"embd_pdrop", 0.0},
                        {"attn_pdrop", 0.0},
                        {"torch_dtype", "float32"}};
    j["bos_token_id"] = gpt2_vocab ? nlohmann::json(50256) : nlohmann::json(nullptr);
    j["eos_token_id"] = j["bos_token_id"];
    return j;
  }
  return {{"architectures", {"LlamaForCausalLM"}},
          {"model_type", "llama"},
          {"vocab_size", c.vocab_size},
          {"max_position_embeddings", c.seq_len},
          {"hidden_size", c.d_model},
          {"intermediate_size", c.ff_dim()},
          {"num_hidden_layers", c.n_layer},
          {"num_attention_heads", c.n_head},
          {"num_key_value_heads", c.kv_heads()},
          {"head_dim", c.head_dim()},
          {"hidden_act", "silu"},
          {"rms_norm_eps", c.norm_eps},
          {"rope_theta", c.rope_theta},
          {"attention_bias", false},
          {"mlp_bias", false},
          {"tie_word_embeddings", c.tie_embeddings},
          {"bos_token_id", nullptr},
          {"eos_token_id", nullptr},
          {"torch_dtype", "float32"}};
}

void export_hf(const graph::ParamStore& params, const ModelConfig& c, const fs::path& dir) {
  if (!params.elsewhere().empty())
    throw ConfigError("export: the model is a pipeline stage's part (" +
                      std::to_string(params.elsewhere().size()) +
                      " of its parameters are held by other stages); export a whole model");
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (const HfTensor& t : hf_layout(c)) {
    at::Tensor v = params.get(t.ours).value.detach();
    if (t.rows >= 0) v = v.narrow(0, t.begin, t.rows);
    if (t.transpose) v = v.t();
    tensors.emplace_back(t.hf, v.to(at::kCPU, at::kFloat).contiguous());
  }
  fs::create_directories(dir);
  const fs::path weights = dir / "model.safetensors", config = dir / "config.json";
  write_safetensors(weights.string() + ".tmp", tensors, {{"format", "pt"}});
  fs::rename(weights.string() + ".tmp", weights);
  {
    std::ofstream out(config.string() + ".tmp");
    out << hf_config(c).dump(2) << "\n";
    if (!out) throw Error("export: cannot write " + config.string());
  }
  fs::rename(config.string() + ".tmp", config);
}

}  // namespace starling::model
