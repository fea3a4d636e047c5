#include "starling/train/export_checkpoint.h"

#include "starling/common/error.h"
#include "starling/model/hf_export.h"
#include "starling/train/checkpoint_dir.h"
#include "starling/train/checkpoint_model.h"

namespace starling::train {
namespace fs = std::filesystem;

std::string export_checkpoint(const fs::path& path, const fs::path& out,
                              const std::string& format) {
  if (format != "hf")
    throw ConfigError("--format: \"" + format + "\" is not an export format; use \"hf\"");
  // The export writes model.safetensors and config.json: into a checkpoint or a run it would
  // destroy what it reads, or what a --resume needs.
  if (fs::exists(out) && !fs::is_directory(out))
    throw ConfigError("--out " + out.string() + ": is a file, not a directory");
  const bool run = holds_checkpoint(out);
  if (run || fs::exists(out / "meta.json"))
    throw ConfigError(
        "--out " + out.string() + ": holds " +
        (run ? "a run's checkpoints" : "a Starling checkpoint or dataset (meta.json)") +
        ", which the export would write into; export to a directory of its own");
  const CheckpointModel m = load_checkpoint_model(path);
  const Checkpoint& ckpt = m.checkpoint;
  const RunConfig& config = m.config;
  if (ckpt.meta.tokenizer_kind == "sentencepiece" && !fs::exists(ckpt.dir / "tokenizer.model"))
    throw CheckpointError((ckpt.dir / "tokenizer.model").string() +
                          ": missing (the checkpoint's tokens are SentencePiece pieces, and the "
                          "export carries their model)");
  model::export_hf(m.dag->params(), config.model, out);
  std::string tokenizer =
      "no tokenizer files (" + ckpt.meta.tokenizer_kind + " tokens: the ids are the bytes)";
  if (ckpt.meta.tokenizer_kind == "sentencepiece") {
    fs::copy_file(ckpt.dir / "tokenizer.model", out / "tokenizer.model",
                  fs::copy_options::overwrite_existing);
    tokenizer = "tokenizer.model (SentencePiece)";
  } else if (ckpt.meta.tokenizer_kind != "byte") {
    tokenizer = "no tokenizer files (" + ckpt.meta.tokenizer_kind + " tokens)";
  }
  return "exported " + ckpt.dir.string() + " (" + model::to_string(config.model.arch) + ", " +
         std::to_string(config.model.num_params()) + " parameters) to " + out.string() +
         ": model.safetensors, config.json, " + tokenizer;
}

}  // namespace starling::train
