#include "starling/sched/workload.h"

#include <algorithm>
#include <chrono>
#include <vector>

#include "starling/common/cpu_runtime.h"
#include "starling/graph/dag.h"
#include "starling/graph/executor.h"
#include "starling/model/build.h"
#include "starling/swap/profile.h"
#include "starling/train/config.h"
#include "starling/train/precision.h"

namespace starling::sched {

CostTable profile_workload(const train::RunConfig& c, double steady_seconds) {
  const int threads = setup_cpu_runtime(c.train.threads, c.train.cpu_allocator == "system");
  auto dag = model::build_model(c.model, c.train.seed, c10::kCPU);
  const graph::ExecutorOptions options{
      .recompute = c.train.recompute, .autocast = train::parse_dtype(c.train.dtype, "train.dtype")};
  // The first pass pays for allocations and one-time set-up; the faster of two is the steady one.
  const auto cold = swap::profile_nodes(*dag, options, c.train.batch_size, c.model.seq_len);
  std::vector<swap::SwapProblem> steady;
  const auto start = std::chrono::steady_clock::now();
  do {
    steady.push_back(swap::profile_nodes(*dag, options, c.train.batch_size, c.model.seq_len));
  } while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() <
           steady_seconds);
  const int n = dag->size();
  const auto& nodes = dag->nodes();

  // The bytes of each node's output, and the last node that reads it.
  std::vector<int64_t> out_bytes(static_cast<size_t>(n), 0);
  std::vector<int> last_reader(static_cast<size_t>(n), -1);
  for (int i = 0; i < n; ++i) {
    int64_t elements = 1;
    for (const int64_t d :
         nodes[static_cast<size_t>(i)].op->output_shape(c.train.batch_size, c.model.seq_len))
      elements *= d;
    out_bytes[static_cast<size_t>(i)] = elements * 4;
    for (const auto& src : nodes[static_cast<size_t>(i)].inputs)
      if (src.kind == graph::Source::Kind::kNode)
        last_reader[static_cast<size_t>(src.index)] =
            std::max(last_reader[static_cast<size_t>(src.index)], i);
  }

  CostTable t;
  t.micro_batches = c.train.grad_accum;
  t.one_f_one_b = c.pipeline.schedule == "1f1b";
  t.extra_warmup = c.pipeline.extra_warmup;
  t.reference_cpus = threads;
  t.devices = {{.name = "this machine", .speed = 1}};
  t.links = {{LinkCost{}}};
  for (int i = 0; i < n; ++i) {
    NodeCost node{.name = nodes[static_cast<size_t>(i)].name};
    const auto& a = cold.nodes[static_cast<size_t>(i)];
    if (steady_seconds > 0) {
      // The mean over the steady passes: what a long computation sees of every pause.
      for (const auto& pass : steady) {
        const auto& b = pass.nodes[static_cast<size_t>(i)];
        node.compute_s += (b.forward_s + b.backward_s) / static_cast<double>(steady.size());
        node.forward_s += b.forward_s / static_cast<double>(steady.size());
      }
    } else {
      const auto& b = steady.front().nodes[static_cast<size_t>(i)];
      const auto& quick = a.forward_s + a.backward_s <= b.forward_s + b.backward_s ? a : b;
      node.compute_s = quick.forward_s + quick.backward_s;
      node.forward_s = quick.forward_s;
    }
    node.param_bytes = dag->node_param_bytes(i);
    // A cut after node i carries every output of a node <= i that a node > i reads.
    for (int j = 0; j <= i && i + 1 < n; ++j)
      if (last_reader[static_cast<size_t>(j)] > i)
        node.cut_bytes += out_bytes[static_cast<size_t>(j)];
    t.nodes.push_back(std::move(node));
  }
  return t;
}

}  // namespace starling::sched
