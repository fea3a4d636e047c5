#include "starling/train/eval_checkpoint.h"

#include <ATen/ATen.h>

#include <cmath>
#include <iostream>
#include <nlohmann/json.hpp>

#include "starling/common/error.h"
#include "starling/data/dataset.h"
#include "starling/data/loader.h"
#include "starling/graph/executor.h"
#include "starling/train/checkpoint_model.h"
#include "starling/train/metrics.h"
#include "starling/train/step_runner.h"

namespace starling::train {
namespace fs = std::filesystem;

EvalResult eval_checkpoint(const fs::path& path, const EvalOptions& o) {
  if (o.split != "val" && o.split != "train")
    throw ConfigError("--split: \"" + o.split + "\" is not a split; use \"val\" or \"train\"");
  if (o.batches < 0) throw ConfigError("--batches: must be >= 0 (0 = the whole split)");
  if (o.batch_size < 0) throw ConfigError("--batch-size: must be >= 0 (0 = the run's)");
  const c10::Device device(o.device);
  const CheckpointModel m = load_checkpoint_model(path, device);
  const Checkpoint& ckpt = m.checkpoint;
  const RunConfig& config = m.config;
  const fs::path data_dir = o.data.empty() ? fs::path(config.data.dir) : fs::path(o.data);
  if (o.data.empty() && !fs::exists(data_dir))
    throw DataError("the run's data.dir " + data_dir.string() +
                    " is not here (a relative path counts from where the run trained); pass "
                    "--data DIR");
  const data::DatasetInfo ds = data::open_dataset(data_dir);
  if (ds.tokenizer_kind != ckpt.meta.tokenizer_kind)
    throw DataError(data_dir.string() + " holds " + ds.tokenizer_kind +
                    " tokens, but the model of " + ckpt.dir.string() + " was trained on " +
                    ckpt.meta.tokenizer_kind + " tokens");
  const auto& shards = o.split == "val" ? ds.val_shards : ds.train_shards;
  if (shards.empty()) throw DataError(data_dir.string() + " has no " + o.split + " shards");

  const int64_t batch = o.batch_size > 0 ? o.batch_size : config.train.batch_size;
  data::TokenLoader loader(shards, {.seq_len = config.model.seq_len,
                                    .batch = batch,
                                    .seed = config.train.seed,
                                    .shuffle = false,
                                    .vocab_size = config.model.vocab_size});
  const auto complete = static_cast<int64_t>(loader.windows_per_epoch()) / batch;
  if (complete == 0)
    throw DataError("the " + o.split + " split of " + data_dir.string() + " holds " +
                    std::to_string(loader.windows_per_epoch()) + " windows of " +
                    std::to_string(config.model.seq_len) + " tokens, fewer than one batch of " +
                    std::to_string(batch) + "; pass a smaller --batch-size");
  const int64_t batches = o.batches > 0 ? std::min(o.batches, complete) : complete;

  EvalResult r{.checkpoint = ckpt.dir,
               .step = ckpt.meta.step,
               .data = data_dir,
               .split = o.split,
               .batches = batches};
  at::NoGradGuard no_grad;
  graph::Executor exec(*m.dag);
  at::Tensor total = at::zeros({}, at::TensorOptions(at::kDouble).device(device));
  const double t0 = now_s();
  for (int64_t b = 0; b < batches; ++b) {
    total += exec.forward(to_device(loader.next(), device)).to(at::kDouble);
    if (o.progress && (b + 1 == batches || (b + 1) % 10 == 0)) {
      const double so_far = total.item<double>() / static_cast<double>(b + 1);
      std::cerr << "\reval: " << (b + 1) << "/" << batches << " batches, loss "
                << fmt("%.4f", so_far) << std::flush;
    }
  }
  if (o.progress) std::cerr << "\n";
  r.seconds = now_s() - t0;
  r.tokens = batches * batch * config.model.seq_len;
  r.loss = total.item<double>() / static_cast<double>(batches);
  r.perplexity = std::exp(r.loss);
  return r;
}

std::string eval_json(const EvalResult& r) {
  return nlohmann::json{{"checkpoint", r.checkpoint.string()},
                        {"step", r.step},
                        {"data", r.data.string()},
                        {"split", r.split},
                        {"batches", r.batches},
                        {"tokens", r.tokens},
                        {"loss", r.loss},
                        {"perplexity", r.perplexity},
                        {"seconds", r.seconds}}
      .dump();
}

}  // namespace starling::train
