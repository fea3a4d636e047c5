// Validation loss of the current parameters: the mean over train.eval_batches batches of the
// validation shards, read in order (the same batches at every evaluation and on every peer).
#pragma once

#include <c10/core/Device.h>

#include "starling/data/dataset.h"
#include "starling/graph/executor.h"
#include "starling/train/config.h"

namespace starling::train {

double evaluate(graph::Executor& executor, const data::DatasetInfo& dataset,
                const RunConfig& config, const c10::Device& device);

}  // namespace starling::train
