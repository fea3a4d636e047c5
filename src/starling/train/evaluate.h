// Validation loss of the current parameters: the mean over train.eval_batches batches of the
// validation shards, read in order (the same batches at every evaluation and on every peer).
#pragma once

#include <c10/core/Device.h>

#include <functional>
#include <optional>

#include "starling/data/dataset.h"
#include "starling/data/loader.h"
#include "starling/graph/executor.h"
#include "starling/train/config.h"

namespace starling::train {

class StepRunner;

// Each batch's loss comes from runner.evaluation_loss (the whole model through `executor`, or a
// pipeline's stages together). `stop`, asked before each batch, ends the evaluation early (a
// signal: the run stops, and a long evaluation must not hold it): nullopt then. DataError naming
// the validation split where its shards hold no batch.
std::optional<double> evaluate(StepRunner& runner, graph::Executor& executor,
                               const data::DatasetInfo& dataset, const RunConfig& config,
                               const c10::Device& device, const std::function<bool()>& stop = {});

// The validation split's loader for `config` (its batches in order); DataError naming the split's
// directory where its shards hold no batch. Checked when a run starts, so that a split the run
// cannot evaluate is found before the training, not after it.
data::TokenLoader validation_loader(const data::DatasetInfo& dataset, const RunConfig& config);

}  // namespace starling::train
