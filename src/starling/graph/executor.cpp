#include "starling/graph/executor.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <string>

#include "starling/graph/autocast.h"

namespace starling::graph {
namespace {

// Autocast follows the data: the device of the first tensor input (tokens for a whole model, the
// incoming activation for a later stage).
c10::DeviceType input_device(const std::vector<at::Tensor>& inputs, const EdgeTensors& incoming) {
  for (const auto& [producer, t] : incoming)
    if (t.defined()) return t.device().type();
  for (const auto& t : inputs)
    if (t.defined()) return t.device().type();
  return c10::DeviceType::CPU;
}

}  // namespace

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::kForward:
      return "forward";
    case Phase::kRecompute:
      return "recompute";
    case Phase::kBackward:
      return "backward";
  }
  return "?";
}

Executor::Executor(OpDag& dag, ExecutorOptions options) : dag_(dag), options_(options) {
  if (dag_.size() == 0) throw std::logic_error("Executor: empty OpDag");
  const auto& all = dag_.params().params();
  for (const auto& node : dag_.nodes()) {
    std::vector<size_t>& slots = param_slots_.emplace_back();
    for (const auto& name : node.op->param_names()) {
      const auto it =
          std::find_if(all.begin(), all.end(), [&](const Param& p) { return p.name == name; });
      if (it != all.end()) {
        slots.push_back(static_cast<size_t>(it - all.begin()));
      } else if (dag_.params().held_elsewhere(name)) {
        slots.push_back(kHeldElsewhere);  // a node of another peer's part: never run here
      } else {
        throw std::logic_error("Executor: node " + node.name + " reads parameter " + name +
                               ", which the ParamStore lacks");
      }
    }
  }
}

std::vector<at::Tensor> Executor::params_of(int node) const {
  const auto& all = dag_.params().params();
  std::vector<at::Tensor> out;
  out.reserve(param_slots_[node].size());
  for (size_t slot : param_slots_[node]) {
    if (slot == kHeldElsewhere)
      throw std::logic_error("Executor: node " + dag_.nodes()[static_cast<size_t>(node)].name +
                             " reads a parameter that another peer holds; this peer runs only "
                             "the nodes of its own part of the model");
    out.push_back(all[slot].value);
  }
  return out;
}

void Executor::notify(int node, Phase phase, bool after) {
  for (NodeObserver* o : observers_) after ? o->after(node, phase) : o->before(node, phase);
}

void Executor::notify_forward(int node, const std::vector<at::Tensor>& inputs) {
  for (NodeObserver* o : observers_) o->before_forward(node, inputs);
}

StageRange Executor::resolve(StageRange range) const {
  const int n = dag_.size();
  if (range.last < 0) range.last = n - 1;
  if (range.first < 0 || range.first > range.last || range.last >= n)
    throw std::out_of_range("Executor: stage [" + std::to_string(range.first) + ", " +
                            std::to_string(range.last) + "] is not a node range of a " +
                            std::to_string(n) + "-node DAG");
  return range;
}

std::vector<at::Tensor> Executor::gather_inputs(int node,
                                                const std::vector<at::Tensor>& graph_inputs,
                                                const std::vector<at::Tensor>& outputs,
                                                bool as_leaves) {
  std::vector<at::Tensor> ins;
  for (const auto& s : dag_.nodes()[node].inputs) {
    if (s.kind == Source::Kind::kGraphInput) {
      if (s.index >= static_cast<int>(graph_inputs.size()))
        throw std::invalid_argument("Executor: node " + dag_.nodes()[node].name +
                                    " reads graph input \"" + dag_.graph_inputs()[s.index] +
                                    "\", which was not handed in");
      ins.push_back(graph_inputs[s.index]);
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

MicroBatch Executor::forward_stage(const std::vector<at::Tensor>& inputs, StageRange range,
                                   const EdgeTensors& incoming, bool for_backward) {
  const int n = dag_.size();
  auto& nodes = dag_.nodes();
  MicroBatch mb;
  mb.range_ = resolve(range);
  const auto [first, last] = mb.range_;
  mb.device_ = input_device(inputs, incoming);
  mb.graph_inputs_ = inputs;
  mb.outputs_.resize(n);
  mb.node_inputs_.resize(n);
  for (int i = first; i <= last; ++i)
    for (const auto& s : nodes[i].inputs) {
      if (s.kind != Source::Kind::kNode || s.index >= first) continue;
      auto it = incoming.find(s.index);
      if (it == incoming.end() || !it->second.defined())
        throw std::invalid_argument("Executor: node " + nodes[i].name + " reads node " +
                                    nodes[s.index].name + ", which is before the stage [" +
                                    std::to_string(first) + ", " + std::to_string(last) +
                                    "] and was not handed in");
      mb.outputs_[s.index] = it->second;
    }

  std::optional<AutocastScope> autocast(std::in_place, mb.device_, options_.autocast);
  for (int i = first; i <= last; ++i) {
    std::vector<at::Tensor> ins =
        gather_inputs(i, inputs, mb.outputs_, /*as_leaves=*/for_backward && !options_.recompute);
    notify_forward(i, ins);
    if (!for_backward) {
      at::NoGradGuard no_grad;
      mb.outputs_[i] = nodes[i].op->forward(ins, params_of(i));
    } else if (options_.recompute) {
      at::NoGradGuard no_grad;
      mb.node_inputs_[i] = std::move(ins);
      mb.outputs_[i] = nodes[i].op->forward(mb.node_inputs_[i], params_of(i));
    } else {
      at::AutoGradMode grad(true);
      mb.node_inputs_[i] = std::move(ins);
      mb.outputs_[i] = nodes[i].op->forward(mb.node_inputs_[i], params_of(i));
    }
    notify(i, Phase::kForward, true);
  }
  autocast.reset();

  // What leaves the stage: outputs read after it, and the loss if the stage ends the DAG.
  for (int j = last + 1; j < n; ++j)
    for (const auto& s : nodes[j].inputs)
      if (s.kind == Source::Kind::kNode && s.index >= first && s.index <= last)
        mb.boundary_[s.index] = mb.outputs_[s.index].detach();
  if (last == n - 1) mb.boundary_[last] = mb.outputs_[last].detach();
  mb.forward_only_ = !for_backward;
  return mb;
}

EdgeTensors Executor::backward_stage(MicroBatch& mb, const EdgeTensors& output_grads) {
  if (mb.forward_only_)
    throw std::logic_error("Executor: this micro-batch ran forward only (for_backward = false)");
  if (mb.done_) throw std::logic_error("Executor: this micro-batch already ran backward");
  mb.done_ = true;
  const int n = dag_.size();
  auto& nodes = dag_.nodes();
  const auto [first, last] = mb.range_;
  std::vector<at::Tensor> grads(n);
  std::vector<bool> owned(n, false);  // whether grads[j] may be added to in place
  for (const auto& [producer, g] : output_grads) {
    if (!mb.boundary_.count(producer))
      throw std::invalid_argument("Executor: a gradient for node " + nodes.at(producer).name +
                                  ", which is not an output of this stage");
    const at::Tensor& out = mb.outputs_[producer];
    grads[producer] = g.sizes() == out.sizes() ? g : g.reshape(out.sizes());
  }

  for (int i = last; i >= first; --i) {
    if (!grads[i].defined()) continue;
    at::Tensor out = mb.outputs_[i];
    std::vector<at::Tensor>& ins = mb.node_inputs_[i];
    if (options_.recompute) {
      notify(i, Phase::kRecompute, false);
      at::AutoGradMode grad(true);
      for (auto& t : ins)
        if (t.defined() && t.is_floating_point()) t = t.detach().requires_grad_(true);
      AutocastScope recompute_autocast(mb.device_, options_.autocast);
      out = nodes[i].op->forward(ins, params_of(i));
      notify(i, Phase::kRecompute, true);
    }
    notify(i, Phase::kBackward, false);
    if (out.requires_grad()) torch::autograd::backward({out}, {grads[i]});
    const auto& sources = nodes[i].inputs;
    for (size_t k = 0; k < sources.size(); ++k) {
      if (sources[k].kind != Source::Kind::kNode || !ins[k].defined()) continue;
      at::Tensor g = ins[k].grad();
      if (!g.defined()) continue;
      const int j = sources[k].index;
      if (!grads[j].defined()) {
        grads[j] = g;
      } else {
        grads[j] = owned[j] ? grads[j].add_(g) : grads[j] + g;
      }
      owned[j] = true;
    }
    // This node is done: drop its activations and edge tensors as early as possible.
    mb.outputs_[i].reset();
    ins.clear();
    grads[i].reset();
    notify(i, Phase::kBackward, true);
  }

  EdgeTensors incoming_grads;
  for (int j = 0; j < first; ++j)
    if (grads[j].defined()) incoming_grads[j] = grads[j];
  mb.outputs_.clear();
  mb.node_inputs_.clear();
  return incoming_grads;
}

at::Tensor Executor::forward_backward(const std::vector<at::Tensor>& inputs, double loss_scale) {
  const int n = dag_.size();
  MicroBatch mb = forward_stage(inputs, {0, n - 1});
  const at::Tensor& out = mb.outputs().at(n - 1);
  if (out.numel() != 1)
    throw std::logic_error("Executor: the last node (" + dag_.nodes()[n - 1].name +
                           ") must be a scalar loss");
  at::Tensor loss = out.reshape({});
  backward_stage(mb, {{n - 1, at::full({}, loss_scale, out.options())}});
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
  AutocastScope autocast(input_device(inputs, {}), options_.autocast);
  std::vector<at::Tensor> outputs(n);
  for (int i = 0; i <= last; ++i) {
    const std::vector<at::Tensor> ins = gather_inputs(i, inputs, outputs, /*as_leaves=*/false);
    notify_forward(i, ins);
    outputs[i] = nodes[i].op->forward(ins, params_of(i));
    notify(i, Phase::kForward, true);
    for (const auto& s : nodes[i].inputs)
      if (s.kind == Source::Kind::kNode && last_use[s.index] == i && s.index != last)
        outputs[s.index].reset();
  }
  return outputs[last];
}

at::Tensor Executor::forward_cached(const std::vector<at::Tensor>& inputs, DecodeCache& cache,
                                    int last) {
  const int n = dag_.size();
  if (last < 0 || last >= n)
    throw std::out_of_range("Executor::forward_cached: node index out of range");
  auto& nodes = dag_.nodes();
  cache.state_.resize(static_cast<size_t>(n));
  at::NoGradGuard no_grad;
  AutocastScope autocast(input_device(inputs, {}), options_.autocast);
  std::vector<at::Tensor> outputs(n);
  int64_t t = -1;
  for (int i = 0; i <= last; ++i) {
    const auto ins = gather_inputs(i, inputs, outputs, /*as_leaves=*/false);
    notify_forward(i, ins);
    if (t < 0 && !ins.empty() && ins[0].dim() >= 2) t = ins[0].size(1);
    outputs[i] = nodes[i].op->forward_cached(ins, params_of(i), cache.position_,
                                             cache.state_[static_cast<size_t>(i)]);
    notify(i, Phase::kForward, true);
  }
  cache.position_ += t;
  return outputs[last];
}

}  // namespace starling::graph
