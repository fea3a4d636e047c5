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

  // Each parameter's readers, the parameters in the order the nodes first read them.
  std::vector<std::string> order;
  std::map<std::string, std::set<int>> readers;
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
    for (const auto& name : nodes[static_cast<size_t>(i)].op->param_names()) {
      auto& r = readers[name];
      if (r.empty()) order.push_back(name);
      r.insert(s);
    }
  }

  for (size_t id = 0; id < order.size(); ++id) {
    const std::string& name = order[id];
    const std::set<int>& r = readers.at(name);
    for (const int s : r) {
      auto& own = stages_[static_cast<size_t>(s)].params;
      if (std::find(own.begin(), own.end(), name) == own.end()) own.push_back(name);
    }
    first_reader_[name] = *r.begin();
    if (r.size() > 1)
      shared_.push_back({name, static_cast<int>(id), std::vector<int>(r.begin(), r.end())});
  }
  for (auto& st : stages_)
    for (auto& [producer, to] : st.sends) std::sort(to.begin(), to.end());
}

bool PipelineLayout::counts_in_norm(int s, const std::string& name) const {
  const auto it = first_reader_.find(name);
  return it != first_reader_.end() && it->second == s;
}

}  // namespace starling::strategy
