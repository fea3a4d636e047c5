#include "starling/train/evaluate.h"

#include <ATen/ATen.h>

#include "starling/common/error.h"
#include "starling/data/loader.h"
#include "starling/train/step_runner.h"

namespace starling::train {

data::TokenLoader validation_loader(const data::DatasetInfo& ds, const RunConfig& c) {
  try {
    return data::TokenLoader(ds.val_shards, {.seq_len = c.model.seq_len,
                                             .batch = c.train.batch_size,
                                             .seed = c.train.seed,
                                             .rank = 0,
                                             .world = 1,
                                             .shuffle = false,
                                             .vocab_size = c.model.vocab_size});
  } catch (const DataError& e) {
    throw DataError("the validation split of " + ds.dir.string() + " (" +
                    std::to_string(ds.val_shards.size()) + " shard(s)): " + e.what());
  }
}

std::optional<double> evaluate(StepRunner& runner, graph::Executor& exec,
                               const data::DatasetInfo& ds, const RunConfig& c,
                               const c10::Device& device, const std::function<bool()>& stop) {
  data::TokenLoader val = validation_loader(ds, c);
  at::Tensor total = at::zeros({}, at::TensorOptions(at::kDouble).device(device));
  for (int64_t i = 0; i < c.train.eval_batches; ++i) {
    if (stop && stop()) return std::nullopt;
    total += runner.evaluation_loss(exec, to_device(val.next(), device));
  }
  return total.item<double>() / static_cast<double>(c.train.eval_batches);
}

}  // namespace starling::train
