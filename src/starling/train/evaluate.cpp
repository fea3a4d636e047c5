#include "starling/train/evaluate.h"

#include <ATen/ATen.h>

#include "starling/data/loader.h"
#include "starling/train/step_runner.h"

namespace starling::train {

double evaluate(StepRunner& runner, graph::Executor& exec, const data::DatasetInfo& ds,
                const RunConfig& c, const c10::Device& device) {
  data::LoaderOptions opts{.seq_len = c.model.seq_len,
                           .batch = c.train.batch_size,
                           .seed = c.train.seed,
                           .rank = 0,
                           .world = 1,
                           .shuffle = false,
                           .vocab_size = c.model.vocab_size};
  data::TokenLoader val(ds.val_shards, opts);
  at::Tensor total = at::zeros({}, at::TensorOptions(at::kDouble).device(device));
  for (int64_t i = 0; i < c.train.eval_batches; ++i)
    total += runner.evaluation_loss(exec, to_device(val.next(), device));
  return total.item<double>() / static_cast<double>(c.train.eval_batches);
}

}  // namespace starling::train
