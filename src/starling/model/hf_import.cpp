#include "starling/model/hf_import.h"

#include <ATen/ATen.h>

#include <map>
#include <set>

#include "starling/common/error.h"
#include "starling/common/safetensors.h"
#include "starling/model/hf_layout.h"

namespace starling::model {

void load_hf(const std::filesystem::path& file, graph::OpDag& dag, const ModelConfig& c) {
  const std::string where = file.string();
  const SafetensorsFile st = read_safetensors(file);
  std::map<std::string, HfTensor> layout;
  for (const HfTensor& t : hf_layout(c)) layout[t.hf] = t;
  const std::string arch = to_string(c.arch);
  std::set<std::string> filled;
  at::NoGradGuard no_grad;
  for (const auto& [raw, tensor] : st.tensors) {
    const std::string name = hf_canonical_name(c, raw);
    if (hf_ignorable(c, name)) continue;
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
    filled.insert(name);
    if (dag.params().held_elsewhere(m.ours)) continue;  // another peer's part of the model
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
      throw CheckpointError(
          where + ": tensor \"" + raw + "\" has shape " + c10::str(tensor.sizes()) +
          ", which does not fit Starling's \"" + m.ours + "\"" +
          (m.rows >= 0
               ? " rows " + std::to_string(m.begin) + ".." + std::to_string(m.begin + m.rows - 1)
               : std::string()) +
          " " + c10::str(target.sizes()) +
          " (check model.d_model, model.n_head, model.n_kv_head, model.d_ff, "
          "model.vocab_size, model.seq_len)");
    target.copy_(value);
  }
  for (const auto& [hf, m] : layout)
    if (!filled.count(hf))
      throw CheckpointError(where + ": missing tensor \"" + hf + "\" (model.n_layer too large?)");
}

}  // namespace starling::model
