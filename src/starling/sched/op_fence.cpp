#include "starling/sched/op_fence.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <set>
#include <stdexcept>
#include <string>

#include "starling/sched/pipeline_sim.h"

namespace starling::sched {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The link after the node `last` between devices a and b, per micro-batch and direction.
double link_time(const CostTable& t, int last, int a, int b) {
  const LinkCost l = t.link(static_cast<size_t>(a), static_cast<size_t>(b));
  return static_cast<double>(t.nodes[static_cast<size_t>(last)].cut_bytes) / l.bytes_per_s +
         l.latency_s;
}

// What stage `s` of `stages` on device `d` sends through the device's one upload per micro-batch,
// when it starts after node first - 1 and ends at node last: the gradient of its input back
// (not the first stage) and its output forward (not the last). 0 without an upload of its own.
double egress_time(const CostTable& t, int d, int s, int stages, int first, int last) {
  const double rate = t.devices[static_cast<size_t>(d)].egress_bytes_per_s;
  if (rate <= 0) return 0;
  double bytes = 0;
  if (s > 0) bytes += static_cast<double>(t.nodes[static_cast<size_t>(first) - 1].cut_bytes);
  if (s + 1 < stages) bytes += static_cast<double>(t.nodes[static_cast<size_t>(last)].cut_bytes);
  return bytes / rate;
}

int find(std::vector<int>& parent, int x) {
  while (parent[static_cast<size_t>(x)] != x) {
    parent[static_cast<size_t>(x)] = parent[static_cast<size_t>(parent[static_cast<size_t>(x)])];
    x = parent[static_cast<size_t>(x)];
  }
  return x;
}

// The fastest link between two groups.
double join(const CostTable& t, const std::vector<int>& x, const std::vector<int>& y) {
  double best = 0;
  for (const int a : x)
    for (const int b : y)
      best = std::max(best, t.link(static_cast<size_t>(a), static_cast<size_t>(b)).bytes_per_s);
  return best;
}

// Whether order `a` of groups beats order `b`: a faster slowest join, then a faster sum of joins.
bool better(const std::pair<double, double>& a, const std::pair<double, double>& b) {
  return a.first > b.first || (a.first == b.first && a.second > b.second);
}

std::pair<double, double> joins(const std::vector<std::vector<double>>& j,
                                const std::vector<int>& order) {
  double slowest = kInf, sum = 0;
  for (size_t i = 0; i + 1 < order.size(); ++i) {
    const double v = j[static_cast<size_t>(order[i])][static_cast<size_t>(order[i + 1])];
    slowest = std::min(slowest, v);
    sum += v;
  }
  return {slowest, sum};
}

}  // namespace

std::vector<std::vector<int>> cluster_devices(const CostTable& t, double gap) {
  t.validate();
  const int n = static_cast<int>(t.devices.size());
  std::vector<double> rates;
  for (int a = 0; a < n; ++a)
    for (int b = a + 1; b < n; ++b)
      rates.push_back(t.link(static_cast<size_t>(a), static_cast<size_t>(b)).bytes_per_s);
  std::sort(rates.begin(), rates.end());
  // The largest ratio between consecutive bandwidths splits slow links from fast ones.
  double threshold = 0, widest = 1;
  for (size_t i = 0; i + 1 < rates.size(); ++i) {
    const double ratio = rates[i + 1] / rates[i];
    if (ratio > widest) {
      widest = ratio;
      threshold = std::sqrt(rates[i] * rates[i + 1]);
    }
  }
  if (widest < gap) threshold = 0;
  std::vector<int> parent(static_cast<size_t>(n));
  std::iota(parent.begin(), parent.end(), 0);
  for (int a = 0; a < n; ++a)
    for (int b = a + 1; b < n; ++b)
      if (t.link(static_cast<size_t>(a), static_cast<size_t>(b)).bytes_per_s >= threshold)
        parent[static_cast<size_t>(find(parent, a))] = find(parent, b);
  std::vector<std::vector<int>> groups;
  std::vector<int> group_of(static_cast<size_t>(n), -1);
  for (int d = 0; d < n; ++d) {
    const int root = find(parent, d);
    if (group_of[static_cast<size_t>(root)] < 0) {
      group_of[static_cast<size_t>(root)] = static_cast<int>(groups.size());
      groups.emplace_back();
    }
    groups[static_cast<size_t>(group_of[static_cast<size_t>(root)])].push_back(d);
  }
  return groups;
}

std::vector<int> device_chain(const CostTable& t, const std::vector<std::vector<int>>& clusters) {
  const size_t m = clusters.size();
  std::vector<std::vector<double>> j(m, std::vector<double>(m, 0));
  for (size_t x = 0; x < m; ++x)
    for (size_t y = 0; y < m; ++y)
      if (x != y) j[x][y] = join(t, clusters[x], clusters[y]);
  std::vector<int> order(m);
  std::iota(order.begin(), order.end(), 0);
  if (m <= 8) {
    std::vector<int> best = order, perm = order;
    do {
      if (better(joins(j, perm), joins(j, best))) best = perm;
    } while (std::next_permutation(perm.begin(), perm.end()));
    order = best;
  } else {
    std::vector<bool> used(m, false);
    order = {0};
    used[0] = true;
    while (order.size() < m) {
      int next = -1;
      for (size_t y = 0; y < m; ++y)
        if (!used[y] &&
            (next < 0 || j[static_cast<size_t>(order.back())][y] >
                             j[static_cast<size_t>(order.back())][static_cast<size_t>(next)]))
          next = static_cast<int>(y);
      used[static_cast<size_t>(next)] = true;
      order.push_back(next);
    }
  }
  // Within each group, the order whose slowest link is fastest, then the fastest sum: all orders
  // for up to 8 devices. The links counted are the join from the previous group and the way out
  // to the next group, at its best (the next group is entered where the last device has its
  // fastest link): a group that ended at a device poorly linked to the next would put that link
  // into the chain although another order of the same group avoids it. Larger groups: entered at
  // the device with the fastest link from the previous group, the others ascending.
  std::vector<int> chain;
  auto rate = [&](int a, int b) {
    return t.link(static_cast<size_t>(a), static_cast<size_t>(b)).bytes_per_s;
  };
  for (size_t i = 0; i < m; ++i) {
    std::vector<int> g = clusters[static_cast<size_t>(order[i])];
    const std::vector<int>* next =
        i + 1 < m ? &clusters[static_cast<size_t>(order[i + 1])] : nullptr;
    auto score = [&](const std::vector<int>& seq) {
      double slowest = kInf, sum = 0;
      auto count = [&](double r) {
        slowest = std::min(slowest, r);
        sum += r;
      };
      for (size_t k = 0; k < seq.size(); ++k)
        if (k > 0 || !chain.empty()) count(rate(k == 0 ? chain.back() : seq[k - 1], seq[k]));
      if (next != nullptr) {
        double out = 0;
        for (const int d : *next) out = std::max(out, rate(seq.back(), d));
        count(out);
      }
      return std::pair{slowest, sum};
    };
    std::vector<int> best = g;
    if (g.size() <= 8) {
      std::vector<int> perm = g;
      std::sort(perm.begin(), perm.end());
      best = perm;
      while (std::next_permutation(perm.begin(), perm.end()))
        if (better(score(perm), score(best))) best = perm;
    } else if (!chain.empty()) {
      const auto entry = std::max_element(g.begin(), g.end(), [&](int a, int b) {
        return rate(chain.back(), a) < rate(chain.back(), b);
      });
      std::rotate(g.begin(), entry, entry + 1);
      best = g;
    }
    chain.insert(chain.end(), best.begin(), best.end());
  }
  return chain;
}

void price(const CostTable& t, PipelinePlan& plan) {
  std::vector<double> prefix(t.nodes.size() + 1, 0);
  for (size_t i = 0; i < t.nodes.size(); ++i) prefix[i + 1] = prefix[i] + t.nodes[i].compute_s;
  double sum = 0, slowest = 0;
  for (size_t s = 0; s < plan.stages.size(); ++s) {
    StagePlan& st = plan.stages[s];
    st.compute_s =
        (prefix[static_cast<size_t>(st.last) + 1] - prefix[static_cast<size_t>(st.first)]) /
        t.devices[static_cast<size_t>(st.device)].speed;
    st.link_s = s + 1 < plan.stages.size()
                    ? link_time(t, st.last, st.device, plan.stages[s + 1].device)
                    : 0;
    st.egress_s = egress_time(t, st.device, static_cast<int>(s),
                              static_cast<int>(plan.stages.size()), st.first, st.last);
    sum += st.compute_s + 2 * st.link_s;
    slowest = std::max({slowest, st.compute_s, st.link_s, st.egress_s});
  }
  plan.bottleneck_s = slowest;
  plan.steady_step_s = sum + static_cast<double>(t.micro_batches - 1) * slowest;
  plan.step_s = simulate_step(t, plan);
}

PipelinePlan cut_pipeline(const CostTable& t, const std::vector<int>& chain) {
  t.validate();
  const int n = static_cast<int>(t.nodes.size());
  const int k = static_cast<int>(chain.size());
  if (k == 0 || k > n)
    throw std::invalid_argument("cut_pipeline: " + std::to_string(k) + " stages for " +
                                std::to_string(n) + " nodes");
  if (std::set<int>(chain.begin(), chain.end()).size() != chain.size())
    throw std::invalid_argument("cut_pipeline: a device appears twice in the chain");
  for (const int d : chain)
    if (d < 0 || d >= static_cast<int>(t.devices.size()))
      throw std::invalid_argument("cut_pipeline: no device " + std::to_string(d));
  std::vector<double> prefix(static_cast<size_t>(n) + 1, 0);
  for (int i = 0; i < n; ++i)
    prefix[static_cast<size_t>(i) + 1] =
        prefix[static_cast<size_t>(i)] + t.nodes[static_cast<size_t>(i)].compute_s;
  // Stage s on chain[s] takes nodes [j, i).
  auto stage = [&](int s, int j, int i) {
    return (prefix[static_cast<size_t>(i)] - prefix[static_cast<size_t>(j)]) /
           t.devices[static_cast<size_t>(chain[static_cast<size_t>(s)])].speed;
  };
  // The link between stage s - 1 and s when stage s starts at node j.
  auto link = [&](int s, int j) {
    return link_time(t, j - 1, chain[static_cast<size_t>(s) - 1], chain[static_cast<size_t>(s)]);
  };
  // Stage s on nodes [j, i): its compute, and its upload's time where its device has one of its
  // own. Both cuts of the stage are known here, so the cut stays exact.
  auto part = [&](int s, int j, int i) {
    return std::max(stage(s, j, i), egress_time(t, chain[static_cast<size_t>(s)], s, k, j, i - 1));
  };
  using Table = std::vector<std::vector<double>>;
  const size_t rows = static_cast<size_t>(k), cols = static_cast<size_t>(n) + 1;

  // 1. The smallest possible slowest part: worst[s][i] for nodes [0, i) on stages 0..s.
  Table worst(rows, std::vector<double>(cols, kInf));
  for (int i = 1; i <= n; ++i) worst[0][static_cast<size_t>(i)] = part(0, 0, i);
  for (int s = 1; s < k; ++s)
    for (int i = s + 1; i <= n; ++i)
      for (int j = s; j < i; ++j)
        worst[static_cast<size_t>(s)][static_cast<size_t>(i)] =
            std::min(worst[static_cast<size_t>(s)][static_cast<size_t>(i)],
                     std::max({worst[static_cast<size_t>(s) - 1][static_cast<size_t>(j)],
                               link(s, j), part(s, j, i)}));
  const double bound = worst[rows - 1][cols - 1];
  const double limit = bound * (1 + 1e-12) + 1e-300;

  // 2. Among the cuts whose every part fits under that bound, the smallest sum of stages and
  // links (both directions), remembering where each stage starts.
  Table sum(rows, std::vector<double>(cols, kInf));
  std::vector<std::vector<int>> start(rows, std::vector<int>(cols, -1));
  for (int i = 1; i <= n; ++i)
    if (const double c = stage(0, 0, i); part(0, 0, i) <= limit) {
      sum[0][static_cast<size_t>(i)] = c;
      start[0][static_cast<size_t>(i)] = 0;
    }
  for (int s = 1; s < k; ++s)
    for (int i = s + 1; i <= n; ++i)
      for (int j = s; j < i; ++j) {
        const double before = sum[static_cast<size_t>(s) - 1][static_cast<size_t>(j)];
        const double l = link(s, j), c = stage(s, j, i);
        if (before == kInf || l > limit || part(s, j, i) > limit) continue;
        if (const double v = before + 2 * l + c;
            v < sum[static_cast<size_t>(s)][static_cast<size_t>(i)]) {
          sum[static_cast<size_t>(s)][static_cast<size_t>(i)] = v;
          start[static_cast<size_t>(s)][static_cast<size_t>(i)] = j;
        }
      }
  PipelinePlan plan;
  plan.stages.resize(rows);
  for (int s = k - 1, i = n; s >= 0; --s) {
    const int j = start[static_cast<size_t>(s)][static_cast<size_t>(i)];
    plan.stages[static_cast<size_t>(s)] = {
        .first = j, .last = i - 1, .device = chain[static_cast<size_t>(s)]};
    i = j;
  }
  price(t, plan);
  return plan;
}

PipelinePlan uniform_pipeline(const CostTable& t, const std::vector<int>& chain) {
  const int n = static_cast<int>(t.nodes.size()), k = static_cast<int>(chain.size());
  if (k == 0 || k > n) throw std::invalid_argument("uniform_pipeline: more stages than nodes");
  PipelinePlan plan;
  int first = 0;
  for (int s = 0; s < k; ++s) {
    const int count = n / k + (s < n % k ? 1 : 0);
    plan.stages.push_back(
        {.first = first, .last = first + count - 1, .device = chain[static_cast<size_t>(s)]});
    first += count;
  }
  price(t, plan);
  return plan;
}

PipelinePlan op_fence(const CostTable& t, double gap) {
  const std::vector<int> chain = device_chain(t, cluster_devices(t, gap));
  const int n = static_cast<int>(t.nodes.size());
  PipelinePlan best;
  best.step_s = kInf;
  for (size_t len = 1; len <= chain.size() && static_cast<int>(len) <= n; ++len)
    for (size_t from = 0; from + len <= chain.size(); ++from) {
      const std::vector<int> window(chain.begin() + static_cast<std::ptrdiff_t>(from),
                                    chain.begin() + static_cast<std::ptrdiff_t>(from + len));
      PipelinePlan p = cut_pipeline(t, window);
      if (p.step_s < best.step_s) best = std::move(p);
    }
  return best;
}

namespace {

// The replicated plan's step from its slowest pipeline's and the averaging's time.
void set_step(const CostTable& t, ReplicatedPlan& p, double slowest_step, const ReplicaSync& sync) {
  const double per_step = p.averaging_s / sync.every_steps;
  // Overlapped, a round of `every_steps` steps takes the longer of its computation and its
  // averaging; otherwise the averaging comes on top.
  p.step_s = sync.overlapped ? std::max(slowest_step, per_step) : slowest_step + per_step;
  p.sync_s = p.step_s - slowest_step;
  p.micro_batches_per_s = p.replicas * static_cast<double>(t.micro_batches) / p.step_s;
}

// One stage count and one orientation of each replica's window of the chain, planned and priced.
ReplicatedPlan plan_windows(const CostTable& t, const std::vector<int>& chain, int stages,
                            unsigned flipped, const ReplicaSync& sync) {
  const int replicas = static_cast<int>(chain.size()) / stages;
  auto device = [&](int r, int s) {
    const int at = (flipped >> r & 1u) != 0 ? stages - 1 - s : s;
    return chain[static_cast<size_t>(r * stages + at)];
  };
  // The chain of slowest counterparts: device s is stage s's slowest device over the replicas,
  // link s -> s+1 the slowest of the replicas' links between stages s and s+1.
  CostTable v;
  v.nodes = t.nodes;
  v.micro_batches = t.micro_batches;
  v.one_f_one_b = t.one_f_one_b;
  v.extra_warmup = t.extra_warmup;
  v.links.assign(static_cast<size_t>(stages),
                 std::vector<LinkCost>(static_cast<size_t>(stages), {kUnshapedBytesPerS, 0}));
  for (int s = 0; s < stages; ++s) {
    double speed = kInf, egress = 0;  // the slowest upload of one (0: none has one)
    for (int r = 0; r < replicas; ++r) {
      const DeviceCost& d = t.devices[static_cast<size_t>(device(r, s))];
      speed = std::min(speed, d.speed);
      if (d.egress_bytes_per_s > 0)
        egress = egress > 0 ? std::min(egress, d.egress_bytes_per_s) : d.egress_bytes_per_s;
    }
    v.devices.push_back(
        {.name = "stage " + std::to_string(s), .speed = speed, .egress_bytes_per_s = egress});
    if (s + 1 == stages) continue;
    LinkCost slowest{kInf, 0};
    for (int r = 0; r < replicas; ++r) {
      const LinkCost l =
          t.link(static_cast<size_t>(device(r, s)), static_cast<size_t>(device(r, s + 1)));
      slowest.bytes_per_s = std::min(slowest.bytes_per_s, l.bytes_per_s);
      slowest.latency_s = std::max(slowest.latency_s, l.latency_s);
    }
    v.links[static_cast<size_t>(s)][static_cast<size_t>(s + 1)] = slowest;
    v.links[static_cast<size_t>(s + 1)][static_cast<size_t>(s)] = slowest;
  }
  std::vector<int> order(static_cast<size_t>(stages));
  std::iota(order.begin(), order.end(), 0);
  const PipelinePlan cut = cut_pipeline(v, order);

  ReplicatedPlan p;
  p.chain = chain;
  p.stages = stages;
  p.replicas = replicas;
  double slowest_step = 0;
  for (int r = 0; r < replicas; ++r) {
    PipelinePlan mine = cut;
    for (int s = 0; s < stages; ++s) mine.stages[static_cast<size_t>(s)].device = device(r, s);
    price(t, mine);
    slowest_step = std::max(slowest_step, mine.step_s);
    p.pipelines.push_back(std::move(mine));
  }
  if (replicas > 1) {
    for (int s = 0; s < stages; ++s) {
      const auto& st = cut.stages[static_cast<size_t>(s)];
      int64_t bytes = 0;
      for (int i = st.first; i <= st.last; ++i)
        bytes += t.nodes[static_cast<size_t>(i)].param_bytes;
      // The ring's slowest hop: between consecutive replicas' counterparts, and back around.
      double bandwidth = kInf;
      for (int r = 0; r < replicas; ++r)
        bandwidth = std::min(bandwidth, t.link(static_cast<size_t>(device(r, s)),
                                               static_cast<size_t>(device((r + 1) % replicas, s)))
                                            .bytes_per_s);
      p.averaging_s = std::max(
          p.averaging_s, 2.0 * (replicas - 1) / replicas * static_cast<double>(bytes) / bandwidth);
    }
  }
  set_step(t, p, slowest_step, sync);
  return p;
}

}  // namespace

void reprice(const CostTable& t, ReplicatedPlan& p, const ReplicaSync& sync) {
  double slowest_step = 0;
  for (PipelinePlan& pipe : p.pipelines) {
    price(t, pipe);
    slowest_step = std::max(slowest_step, pipe.step_s);
  }
  set_step(t, p, slowest_step, sync);
}

ReplicatedPlan plan_replicas(const CostTable& t, bool replicas_allowed, const ReplicaSync& sync,
                             double gap) {
  if (!(sync.every_steps > 0))
    throw std::invalid_argument("plan_replicas: every_steps must be > 0");
  const std::vector<int> chain = device_chain(t, cluster_devices(t, gap));
  const int n = static_cast<int>(chain.size());
  const int nodes = static_cast<int>(t.nodes.size());
  ReplicatedPlan best;
  for (int stages = 2; stages <= n && stages <= nodes; ++stages) {
    if (n % stages != 0 || (!replicas_allowed && stages != n)) continue;
    const int replicas = n / stages;
    // Each replica's window may run either way along the chain: that changes which devices are
    // counterparts (the averaging's links, and each stage's slowest device, so the shared cut),
    // while a replica's own links stay the same pairs. Every choice for up to 8 replicas (the
    // first one's direction fixed), as laid out beyond that.
    const unsigned choices = replicas <= 8 ? 1u << (replicas - 1) : 1u;
    for (unsigned flipped = 0; flipped < choices; ++flipped) {
      ReplicatedPlan p = plan_windows(t, chain, stages, flipped << 1, sync);
      const bool faster = p.micro_batches_per_s > best.micro_batches_per_s * (1 + 1e-12);
      const bool as_fast = p.micro_batches_per_s >= best.micro_batches_per_s * (1 - 1e-12);
      if (faster || (as_fast && p.averaging_s < best.averaging_s)) best = std::move(p);
    }
  }
  if (best.stages == 0) {
    std::string why;
    if (n < 2)
      why = "a pipeline needs at least 2 devices";
    else if (nodes < 2)
      why = "a pipeline needs at least 2 nodes";
    else if (!replicas_allowed)
      why = "without replicas every device is a stage, and there are more devices than nodes";
    else
      why = "no stage count from 2 to " + std::to_string(std::min(n, nodes)) +
            " divides the devices into whole replicas";
    throw std::invalid_argument("no pipeline fits " + std::to_string(n) + " devices and " +
                                std::to_string(nodes) + " nodes: " + why);
  }
  return best;
}

}  // namespace starling::sched
