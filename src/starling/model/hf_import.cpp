#include "starling/model/hf_import.h"

#include <ATen/ATen.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "starling/common/error.h"
#include "starling/common/safetensors.h"
#include "starling/model/hf_layout.h"

namespace starling::model {

namespace {

namespace fs = std::filesystem;

// The safetensors files of a Hugging Face model at `path`: the file itself; for a directory (a
// model as `save_pretrained` writes it), its model.safetensors, or else the shards that its
// model.safetensors.index.json maps the tensors to, each once, in name order.
std::vector<fs::path> hf_files(const fs::path& path) {
  // The index of a sharded model names its directory's weights; another JSON file (config.json)
  // is no weights at all, though safetensors would read its text as a header's length.
  if (!fs::is_directory(path) && path.filename() == "model.safetensors.index.json")
    return hf_files(path.parent_path().empty() ? fs::path(".") : path.parent_path());
  if (!fs::is_directory(path) && path.extension() == ".json")
    throw CheckpointError(path.string() +
                          ": a JSON file, not a model's weights (its config.json?): name the "
                          "model's directory, or its model.safetensors");
  if (!fs::is_directory(path)) return {path};
  if (fs::exists(path / "model.safetensors")) return {path / "model.safetensors"};
  const fs::path index = path / "model.safetensors.index.json";
  if (!fs::exists(index))
    throw CheckpointError(path.string() +
                          ": a directory without model.safetensors or "
                          "model.safetensors.index.json (the files of a Hugging Face model's "
                          "weights)");
  std::ifstream in(index);
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(index.string() + ": not valid JSON: " + e.what());
  }
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw CheckpointError(index.string() + ": expected an object with a \"weight_map\" object");
  std::set<std::string> shards;
  for (const auto& [tensor, file] : j["weight_map"].items()) {
    if (!file.is_string())
      throw CheckpointError(index.string() + ": weight_map[\"" + tensor + "\"] is not a string");
    const std::string name = file.get<std::string>();
    // A shard lies beside the index: a path elsewhere is a damaged or hostile index.
    if (name.empty() || name.find('/') != std::string::npos || name == "." || name == "..")
      throw CheckpointError(index.string() + ": weight_map[\"" + tensor + "\"] = \"" + name +
                            "\" is not a file name in " + path.string());
    shards.insert(name);
  }
  if (shards.empty()) throw CheckpointError(index.string() + ": weight_map names no file");
  std::vector<fs::path> files;
  for (const auto& name : shards) files.push_back(path / name);
  return files;
}

// Copies HF tensor `raw` of `where` into its place in `dag`, recording it in `filled`.
void load_tensor(const std::string& raw, const at::Tensor& tensor, const std::string& where,
                 const ModelConfig& c, const std::map<std::string, HfTensor>& layout,
                 std::map<std::string, std::filesystem::path>& filled, graph::OpDag& dag) {
  const std::string arch = to_string(c.arch);
  const std::string name = hf_canonical_name(c, raw);
  if (hf_ignorable(c, name)) return;
  const auto it = layout.find(name);
  if (it == layout.end())
    throw CheckpointError(where + ": tensor \"" + raw + "\" is not part of a " +
                          std::to_string(c.n_layer) + "-layer " + arch + " model" +
                          (name == "lm_head.weight"
                               ? " with tied embeddings (set model.tie_embeddings = false)"
                               : " (model.arch or model.n_layer wrong?)"));
  const HfTensor& m = it->second;
  if (!tensor.is_floating_point())
    throw CheckpointError(where + ": tensor \"" + raw + "\" is not floating point");
  if (const auto seen = filled.find(name); seen != filled.end())
    throw CheckpointError(where + ": tensor \"" + raw + "\" is also in " + seen->second.string());
  filled.emplace(name, where);
  if (dag.params().held_elsewhere(m.ours)) return;  // another peer's part of the model
  at::Tensor value = tensor.to(at::kFloat);
  if (m.transpose) {
    if (value.dim() != 2)
      throw CheckpointError(where + ": tensor \"" + raw + "\" should be 2-D, has shape " +
                            c10::str(value.sizes()));
    value = value.t();
  }
  at::Tensor target = dag.params().get(m.ours).value;
  if (m.rows >= 0) target = target.narrow(0, m.begin, m.rows);
  if (m.ours == "embed.pos.weight" && value.dim() == 2 && value.size(0) > target.size(0) &&
      value.size(1) == target.size(1))
    value = value.narrow(0, 0, target.size(0));  // shorter context: first seq_len positions
  if (value.sizes() != target.sizes())
    throw CheckpointError(where + ": tensor \"" + raw + "\" has shape " + c10::str(tensor.sizes()) +
                          ", which does not fit Starling's \"" + m.ours + "\"" +
                          (m.rows >= 0 ? " rows " + std::to_string(m.begin) + ".." +
                                             std::to_string(m.begin + m.rows - 1)
                                       : std::string()) +
                          " " + c10::str(target.sizes()) +
                          " (check model.d_model, model.n_head, model.n_kv_head, model.d_ff, "
                          "model.vocab_size, model.seq_len)");
  target.copy_(value);
}

}  // namespace

void load_hf(const std::filesystem::path& path, graph::OpDag& dag, const ModelConfig& c) {
  std::map<std::string, HfTensor> layout;
  for (const HfTensor& t : hf_layout(c)) layout[t.hf] = t;
  std::map<std::string, fs::path> filled;  // HF name -> the file it came from
  at::NoGradGuard no_grad;
  // One file at a time, mapped: a model of several shards never has two in memory.
  for (const fs::path& file : hf_files(path)) {
    const std::string where = file.string();
    const SafetensorsFile st = read_safetensors(file, SafetensorsRead::kMap);
    for (const auto& [raw, tensor] : st.tensors)
      load_tensor(raw, tensor, where, c, layout, filled, dag);
  }
  for (const auto& [hf, m] : layout)
    if (!filled.count(hf))
      throw CheckpointError(path.string() + ": missing tensor \"" + hf +
                            "\" (model.n_layer too large?)");
}

}  // namespace starling::model
