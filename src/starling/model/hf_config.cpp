#include "starling/model/hf_config.h"

#include <charconv>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "starling/common/error.h"

namespace starling::model {

namespace {

namespace fs = std::filesystem;

// Reads config.json's fields with the file named in every error.
class HfFields {
 public:
  HfFields(nlohmann::json j, std::string where) : j_(std::move(j)), where_(std::move(where)) {}

  [[noreturn]] void fail(const std::string& what) const { throw ConfigError(where_ + ": " + what); }

  bool has(const char* key) const { return j_.contains(key) && !j_[key].is_null(); }

  int64_t size(const char* key) const {
    if (!has(key)) fail("missing \"" + std::string(key) + "\"");
    return size_or(key, 0);
  }
  int64_t size_or(const char* key, int64_t fallback) const {
    if (!has(key)) return fallback;
    const auto& v = j_[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 1)
      fail("\"" + std::string(key) + "\" must be a whole number of at least 1, not " + v.dump());
    return v.get<int64_t>();
  }
  double number_or(const char* key, double fallback) const {
    if (!has(key)) return fallback;
    const auto& v = j_[key];
    if (!v.is_number() || !std::isfinite(v.get<double>()) || v.get<double>() <= 0)
      fail("\"" + std::string(key) + "\" must be a number above 0, not " + v.dump());
    return v.get<double>();
  }
  bool flag_or(const char* key, bool fallback) const {
    if (!has(key)) return fallback;
    if (!j_[key].is_boolean()) fail("\"" + std::string(key) + "\" must be true or false");
    return j_[key].get<bool>();
  }
  std::string text_or(const char* key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    if (!j_[key].is_string()) fail("\"" + std::string(key) + "\" must be a string");
    return j_[key].get<std::string>();
  }
  // A setting Starling's model has one value of: `want`, or the file's model is another one.
  void require(const char* key, const std::string& fallback, const std::string& want,
               const std::string& why) const {
    const std::string got = text_or(key, fallback);
    if (got != want) fail("\"" + std::string(key) + "\" is \"" + got + "\"; " + why);
  }

 private:
  nlohmann::json j_;
  std::string where_;
};

ModelConfig gpt2_config(const HfFields& f) {
  ModelConfig c;
  c.name = "hf-gpt2";
  c.arch = Arch::kGpt2;
  f.require("activation_function", "gelu_new", "gelu_new",
            "Starling's GPT-2 computes the tanh approximation of GELU (gelu_new) only");
  c.vocab_size = f.size("vocab_size");
  c.seq_len = f.size_or("n_positions", f.size_or("n_ctx", 1024));
  c.n_layer = f.size("n_layer");
  c.n_head = f.size("n_head");
  c.d_model = f.size("n_embd");
  c.d_ff = f.size_or("n_inner", 4 * c.d_model);
  c.norm_eps = f.number_or("layer_norm_epsilon", 1e-5);
  c.tie_embeddings = f.flag_or("tie_word_embeddings", true);
  return c;
}

ModelConfig llama_config(const HfFields& f) {
  ModelConfig c;
  c.name = "hf-llama";
  c.arch = Arch::kLlama;
  f.require("hidden_act", "silu", "silu", "Starling's LLaMA MLP is SwiGLU (silu) only");
  if (f.flag_or("attention_bias", false) || f.flag_or("mlp_bias", false))
    f.fail("its attention or MLP has biases (attention_bias, mlp_bias); Starling's LLaMA has none");
  if (f.has("rope_scaling"))
    f.fail("\"rope_scaling\" is set; Starling's rotary embedding has no scaling");
  c.vocab_size = f.size("vocab_size");
  c.seq_len = f.size_or("max_position_embeddings", 2048);
  c.n_layer = f.size("num_hidden_layers");
  c.n_head = f.size("num_attention_heads");
  c.n_kv_head = f.size_or("num_key_value_heads", c.n_head);
  c.d_model = f.size("hidden_size");
  c.d_ff = f.size("intermediate_size");
  c.norm_eps = f.number_or("rms_norm_eps", 1e-6);
  c.rope_theta = f.number_or("rope_theta", 10000.0);
  c.tie_embeddings = f.flag_or("tie_word_embeddings", false);
  if (f.size_or("head_dim", c.d_model / c.n_head) * c.n_head != c.d_model)
    f.fail(
        "\"head_dim\" times \"num_attention_heads\" is not \"hidden_size\"; Starling's heads "
        "split the width evenly");
  return c;
}

// The shortest text that reads back as `v` (1e-05, 0.95, 10000.0).
std::string float_text(double v) {
  char text[32];
  std::string s(text, std::to_chars(text, text + sizeof text, v).ptr);
  if (s.find_first_of(".e") == std::string::npos) s += ".0";
  return s;
}

}  // namespace

ModelConfig model_from_hf_config(const fs::path& path) {
  const fs::path file = fs::is_directory(path) ? path / "config.json" : path;
  const std::string where = file.string();
  if (fs::is_directory(file)) throw ConfigError(where + ": is a directory, not a config.json");
  std::ifstream in(file);
  if (!in) throw ConfigError(where + ": cannot open (missing or unreadable)");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(where + ": not valid JSON: " + e.what());
  }
  if (!j.is_object()) throw ConfigError(where + ": not a JSON object");
  const HfFields f(j, where);
  const std::string type = f.text_or("model_type", "");
  ModelConfig c;
  if (type == "gpt2") {
    c = gpt2_config(f);
  } else if (type == "llama") {
    c = llama_config(f);
  } else {
    f.fail("\"model_type\" is \"" + type +
           "\"; Starling builds GPT-2 (\"gpt2\") and LLaMA (\"llama\") models");
  }
  try {
    c.validate();
  } catch (const ConfigError& e) {
    f.fail(std::string("describes a model Starling cannot build: ") + e.what());
  }
  return c;
}

std::string model_table(const ModelConfig& c) {
  const bool llama = c.arch == Arch::kLlama;
  std::string t = "[model]\n";
  t += "arch = \"" + to_string(c.arch) + "\"\n";
  t += "vocab_size = " + std::to_string(c.vocab_size) + "\n";
  t += "seq_len = " + std::to_string(c.seq_len) + "\n";
  t += "n_layer = " + std::to_string(c.n_layer) + "\n";
  t += "n_head = " + std::to_string(c.n_head) + "\n";
  if (llama) t += "n_kv_head = " + std::to_string(c.kv_heads()) + "\n";
  t += "d_model = " + std::to_string(c.d_model) + "\n";
  t += "d_ff = " + std::to_string(c.ff_dim()) + "\n";
  t += "norm_eps = " + float_text(c.norm_eps) + "\n";
  if (llama) t += "rope_theta = " + float_text(c.rope_theta) + "\n";
  t += std::string("tie_embeddings = ") + (c.tie_embeddings ? "true" : "false") + "\n";
  return t;
}

std::vector<std::string> hf_model_differences(const ModelConfig& run, const ModelConfig& hf) {
  std::vector<std::string> out;
  const auto differ = [&](const char* key, const std::string& ours, const std::string& theirs) {
    if (ours != theirs)
      out.push_back(std::string("model.") + key + " = " + ours + ", the model's config.json says " +
                    theirs);
  };
  const auto whole = [](int64_t v) { return std::to_string(v); };
  differ("arch", "\"" + to_string(run.arch) + "\"", "\"" + to_string(hf.arch) + "\"");
  if (!out.empty()) return out;  // every other key means something else
  differ("vocab_size", whole(run.vocab_size), whole(hf.vocab_size));
  // A GPT-2 learns its positions: a longer context has none for the last tokens. LLaMA's are
  // rotary, computed at any length.
  if (run.arch == Arch::kGpt2 && run.seq_len > hf.seq_len)
    out.push_back("model.seq_len = " + whole(run.seq_len) + ", longer than the " +
                  whole(hf.seq_len) + " positions the model's config.json has");
  differ("n_layer", whole(run.n_layer), whole(hf.n_layer));
  differ("n_head", whole(run.n_head), whole(hf.n_head));
  if (run.arch == Arch::kLlama) differ("n_kv_head", whole(run.kv_heads()), whole(hf.kv_heads()));
  differ("d_model", whole(run.d_model), whole(hf.d_model));
  differ("d_ff", whole(run.ff_dim()), whole(hf.ff_dim()));
  differ("norm_eps", float_text(run.norm_eps), float_text(hf.norm_eps));
  if (run.arch == Arch::kLlama)
    differ("rope_theta", float_text(run.rope_theta), float_text(hf.rope_theta));
  differ("tie_embeddings", run.tie_embeddings ? "true" : "false",
         hf.tie_embeddings ? "true" : "false");
  return out;
}

}  // namespace starling::model
