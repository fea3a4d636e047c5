// Runs an OpDag forward and backward node by node. Every node input enters as a fresh autograd
// leaf (a detached view of its producer's output), each node's backward is local autograd, and
// the gradient of every edge is handed explicitly to its producer. Nothing in a node's autograd
// graph reaches past its own inputs, which is what lets an edge become a network link, a node be
// swapped out, or a node be recomputed.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <functional>
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

// Called before a node runs (forward, recompute, or backward). Swapping hooks in here.
using NodeHook = std::function<void(int node, bool backward)>;

class Executor {
 public:
  Executor(OpDag& dag, ExecutorOptions options = {});

  // Forward and backward of one micro-batch. The last node's output must be a scalar loss; its
  // gradient is seeded with `loss_scale` (1/accumulation steps when accumulating, times the fp16
  // loss scale). Parameter gradients accumulate into each parameter's .grad(). Returns the
  // unscaled loss as a detached 0-dim tensor on the model's device: reading it (.item()) waits for
  // the device, so callers read it only when they report it.
  at::Tensor forward_backward(const std::vector<at::Tensor>& inputs, double loss_scale = 1.0);

  // Forward without autograd up to and including node `last` (-1 = the last node); returns its
  // output. Used for evaluation and sampling.
  at::Tensor forward(const std::vector<at::Tensor>& inputs, int last = -1);

  void set_hook(NodeHook hook) { hook_ = std::move(hook); }
  const ExecutorOptions& options() const { return options_; }

 private:
  std::vector<at::Tensor> gather_inputs(int node, const std::vector<at::Tensor>& graph_inputs,
                                        const std::vector<at::Tensor>& outputs, bool as_leaves);

  OpDag& dag_;
  ExecutorOptions options_;
  NodeHook hook_;
};

}  // namespace starling::graph
