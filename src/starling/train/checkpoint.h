// Checkpoints: weights and optimizer state in safetensors plus meta.json (step, data position,
// RNG state, the full config), written so a crash at any moment leaves the previous checkpoint
// loadable:
//   <run>/checkpoints/step_00000100/{model.safetensors, optimizer.safetensors, meta.json,
//                                    tokenizer.model (sentencepiece only)}
//   <run>/checkpoints/latest   (text: the name of the newest complete checkpoint)
// A checkpoint is assembled in a hidden temporary directory, every file and the directory are
// fsynced, the directory is renamed into place, and only then is `latest` replaced (atomically).
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "starling/common/safetensors.h"
#include "starling/data/loader.h"
#include "starling/graph/param_store.h"
#include "starling/train/adamw.h"
#include "starling/train/checkpoint_dir.h"

namespace starling::train {

struct CheckpointMeta {
  int64_t step = 0;     // optimizer steps completed
  uint64_t tokens = 0;  // training tokens consumed
  data::LoaderState loader;
  std::string config_toml;  // the complete run config (to_toml)
  std::string tokenizer_kind;
  uint32_t data_vocab_size = 0;
  double val_loss = -1;  // last validation loss, -1 if none yet
  // State of the strategy that trained the run (round, flags), null for a single replica. Its
  // tensors live in optimizer.safetensors under the "strategy." prefix.
  nlohmann::json strategy;
};

struct SaveOptions {
  int keep = 2;  // newest checkpoints kept; older ones are deleted after a successful save
  std::filesystem::path tokenizer_model;  // copied into the checkpoint when not empty
  // Called after each stage ("model", "optimizer", "meta", "renamed", "committed"): progress
  // reporting, and crash tests that kill the process between stages.
  std::function<void(const std::string& stage)> on_stage;
  // Told what a save did besides writing: older checkpoints removed early to make room when the
  // disk could not hold one more (the newest complete one is never removed).
  std::function<void(const std::string& note)> on_note;
  // Written beside the optimizer state in optimizer.safetensors (names start with "strategy.").
  std::vector<std::pair<std::string, at::Tensor>> strategy_tensors;
  // Reads each weight and optimizer tensor just before it is written (write_safetensors): a step
  // runner that keeps the state in a slower tier lends one tensor at a time (StepRunner::
  // read_state), so a checkpoint never needs the whole state in memory.
  TensorReader read_state;
};

// Saves into <run_dir>/checkpoints and returns the new checkpoint directory. Checks the free
// space first, removing older checkpoints (never the newest) if that makes room; CheckpointError
// naming the directory, the bytes the checkpoint needs and those free when the disk cannot hold
// it, or when a write fails (a disk that fills meanwhile): what the save wrote is removed, and the
// previous checkpoints and `latest` are as they were.
std::filesystem::path save_checkpoint(const std::filesystem::path& run_dir,
                                      const graph::ParamStore& params, const AdamW& optimizer,
                                      const CheckpointMeta& meta, const SaveOptions& options);

struct Checkpoint {
  std::filesystem::path dir;
  CheckpointMeta meta;
  SafetensorsFile model;
  SafetensorsFile optimizer;
};

// Reads and validates meta.json and both tensor files. CheckpointError names the file and field.
// The tensors are mapped from the files (SafetensorsRead::kMap): they occupy the page cache, not
// the process's memory, until they are copied or written to.
Checkpoint read_checkpoint(const std::filesystem::path& dir);

// Copies checkpoint weights into the model. CheckpointError naming the tensor on a missing or
// unexpected name or a shape that does not match the model. A store that holds part of the model
// takes its own tensors and skips the ones held elsewhere (a whole model's checkpoint loads into a
// pipeline stage).
void load_params(const SafetensorsFile& weights, graph::ParamStore& params);

// The RNG state tensor stored in optimizer.safetensors ("rng.cpu").
inline constexpr const char* kRngTensor = "rng.cpu";

}  // namespace starling::train
