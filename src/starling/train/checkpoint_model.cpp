#include "starling/train/checkpoint_model.h"

#include <ATen/ATen.h>

#include <iostream>

#include "starling/common/error.h"
#include "starling/model/build.h"

namespace starling::train {

namespace {

namespace fs = std::filesystem;

// find_checkpoint(), and for the output directory of a local swarm (`train --peers N`: a
// directory per peer, peer-0 to peer-N-1, and none of its own) the newest checkpoint of the
// lowest-numbered peer that wrote one, named on stderr.
fs::path find_model_checkpoint(const fs::path& path) {
  try {
    return find_checkpoint(path);
  } catch (const CheckpointError&) {
    for (int i = 0; i < 1024; ++i) {
      const fs::path peer = path / ("peer-" + std::to_string(i));
      if (!fs::is_directory(peer)) break;
      // A peer that wrote none (it failed or left early) is passed over; a broken one is not.
      if (!holds_checkpoint(peer) && !fs::exists(peer / "latest") &&
          !fs::exists(peer / "meta.json"))
        continue;
      const fs::path found = find_checkpoint(peer);
      std::cerr << path.string() << " holds a swarm's run, a directory per peer: reading "
                << found.string() << " (peer " << i << "'s newest; another peer's is in "
                << path.string() << "/peer-N)\n";
      return found;
    }
    throw;
  }
}

}  // namespace

RunConfig saved_run_config(const Checkpoint& ckpt) {
  const std::string where = (ckpt.dir / "meta.json").string();
  RunConfig config = parse_saved_config(ckpt.meta.config_toml, where);
  if (ckpt.meta.data_vocab_size > static_cast<uint64_t>(config.model.vocab_size))
    throw CheckpointError(where + ": its tokenizer has " +
                          std::to_string(ckpt.meta.data_vocab_size) +
                          " tokens, more than its model's vocabulary (model.vocab_size = " +
                          std::to_string(config.model.vocab_size) + ")");
  return config;
}

void check_finite_weights(const graph::ParamStore& params, const Checkpoint& ckpt) {
  for (const auto& p : params.params())
    if (!p.value.isfinite().all().item<bool>())
      throw CheckpointError(ckpt.model.file.string() + ": tensor \"" + p.name +
                            "\" holds values that are not finite (NaN or infinity): the run had "
                            "diverged by step " +
                            std::to_string(ckpt.meta.step) +
                            "; an earlier checkpoint, if one is kept, may be whole");
}

Checkpoint read_model_checkpoint(const std::filesystem::path& path) {
  return read_checkpoint(find_model_checkpoint(path));
}

CheckpointModel load_checkpoint_model(const std::filesystem::path& path, c10::Device device) {
  CheckpointModel m{.checkpoint = read_model_checkpoint(path)};
  m.config = saved_run_config(m.checkpoint);
  if (m.config.pipeline.count() > 1)
    throw ConfigError(m.checkpoint.dir.string() +
                      " is a pipeline stage's checkpoint: it holds part of the model");
  m.dag = model::build_model(m.config.model, m.config.train.seed, device);
  load_params(m.checkpoint.model, m.dag->params());
  // Evaluating or exporting NaN weights would report "loss nan" and succeed.
  check_finite_weights(m.dag->params(), m.checkpoint);
  return m;
}

}  // namespace starling::train
