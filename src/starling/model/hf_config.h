// The model a Hugging Face `config.json` describes, as Starling's [model] table: what a run
// that starts from that model's weights (train.init_from) must say, and what `starling model
// from-hf` prints. The inverse of hf_export.h's hf_config for the two architectures Starling
// builds (GPT2LMHeadModel, LlamaForCausalLM).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "starling/model/config.h"

namespace starling::model {

// Reads `path` (a config.json, or a model's directory holding one). ConfigError naming the file
// and the field for what Starling's models cannot be: another model_type, an activation other
// than GPT-2's gelu_new or LLaMA's silu, biases in LLaMA's attention or MLP, rope_scaling, a
// head_dim other than the width over the heads, a missing or mistyped size.
ModelConfig model_from_hf_config(const std::filesystem::path& path);

// The [model] keys of `c` as TOML, one per line: a table a config can take as it is.
std::string model_table(const ModelConfig& c);

// What a run's [model] `run` lacks to take the weights of the model `hf` describes, one line per
// key ("model.n_kv_head = 32, the model's config.json says 4"); empty when it takes them. A
// shorter seq_len is fine (a GPT-2 takes the first positions), and so is a longer one for LLaMA
// (its positions are rotary); init_std is not compared (the weights replace the init).
std::vector<std::string> hf_model_differences(const ModelConfig& run, const ModelConfig& hf);

}  // namespace starling::model
