// Autoregressive sampling from a model DAG: temperature, top-k and top-p (nucleus) over the
// logits node, the context cropped to the model's seq_len.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "starling/graph/dag.h"
#include "starling/model/config.h"
#include "starling/train/config.h"

namespace starling::data {
class Tokenizer;
}

namespace starling::train {

// Returns `prompt` followed by up to options.max_tokens generated ids. A temperature of 0 picks
// the likeliest token. Deterministic for a given options.seed. With options.cache the prompt runs
// once through a KV cache (graph::DecodeCache) and every new token alone, until the context
// reaches model.seq_len; beyond it (and without the cache) each token reruns the last seq_len
// tokens whole. Both give the same tokens up to rounding. `done`, when given, is asked after
// every token with the ids so far and ends generation when it returns true (stop sequences need
// the text, which only the caller's tokenizer knows).
std::vector<uint32_t> generate(graph::OpDag& dag, const model::ModelConfig& config,
                               const std::vector<uint32_t>& prompt, const SampleConfig& options,
                               const std::function<bool(const std::vector<uint32_t>&)>& done = {});

// The prompt and what generate() continues it with, as text: decoded by `tokenizer`, and cut
// before the first of options.stop that appears after the prompt (generation ends there too).
// `generated`, when given, is set to the number of tokens generated.
std::string sample_text(graph::OpDag& dag, const model::ModelConfig& config,
                        const data::Tokenizer& tokenizer, const std::vector<uint32_t>& prompt,
                        const SampleConfig& options, int64_t* generated = nullptr);

}  // namespace starling::train
