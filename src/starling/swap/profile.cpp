#include "starling/swap/profile.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <thread>

#include "starling/common/cpu_runtime.h"
#include "starling/common/device.h"
#include "starling/graph/dag.h"
#include "starling/graph/executor.h"
#include "starling/swap/buffer_pool.h"
#include "starling/swap/pinned_tier.h"
#include "starling/train/adamw.h"
#include "starling/train/metrics.h"

namespace starling::swap {
namespace {

using train::now_s;

// On a GPU a node's time is its kernels': the timer waits for the device at both ends.
class NodeTimer final : public graph::NodeObserver {
 public:
  NodeTimer(std::vector<NodeCost>& nodes, c10::Device device) : nodes_(nodes), device_(device) {}
  void before(int, graph::Phase) override {
    synchronize(device_);
    start_ = now_s();
  }
  void after(int node, graph::Phase phase) override {
    synchronize(device_);
    const double dt = now_s() - start_;
    (phase == graph::Phase::kForward ? nodes_[node].forward_s : nodes_[node].backward_s) += dt;
  }

 private:
  std::vector<NodeCost>& nodes_;
  c10::Device device_;
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
double optimizer_seconds_per_element(c10::Device device) {
  constexpr int64_t n = int64_t{1} << 22;
  const auto f32 = at::TensorOptions(at::kFloat).device(device);
  at::Tensor w = at::zeros({n}, f32), g = at::full({n}, 1e-3, f32), m = at::zeros({n}, f32),
             v = at::zeros({n}, f32);
  train::AdamWOptions options;
  train::update_elements(w, g, m, v, 1e-3, true, options, 1);  // warm up
  synchronize(device);
  const double t0 = now_s();
  constexpr int reps = 3;
  for (int i = 0; i < reps; ++i) train::update_elements(w, g, m, v, 1e-3, true, options, i + 2);
  synchronize(device);
  return (now_s() - t0) / reps / static_cast<double>(n);
}

// A unit of computation like a training step's, on the training's threads: matrix products
// (bound by the cores) and an AdamW update (bound by memory). Constant inputs: no random
// generator is drawn from.
class ComputeProbe {
 public:
  ComputeProbe()
      : a_(at::full({256, 768}, 0.5f)),
        b_(at::full({768, 768}, 1e-3f)),
        c_(at::empty({256, 768})),
        w_(at::zeros({kUpdated})),
        g_(at::full({kUpdated}, 1e-3f)),
        m_(at::zeros({kUpdated})),
        v_(at::zeros({kUpdated})) {}
  // Seconds for `reps` units.
  double run(int reps) {
    const double t0 = now_s();
    for (int i = 0; i < reps; ++i) {
      for (int k = 0; k < 4; ++k) at::mm_out(c_, a_, b_);
      train::update_elements(w_, g_, m_, v_, 1e-3, true, options_, ++steps_);
    }
    return now_s() - t0;
  }

 private:
  static constexpr int64_t kUpdated = int64_t{1} << 20;
  at::Tensor a_, b_, c_, w_, g_, m_, v_;
  train::AdamWOptions options_;
  int64_t steps_ = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

// Timed alone before and after the timings beside, so that a machine changing speed meanwhile
// shows in neither alone.
double probe_slowdown(const std::function<void()>& beside) {
  at::NoGradGuard no_grad;
  ComputeProbe probe;
  probe.run(2);  // warm-up: allocator, kernels, caches
  const int reps = std::clamp(static_cast<int>(0.05 / std::max(probe.run(4) / 4, 1e-6)), 1, 1000);
  std::vector<double> alone, busy;
  for (int i = 0; i < 3; ++i) alone.push_back(probe.run(reps));
  {
    // A failure beside (a tier's I/O error) is raised here, after the thread ends, not in it.
    std::atomic<bool> stop{false};
    std::exception_ptr failed;
    std::thread io([&] {
      try {
        while (!stop.load()) beside();
      } catch (...) {
        failed = std::current_exception();
      }
    });
    for (int i = 0; i < 5; ++i) busy.push_back(probe.run(reps));
    stop = true;
    io.join();
    if (failed) std::rethrow_exception(failed);
  }
  for (int i = 0; i < 2; ++i) alone.push_back(probe.run(reps));
  return std::max(0.0, median(busy) / median(alone) - 1);
}

SwapProblem profile_nodes(graph::OpDag& dag, const graph::ExecutorOptions& options, int64_t batch,
                          int64_t seq_len, c10::Device device) {
  SwapProblem p;
  p.lookup_tokens = batch * seq_len;
  auto& params = dag.params().params();
  for (const auto& param : params)
    p.param_bytes.push_back(param.value.numel() * static_cast<int64_t>(param.value.element_size()));
  for (const auto& node : dag.nodes()) {
    NodeCost c;
    c.name = node.name;
    const auto names = node.op->param_names();
    for (size_t k = 0; k < names.size(); ++k)
      for (size_t i = 0; i < params.size(); ++i)
        if (params[i].name == names[k]) {
          c.params.push_back(static_cast<int>(i));
          if (node.op->reads_rows(k) && params[i].value.dim() == 2 &&
              rows_go_first(params[i].value.size(0), batch * seq_len))
            c.rows.push_back(static_cast<int>(i));
        }
    p.nodes.push_back(std::move(c));
  }
  // Token 0 everywhere: the time of every node but the embedding's gather is independent of the
  // ids, and no random generator is drawn from.
  const at::Tensor tokens =
      at::zeros({batch, seq_len}, at::TensorOptions(at::kLong).device(device));
  graph::Executor exec(dag, options);
  GradientDropper dropper(dag.params(), p.nodes);
  exec.add_observer(&dropper);
  exec.forward_backward({tokens, tokens});  // warm-up: allocator, kernels, caches
  NodeTimer timer(p.nodes, device);
  exec.remove_observer(&dropper);  // the timer first, so dropping is not timed as the node's work
  exec.add_observer(&timer);
  exec.add_observer(&dropper);
  exec.forward_backward({tokens, tokens});
  dag.params().zero_grad();
  int64_t elements = 0;
  for (const auto& param : params) elements += param.value.numel();
  {
    at::NoGradGuard no_grad;
    p.optimizer_s = optimizer_seconds_per_element(device) * static_cast<double>(elements);
  }
  return p;
}

void measure_tier(SwapProblem& p, const std::string& kind, const std::filesystem::path& dir,
                  int64_t bytes, c10::Device device, bool slowdown) {
  constexpr size_t piece = size_t{8} << 20;
  const size_t total = std::max(piece, align_up(static_cast<size_t>(bytes)) / piece * piece);
  // The buffer is in compute memory, where the swapper's transfers start and end. It outlives the
  // tier, whose destructor lets transfers in flight finish.
  BufferPool pool(device);
  at::DataPtr owned = pool.take(piece);
  std::unique_ptr<Tier> tier = make_tier(kind, dir, device);
  const uint64_t key = tier->reserve(total);
  void* buf = owned.get();
  if (device.is_cpu())
    std::memset(buf, 1, piece);
  else
    at::from_blob(buf, {static_cast<int64_t>(piece)}, at::TensorOptions(at::kByte).device(device))
        .fill_(1);
  auto pass = [&](bool write) {
    const double t0 = now_s();
    std::vector<Ticket> tickets;
    for (size_t off = 0; off < total; off += piece)
      tickets.push_back(write ? tier->write(key, off, buf, piece)
                              : tier->read(key, off, buf, piece));
    for (Ticket t : tickets) tier->wait(t);
    return static_cast<double>(total) / std::max(now_s() - t0, 1e-9);
  };
  pass(true);  // first touch allocates the file's blocks; measure the steady state
  p.write_bps = pass(true);
  p.read_bps = pass(false);
  p.tier = kind;
  p.duplex = tier->duplex();
  // A computation whose threads leave a core free could copy there; one that fills them (or
  // fills a cgroup's CPU limit) cannot.
  p.copies_take_compute =
      tier->copies_on_cpu() && device.is_cpu() && at::get_num_threads() >= default_threads();
  p.in_place = tier->in_place(key) != nullptr;
  // Copies made by the computing cores are counted as computation already (swap_plan.h); a GPU's
  // kernels do not share the host's cores.
  if (slowdown && device.is_cpu() && !p.copies_take_compute) {
    bool write = false;
    p.io_slowdown = probe_slowdown([&] { pass(write = !write); });
  }
}

}  // namespace starling::swap
