// Import of GPT-2 weights from a Hugging Face `model.safetensors` (their tensor names, with or
// without the "transformer." prefix; Conv1D weights are stored [in, out] and are transposed into
// Starling's [out, in] layout). F32, F16 and BF16 files are accepted; weights become fp32.
#pragma once

#include <filesystem>

#include "starling/graph/dag.h"
#include "starling/model/config.h"

namespace starling::model {

// Copies the weights into `dag` (built from `config`, which must be arch "gpt2" with tied
// embeddings). A model with a shorter seq_len takes the first seq_len learned positions.
// CheckpointError naming the file and tensor when one is missing, unexpected or mis-shaped.
// Tensors of parameters that `dag` holds elsewhere (a pipeline stage's model) are skipped.
void load_hf_gpt2(const std::filesystem::path& file, graph::OpDag& dag, const ModelConfig& config);

}  // namespace starling::model
