#include "starling/train/sample_checkpoint.h"

#include "starling/common/error.h"
#include "starling/data/dataset.h"
#include "starling/data/tokenizer.h"
#include "starling/train/checkpoint_model.h"
#include "starling/train/metrics.h"
#include "starling/train/sampler.h"

namespace starling::train {

std::string sample_from_checkpoint(const std::filesystem::path& path, const SampleConfig& options,
                                   SampleTiming* timing) {
  const CheckpointModel m = load_checkpoint_model(path);
  const Checkpoint& ckpt = m.checkpoint;
  const RunConfig& config = m.config;
  std::unique_ptr<data::Tokenizer> tokenizer;
  if (ckpt.meta.tokenizer_kind == "byte") {
    tokenizer = data::make_byte_tokenizer();
  } else if (ckpt.meta.tokenizer_kind == "sentencepiece") {
    tokenizer = data::load_sentencepiece(ckpt.dir / "tokenizer.model");
  } else if (ckpt.meta.tokenizer_kind == "gpt2") {
    // GPT-2's BPE is the same for every run: the run's dataset carries it (or says where it
    // should be).
    tokenizer = data::load_dataset_tokenizer(data::open_dataset(config.data.dir));
  } else {
    throw DataError((ckpt.dir / "meta.json").string() + ": tokenizer \"" +
                    ckpt.meta.tokenizer_kind +
                    "\" has no built-in decoder, so text cannot be sampled");
  }
  std::vector<uint32_t> prompt = tokenizer->encode(options.prompt);
  if (prompt.empty()) throw ConfigError("--prompt: the prompt encodes to no tokens");
  for (auto id : prompt)
    if (id >= static_cast<uint32_t>(config.model.vocab_size))
      throw ConfigError("--prompt: token " + std::to_string(id) +
                        " is outside the model's vocabulary");
  const double start = now_s();
  int64_t generated = 0;
  std::string text = sample_text(*m.dag, config.model, *tokenizer, prompt, options, &generated);
  if (timing != nullptr) *timing = {.tokens = generated, .seconds = now_s() - start};
  return text;
}

}  // namespace starling::train
