// A printable summary of a model's OP-DAG (`starling model show`). Torch-free header.
#pragma once

#include <cstdint>
#include <string>

#include "starling/model/config.h"

namespace starling::model {

// Builds the model and lists every node: kind, inputs, output shape, parameter MB, MFLOP/token;
// then totals (parameters, training FLOPs per token).
std::string describe_model(const ModelConfig& config, int64_t batch);

}  // namespace starling::model
