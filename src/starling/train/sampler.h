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
// the likeliest token. Deterministic for a given options.seed. Each token is picked from the
// logits of a window of the ids so far, ids[start, end), at most model.seq_len long: once it
// would grow past seq_len, start moves on by window_slide() tokens at once (a prompt longer than
// seq_len is cut to its last seq_len first). With options.cache the window runs once through a
// KV cache (graph::DecodeCache) and every new token alone until the window moves; without it the
// whole window reruns for every token. Both give the same tokens up to rounding. `done`, when
// given, is asked after every token with the ids so far and ends generation when it returns true
// (stop sequences need the text, which only the caller's tokenizer knows).
std::vector<uint32_t> generate(graph::OpDag& dag, const model::ModelConfig& config,
                               const std::vector<uint32_t>& prompt, const SampleConfig& options,
                               const std::function<bool(const std::vector<uint32_t>&)>& done = {});

// How many tokens the window moves at once past seq_len: options.slide, at most seq_len; 0 (the
// default) is half of seq_len. With a slide of 1 every token sees seq_len tokens before it and
// (with the cache) costs a whole window; with S each token sees between seq_len - S + 1 and
// seq_len, and the cached window reruns once every S tokens.
size_t window_slide(const SampleConfig& options, const model::ModelConfig& config);

// The prompt and what generate() continues it with, as text: decoded by `tokenizer`, and cut
// before the first of options.stop that appears after the prompt (generation ends there too).
// `generated`, when given, is set to the number of tokens generated.
std::string sample_text(graph::OpDag& dag, const model::ModelConfig& config,
                        const data::Tokenizer& tokenizer, const std::vector<uint32_t>& prompt,
                        const SampleConfig& options, int64_t* generated = nullptr);

}  // namespace starling::train
