#include "starling/graph/dag.h"

#include <algorithm>
#include <cstdio>
#include <sstream>
#include <stdexcept>
#include <unordered_map>

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

std::vector<std::vector<int>> OpDag::params_by_first_reader() const {
  std::unordered_map<std::string, int> index;
  for (size_t p = 0; p < params_.params().size(); ++p)
    index.emplace(params_.params()[p].name, static_cast<int>(p));
  std::vector<int> owner(params_.params().size(), -1);
  for (int i = 0; i < size(); ++i)
    for (const auto& name : nodes_[i].op->param_names())
      if (auto it = index.find(name); it != index.end() && owner[it->second] < 0)
        owner[it->second] = i;
  std::vector<std::vector<int>> pieces(static_cast<size_t>(std::max(size(), 1)));
  // A parameter no node reads (none in the presets) goes with the first node's.
  for (size_t p = 0; p < owner.size(); ++p)
    pieces[static_cast<size_t>(std::max(owner[p], 0))].push_back(static_cast<int>(p));
  std::erase_if(pieces, [](const std::vector<int>& piece) { return piece.empty(); });
  return pieces;
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
