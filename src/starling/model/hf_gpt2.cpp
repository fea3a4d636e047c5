#include "starling/model/hf_gpt2.h"

#include <ATen/ATen.h>

#include <map>
#include <set>

#include "starling/common/error.h"
#include "starling/common/safetensors.h"

namespace starling::model {
namespace {

struct Mapping {
  std::string ours;
  bool transpose;  // Conv1D [in, out] -> Linear [out, in]
};

// Hugging Face GPT-2 name (prefix stripped) -> Starling parameter.
std::map<std::string, Mapping> name_map(const ModelConfig& c) {
  std::map<std::string, Mapping> m{{"wte.weight", {"embed.tok.weight", false}},
                                   {"wpe.weight", {"embed.pos.weight", false}},
                                   {"ln_f.weight", {"final_norm.weight", false}},
                                   {"ln_f.bias", {"final_norm.bias", false}}};
  for (int64_t i = 0; i < c.n_layer; ++i) {
    const std::string h = "h." + std::to_string(i) + ".", l = "layers." + std::to_string(i) + ".";
    m[h + "ln_1.weight"] = {l + "attn.norm.weight", false};
    m[h + "ln_1.bias"] = {l + "attn.norm.bias", false};
    m[h + "attn.c_attn.weight"] = {l + "attn.qkv.weight", true};
    m[h + "attn.c_attn.bias"] = {l + "attn.qkv.bias", false};
    m[h + "attn.c_proj.weight"] = {l + "attn.proj.weight", true};
    m[h + "attn.c_proj.bias"] = {l + "attn.proj.bias", false};
    m[h + "ln_2.weight"] = {l + "mlp.norm.weight", false};
    m[h + "ln_2.bias"] = {l + "mlp.norm.bias", false};
    m[h + "mlp.c_fc.weight"] = {l + "mlp.fc.weight", true};
    m[h + "mlp.c_fc.bias"] = {l + "mlp.fc.bias", false};
    m[h + "mlp.c_proj.weight"] = {l + "mlp.proj.weight", true};
    m[h + "mlp.c_proj.bias"] = {l + "mlp.proj.bias", false};
  }
  return m;
}

// Buffers and duplicates some exports carry that are not parameters.
bool ignorable(const std::string& name) {
  auto ends_with = [&](const std::string& s) {
    return name.size() >= s.size() && name.compare(name.size() - s.size(), s.size(), s) == 0;
  };
  return ends_with(".attn.bias") || ends_with(".attn.masked_bias") || name == "lm_head.weight";
}

}  // namespace

void load_hf_gpt2(const std::filesystem::path& file, graph::OpDag& dag, const ModelConfig& c) {
  const std::string where = file.string();
  if (c.arch != Arch::kGpt2 || !c.tie_embeddings)
    throw ConfigError(
        "train.init_from: Hugging Face GPT-2 weights need model.arch = \"gpt2\" and "
        "model.tie_embeddings = true");
  const SafetensorsFile st = read_safetensors(file);
  const auto map = name_map(c);
  std::set<std::string> filled;
  at::NoGradGuard no_grad;
  for (const auto& [raw, tensor] : st.tensors) {
    std::string name = raw.rfind("transformer.", 0) == 0 ? raw.substr(12) : raw;
    if (ignorable(name)) continue;
    auto it = map.find(name);
    if (it == map.end())
      throw CheckpointError(where + ": tensor \"" + raw + "\" is not part of a " +
                            std::to_string(c.n_layer) + "-layer GPT-2 (model.n_layer too small?)");
    if (!tensor.is_floating_point())
      throw CheckpointError(where + ": tensor \"" + raw + "\" is not floating point");
    if (dag.params().held_elsewhere(it->second.ours)) {  // another peer's part of the model
      filled.insert(it->second.ours);
      continue;
    }
    at::Tensor value = tensor.to(at::kFloat);
    if (it->second.transpose) {
      if (value.dim() != 2)
        throw CheckpointError(where + ": tensor \"" + raw + "\" should be 2-D, has shape " +
                              c10::str(value.sizes()));
      value = value.t();
    }
    at::Tensor& target = dag.params().get(it->second.ours).value;
    if (it->second.ours == "embed.pos.weight" && value.dim() == 2 &&
        value.size(0) > target.size(0) && value.size(1) == target.size(1))
      value = value.narrow(0, 0, target.size(0));  // shorter context: first seq_len positions
    if (value.sizes() != target.sizes())
      throw CheckpointError(where + ": tensor \"" + raw + "\" has shape " +
                            c10::str(tensor.sizes()) + ", which does not fit Starling's \"" +
                            it->second.ours + "\" " + c10::str(target.sizes()) +
                            " (check model.d_model, model.vocab_size, model.seq_len)");
    target.copy_(value);
    filled.insert(it->second.ours);
  }
  for (const auto& [hf, m] : map)
    if (!filled.count(m.ours))
      throw CheckpointError(where + ": missing tensor \"" + hf + "\" (model.n_layer too large?)");
}

}  // namespace starling::model
