// Where a pipeline's tensors go: for a model's OP-DAG cut into contiguous stages, which activations
// each stage receives from which earlier stage (and sends the gradients of back), which of its
// outputs it sends to which later stages, which parameters it owns, and which parameters several
// stages read (GPT-2's tied embedding and head), whose gradients those stages must add up.
// Pure bookkeeping over the DAG's nodes: parameters go by name, so it is the same on every stage
// whichever part of the model the stage's ParamStore holds. pipeline_runner.h moves the tensors.
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "starling/graph/dag.h"
#include "starling/graph/executor.h"

namespace starling::strategy {

struct StageLayout {
  graph::StageRange range;
  // Producer node -> the earlier stage that computes it, for every activation this stage reads
  // from before its range (what it receives forward and sends gradients back for).
  std::map<int, int> receives;
  // Producer node in this stage -> the later stages reading it (what it sends forward and
  // receives gradients from); the last stage's loss is not in here.
  std::map<int, std::vector<int>> sends;
  // Names of the parameters this stage's nodes read, in the order the nodes first read them.
  std::vector<std::string> params;
};

// A parameter read by nodes of more than one stage: its gradient is the sum of theirs.
struct SharedParam {
  std::string name;
  int id = 0;               // its place among the model's parameters in node order (a message tag)
  std::vector<int> stages;  // the stages reading it, ascending; the first one counts it in norms
};

class PipelineLayout {
 public:
  // `ranges` are [first, last] node ranges covering the DAG in order (pipeline_config.h checks
  // that); std::invalid_argument otherwise.
  PipelineLayout(const graph::OpDag& dag, const std::vector<std::pair<int, int>>& ranges);

  int stages() const { return static_cast<int>(stages_.size()); }
  const StageLayout& stage(int s) const { return stages_.at(static_cast<size_t>(s)); }
  // Index of the node whose output is the loss (the last node, on the last stage).
  int loss_node() const { return loss_node_; }
  const std::vector<SharedParam>& shared() const { return shared_; }
  // Whether stage `s` counts parameter `name` in the global gradient norm (it reads it, and no
  // earlier stage does).
  bool counts_in_norm(int s, const std::string& name) const;

 private:
  std::vector<StageLayout> stages_;
  std::vector<SharedParam> shared_;
  std::map<std::string, int> first_reader_;  // per parameter: the first stage reading it
  int loss_node_ = 0;
};

}  // namespace starling::strategy
