#include "starling/train/checkpoint_model.h"

#include "starling/common/error.h"
#include "starling/model/build.h"

namespace starling::train {

CheckpointModel load_checkpoint_model(const std::filesystem::path& path, c10::Device device) {
  CheckpointModel m{.checkpoint = read_checkpoint(find_checkpoint(path))};
  m.config =
      parse_run_config(m.checkpoint.meta.config_toml, (m.checkpoint.dir / "meta.json").string());
  if (m.config.pipeline.count() > 1)
    throw ConfigError(m.checkpoint.dir.string() +
                      " is a pipeline stage's checkpoint: it holds part of the model");
  m.dag = model::build_model(m.config.model, m.config.train.seed, device);
  load_params(m.checkpoint.model, m.dag->params());
  return m;
}

}  // namespace starling::train
