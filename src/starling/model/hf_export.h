// Export of a model to Hugging Face's format: `model.safetensors` in the official names and
// layouts (hf_layout.h) and a `config.json` that transformers reads as GPT2LMHeadModel or
// LlamaForCausalLM. fp32, like our weights and checkpoints.
#pragma once

#include <filesystem>
#include <nlohmann/json.hpp>

#include "starling/graph/param_store.h"
#include "starling/model/config.h"

namespace starling::model {

// The transformers config of a model of `config`.
nlohmann::json hf_config(const ModelConfig& config);

// Writes `params` (every parameter of a model of `config`) into `dir` (created) as
// model.safetensors and config.json. ConfigError when `params` is part of a model (a pipeline
// stage's); each file is written under a temporary name and renamed, so a failure leaves no
// half-written file.
void export_hf(const graph::ParamStore& params, const ModelConfig& config,
               const std::filesystem::path& dir);

}  // namespace starling::model
