#include "starling/strategy/pipeline_layout.h"

#include <algorithm>
#include <set>
#include <stdexcept>
#include <string>

namespace starling::strategy {

PipelineLayout::PipelineLayout(const graph::OpDag& dag,
                               const std::vector<std::pair<int, int>>& ranges) {
  const int n = dag.size();
  if (ranges.empty() || ranges.front().first != 0 || ranges.back().second != n - 1)
    throw std::invalid_argument("pipeline stages must cover nodes 0 .. " + std::to_string(n - 1));
  std::vector<int> stage_of(static_cast<size_t>(n), -1);
  for (size_t s = 0; s < ranges.size(); ++s) {
    const auto [first, last] = ranges[s];
    if (last < first || (s > 0 && first != ranges[s - 1].second + 1))
      throw std::invalid_argument("pipeline stage " + std::to_string(s) + " [" +
                                  std::to_string(first) + ", " + std::to_string(last) +
                                  "] does not continue the previous one");
    for (int i = first; i <= last; ++i) stage_of[static_cast<size_t>(i)] = static_cast<int>(s);
    stages_.push_back({.range = {first, last}});
  }
  loss_node_ = n - 1;

  std::map<std::string, int> param_index;
  const auto& params = dag.params().params();
  for (size_t i = 0; i < params.size(); ++i) param_index[params[i].name] = static_cast<int>(i);
  std::vector<std::set<int>> readers(params.size());

  const auto& nodes = dag.nodes();
  for (int i = 0; i < n; ++i) {
    const int s = stage_of[static_cast<size_t>(i)];
    for (const auto& src : nodes[static_cast<size_t>(i)].inputs) {
      if (src.kind != graph::Source::Kind::kNode) continue;
      const int from = stage_of[static_cast<size_t>(src.index)];
      if (from == s) continue;
      stages_[static_cast<size_t>(s)].receives[src.index] = from;
      auto& to = stages_[static_cast<size_t>(from)].sends[src.index];
      if (std::find(to.begin(), to.end(), s) == to.end()) to.push_back(s);
    }
    for (const auto& name : nodes[static_cast<size_t>(i)].op->param_names())
      readers[static_cast<size_t>(param_index.at(name))].insert(s);
  }

  first_reader_.assign(params.size(), -1);
  for (size_t p = 0; p < params.size(); ++p) {
    for (const int s : readers[p])
      stages_[static_cast<size_t>(s)].params.push_back(static_cast<int>(p));
    if (!readers[p].empty()) first_reader_[p] = *readers[p].begin();
    if (readers[p].size() > 1)
      shared_.push_back(
          {static_cast<int>(p), std::vector<int>(readers[p].begin(), readers[p].end())});
  }
  for (auto& st : stages_)
    for (auto& [producer, to] : st.sends) std::sort(to.begin(), to.end());
}

bool PipelineLayout::counts_in_norm(int s, int param) const {
  return first_reader_.at(static_cast<size_t>(param)) == s;
}

}  // namespace starling::strategy
