// Validation loss of the current parameters: the mean over train.eval_batches batches of the
// validation shards, read in order (the same batches at every evaluation and on every peer).
#pragma once

#include <c10/core/Device.h>

#include "starling/data/dataset.h"
#include "starling/graph/executor.h"
#include "starling/train/config.h"

namespace starling::train {

class StepRunner;

// Each batch's loss comes from runner.evaluation_loss (the whole model through `executor`, or a
// pipeline's stages together).
double evaluate(StepRunner& runner, graph::Executor& executor, const data::DatasetInfo& dataset,
                const RunConfig& config, const c10::Device& device);

}  // namespace starling::train
