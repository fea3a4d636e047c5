// OpDag: operators as nodes, tensors as edges. Each node's inputs are either graph inputs
// (e.g. "tokens", "targets") or the output of an earlier node, so node order is a topological
// order by construction. The last node is the loss.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "starling/graph/op.h"
#include "starling/graph/param_store.h"

namespace starling::graph {

// Where a node input comes from.
struct Source {
  enum class Kind { kGraphInput, kNode } kind;
  int index;  // graph input index or node index
};

// A parameter that more than one node reads (GPT-2's token embedding: the embedding and the
// head). Its gradient is the sum over its readers, so stages that split them must add theirs.
struct TiedParam {
  std::string name;
  std::vector<int> nodes;  // readers, in node order
};

struct Node {
  std::string name;  // e.g. "layers.3.attn"
  std::unique_ptr<Op> op;
  std::vector<Source> inputs;
};

class OpDag {
 public:
  explicit OpDag(std::vector<std::string> graph_inputs) : graph_inputs_(std::move(graph_inputs)) {}

  // Appends a node; its sources must already exist. Returns the node index.
  int add_node(std::string name, std::unique_ptr<Op> op, std::vector<Source> inputs);

  const std::vector<std::string>& graph_inputs() const { return graph_inputs_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  std::vector<Node>& nodes() { return nodes_; }
  int size() const { return static_cast<int>(nodes_.size()); }
  // Index of the node with that name, or -1.
  int find(const std::string& name) const;

  ParamStore& params() { return params_; }
  const ParamStore& params() const { return params_; }

  // Bytes of the parameters a node reads (a shared parameter counts for each reader).
  int64_t node_param_bytes(int node) const;
  // Every parameter read by more than one node.
  std::vector<TiedParam> tied_params() const;
  // The parameters (ParamStore indices) cut into one piece per node, by the node that reads each
  // first: pieces in node order, indices ascending within each, nodes that read no parameter of
  // their own left out. The same on every replica of the model, whatever its memory or plan: the
  // pieces in which peers that exchange gradients a piece at a time agree (StepRunner).
  std::vector<std::vector<int>> params_by_first_reader() const;

  // One line per node: name, kind, inputs, output shape, parameter bytes, GFLOPs per token.
  std::string describe(int64_t batch, int64_t seq_len) const;

 private:
  std::vector<std::string> graph_inputs_;
  std::vector<Node> nodes_;
  ParamStore params_;
};

}  // namespace starling::graph
