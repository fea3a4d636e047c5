// Import of weights from a Hugging Face `model.safetensors` (or a sharded model's files): GPT-2
// (GPT2LMHeadModel or GPT2Model names, with or without the "transformer." prefix) and LLaMA
// (LlamaForCausalLM names). hf_layout.h says where each HF tensor goes. F32, F16 and BF16 files are
// accepted; weights become fp32.
#pragma once

#include <filesystem>

#include "starling/graph/dag.h"
#include "starling/model/config.h"

namespace starling::model {

// Copies the weights into `dag` (built from `config`; its arch, sizes and tie_embeddings must
// match the file's model). `path` is a model.safetensors, or a model's directory as Hugging Face
// saves it: its model.safetensors, or the shards named by its model.safetensors.index.json (each
// read in turn, mapped, so a sharded model takes no more memory than one file). A GPT-2 with a
// shorter seq_len takes the first seq_len learned positions. CheckpointError naming the file and
// tensor when one is missing, unexpected or mis-shaped, or in two shards. Tensors of parameters
// that `dag` holds elsewhere (a pipeline stage's model) are skipped.
void load_hf(const std::filesystem::path& path, graph::OpDag& dag, const ModelConfig& config);

}  // namespace starling::model
