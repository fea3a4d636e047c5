// Text generation from a saved checkpoint (`starling sample`). Torch-free header.
#pragma once

#include <filesystem>
#include <string>

#include "starling/train/config.h"

namespace starling::train {

// How long the generation itself took (the checkpoint's loading left out).
struct SampleTiming {
  int64_t tokens = 0;  // generated, the prompt not counted
  double seconds = 0;
};

// Loads the checkpoint (a run directory or a checkpoint directory), its config and tokenizer,
// and returns the prompt followed by the generated text; fills `timing` when given.
// CheckpointError/DataError on bad input.
std::string sample_from_checkpoint(const std::filesystem::path& checkpoint,
                                   const SampleConfig& options, SampleTiming* timing = nullptr);

}  // namespace starling::train
