#include "starling/model/config.h"

#include <map>

#include "starling/common/error.h"
#include "starling/config/config_keys.h"

namespace starling::model {

std::string to_string(Arch arch) { return arch == Arch::kGpt2 ? "gpt2" : "llama"; }

Arch parse_arch(const std::string& name) {
  if (name == "gpt2") return Arch::kGpt2;
  if (name == "llama") return Arch::kLlama;
  throw ConfigError("model.arch: expected \"gpt2\" or \"llama\", got \"" + name + "\"");
}

int64_t ModelConfig::ff_dim() const {
  if (d_ff > 0) return d_ff;
  if (arch == Arch::kGpt2) return 4 * d_model;
  // SwiGLU has three matrices instead of two; 2/3 of 4*d keeps the parameter count of a
  // GELU MLP. Rounded up so the matmuls stay well shaped.
  const int64_t raw = (8 * d_model + 2) / 3;
  return (raw + 63) / 64 * 64;
}

void ModelConfig::validate() const {
  auto positive = [](const char* field, int64_t v) {
    if (v < 1)
      throw ConfigError(std::string("model.") + field + ": must be >= 1, got " + std::to_string(v));
  };
  positive("vocab_size", vocab_size);
  positive("seq_len", seq_len);
  positive("n_layer", n_layer);
  positive("n_head", n_head);
  positive("d_model", d_model);
  if (d_ff < 0)
    throw ConfigError("model.d_ff: must be >= 0 (0 = default), got " + std::to_string(d_ff));
  if (n_kv_head < 0) throw ConfigError("model.n_kv_head: must be >= 0 (0 = n_head)");
  if (d_model % n_head != 0)
    throw ConfigError("model.d_model (" + std::to_string(d_model) +
                      ") must be divisible by model.n_head (" + std::to_string(n_head) + ")");
  if (n_head % kv_heads() != 0)
    throw ConfigError("model.n_head (" + std::to_string(n_head) +
                      ") must be divisible by model.n_kv_head (" + std::to_string(kv_heads()) +
                      ")");
  if (arch == Arch::kGpt2 && n_kv_head != 0 && n_kv_head != n_head)
    throw ConfigError("model.n_kv_head: grouped-query attention is only for arch = \"llama\"");
  if (arch == Arch::kLlama && head_dim() % 2 != 0)
    throw ConfigError("model: rotary positions need an even head size, d_model/n_head = " +
                      std::to_string(head_dim()));
  if (!(norm_eps > 0)) throw ConfigError("model.norm_eps: must be > 0");
  if (!(init_std > 0)) throw ConfigError("model.init_std: must be > 0");
  if (!(rope_theta > 0)) throw ConfigError("model.rope_theta: must be > 0");
}

int64_t ModelConfig::num_params() const {
  const int64_t d = d_model, f = ff_dim(), hd = head_dim();
  int64_t n = vocab_size * d;  // token embedding
  if (!tie_embeddings) n += vocab_size * d;
  if (arch == Arch::kGpt2) {
    n += seq_len * d;  // positions
    const int64_t attn = d * 3 * d + 3 * d + d * d + d + 2 * d;
    const int64_t mlp = d * f + f + f * d + d + 2 * d;
    n += n_layer * (attn + mlp) + 2 * d;  // + final norm
  } else {
    const int64_t qkv = d * (n_head + 2 * kv_heads()) * hd;
    const int64_t attn = qkv + d * d + d;
    const int64_t mlp = d * 2 * f + f * d + d;
    n += n_layer * (attn + mlp) + d;
  }
  return n;
}

double ModelConfig::train_flops_per_token() const {
  // 6 FLOPs per matmul parameter per token (forward 2, backward 4), plus the attention score and
  // value products, 12 * n_layer * seq_len * d_model: PaLM's count (appendix B), which counts the
  // causal mask as full, as AttentionOp::forward_flops_per_token does.
  const double non_embedding = static_cast<double>(num_params()) -
                               static_cast<double>(vocab_size * d_model) -
                               (arch == Arch::kGpt2 ? static_cast<double>(seq_len * d_model) : 0.0);
  // The LM head matmul: an untied head is already among the non-embedding parameters.
  const double head = tie_embeddings ? static_cast<double>(vocab_size * d_model) : 0.0;
  return 6.0 * (non_embedding + head) + 12.0 * n_layer * seq_len * d_model;
}

namespace {

ModelConfig gpt(const std::string& name, int64_t layers, int64_t d, int64_t heads, int64_t seq,
                int64_t vocab) {
  ModelConfig c;
  c.name = name;
  c.arch = Arch::kGpt2;
  c.n_layer = layers;
  c.d_model = d;
  c.n_head = heads;
  c.seq_len = seq;
  c.vocab_size = vocab;
  c.tie_embeddings = true;
  return c;
}

ModelConfig llama(const std::string& name, int64_t layers, int64_t d, int64_t heads,
                  int64_t kv_heads, int64_t ff, int64_t seq, int64_t vocab) {
  ModelConfig c;
  c.name = name;
  c.arch = Arch::kLlama;
  c.n_layer = layers;
  c.d_model = d;
  c.n_head = heads;
  c.n_kv_head = kv_heads;
  c.d_ff = ff;
  c.seq_len = seq;
  c.vocab_size = vocab;
  c.tie_embeddings = false;
  c.norm_eps = 1e-6;
  return c;
}

const std::map<std::string, ModelConfig>& presets() {
  static const std::map<std::string, ModelConfig> table = [] {
    std::map<std::string, ModelConfig> t;
    auto add = [&](ModelConfig c) { t.emplace(c.name, c); };
    // Tiny models that train in minutes on two CPU cores (byte-level vocabulary).
    add(gpt("gpt2-tiny", 4, 128, 4, 128, 256));
    add(gpt("gpt2-mini", 6, 256, 8, 256, 256));
    add(llama("llama-tiny", 4, 128, 4, 2, 0, 128, 256));
    add(llama("llama-mini", 6, 256, 8, 4, 0, 256, 256));
    // GPT-2 (Radford et al. 2019), 50257 BPE tokens, 1024 positions.
    add(gpt("gpt2-124m", 12, 768, 12, 1024, 50257));
    add(gpt("gpt2-350m", 24, 1024, 16, 1024, 50257));
    add(gpt("gpt2-774m", 36, 1280, 20, 1024, 50257));
    add(gpt("gpt2-1558m", 48, 1600, 25, 1024, 50257));
    // GPT-3 family (Brown et al. 2020, table 2.1), dense attention throughout. Where the paper's
    // head count does not divide d_model (1.3B: 24 heads of 2048; 13B: d_model 5140) we use the
    // nearest consistent shape: 1.3B with 16 heads of 128, 13B with d_model 5120 and 40 heads.
    add(gpt("gpt3-125m", 12, 768, 12, 2048, 50257));
    add(gpt("gpt3-350m", 24, 1024, 16, 2048, 50257));
    add(gpt("gpt3-760m", 24, 1536, 16, 2048, 50257));
    add(gpt("gpt3-1.3b", 24, 2048, 16, 2048, 50257));
    add(gpt("gpt3-2.7b", 32, 2560, 32, 2048, 50257));
    add(gpt("gpt3-6.7b", 32, 4096, 32, 2048, 50257));
    add(gpt("gpt3-13b", 40, 5120, 40, 2048, 50257));
    // LLaMA-style (Touvron et al. 2023) with a 32000-token SentencePiece vocabulary.
    add(llama("llama-125m", 12, 768, 12, 12, 2048, 2048, 32000));
    add(llama("llama-350m", 24, 1024, 16, 16, 2816, 2048, 32000));
    add(llama("llama-1.1b", 22, 2048, 32, 4, 5632, 2048, 32000));  // TinyLlama's shape
    add(llama("llama-7b", 32, 4096, 32, 32, 11008, 2048, 32000));
    return t;
  }();
  return table;
}

}  // namespace

ModelConfig preset(const std::string& name) {
  auto it = presets().find(name);
  if (it == presets().end()) {
    std::string known;
    for (const auto& [n, _] : presets()) known += (known.empty() ? "" : ", ") + n;
    throw ConfigError("model.preset: unknown preset \"" + name + "\"; known presets: " + known);
  }
  return it->second;
}

std::vector<std::string> preset_names() {
  std::vector<std::string> names;
  for (const auto& [n, _] : presets()) names.push_back(n);
  return names;
}

void add_config_keys(ModelConfig& m, config::Keys& k) {
  using namespace config;
  k.push_back({"model", "arch", "string", "\"gpt2\" or \"llama\" (architecture; set by the preset)",
               [&m](const toml::node& n, const std::string& where) {
                 if (!n.is_string()) wrong_type(n, where, "a string");
                 try {
                   m.arch = parse_arch(n.as_string()->get());
                 } catch (const ConfigError& e) {
                   throw ConfigError(where + ": " + e.what());
                 }
               },
               [&m](toml::table& tb) { tb.insert_or_assign("arch", to_string(m.arch)); }});
  // The maxima are far beyond any model this trains (GPT-3's largest: 96 layers, 12288 wide,
  // 2048 tokens), so that a slip of the keyboard is named here rather than failing an
  // allocation.
  k.push_back(int_key("model", "vocab_size", &m.vocab_size, 1,
                      "vocabulary size; must be >= the dataset's", 1 << 24));
  k.push_back(int_key("model", "seq_len", &m.seq_len, 1, "context length in tokens", 1 << 20));
  k.push_back(int_key("model", "n_layer", &m.n_layer, 1, "transformer layers", 10'000));
  k.push_back(int_key("model", "n_head", &m.n_head, 1, "attention heads", 1 << 16));
  k.push_back(int_key("model", "n_kv_head", &m.n_kv_head, 0,
                      "key/value heads for grouped-query attention (llama); 0 = n_head", 1 << 16));
  k.push_back(int_key("model", "d_model", &m.d_model, 1, "residual stream width", 1 << 17));
  k.push_back(int_key("model", "d_ff", &m.d_ff, 0,
                      "MLP hidden width; 0 = 4*d_model (gpt2) or ~8/3*d_model (llama)", 1 << 20));
  k.push_back(float_key("model", "norm_eps", &m.norm_eps, 0, "epsilon of LayerNorm/RMSNorm"));
  k.push_back(float_key("model", "rope_theta", &m.rope_theta, 0, "rotary base (llama)"));
  k.push_back(bool_key("model", "tie_embeddings", &m.tie_embeddings,
                       "share the token embedding with the LM head"));
  k.push_back(float_key("model", "init_std", &m.init_std, 0, "std of the weight init"));
}

}  // namespace starling::model
