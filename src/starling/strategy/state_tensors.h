// Reading a strategy's tensors back from a checkpoint, with errors that name file and tensor.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

#include "starling/common/safetensors.h"

namespace starling::strategy {

// The tensor `name` of `file`; CheckpointError if it is missing or lacks `numel` elements.
const at::Tensor& state_tensor(const SafetensorsFile& file, const std::string& name, int64_t numel);
// dst <- the tensor `name` of `file`; CheckpointError if it is missing or has another size.
void load_state_tensor(const SafetensorsFile& file, const std::string& name, at::Tensor& dst);

}  // namespace starling::strategy
