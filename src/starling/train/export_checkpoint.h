// `starling export`: a checkpoint's model in another framework's format. Torch-free header.
#pragma once

#include <filesystem>
#include <string>

namespace starling::train {

// Writes the model of `checkpoint` (a run directory or a checkpoint directory) into `out` in
// `format` ("hf": Hugging Face's model.safetensors + config.json, and the SentencePiece model as
// tokenizer.model when the run used one). Returns a line saying what was written.
// CheckpointError/ConfigError on bad input.
std::string export_checkpoint(const std::filesystem::path& checkpoint,
                              const std::filesystem::path& out, const std::string& format);

}  // namespace starling::train
