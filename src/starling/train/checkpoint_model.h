// A checkpoint's whole model, ready to run: what `sample`, `eval` and `export` start from.
#pragma once

#include <c10/core/Device.h>

#include <filesystem>
#include <memory>

#include "starling/graph/dag.h"
#include "starling/train/checkpoint.h"
#include "starling/train/config.h"

namespace starling::train {

struct CheckpointModel {
  Checkpoint checkpoint;
  RunConfig config;  // the run's, as stored in meta.json
  std::unique_ptr<graph::OpDag> dag;
};

// The run's config as `ckpt`'s meta.json stores it. ConfigError or CheckpointError naming the
// meta.json when the text does not parse, or when the tokenizer it records has more tokens than
// the model's vocabulary.
RunConfig saved_run_config(const Checkpoint& ckpt);

// After load_params from `ckpt`: CheckpointError naming the first tensor of `params` that holds
// a value that is not finite (the run had diverged before it saved them), with the step.
void check_finite_weights(const graph::ParamStore& params, const Checkpoint& ckpt);

// Reads the checkpoint `path` means, as load_checkpoint_model finds it, without building its
// model. CheckpointError when there is none.
Checkpoint read_model_checkpoint(const std::filesystem::path& path);

// Reads the checkpoint (a run directory or a checkpoint directory; for a local swarm's output
// directory, that of the lowest-numbered peer with a checkpoint, named on stderr), builds its
// model on `device` and loads the weights. CheckpointError for weights that are not finite (a
// run that diverged before it saved them: an earlier checkpoint may be whole). ConfigError for a
// pipeline stage's checkpoint (part of a model); CheckpointError for a bad checkpoint.
CheckpointModel load_checkpoint_model(const std::filesystem::path& path,
                                      c10::Device device = c10::Device(c10::kCPU));

}  // namespace starling::train
