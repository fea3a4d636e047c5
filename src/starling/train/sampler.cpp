#include "starling/train/sampler.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <stdexcept>

#include "starling/graph/executor.h"
#include "starling/model/build.h"

namespace starling::train {

std::vector<uint32_t> generate(graph::OpDag& dag, const model::ModelConfig& config,
                               const std::vector<uint32_t>& prompt, const SampleConfig& options) {
  if (prompt.empty()) throw std::invalid_argument("sampling needs a non-empty prompt");
  graph::Executor exec(dag);
  const int head = model::logits_node(dag);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(options.seed);
  const auto device = dag.params().params().front().value.device();
  std::vector<uint32_t> ids = prompt;
  for (int64_t n = 0; n < options.max_tokens; ++n) {
    const size_t ctx = std::min<size_t>(ids.size(), static_cast<size_t>(config.seq_len));
    std::vector<int64_t> window(ids.end() - static_cast<std::ptrdiff_t>(ctx), ids.end());
    at::Tensor tokens =
        at::tensor(window, at::kLong).view({1, static_cast<int64_t>(ctx)}).to(device);
    at::Tensor logits =
        exec.forward({tokens, at::Tensor()}, head)[0][-1].to(at::kCPU).to(at::kFloat);
    int64_t next;
    if (options.temperature <= 0) {
      next = logits.argmax().item<int64_t>();
    } else {
      logits = logits / options.temperature;
      if (options.top_k > 0 && options.top_k < logits.size(0)) {
        const double kth = std::get<0>(logits.topk(options.top_k)).min().item<double>();
        logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
      }
      at::Tensor probs = at::softmax(logits, -1);
      next = at::multinomial(probs, 1, false, gen).item<int64_t>();
    }
    ids.push_back(static_cast<uint32_t>(next));
  }
  return ids;
}

}  // namespace starling::train

// ---- sample_checkpoint.h -------------------------------------------------------------------
#include "starling/common/error.h"
#include "starling/data/tokenizer.h"
#include "starling/train/checkpoint.h"
#include "starling/train/sample_checkpoint.h"

namespace starling::train {

std::string sample_from_checkpoint(const std::filesystem::path& path, const SampleConfig& options) {
  const Checkpoint ckpt = read_checkpoint(find_checkpoint(path));
  const RunConfig config =
      parse_run_config(ckpt.meta.config_toml, (ckpt.dir / "meta.json").string());
  std::unique_ptr<data::Tokenizer> tokenizer;
  if (ckpt.meta.tokenizer_kind == "byte") {
    tokenizer = data::make_byte_tokenizer();
  } else if (ckpt.meta.tokenizer_kind == "sentencepiece") {
    tokenizer = data::load_sentencepiece(ckpt.dir / "tokenizer.model");
  } else {
    throw DataError((ckpt.dir / "meta.json").string() + ": tokenizer \"" +
                    ckpt.meta.tokenizer_kind +
                    "\" has no built-in decoder, so text cannot be sampled");
  }
  auto dag = model::build_model(config.model, config.train.seed);
  load_params(ckpt.model, dag->params());
  std::vector<uint32_t> prompt = tokenizer->encode(options.prompt);
  if (prompt.empty()) throw ConfigError("--prompt: the prompt encodes to no tokens");
  for (auto id : prompt)
    if (id >= static_cast<uint32_t>(config.model.vocab_size))
      throw ConfigError("--prompt: token " + std::to_string(id) +
                        " is outside the model's vocabulary");
  return tokenizer->decode(generate(*dag, config.model, prompt, options));
}

}  // namespace starling::train
