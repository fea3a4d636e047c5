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
