// Runs an OpDag forward and backward node by node. Every node input enters as a fresh autograd
// leaf (a detached view of its producer's output), each node's backward is local autograd, and
// the gradient of every edge is handed explicitly to its producer. Nothing in a node's autograd
// graph reaches past its own inputs, which is what lets an edge become a network link, a node be
// swapped out, or a node be recomputed.
//
// A micro-batch's state lives in a MicroBatch the caller owns, so several can be in flight, and
// any contiguous range of nodes (a pipeline stage) can run forward or backward alone: the
// activations it reads from earlier nodes come in explicitly, and their gradients go out.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/DeviceType.h>
#include <c10/core/ScalarType.h>

#include <map>
#include <vector>

#include "starling/graph/dag.h"

namespace starling::graph {

struct ExecutorOptions {
  // Keep only each node's inputs in the forward pass and rerun the node before its backward:
  // activation memory drops to the edge tensors at the cost of one more forward.
  bool recompute = false;
  // Forward passes (and recomputation) run under autocast to this dtype on the inputs' device;
  // kFloat runs them in fp32. Parameters stay fp32 either way (see autocast.h).
  c10::ScalarType autocast = c10::ScalarType::Float;
};

// Nodes [first, last] of the DAG, in order; last = -1 means through the last node.
struct StageRange {
  int first = 0;
  int last = -1;
};

// Activations crossing a stage boundary, keyed by the index of the node that produced them.
using EdgeTensors = std::map<int, at::Tensor>;

enum class Phase { kForward, kRecompute, kBackward };
const char* phase_name(Phase phase);

// Told before and after each node runs, in the order the executor runs them: timing for a
// planner, load and evict for swapping. Observers are not owned and must outlive the executor's
// use of them.
class NodeObserver {
 public:
  virtual ~NodeObserver() = default;
  virtual void before(int /*node*/, Phase /*phase*/) {}
  // Before a node's forward (Phase::kForward, not recomputation), with the inputs it is about to
  // read, in place of before(): a swapper reads a table lookup's rows from them. The default
  // hands over to before().
  virtual void before_forward(int node, const std::vector<at::Tensor>& /*inputs*/) {
    before(node, Phase::kForward);
  }
  virtual void after(int /*node*/, Phase /*phase*/) {}
};

// One micro-batch in flight through a stage: the edge tensors and what backward needs. Made by
// Executor::forward_stage, consumed by Executor::backward_stage.
class MicroBatch {
 public:
  const StageRange& range() const { return range_; }
  // The activations later stages read (producer index -> tensor, detached), and for a stage that
  // ends with the loss node, the loss under that node's index.
  const EdgeTensors& outputs() const { return boundary_; }

 private:
  friend class Executor;
  StageRange range_;
  c10::DeviceType device_ = c10::DeviceType::CPU;
  std::vector<at::Tensor> graph_inputs_;
  std::vector<at::Tensor> outputs_;                   // per node; incoming edges included
  std::vector<std::vector<at::Tensor>> node_inputs_;  // per node of the range
  EdgeTensors boundary_;
  bool done_ = false;
  bool forward_only_ = false;  // made without autograd: no backward
};

// The cache of incremental decoding (Executor::forward_cached): how many positions of the
// sequence have run, and what each node keeps of them (Op::forward_cached's state).
class DecodeCache {
 public:
  int64_t position() const { return position_; }
  // Forgets everything: the next forward_cached starts the sequence at position 0.
  void clear() {
    position_ = 0;
    state_.clear();
  }

 private:
  friend class Executor;
  int64_t position_ = 0;
  std::vector<std::vector<at::Tensor>> state_;  // per node
};

class Executor {
 public:
  // The DAG's ParamStore may hold only part of the model (ParamStore::held_elsewhere): running a
  // node whose parameters another peer holds is then a std::logic_error.
  Executor(OpDag& dag, ExecutorOptions options = {});
  const OpDag& dag() const { return dag_; }

  // Forward and backward of one micro-batch through the whole DAG. The last node's output must be
  // a scalar loss; its gradient is seeded with `loss_scale` (1/accumulation steps when
  // accumulating, times the fp16 loss scale). Parameter gradients accumulate into each
  // parameter's .grad(). Returns the unscaled loss as a detached 0-dim tensor on the model's
  // device: reading it (.item()) waits for the device, so callers read it only when they report it.
  at::Tensor forward_backward(const std::vector<at::Tensor>& inputs, double loss_scale = 1.0);

  // Forward of the nodes in `range`, keeping what their backward needs. `inputs` are the graph
  // inputs (tokens, targets; undefined where the stage reads none); `incoming` holds every
  // activation the range reads from nodes before it. std::invalid_argument names a missing one.
  // With `for_backward` false (evaluation) nothing is kept for a backward and no autograd graph is
  // built; backward_stage then refuses the micro-batch.
  MicroBatch forward_stage(const std::vector<at::Tensor>& inputs, StageRange range,
                           const EdgeTensors& incoming = {}, bool for_backward = true);
  // Backward of a micro-batch's stage. `output_grads` holds the gradient of each of its outputs()
  // (for the loss node: the seed, e.g. a 0-dim tensor of the loss scale); an output without one
  // gets no gradient. Parameter gradients accumulate; returns the gradients of `incoming`
  // (producer index -> gradient; absent where none flowed). A MicroBatch runs backward once.
  EdgeTensors backward_stage(MicroBatch& mb, const EdgeTensors& output_grads);

  // Forward without autograd up to and including node `last` (-1 = the last node); returns its
  // output. Used for evaluation and sampling.
  at::Tensor forward(const std::vector<at::Tensor>& inputs, int last = -1);
  // forward() of the next positions of one sequence: `inputs` hold the tokens at positions
  // [cache.position(), cache.position() + t), the earlier ones having run through `cache`, and the
  // result is node `last`'s output at the new positions, as forward() over the whole sequence
  // gives it (up to rounding). The nodes up to `last` must not mix sequences or read the targets
  // (the loss node). Sampling uses it: the prompt once, then one token at a time.
  at::Tensor forward_cached(const std::vector<at::Tensor>& inputs, DecodeCache& cache, int last);

  void add_observer(NodeObserver* observer) { observers_.push_back(observer); }
  void remove_observer(NodeObserver* observer) { std::erase(observers_, observer); }
  const ExecutorOptions& options() const { return options_; }

 private:
  StageRange resolve(StageRange range) const;
  std::vector<at::Tensor> gather_inputs(int node, const std::vector<at::Tensor>& graph_inputs,
                                        const std::vector<at::Tensor>& outputs, bool as_leaves);
  void notify(int node, Phase phase, bool after);
  void notify_forward(int node, const std::vector<at::Tensor>& inputs);
  // The node's parameters as the ParamStore holds them now (after the `before` observers ran:
  // one may just have brought them in).
  std::vector<at::Tensor> params_of(int node) const;

  OpDag& dag_;
  // A parameter slot of a node whose parameter another peer holds (ParamStore::held_elsewhere).
  static constexpr size_t kHeldElsewhere = static_cast<size_t>(-1);
  std::vector<std::vector<size_t>> param_slots_;  // per node: indices into dag_.params()
  ExecutorOptions options_;
  std::vector<NodeObserver*> observers_;
};

}  // namespace starling::graph
