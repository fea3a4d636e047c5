// Text generation from a saved checkpoint (`starling sample`). Torch-free header.
#pragma once

#include <filesystem>
#include <string>

#include "starling/train/config.h"

namespace starling::train {

// Loads the checkpoint (a run directory or a checkpoint directory), its config and tokenizer,
// and returns the prompt followed by the generated text. CheckpointError/DataError on bad input.
std::string sample_from_checkpoint(const std::filesystem::path& checkpoint,
                                   const SampleConfig& options);

}  // namespace starling::train
