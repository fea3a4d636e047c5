#include "starling/swap/swap_plan.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <set>

#include "starling/common/error.h"
#include "starling/swap/swap_config.h"
#include "starling/swap/tier.h"

namespace starling::swap {
namespace {

// Per operand; large enough to keep the device busy, small enough to stay out of the budget's way.
// A chunk is at most half the largest parameter, so the staging area's six sets take no more
// than three sets of whole parameters would.
constexpr int64_t kMaxChunk = int64_t{2} << 20;
constexpr int kMaxDepth = 4;

int64_t aligned(int64_t bytes) {
  return static_cast<int64_t>(align_up(static_cast<size_t>(bytes)));
}

struct Grouping {
  std::vector<SwapGroup> groups;
  std::vector<std::set<int>> params;  // per group
};

Grouping make_groups(const SwapProblem& p, const std::vector<std::pair<int, int>>& ranges) {
  Grouping g;
  for (auto [first, last] : ranges) {
    std::set<int> ps;
    for (int n = first; n <= last; ++n)
      ps.insert(p.nodes[n].params.begin(), p.nodes[n].params.end());
    int64_t bytes = 0;
    for (int q : ps) bytes += 2 * aligned(p.param_bytes[q]);
    g.groups.push_back({.first = first, .last = last, .bytes = bytes});
    g.params.push_back(std::move(ps));
  }
  return g;
}

// Contiguous groups of nodes whose weights and gradients stay under `target` bytes (a node larger
// than that is a group of its own), or every `fixed` nodes.
std::vector<std::pair<int, int>> pack(const SwapProblem& p, int64_t target, int64_t fixed) {
  std::vector<std::pair<int, int>> out;
  const int n = static_cast<int>(p.nodes.size());
  int first = 0;
  std::set<int> ps;
  int64_t bytes = 0;
  for (int i = 0; i < n; ++i) {
    int64_t add = 0;
    for (int q : p.nodes[i].params)
      if (!ps.count(q)) add += 2 * aligned(p.param_bytes[q]);
    const bool full = fixed > 0 ? i - first >= fixed : bytes + add > target;
    if (i > first && full) {
      out.emplace_back(first, i - 1);
      first = i;
      ps.clear();
      bytes = 0;
      add = 0;
      for (int q : p.nodes[i].params)
        if (!ps.count(q)) add += 2 * aligned(p.param_bytes[q]);
    }
    ps.insert(p.nodes[i].params.begin(), p.nodes[i].params.end());
    bytes += add;
  }
  out.emplace_back(first, n - 1);
  return out;
}

std::set<int> pinned_params(const Grouping& g) {
  std::set<int> out;
  for (size_t i = 0; i < g.groups.size(); ++i)
    if (g.groups[i].pinned) out.insert(g.params[i].begin(), g.params[i].end());
  return out;
}

// Parameters whose AdamW moments stay in compute memory.
std::set<int> kept_moment_params(const Grouping& g) {
  std::set<int> out;
  for (size_t i = 0; i < g.groups.size(); ++i)
    if (g.groups[i].moments) out.insert(g.params[i].begin(), g.params[i].end());
  return out;
}

int64_t bytes_of(const SwapProblem& p, const std::set<int>& ps) {
  int64_t b = 0;
  for (int q : ps) b += 2 * aligned(p.param_bytes[q]);
  return b;
}

// The largest resident set: pinned groups and kept moments, plus any `window` consecutive
// unpinned groups.
int64_t peak_of(const SwapProblem& p, const Grouping& g, int window) {
  const std::set<int> pinned = pinned_params(g);
  std::vector<int> moving;
  for (size_t i = 0; i < g.groups.size(); ++i)
    if (!g.groups[i].pinned) moving.push_back(static_cast<int>(i));
  int64_t worst = 0;
  for (size_t s = 0; s < moving.size(); ++s) {
    std::set<int> ps;
    for (size_t k = s; k < std::min(moving.size(), s + window); ++k)
      for (int q : g.params[moving[k]])
        if (!pinned.count(q)) ps.insert(q);
    worst = std::max(worst, bytes_of(p, ps));
  }
  // Two moments per parameter: the same bytes as a weight and its gradient.
  return bytes_of(p, pinned) + bytes_of(p, kept_moment_params(g)) + worst;
}

// Weights and gradients of group `i` that move (not held by a pinned group).
int64_t moving_bytes(const SwapProblem& p, const Grouping& g, const std::set<int>& pinned, int i) {
  int64_t b = 0;
  for (int q : g.params[i])
    if (!pinned.count(q)) b += aligned(p.param_bytes[q]);
  return b;  // one of the two (weights or gradients)
}

// The tier's time: transfers, each placed in the earliest idle stretch after it can start (a
// prefetch issued early goes ahead of a write that becomes ready later).
class IoTimeline {
 public:
  // Returns when a transfer of `seconds` that can start at `ready` is done.
  double place(double ready, double seconds) {
    if (seconds <= 0) return ready;
    double start = ready;
    auto it = busy_.begin();
    for (; it != busy_.end(); ++it) {
      if (it->second <= start) continue;
      if (it->first >= start + seconds) break;  // fits in the gap before this one
      start = it->second;
    }
    busy_.insert(it, {start, start + seconds});
    return start + seconds;
  }
  // The same for a transfer that can be cut into pieces (the update's chunks): each idle stretch
  // after `ready` takes what fits, in order.
  double fill(double ready, double seconds) {
    return fill_before(ready, seconds, std::numeric_limits<double>::infinity()).first;
  }
  // The same, only in the idle stretches before `deadline`: when the last piece ends, and the
  // seconds left over.
  std::pair<double, double> fill_before(double ready, double seconds, double deadline) {
    double at = ready;
    size_t i = 0;
    while (seconds > 0 && at < deadline) {
      while (i < busy_.size() && busy_[i].second <= at) ++i;
      if (i < busy_.size() && busy_[i].first <= at) {  // inside a busy stretch: after it
        at = busy_[i++].second;
        continue;
      }
      const double gap_end = std::min(deadline, i < busy_.size() ? busy_[i].first : deadline);
      const double piece = std::min(seconds, gap_end - at);
      if (piece <= 0) break;
      busy_.insert(busy_.begin() + static_cast<std::ptrdiff_t>(i++), {at, at + piece});
      seconds -= piece;
      at += piece;
    }
    return {at, std::max(seconds, 0.0)};
  }
  double end() const { return busy_.empty() ? 0 : busy_.back().second; }
  // Seconds of transfers within [from, to).
  double busy_within(double from, double to) const {
    double s = 0;
    for (const auto& [a, b] : busy_) s += std::max(0.0, std::min(b, to) - std::max(a, from));
    return s;
  }

 private:
  std::vector<std::pair<double, double>> busy_;  // sorted, disjoint
};

// The groups over which parameter q's update runs, first reader group `first`: that group alone,
// or for a table whose rows go first, the groups after the lookup's window up to the one before
// its next reader (the last group when there is none), where there are any.
std::pair<int, int> rows_spread(const SwapProblem& p, const Grouping& g, int q, int first,
                                int depth) {
  if (!p.rows_first || !p.overlap_update) return {first, first};
  const SwapGroup& own = g.groups[first];
  int readers = 0;
  bool by_row = false;
  for (int n = own.first; n <= own.last; ++n)
    if (std::count(p.nodes[n].params.begin(), p.nodes[n].params.end(), q) > 0) {
      by_row = by_row ||
               (readers == 0 && std::count(p.nodes[n].rows.begin(), p.nodes[n].rows.end(), q) > 0);
      ++readers;
    }
  if (!by_row || readers != 1) return {first, first};
  const int G = static_cast<int>(g.groups.size());
  int hi = G - 1;
  for (int a = first + 1; a < G && hi == G - 1; ++a)
    if (g.params[a].count(q)) hi = a - 1;
  const int lo = first + depth + 1;
  return lo <= hi ? std::pair{lo, hi} : std::pair{first, first};
}

// Two streams, compute and I/O: a group's load may start once the group `depth + 1` tasks back has
// finished computing (its room is free) and the I/O stream is idle; it computes after its load;
// gradients are written after its backward. The previous step's optimizer update is deferred
// into this step's first forward: the I/O stream starts with it, in the order the forward reads
// the parameters, and each group computes only once its own parameters' update is through.
// Copies made by the cores that compute (p.copies_take_compute) are no stream of their own: each
// lengthens the task it serves.
//
// `redone`: the updates begun inside the backward as a guess (p.speculation) are redone, the step
// clipped: the guess's chunks take the tier's idle time until the backward ends, those in flight
// then drain, and the whole update runs from the next step's start as if nothing was guessed.
void simulate(const SwapProblem& p, const Grouping& g, SwapPlan& plan, bool redone = false) {
  const std::set<int> pinned = pinned_params(g);
  const std::set<int> kept = kept_moment_params(g);
  const int G = static_cast<int>(g.groups.size());
  // The optimizer streams the moments (and moving weights and gradients) through the staging
  // area, each parameter's share just before its first reader group's forward.
  const double r = p.read_bps, w = p.write_bps;
  std::vector<double> opt_in(G, 0), opt_out(G, 0), opt_compute(G, 0);
  // The same for the parameters whose update starts inside the backward, by their group.
  std::vector<double> bwd_in(G, 0), bwd_out(G, 0), bwd_compute(G, 0);
  std::vector<int64_t> own_moving(G, 0);  // moving weights each group reads first
  int64_t opt_read = 0, opt_write = 0, all_bytes = 0;
  for (int64_t b : p.param_bytes) all_bytes += b;
  std::vector<bool> seen(p.param_bytes.size(), false);
  for (int i = 0; i < G; ++i)
    for (int q : g.params[i]) {
      if (seen[q]) continue;
      seen[q] = true;
      // A table looked up by row whose rows go first: its update is spread evenly over the
      // groups after the lookup's window, up to its next reader (swapper.h); the rows are left
      // out (a few hundred of a vocabulary's tens of thousands).
      const auto [lo, hi] = rows_spread(p, g, q, i, plan.depth);
      const int64_t b = aligned(p.param_bytes[q]);
      const int64_t moments = kept.count(q) ? 0 : 2 * b;
      const bool in_backward = p.update_in_backward && i > 0 && lo == i && hi == i;
      // Bytes read and written by the update: a moving weight, overlapped with the forward, is
      // changed in place where the forward's window loads it, and written when the forward
      // leaves its group (below); after the passes or inside the backward, it goes through
      // staging. A tier updated in place moves none of them.
      auto traffic = [&](bool backward) {
        const int64_t weight = pinned.count(q) || (p.overlap_update && !backward) ? 0 : b;
        return std::pair<int64_t, int64_t>{
            p.in_place ? 0 : moments + (pinned.count(q) ? 0 : b) + weight,
            p.in_place ? 0 : moments + weight};
      };
      const double compute = p.optimizer_s * p.param_bytes[q] / std::max<int64_t>(all_bytes, 1);
      if (in_backward) {
        const auto [in, out] = traffic(true);
        opt_read += in;
        opt_write += out;
        bwd_in[i] += in / r;
        bwd_out[i] += out / w;
        bwd_compute[i] += compute;
        // A redone guess's update runs again, from the step's start, as one not guessed.
        if (!redone) continue;
      }
      const auto [in, out] = traffic(false);
      if (!pinned.count(q)) own_moving[i] += b;
      opt_read += in;
      opt_write += out;
      const double share = 1.0 / (hi - lo + 1);
      for (int a = lo; a <= hi; ++a) {
        opt_in[a] += share * in / r;
        opt_out[a] += share * out / w;
        opt_compute[a] += share * compute;
      }
    }
  struct Task {
    int group;
    bool backward;
    int64_t micro;
  };
  std::vector<Task> tasks;
  for (int64_t m = 0; m < p.micro_batches; ++m) {
    for (int i = 0; i < G; ++i) tasks.push_back({i, false, m});
    for (int i = G - 1; i >= 0; --i) tasks.push_back({i, true, m});
  }
  std::vector<double> begin(tasks.size(), 0), end(tasks.size(), 0);
  // A duplex tier (DMA engines each way) reads and writes at once; otherwise both share one.
  IoTimeline reads, own_writes;
  IoTimeline& writes = p.duplex ? own_writes : reads;
  double cp_free = 0, compute = 0, update_done = 0;
  int64_t read = 0, written = 0;
  // Updates started inside the backward: when each may start, and its transfers' seconds each
  // way. They take the tier's idle time once the passes' own transfers are placed, as the
  // stream's few sets in flight leave the window's loads their turn.
  struct Deferred {
    double ready, in, out;
  };
  std::vector<Deferred> in_backward;
  for (size_t k = 0; k < tasks.size(); ++k) {
    const Task& t = tasks[k];
    const SwapGroup& grp = g.groups[t.group];
    double c = 0;
    for (int n = grp.first; n <= grp.last; ++n)
      c += t.backward ? p.nodes[n].backward_s : p.nodes[n].forward_s;
    compute += c;
    double ready = 0;
    const bool updating = p.overlap_update && !t.backward && t.micro == 0;
    if (updating) {
      // The update's stream runs from the step's start, one parameter after the other, each
      // group's once the forward has entered the group `depth` before it (the window's reach).
      const double reach =
          t.group > plan.depth ? std::max(update_done, begin[k - plan.depth]) : update_done;
      if (p.copies_take_compute) {
        c += opt_in[t.group] + opt_out[t.group];
      } else if (p.duplex) {
        const double in = reads.fill(reach, opt_in[t.group]);
        update_done = std::max(in, writes.fill(reach, opt_out[t.group]));
      } else {
        update_done = reads.fill(reach, opt_in[t.group] + opt_out[t.group]);
      }
      ready = update_done;
      c += opt_compute[t.group];
    }
    const bool final_backward = t.backward && t.micro == p.micro_batches - 1;
    if (final_backward) c += bwd_compute[t.group];  // AdamW between the backward's operators
    if (final_backward && p.copies_take_compute) c += bwd_in[t.group] + bwd_out[t.group];
    // Still resident when it ran within the last depth + 1 tasks.
    bool recent = false;
    for (size_t j = k >= static_cast<size_t>(plan.depth + 1) ? k - plan.depth - 1 : 0; j < k; ++j)
      recent = recent || tasks[j].group == t.group;
    int64_t load = 0, write = 0;
    if (!grp.pinned) {
      const int64_t b = moving_bytes(p, g, pinned, t.group);
      if (!recent) load = b + (t.backward && t.micro > 0 ? b : 0);
      if (t.backward) write = b;
      if (updating) write = own_moving[t.group];  // updated in place
    }
    const double window_open =
        k >= static_cast<size_t>(plan.depth + 1) ? end[k - plan.depth - 1] : 0;
    if (p.copies_take_compute) {
      // The cores that compute make the copies too: each takes its length from the passes.
      c += load / r + write / w;
    } else {
      if (load > 0) ready = std::max(ready, reads.place(window_open, load / r));
    }
    begin[k] = std::max(cp_free, ready);
    end[k] = begin[k] + c;
    cp_free = end[k];
    if (write > 0 && !p.copies_take_compute) writes.place(end[k], write / w);
    if (final_backward && !p.copies_take_compute && bwd_in[t.group] + bwd_out[t.group] > 0)
      in_backward.push_back({end[k], bwd_in[t.group], bwd_out[t.group]});
    read += load;
    written += write;
  }
  if (redone) {
    // Speculation is for a tier that reads and writes through one stream (the disk).
    const double passes_end = cp_free;
    double left = 0;
    for (const Deferred& d : in_backward)
      left += reads.fill_before(d.ready, d.in + d.out, passes_end).second;
    const double sets = static_cast<double>(kStagingChunks * plan.chunk_bytes);
    cp_free = std::max(cp_free, reads.fill(passes_end, std::min(left, sets / r + sets / w)));
  } else {
    for (const Deferred& d : in_backward) {
      if (p.duplex) {
        reads.fill(d.ready, d.in);
        writes.fill(d.ready, d.out);
      } else {
        reads.fill(d.ready, d.in + d.out);
      }
    }
  }
  // The computation slowed by the transfers it overlaps (p.io_slowdown): first order, the passes
  // as placed, lengthened by the share of their time the tier was busy.
  plan.slowed_s = 0;
  if (p.io_slowdown > 0 && !p.copies_take_compute) {
    double overlap = 0;
    for (size_t k = 0; k < tasks.size(); ++k) {
      double busy = reads.busy_within(begin[k], end[k]);
      if (p.duplex) busy = std::max(busy, writes.busy_within(begin[k], end[k]));
      overlap += busy;
    }
    plan.slowed_s = p.io_slowdown * overlap;
  }
  plan.compute_s = compute + p.optimizer_s;
  plan.read_bytes = read + opt_read;
  plan.write_bytes = written + opt_write;
  plan.io_s = p.duplex ? std::max(plan.read_bytes / r, plan.write_bytes / w)
                       : plan.read_bytes / r + plan.write_bytes / w;
  plan.predicted_s = std::max({cp_free, reads.end(), writes.end()}) + plan.slowed_s;
  if (!p.overlap_update) {
    // The update after the passes: its transfers and AdamW's compute, whichever is longer.
    double opt_in_s = 0, opt_out_s = 0;
    for (int i = 0; i < G; ++i) opt_in_s += opt_in[i], opt_out_s += opt_out[i];
    const double opt_s = p.duplex ? std::max(opt_in_s, opt_out_s) : opt_in_s + opt_out_s;
    plan.predicted_s +=
        p.copies_take_compute ? p.optimizer_s + opt_s : std::max(p.optimizer_s, opt_s);
  }
}

}  // namespace

void GuessRecord::add(bool kept) {
  kept_.push_back(kept);
  if (kept_.size() > kWindow) kept_.erase(kept_.begin());
}

int GuessRecord::kept() const {
  return static_cast<int>(std::count(kept_.begin(), kept_.end(), true));
}

double GuessRecord::keep_rate() const {
  return (kept() + 1.0) / (static_cast<double>(kept_.size()) + 2.0);
}

double SwapPlan::hidden_share() const {
  if (io_s <= 0) return 1;
  return std::clamp(1 - (predicted_s - compute_s) / io_s, 0.0, 1.0);
}

std::vector<int> SwapPlan::node_groups(int nodes) const {
  std::vector<int> out(nodes, 0);
  for (size_t g = 0; g < groups.size(); ++g)
    for (int n = groups[g].first; n <= groups[g].last && n < nodes; ++n)
      out[n] = static_cast<int>(g);
  return out;
}

SwapPlan plan_swap(const SwapProblem& p) {
  if (p.nodes.empty()) throw std::logic_error("plan_swap: no nodes");
  SwapPlan base;
  base.budget = p.budget;
  base.overlap_update = p.overlap_update;
  base.rows_first = p.rows_first;
  base.speculation = p.speculation;
  base.lookup_tokens = p.lookup_tokens;
  int64_t largest = 0;
  for (int64_t b : p.param_bytes) {
    base.state_bytes += 4 * aligned(b);
    largest = std::max(largest, aligned(b));
  }
  const int n = static_cast<int>(p.nodes.size());
  if (base.state_bytes <= p.budget) {
    base.everything_resident = true;
    Grouping all = make_groups(p, {{0, n - 1}});
    all.groups[0].pinned = true;
    base.groups = all.groups;
    base.peak_bytes = base.state_bytes;
    simulate(p, all, base);
    base.io_s = 0;
    base.read_bytes = base.write_bytes = 0;
    base.predicted_s = base.compute_s;
    return base;
  }
  base.chunk_bytes = std::min(kMaxChunk, aligned((largest + 1) / 2));
  // A tier updated in place (host RAM below a CPU) is the optimizer's operands' own memory: the
  // update stages nothing, and the budget keeps no room for it.
  base.staging_bytes = p.in_place ? 0 : kStagingChunks * base.chunk_bytes;
  const int64_t room = p.budget - base.staging_bytes;

  // The smallest budget: the staging area plus the largest single node (or fixed group).
  Grouping finest = make_groups(p, pack(p, 0, p.group_nodes > 0 ? p.group_nodes : 1));
  int64_t need = 0;
  for (const auto& grp : finest.groups) need = std::max(need, grp.bytes);
  // Fixed kept moments are smallest with the finest groups.
  const int G_finest = static_cast<int>(finest.groups.size());
  for (int i = 0; i < std::min(p.moment_groups, G_finest); ++i) finest.groups[i].moments = true;
  const int64_t kept = bytes_of(p, kept_moment_params(finest));
  if (need + kept > room)
    throw ConfigError(
        "swap.budget " + format_bytes(static_cast<double>(p.budget)) +
        " cannot hold one layer group's weights and gradients (" +
        format_bytes(static_cast<double>(need)) + ")" +
        (base.staging_bytes > 0 ? " plus the optimizer's staging (" +
                                      format_bytes(static_cast<double>(base.staging_bytes)) + ")"
                                : std::string()) +
        (kept > 0
             ? " and the AdamW moments of swap.moment_groups = " + std::to_string(p.moment_groups) +
                   " groups (" + format_bytes(static_cast<double>(kept)) + ")"
             : std::string()) +
        "; the smallest feasible budget is " +
        format_bytes(static_cast<double>(need + kept + base.staging_bytes)) + " (of " +
        format_bytes(static_cast<double>(base.state_bytes)) + " training state)");

  // Candidate group sizes: geometric steps from the smallest node to the whole room. A node larger
  // than the target is a group of its own, so groups finer than the largest node (GPT-2's head,
  // which reads the whole token embedding) are possible: small layer groups leave room to pin the
  // large ones, whose weights and gradients then never move.
  std::vector<int64_t> targets;
  if (p.group_nodes > 0) {
    targets.push_back(0);
  } else {
    int64_t least = need;
    for (const auto& grp : finest.groups)
      if (grp.bytes > 0) least = std::min(least, grp.bytes);
    for (double t = static_cast<double>(least); t <= room * 1.0001; t *= 1.25)
      targets.push_back(static_cast<int64_t>(t));
    targets.push_back(room);
  }
  SwapPlan best;
  Grouping best_grouping;
  bool found = false;
  auto consider = [&](const Grouping& g, int depth, int window) {
    SwapPlan plan = base;
    plan.depth = depth;
    plan.peak_bytes = base.staging_bytes + std::min(room, peak_of(p, g, window));
    simulate(p, g, plan);
    plan.groups = g.groups;
    const bool better =
        !found || plan.predicted_s < best.predicted_s * 0.999 ||
        (plan.predicted_s <= best.predicted_s * 1.001 && plan.groups.size() < best.groups.size());
    if (better) {
      best = plan;
      best_grouping = g;
      found = true;
    }
  };
  for (int64_t target : targets) {
    const auto ranges = pack(p, target, p.group_nodes);
    for (int depth = p.depth >= 0 ? p.depth : 0; depth <= (p.depth >= 0 ? p.depth : kMaxDepth);
         ++depth) {
      const Grouping plain = make_groups(p, ranges);
      const int G = static_cast<int>(plain.groups.size());
      const int window = depth + 2;  // computing, loading ahead, draining
      if (peak_of(p, plain, 1) > room) continue;
      // Pin the largest groups while the rest still fits with its window (or, failing that,
      // with one group at a time).
      std::vector<int> by_size(G);
      for (int i = 0; i < G; ++i) by_size[i] = i;
      std::stable_sort(by_size.begin(), by_size.end(),
                       [&](int a, int b) { return plain.groups[a].bytes > plain.groups[b].bytes; });
      auto pin_largest = [&](Grouping& g) {
        for (int i : by_size) {
          if (g.groups[i].pinned) continue;
          g.groups[i].pinned = true;
          if (peak_of(p, g, window) > room) g.groups[i].pinned = false;
        }
      };
      // The moments of the first k groups kept, then the largest groups pinned in what is left;
      // k from none up in steps that grow (the first groups' updates are the exposed ones).
      std::vector<int> counts;
      if (p.moment_groups >= 0) {
        counts.push_back(std::min(p.moment_groups, G));
      } else {
        for (int k = 0; k <= G; k = k < 4 ? k + 1 : k * 3 / 2) counts.push_back(k);
      }
      for (int k : counts) {
        Grouping g = plain;
        for (int i = 0; i < k; ++i) g.groups[i].moments = true;
        // Kept moments must leave room for the prefetch window; without it the plan would be
        // simulated faster than it runs.
        if (k > 0 && peak_of(p, g, window) > room) {
          if (p.moment_groups < 0) break;  // more groups' moments fit no better
          if (peak_of(p, g, 1) > room) continue;
        }
        pin_largest(g);
        consider(g, depth, window);
      }
      if (p.moment_groups < 0) {
        // The other way round: the largest groups pinned first, then the moments of as many
        // groups from the first as still fit.
        Grouping g = plain;
        pin_largest(g);
        bool any = false;
        for (int i = 0; i < G; ++i) {
          g.groups[i].moments = true;
          if (peak_of(p, g, window) > room) {
            g.groups[i].moments = false;
            break;
          }
          any = true;
        }
        if (any) consider(g, depth, window);
      }
    }
  }
  if (!found) throw std::logic_error("plan_swap: no plan although one group fits");
  if (p.speculation != Speculation::kOff && p.update_in_backward) {
    // The plan is chosen for guesses kept; a clipped step's, or one not guessed, costs more.
    SwapPlan redone = best;
    simulate(p, best_grouping, redone, /*redone=*/true);
    best.redone_s = redone.predicted_s;
    SwapProblem unguessed = p;
    unguessed.update_in_backward = false;
    SwapPlan plain = best;
    simulate(unguessed, best_grouping, plain);
    best.unguessed_s = plain.predicted_s;
    // A guess kept saves (unguessed - kept), one redone costs (redone - unguessed): guessing
    // pays when the kept share q has q * save > (1 - q) * cost.
    const double save = best.unguessed_s - best.predicted_s;
    const double cost = std::max(0.0, best.redone_s - best.unguessed_s);
    best.break_even = p.guess_break_even >= 0                   ? p.guess_break_even
                      : save < kMinGuessGain * best.unguessed_s ? 2.0
                                                                : cost / (save + cost);
  }
  return best;
}

std::string describe_plan(const SwapPlan& plan, const SwapProblem& p) {
  auto b = [](int64_t v) { return format_bytes(static_cast<double>(v)); };
  char line[512];
  std::string out;
  // A budget past the whole state is no share of it ("6TB" for a 2 GB state read 300000%).
  const std::string share_of_state =
      plan.budget >= plan.state_bytes
          ? "all of it"
          : std::to_string(std::lround(100.0 * plan.budget / plan.state_bytes)) + "%";
  std::snprintf(line, sizeof line,
                "swap plan: budget %s for %s of training state (%s), tier %s (read %s/s, "
                "write %s/s%s)\n",
                b(plan.budget).c_str(), b(plan.state_bytes).c_str(), share_of_state.c_str(),
                p.tier.c_str(), b(p.read_bps).c_str(), b(p.write_bps).c_str(),
                p.duplex                ? ", at once"
                : p.copies_take_compute ? ", copied by the cores that compute"
                                        : "");
  out += line;
  if (plan.everything_resident) {
    std::snprintf(line, sizeof line, "  the whole state fits: nothing is swapped; step %.3f s\n",
                  plan.compute_s);
    return out + line;
  }
  int pinned = 0, kept = 0;
  for (const auto& g : plan.groups) pinned += g.pinned, kept += g.moments;
  const std::string moments = kept == 0 ? "AdamW moments in the tier"
                                        : "AdamW moments of the first " + std::to_string(kept) +
                                              (kept == 1 ? " group" : " groups") +
                                              " in compute memory, the rest in the tier";
  std::snprintf(line, sizeof line,
                "  %zu layer groups, %d pinned in compute memory, prefetch depth %d; %s, "
                "%s in %s chunks\n",
                plan.groups.size(), pinned, plan.depth, moments.c_str(),
                plan.staging_bytes > 0 ? "streamed" : "updated there", b(plan.chunk_bytes).c_str());
  out += line;
  out += "  group  nodes                                    weights+grads  where\n";
  for (size_t i = 0; i < plan.groups.size(); ++i) {
    const auto& g = plan.groups[i];
    const std::string nodes = std::to_string(g.first) + "-" + std::to_string(g.last) + " (" +
                              p.nodes[g.first].name + " .. " + p.nodes[g.last].name + ")";
    const std::string where =
        (g.pinned ? std::string("compute memory") : p.tier) +
        (g.moments ? (g.pinned ? ", moments too" : "; moments in compute memory") : "");
    std::snprintf(line, sizeof line, "  %-5zu  %-40s %13s  %s\n", i, nodes.c_str(),
                  b(g.bytes).c_str(), where.c_str());
    out += line;
  }
  // A parameter that groups share (a tied token table, read by the embedding and the head) is
  // in each one's weights+grads: said, so that the column's sum past "resident at most" is read
  // right.
  std::map<int, int> readers;  // parameter -> groups reading it
  for (const auto& g : plan.groups) {
    std::set<int> ps;
    for (int n = g.first; n <= g.last; ++n)
      ps.insert(p.nodes[n].params.begin(), p.nodes[n].params.end());
    for (int q : ps) ++readers[q];
  }
  int64_t shared = 0;
  for (const auto& [q, groups] : readers)
    if (groups > 1) shared += 2 * aligned(p.param_bytes[q]);
  if (shared > 0) {
    std::snprintf(line, sizeof line,
                  "  (%s of weights+grads are read by more than one group, a tied table: counted "
                  "in each)\n",
                  b(shared).c_str());
    out += line;
  }
  std::snprintf(line, sizeof line,
                "  resident at most %s (%s); in the tier %s\n"
                "  per step: compute %.3f s, I/O %.3f s (read %s, write %s), predicted %.3f s "
                "(%.0f%% of I/O hidden)\n",
                b(plan.peak_bytes).c_str(),
                plan.staging_bytes > 0 || plan.everything_resident
                    ? ("staging " + b(plan.staging_bytes)).c_str()
                    : "no staging: the optimizer updates the tier in place",
                b(plan.state_bytes).c_str(), plan.compute_s, plan.io_s, b(plan.read_bytes).c_str(),
                b(plan.write_bytes).c_str(), plan.predicted_s, 100 * plan.hidden_share());
  out += line;
  if (plan.slowed_s > 0) {
    std::snprintf(line, sizeof line,
                  "  of the prediction, %.3f s: the computation runs %.0f%% slower while the tier "
                  "moves data (swap.io_slowdown)\n",
                  plan.slowed_s, 100 * p.io_slowdown);
    out += line;
  }
  if (plan.speculation != Speculation::kOff) {
    // "auto" that finds guessing does not pay here says so below: the guess is only possible.
    const bool declined = plan.speculation == Speculation::kAfterUnclipped && plan.redone_s > 0 &&
                          plan.break_even >= 1;
    out += std::string(declined ? "  the update could start inside the backward "
                                : "  the update starts inside the backward ") +
           (plan.speculation == Speculation::kAlways
                ? "every step"
                : "after a step that was not clipped, where the tier has room") +
           ", into spare rooms in the tier (up to " + b(plan.state_bytes / 4 * 3) +
           " more), kept if the step is not clipped\n";
    if (plan.redone_s > 0) {
      std::snprintf(line, sizeof line,
                    "  predicted %.3f s a step when the guess is kept, %.3f s when it is redone, "
                    "%.3f s without a guess\n",
                    plan.predicted_s, plan.redone_s, plan.unguessed_s);
      out += line;
      if (plan.speculation == Speculation::kAfterUnclipped) {
        if (plan.break_even >= 1 && p.guess_break_even >= 0)
          std::snprintf(line, sizeof line,
                        "  \"auto\" guesses nothing: swap.guess_break_even is 1 or more\n");
        else if (plan.break_even >= 1)
          std::snprintf(line, sizeof line,
                        "  \"auto\" guesses nothing: a kept guess saves under %.0f%% of a step "
                        "without one\n",
                        100 * kMinGuessGain);
        else
          std::snprintf(line, sizeof line,
                        "  \"auto\" guesses after an unclipped step while more than %.0f%% of the "
                        "recent steps after one were not clipped either%s\n",
                        100 * plan.break_even,
                        p.guess_break_even >= 0 ? " (swap.guess_break_even)" : "");
        out += line;
      }
    }
  } else if (p.update_in_backward)
    out += "  the update starts inside the backward (no clipping)\n";
  return out;
}

}  // namespace starling::swap
