#include "starling/swap/profile.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "starling/graph/dag.h"
#include "starling/graph/executor.h"
#include "starling/swap/tier.h"
#include "starling/train/adamw.h"
#include "starling/train/metrics.h"

namespace starling::swap {
namespace {

using train::now_s;

class NodeTimer final : public graph::NodeObserver {
 public:
  explicit NodeTimer(std::vector<NodeCost>& nodes) : nodes_(nodes) {}
  void before(int, graph::Phase) override { start_ = now_s(); }
  void after(int node, graph::Phase phase) override {
    const double dt = now_s() - start_;
    (phase == graph::Phase::kForward ? nodes_[node].forward_s : nodes_[node].backward_s) += dt;
  }

 private:
  std::vector<NodeCost>& nodes_;
  double start_ = 0;
};

// Drops each node's parameter gradients once its backward has made them, so profiling a model
// holds one node's gradients at a time, not a whole model's (which, with the weights, need not
// fit in RAM: the budget is there for that).
class GradientDropper final : public graph::NodeObserver {
 public:
  GradientDropper(graph::ParamStore& params, const std::vector<NodeCost>& nodes)
      : params_(params), nodes_(nodes) {}
  void after(int node, graph::Phase phase) override {
    if (phase != graph::Phase::kBackward) return;
    for (int p : nodes_[node].params) params_.params()[p].value.mutable_grad().reset();
  }

 private:
  graph::ParamStore& params_;
  const std::vector<NodeCost>& nodes_;
};

// AdamW's time per element, from a few passes over scratch tensors of 4M elements.
double optimizer_seconds_per_element() {
  constexpr int64_t n = int64_t{1} << 22;
  at::Tensor w = at::zeros({n}), g = at::full({n}, 1e-3), m = at::zeros({n}), v = at::zeros({n});
  train::AdamWOptions options;
  train::update_elements(w, g, m, v, 1e-3, true, options, 1);  // warm up
  const double t0 = now_s();
  constexpr int reps = 3;
  for (int i = 0; i < reps; ++i) train::update_elements(w, g, m, v, 1e-3, true, options, i + 2);
  return (now_s() - t0) / reps / static_cast<double>(n);
}

}  // namespace

SwapProblem profile_nodes(graph::OpDag& dag, const graph::ExecutorOptions& options, int64_t batch,
                          int64_t seq_len) {
  SwapProblem p;
  auto& params = dag.params().params();
  for (const auto& param : params)
    p.param_bytes.push_back(param.value.numel() * static_cast<int64_t>(param.value.element_size()));
  for (const auto& node : dag.nodes()) {
    NodeCost c;
    c.name = node.name;
    for (const auto& name : node.op->param_names())
      for (size_t i = 0; i < params.size(); ++i)
        if (params[i].name == name) c.params.push_back(static_cast<int>(i));
    p.nodes.push_back(std::move(c));
  }
  // Token 0 everywhere: the time of every node but the embedding's gather is independent of the
  // ids, and no random generator is drawn from.
  const at::Tensor tokens = at::zeros({batch, seq_len}, at::kLong);
  graph::Executor exec(dag, options);
  GradientDropper dropper(dag.params(), p.nodes);
  exec.add_observer(&dropper);
  exec.forward_backward({tokens, tokens});  // warm-up: allocator, kernels, caches
  NodeTimer timer(p.nodes);
  exec.remove_observer(&dropper);  // the timer first, so dropping is not timed as the node's work
  exec.add_observer(&timer);
  exec.add_observer(&dropper);
  exec.forward_backward({tokens, tokens});
  dag.params().zero_grad();
  int64_t elements = 0;
  for (const auto& param : params) elements += param.value.numel();
  {
    at::NoGradGuard no_grad;
    p.optimizer_s = optimizer_seconds_per_element() * static_cast<double>(elements);
  }
  return p;
}

void measure_tier(SwapProblem& p, const std::string& kind, const std::filesystem::path& dir,
                  int64_t bytes) {
  constexpr size_t piece = size_t{8} << 20;
  const size_t total = std::max(piece, align_up(static_cast<size_t>(bytes)) / piece * piece);
  std::unique_ptr<Tier> tier = make_tier(kind, dir);
  const uint64_t key = tier->reserve(total);
  void* buf = std::aligned_alloc(kSwapAlign, piece);
  std::memset(buf, 1, piece);
  auto pass = [&](bool write) {
    const double t0 = now_s();
    std::vector<Ticket> tickets;
    for (size_t off = 0; off < total; off += piece)
      tickets.push_back(write ? tier->write(key, off, buf, piece)
                              : tier->read(key, off, buf, piece));
    for (Ticket t : tickets) tier->wait(t);
    return static_cast<double>(total) / std::max(now_s() - t0, 1e-9);
  };
  try {
    pass(true);  // first touch allocates the file's blocks; measure the steady state
    p.write_bps = pass(true);
    p.read_bps = pass(false);
  } catch (...) {
    std::free(buf);
    throw;
  }
  std::free(buf);
  p.tier = kind;
}

}  // namespace starling::swap
