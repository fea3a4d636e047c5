// `starling eval`: the loss and perplexity of a checkpoint's model on a split of a dataset.
// Torch-free header.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace starling::train {

struct EvalOptions {
  std::string data;            // dataset directory; "" = the run's data.dir
  std::string split = "val";   // "val" or "train"
  int64_t batches = 0;         // 0 = every complete batch of the split
  int64_t batch_size = 0;      // sequences per batch; 0 = the run's train.batch_size
  std::string device = "cpu";  // "cpu" or "cuda"
  bool progress = true;        // a progress line on stderr
};

struct EvalResult {
  std::filesystem::path checkpoint;
  int64_t step = 0;
  std::filesystem::path data;
  std::string split;
  int64_t batches = 0, tokens = 0;
  double loss = 0, perplexity = 0, seconds = 0;
};

// Reads the checkpoint (a run directory or a checkpoint directory), runs its model forward over
// the split's windows in file order (the same batches every time) and returns the mean loss.
// DataError when the dataset's tokens are not the ones the model was trained on; ConfigError for
// bad options; CheckpointError for a bad checkpoint.
EvalResult eval_checkpoint(const std::filesystem::path& checkpoint, const EvalOptions& options);

// {"checkpoint", "step", "data", "split", "batches", "tokens", "loss", "perplexity", "seconds"}.
std::string eval_json(const EvalResult& result);

}  // namespace starling::train
