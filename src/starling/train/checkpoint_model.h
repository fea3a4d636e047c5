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

// Reads the checkpoint (a run directory or a checkpoint directory; for a local swarm's output
// directory, that of the lowest-numbered peer with a checkpoint, named on stderr), builds its
// model on `device` and loads the weights. ConfigError for a pipeline stage's checkpoint (part of
// a model); CheckpointError for a bad checkpoint.
CheckpointModel load_checkpoint_model(const std::filesystem::path& path,
                                      c10::Device device = c10::Device(c10::kCPU));

}  // namespace starling::train
