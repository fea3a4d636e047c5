#include "starling/model/hf_layout.h"

namespace starling::model {
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

std::vector<HfTensor> gpt2_layout(const ModelConfig& c) {
  std::vector<HfTensor> out{{"wte.weight", "embed.tok.weight"}, {"wpe.weight", "embed.pos.weight"}};
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string h = "h." + std::to_string(i) + ".", l = "layers." + std::to_string(i) + ".";
    auto add = [&](const std::string& hf, const std::string& ours, bool transpose = false) {
      out.push_back({h + hf, l + ours, 0, -1, transpose});
    };
    add("ln_1.weight", "attn.norm.weight");
    add("ln_1.bias", "attn.norm.bias");
    add("attn.c_attn.weight", "attn.qkv.weight", true);
    add("attn.c_attn.bias", "attn.qkv.bias");
    add("attn.c_proj.weight", "attn.proj.weight", true);
    add("attn.c_proj.bias", "attn.proj.bias");
    add("ln_2.weight", "mlp.norm.weight");
    add("ln_2.bias", "mlp.norm.bias");
    add("mlp.c_fc.weight", "mlp.fc.weight", true);
    add("mlp.c_fc.bias", "mlp.fc.bias");
    add("mlp.c_proj.weight", "mlp.proj.weight", true);
    add("mlp.c_proj.bias", "mlp.proj.bias");
  }
  out.push_back({"ln_f.weight", "final_norm.weight"});
  out.push_back({"ln_f.bias", "final_norm.bias"});
  if (!c.tie_embeddings) out.push_back({"lm_head.weight", "head.weight"});
  return out;
}

std::vector<HfTensor> llama_layout(const ModelConfig& c) {
  const int64_t q = c.n_head * c.head_dim(), kv = c.kv_heads() * c.head_dim(), ff = c.ff_dim();
  std::vector<HfTensor> out{{"model.embed_tokens.weight", "embed.tok.weight"}};
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string h = "model.layers." + std::to_string(i) + ".",
                      l = "layers." + std::to_string(i) + ".";
    out.push_back({h + "input_layernorm.weight", l + "attn.norm.weight"});
    out.push_back({h + "self_attn.q_proj.weight", l + "attn.qkv.weight", 0, q});
    out.push_back({h + "self_attn.k_proj.weight", l + "attn.qkv.weight", q, kv});
    out.push_back({h + "self_attn.v_proj.weight", l + "attn.qkv.weight", q + kv, kv});
    out.push_back({h + "self_attn.o_proj.weight", l + "attn.proj.weight"});
    out.push_back({h + "post_attention_layernorm.weight", l + "mlp.norm.weight"});
    out.push_back({h + "mlp.gate_proj.weight", l + "mlp.fc.weight", 0, ff});
    out.push_back({h + "mlp.up_proj.weight", l + "mlp.fc.weight", ff, ff});
    out.push_back({h + "mlp.down_proj.weight", l + "mlp.proj.weight"});
  }
  out.push_back({"model.norm.weight", "final_norm.weight"});
  if (!c.tie_embeddings) out.push_back({"lm_head.weight", "head.weight"});
  return out;
}

}  // namespace

std::vector<HfTensor> hf_layout(const ModelConfig& c) {
  return c.arch == Arch::kGpt2 ? gpt2_layout(c) : llama_layout(c);
}

std::string hf_canonical_name(const ModelConfig& c, const std::string& name) {
  if (c.arch == Arch::kGpt2 && name.rfind("transformer.", 0) == 0) return name.substr(12);
  return name;
}

bool hf_ignorable(const ModelConfig& c, const std::string& name) {
  if (c.tie_embeddings && name == "lm_head.weight") return true;
  if (c.arch == Arch::kGpt2)
    return ends_with(name, ".attn.bias") || ends_with(name, ".attn.masked_bias");
  return ends_with(name, ".rotary_emb.inv_freq");
}

}  // namespace starling::model
