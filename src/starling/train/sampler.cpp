#include "starling/train/sampler.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <stdexcept>

#include "starling/common/error.h"
#include "starling/data/tokenizer.h"
#include "starling/graph/executor.h"
#include "starling/model/build.h"

namespace starling::train {

size_t window_slide(const SampleConfig& options, const model::ModelConfig& config) {
  const auto len = static_cast<size_t>(std::max<int64_t>(1, config.seq_len));
  if (options.slide <= 0) return std::max<size_t>(1, len / 2);
  return std::min(static_cast<size_t>(options.slide), len);
}

std::vector<uint32_t> generate(graph::OpDag& dag, const model::ModelConfig& config,
                               const std::vector<uint32_t>& prompt, const SampleConfig& options,
                               const std::function<bool(const std::vector<uint32_t>&)>& done) {
  if (prompt.empty()) throw std::invalid_argument("sampling needs a non-empty prompt");
  graph::Executor exec(dag);
  const int head = model::logits_node(dag);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(options.seed);
  const auto device = dag.params().params().front().value.device();
  std::vector<uint32_t> ids = prompt;
  graph::DecodeCache cache;
  const auto tensor = [&](auto begin, auto end) {
    std::vector<int64_t> window(begin, end);
    return at::tensor(window, at::kLong).view({1, static_cast<int64_t>(window.size())}).to(device);
  };
  const size_t len = static_cast<size_t>(config.seq_len);
  const size_t slide = window_slide(options, config);
  // The window: ids[start, end), never longer than seq_len; a longer prompt is cut to its end.
  size_t start = ids.size() > len ? ids.size() - len : 0;
  size_t cache_start = 0;  // where the cache's window starts (its position 0)
  for (int64_t n = 0; n < options.max_tokens; ++n) {
    // One token past seq_len: the window moves on by `slide` (1 <= slide <= seq_len) at once.
    if (ids.size() - start > len) start += slide;
    const auto begin = ids.begin() + static_cast<std::ptrdiff_t>(start);
    at::Tensor out;
    if (options.cache && cache.position() > 0 && cache_start == start &&
        start + static_cast<size_t>(cache.position()) + 1 == ids.size()) {
      // Only the newest token runs; the cache holds every earlier position of the window.
      out = exec.forward_cached({tensor(ids.end() - 1, ids.end()), at::Tensor()}, cache, head);
    } else if (options.cache) {
      // The prompt, or a window that just moved: its tokens run once, from position 0.
      cache.clear();
      cache_start = start;
      out = exec.forward_cached({tensor(begin, ids.end()), at::Tensor()}, cache, head);
    } else {
      out = exec.forward({tensor(begin, ids.end()), at::Tensor()}, head);
    }
    at::Tensor logits = out[0][-1].to(at::kCPU).to(at::kFloat);
    if (!at::isfinite(logits).all().item<bool>())
      throw Error(
          "sampling: the model's output holds non-finite values (its weights are not "
          "finite: a run that diverged, or a damaged checkpoint)");
    int64_t next;
    // The logits are floats: a temperature that is 0 as a float (below about 7e-46) is greedy.
    const auto temperature = static_cast<float>(options.temperature);
    if (!(temperature > 0)) {
      next = logits.argmax().item<int64_t>();
    } else {
      // From the largest: a tiny temperature sends the others to -inf, never the sum to NaN.
      logits = (logits - logits.max()) / temperature;
      if (options.top_k > 0 && options.top_k < logits.size(0)) {
        const double kth = std::get<0>(logits.topk(options.top_k)).min().item<double>();
        logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
      }
      at::Tensor probs = at::softmax(logits, -1);
      if (options.top_p < 1) {
        // The likeliest tokens whose probabilities, added up in order, first reach top_p (the
        // token that crosses it included, so at least one is kept).
        auto [sorted, order] = probs.sort(/*dim=*/-1, /*descending=*/true);
        const at::Tensor before = sorted.cumsum(-1) - sorted;  // mass ahead of each token
        const at::Tensor dropped = before >= options.top_p;
        probs = probs.scatter(0, order, sorted.masked_fill(dropped, 0));
      }
      next = at::multinomial(probs, 1, false, gen).item<int64_t>();
    }
    ids.push_back(static_cast<uint32_t>(next));
    if (done && done(ids)) break;
  }
  return ids;
}

namespace {

// Where the first of `stop` starts in `text` at or after `from`; npos if none does.
size_t first_stop(const std::string& text, size_t from, const std::vector<std::string>& stop) {
  size_t cut = std::string::npos;
  for (const std::string& s : stop)
    if (!s.empty()) cut = std::min(cut, text.find(s, std::min(from, text.size())));
  return cut;
}

}  // namespace

std::string sample_text(graph::OpDag& dag, const model::ModelConfig& config,
                        const data::Tokenizer& tokenizer, const std::vector<uint32_t>& prompt,
                        const SampleConfig& options, int64_t* generated) {
  // With stop sequences the text is decoded after every token: cheap beside a forward pass.
  const size_t from = tokenizer.decode(prompt).size();
  std::function<bool(const std::vector<uint32_t>&)> done;
  if (!options.stop.empty())
    done = [&](const std::vector<uint32_t>& ids) {
      return first_stop(tokenizer.decode(ids), from, options.stop) != std::string::npos;
    };
  const auto ids = generate(dag, config, prompt, options, done);
  if (generated != nullptr) *generated = static_cast<int64_t>(ids.size() - prompt.size());
  const std::string text = tokenizer.decode(ids);
  const size_t cut = first_stop(text, from, options.stop);
  return cut == std::string::npos ? text : text.substr(0, cut);
}

}  // namespace starling::train
