#include "starling/graph/executor.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <optional>
#include <stdexcept>

#include "starling/graph/autocast.h"

namespace starling::graph {
namespace {

// Autocast follows the data: the device of the first tensor input (tokens for a whole model).
c10::DeviceType input_device(const std::vector<at::Tensor>& inputs) {
  for (const auto& t : inputs)
    if (t.defined()) return t.device().type();
  return c10::DeviceType::CPU;
}

}  // namespace

Executor::Executor(OpDag& dag, ExecutorOptions options) : dag_(dag), options_(options) {
  if (dag_.size() == 0) throw std::logic_error("Executor: empty OpDag");
}

std::vector<at::Tensor> Executor::gather_inputs(int node,
                                                const std::vector<at::Tensor>& graph_inputs,
                                                const std::vector<at::Tensor>& outputs,
                                                bool as_leaves) {
  std::vector<at::Tensor> ins;
  for (const auto& s : dag_.nodes()[node].inputs) {
    if (s.kind == Source::Kind::kGraphInput) {
      ins.push_back(graph_inputs.at(s.index));
      continue;
    }
    // A fresh leaf cuts the autograd graph at the edge: the producer's history stays with the
    // producer, and the gradient arriving here is handed back explicitly.
    at::Tensor t = outputs[s.index].detach();
    if (as_leaves && t.is_floating_point()) t.requires_grad_(true);
    ins.push_back(std::move(t));
  }
  return ins;
}

at::Tensor Executor::forward_backward(const std::vector<at::Tensor>& inputs, double loss_scale) {
  const int n = dag_.size();
  auto& nodes = dag_.nodes();
  const c10::DeviceType device = input_device(inputs);
  std::vector<at::Tensor> outputs(n);
  std::vector<std::vector<at::Tensor>> node_inputs(n);

  std::optional<AutocastScope> autocast(std::in_place, device, options_.autocast);
  for (int i = 0; i < n; ++i) {
    if (hook_) hook_(i, false);
    if (options_.recompute) {
      at::NoGradGuard no_grad;
      node_inputs[i] = gather_inputs(i, inputs, outputs, /*as_leaves=*/false);
      outputs[i] = nodes[i].op->forward(node_inputs[i]);
    } else {
      at::AutoGradMode grad(true);
      node_inputs[i] = gather_inputs(i, inputs, outputs, /*as_leaves=*/true);
      outputs[i] = nodes[i].op->forward(node_inputs[i]);
    }
  }
  autocast.reset();  // backward runs in the dtypes the forward chose
  if (outputs[n - 1].numel() != 1)
    throw std::logic_error("Executor: the last node (" + nodes[n - 1].name +
                           ") must be a scalar loss");
  at::Tensor loss = outputs[n - 1].detach().reshape({});

  std::vector<at::Tensor> grads(n);
  grads[n - 1] = at::full({}, loss_scale, outputs[n - 1].options());
  for (int i = n - 1; i >= 0; --i) {
    if (!grads[i].defined()) continue;
    if (hook_) hook_(i, true);
    at::Tensor out = outputs[i];
    std::vector<at::Tensor>& ins = node_inputs[i];
    if (options_.recompute) {
      at::AutoGradMode grad(true);
      for (auto& t : ins)
        if (t.defined() && t.is_floating_point()) t = t.detach().requires_grad_(true);
      AutocastScope recompute_autocast(device, options_.autocast);
      out = nodes[i].op->forward(ins);
    }
    if (out.requires_grad()) torch::autograd::backward({out}, {grads[i]});
    const auto& sources = nodes[i].inputs;
    for (size_t k = 0; k < sources.size(); ++k) {
      if (sources[k].kind != Source::Kind::kNode || !ins[k].defined()) continue;
      at::Tensor g = ins[k].grad();
      if (!g.defined()) continue;
      auto& acc = grads[sources[k].index];
      acc = acc.defined() ? acc.add_(g) : g;
    }
    // This node is done: drop its activations and edge tensors as early as possible.
    outputs[i].reset();
    ins.clear();
    grads[i].reset();
  }
  return loss;
}

at::Tensor Executor::forward(const std::vector<at::Tensor>& inputs, int last) {
  const int n = dag_.size();
  if (last < 0) last = n - 1;
  if (last >= n) throw std::out_of_range("Executor::forward: node index out of range");
  auto& nodes = dag_.nodes();
  // Free each output after its last consumer has run.
  std::vector<int> last_use(n, -1);
  for (int i = 0; i <= last; ++i)
    for (const auto& s : nodes[i].inputs)
      if (s.kind == Source::Kind::kNode) last_use[s.index] = i;

  at::NoGradGuard no_grad;
  AutocastScope autocast(input_device(inputs), options_.autocast);
  std::vector<at::Tensor> outputs(n);
  for (int i = 0; i <= last; ++i) {
    if (hook_) hook_(i, false);
    outputs[i] = nodes[i].op->forward(gather_inputs(i, inputs, outputs, /*as_leaves=*/false));
    for (const auto& s : nodes[i].inputs)
      if (s.kind == Source::Kind::kNode && last_use[s.index] == i && s.index != last)
        outputs[s.index].reset();
  }
  return outputs[last];
}

}  // namespace starling::graph
