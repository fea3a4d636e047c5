#include "starling/strategy/state_tensors.h"

#include <ATen/ATen.h>

#include "starling/common/error.h"

namespace starling::strategy {

const at::Tensor& state_tensor(const SafetensorsFile& file, const std::string& name,
                               int64_t numel) {
  if (!file.contains(name))
    throw CheckpointError(file.file.string() + ": missing tensor \"" + name +
                          "\" (was the run trained with another strategy?)");
  const at::Tensor& t = file.at(name);
  if (t.numel() != numel)
    throw CheckpointError(file.file.string() + ": tensor \"" + name + "\" has " +
                          std::to_string(t.numel()) + " elements, expected " +
                          std::to_string(numel));
  return t;
}

void load_state_tensor(const SafetensorsFile& file, const std::string& name, at::Tensor& dst) {
  dst.copy_(state_tensor(file, name, dst.numel()).reshape(dst.sizes()));
}

}  // namespace starling::strategy
