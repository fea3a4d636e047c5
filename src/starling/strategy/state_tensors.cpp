#include "starling/strategy/state_tensors.h"

#include <ATen/ATen.h>

#include "starling/common/error.h"

namespace starling::strategy {

void load_state_tensor(const SafetensorsFile& file, const std::string& name, at::Tensor& dst) {
  if (!file.contains(name))
    throw CheckpointError(file.file.string() + ": missing tensor \"" + name +
                          "\" (was the run trained with another strategy?)");
  const at::Tensor& t = file.at(name);
  if (t.numel() != dst.numel())
    throw CheckpointError(file.file.string() + ": tensor \"" + name + "\" has " +
                          std::to_string(t.numel()) + " elements, expected " +
                          std::to_string(dst.numel()));
  dst.copy_(t.reshape(dst.sizes()));
}

}  // namespace starling::strategy
