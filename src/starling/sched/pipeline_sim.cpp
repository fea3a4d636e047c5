#include "starling/sched/pipeline_sim.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "starling/sched/op_fence.h"

namespace starling::sched {
namespace {

struct Op {
  bool forward;
  int micro;
};

// The order stage `s` of `stages` runs its micro-batches in: PipelineStepRunner::run's.
std::vector<Op> stage_order(const CostTable& t, int s, int stages) {
  const int m_count = static_cast<int>(t.micro_batches);
  std::vector<Op> ops;
  if (!t.one_f_one_b) {
    for (int m = 0; m < m_count; ++m) ops.push_back({true, m});
    for (int m = 0; m < m_count; ++m) ops.push_back({false, m});
    return ops;
  }
  const int64_t extra = s < stages - 1 ? t.extra_warmup : 0;
  const int warm = static_cast<int>(std::min<int64_t>(stages - 1 - s + extra, m_count));
  for (int m = 0; m < warm; ++m) ops.push_back({true, m});
  for (int m = warm; m < m_count; ++m) {
    ops.push_back({true, m});
    ops.push_back({false, m - warm});
  }
  for (int m = m_count - warm; m < m_count; ++m) ops.push_back({false, m});
  return ops;
}

// A path one stage sends on, one tensor at a time: a link in one direction, and the sending
// device's upload where it has one.
struct Channel {
  double free_at = 0;
};

}  // namespace

double simulate_step(const CostTable& t, const PipelinePlan& plan) {
  const int stages = static_cast<int>(plan.stages.size());
  if (stages == 0) throw std::invalid_argument("simulate_step: a plan without stages");
  const int m_count = static_cast<int>(t.micro_batches);
  std::vector<double> fwd(static_cast<size_t>(stages), 0), bwd(static_cast<size_t>(stages), 0);
  for (int s = 0; s < stages; ++s) {
    const StagePlan& st = plan.stages[static_cast<size_t>(s)];
    if (st.first < (s > 0 ? 1 : 0) || st.last < st.first ||
        st.last >= static_cast<int>(t.nodes.size()) || st.device < 0 ||
        st.device >= static_cast<int>(t.devices.size()))
      throw std::invalid_argument("simulate_step: stage " + std::to_string(s) +
                                  " names nodes or a device the table does not have");
    const double speed = t.devices[static_cast<size_t>(st.device)].speed;
    for (int i = st.first; i <= st.last; ++i) {
      const double f = t.forward_s(static_cast<size_t>(i));
      fwd[static_cast<size_t>(s)] += f / speed;
      bwd[static_cast<size_t>(s)] += (t.nodes[static_cast<size_t>(i)].compute_s - f) / speed;
    }
  }

  // Channels: forward_link[s] from stage s to s + 1, backward_link[s] from s + 1 to s, and the
  // upload and download of stage s's device (used only where it has them: a star's).
  std::vector<Channel> forward_link(static_cast<size_t>(stages)),
      backward_link(static_cast<size_t>(stages)), upload(static_cast<size_t>(stages)),
      download(static_cast<size_t>(stages));
  // Tensors are queued in the order they become ready (see the loop below). A tensor starts when
  // it is ready and every channel on its path is free, and holds them all for as long as the
  // slowest takes.
  auto send = [&](int from, int to, int64_t bytes, double ready) {
    const auto& a = plan.stages[static_cast<size_t>(from)];
    const auto& b = plan.stages[static_cast<size_t>(to)];
    const LinkCost l = t.link(static_cast<size_t>(a.device), static_cast<size_t>(b.device));
    std::vector<std::pair<Channel*, double>> path = {{to > from
                                                          ? &forward_link[static_cast<size_t>(from)]
                                                          : &backward_link[static_cast<size_t>(to)],
                                                      l.bytes_per_s}};
    if (const double up = t.devices[static_cast<size_t>(a.device)].egress_bytes_per_s; up > 0)
      path.emplace_back(&upload[static_cast<size_t>(from)], up);
    if (const double down = t.devices[static_cast<size_t>(b.device)].ingress_bytes_per_s; down > 0)
      path.emplace_back(&download[static_cast<size_t>(to)], down);
    double start = ready, takes = 0;
    for (const auto& [channel, rate] : path) {
      start = std::max(start, channel->free_at);
      takes = std::max(takes, static_cast<double>(bytes) / rate);
    }
    for (const auto& [channel, rate] : path) channel->free_at = start + takes;
    return start + takes + l.latency_s;
  };

  // When each micro-batch's activations (from stage s - 1) and gradients (from stage s + 1)
  // arrive at stage s; < 0 while unknown.
  using Times = std::vector<std::vector<double>>;
  Times activations(static_cast<size_t>(stages),
                    std::vector<double>(static_cast<size_t>(m_count), -1));
  Times gradients(static_cast<size_t>(stages),
                  std::vector<double>(static_cast<size_t>(m_count), -1));
  std::fill(activations[0].begin(), activations[0].end(), 0.0);      // the first stage reads tokens
  std::fill(gradients.back().begin(), gradients.back().end(), 0.0);  // the last has its loss

  std::vector<std::vector<Op>> order;
  for (int s = 0; s < stages; ++s) order.push_back(stage_order(t, s, stages));
  std::vector<size_t> next(static_cast<size_t>(stages), 0);
  std::vector<double> clock(static_cast<size_t>(stages), 0);
  size_t left = 0;
  for (const auto& ops : order) left += ops.size();
  // Operations run in the order they end: each time, of the stages whose next operation has its
  // input, the one that would finish first. An operation that becomes runnable later ends later
  // (its input leaves after the operation that sends it), so every channel receives its tensors
  // in the order they become ready, from one stage or two.
  const auto duration = [&](size_t s, const Op& op) { return op.forward ? fwd[s] : bwd[s]; };
  while (left > 0) {
    int best = -1;
    double best_end = 0;
    for (int s = 0; s < stages; ++s) {
      const auto su = static_cast<size_t>(s);
      if (next[su] == order[su].size()) continue;
      const Op op = order[su][next[su]];
      const auto mu = static_cast<size_t>(op.micro);
      const double ready = op.forward ? activations[su][mu] : gradients[su][mu];
      if (ready < 0) continue;
      const double end = std::max(clock[su], ready) + duration(su, op);
      if (best < 0 || end < best_end) {
        best = s;
        best_end = end;
      }
    }
    if (best < 0) throw std::logic_error("simulate_step: the schedule deadlocked");
    const auto su = static_cast<size_t>(best);
    const Op op = order[su][next[su]++];
    const auto mu = static_cast<size_t>(op.micro);
    clock[su] = best_end;
    --left;
    const StagePlan& st = plan.stages[su];
    if (op.forward && best + 1 < stages)
      activations[su + 1][mu] =
          send(best, best + 1, t.nodes[static_cast<size_t>(st.last)].cut_bytes, best_end);
    if (!op.forward && best > 0)
      gradients[su - 1][mu] =
          send(best, best - 1, t.nodes[static_cast<size_t>(st.first) - 1].cut_bytes, best_end);
  }
  return *std::max_element(clock.begin(), clock.end());
}

}  // namespace starling::sched
