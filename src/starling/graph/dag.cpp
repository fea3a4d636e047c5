#include "starling/graph/dag.h"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <stdexcept>

namespace starling::graph {

int OpDag::add_node(std::string name, std::unique_ptr<Op> op, std::vector<Source> inputs) {
  for (const auto& s : inputs) {
    const int limit =
        s.kind == Source::Kind::kNode ? size() : static_cast<int>(graph_inputs_.size());
    if (s.index < 0 || s.index >= limit)
      throw std::logic_error("node " + name + ": input refers to a source that does not exist yet");
  }
  nodes_.push_back(Node{std::move(name), std::move(op), std::move(inputs)});
  return size() - 1;
}

int OpDag::find(const std::string& name) const {
  for (int i = 0; i < size(); ++i)
    if (nodes_[i].name == name) return i;
  return -1;
}

int64_t OpDag::node_param_bytes(int node) const {
  int64_t bytes = 0;
  for (const auto& n : nodes_[node].op->param_names()) {
    const auto& t = params_.get(n).value;
    bytes += t.numel() * static_cast<int64_t>(t.element_size());
  }
  return bytes;
}

std::vector<TiedParam> OpDag::tied_params() const {
  std::vector<TiedParam> readers;
  for (int i = 0; i < size(); ++i)
    for (const auto& name : nodes_[i].op->param_names()) {
      auto it = std::find_if(readers.begin(), readers.end(),
                             [&](const TiedParam& t) { return t.name == name; });
      if (it == readers.end()) {
        readers.push_back({name, {i}});
      } else if (it->nodes.back() != i) {
        it->nodes.push_back(i);
      }
    }
  std::vector<TiedParam> tied;
  for (auto& t : readers)
    if (t.nodes.size() > 1) tied.push_back(std::move(t));
  return tied;
}

std::string OpDag::describe(int64_t batch, int64_t seq_len) const {
  std::ostringstream out;
  char line[256];
  std::snprintf(line, sizeof line, "%-4s %-18s %-10s %-22s %-18s %12s %12s\n", "#", "node", "kind",
                "inputs", "output", "param MB", "MFLOP/tok");
  out << line;
  for (int i = 0; i < size(); ++i) {
    const auto& n = nodes_[i];
    std::string ins, shape;
    for (const auto& s : n.inputs) {
      if (!ins.empty()) ins += ",";
      // Appended piece by piece: GCC 12 warns falsely on "#" + std::string (-Wstringop-overflow).
      if (s.kind == Source::Kind::kNode)
        ins.append("#").append(std::to_string(s.index));
      else
        ins += graph_inputs_[s.index];
    }
    for (auto d : n.op->output_shape(batch, seq_len))
      shape.append(shape.empty() ? "[" : "x").append(std::to_string(d));
    shape += shape.empty() ? "[]" : "]";
    std::snprintf(line, sizeof line, "%-4d %-18s %-10s %-22s %-18s %12.3f %12.3f\n", i,
                  n.name.c_str(), n.op->kind().c_str(), ins.c_str(), shape.c_str(),
                  node_param_bytes(i) / 1e6, n.op->forward_flops_per_token(seq_len) / 1e6);
    out << line;
  }
  return out.str();
}

}  // namespace starling::graph
