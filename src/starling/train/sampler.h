// Autoregressive sampling from a model DAG: temperature and top-k over the logits node, the
// context cropped to the model's seq_len.
#pragma once

#include <cstdint>
#include <vector>

#include "starling/graph/dag.h"
#include "starling/model/config.h"
#include "starling/train/config.h"

namespace starling::train {

// Returns `prompt` followed by up to options.max_tokens generated ids. A temperature of 0 picks
// the likeliest token. Deterministic for a given options.seed.
std::vector<uint32_t> generate(graph::OpDag& dag, const model::ModelConfig& config,
                               const std::vector<uint32_t>& prompt, const SampleConfig& options);

}  // namespace starling::train
