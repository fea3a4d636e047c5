// The static swap planner: from a profile of the model's nodes (compute time, parameters) and of
// the tier (read and write bandwidth) it chooses contiguous layer groups, which of them stay
// resident, and how many groups to load ahead (the prefetch depth), so that loading group i+1
// hides behind computing group i and the resident training state never exceeds the budget.
// Torch-free: the runtime (swapper.h) and `starling plan swap` read the same plan.
//
// The memory model (what swapper.h enforces):
//  - the whole state fits (weights, gradients, two AdamW moments): nothing moves;
//  - otherwise the optimizer streams every parameter through a small staging area in chunks
//    (none for a tier it updates in place: host RAM below a CPU);
//    groups hold their weights and gradients (pinned groups always, the others only while they
//    run, plus up to `depth` groups loading ahead and one draining its gradients), and the
//    moments live in the tier except those of the first groups the plan keeps them for.
//
// Why keep moments rather than more weights and gradients: the update of step t must be through
// for a group before step t+1's forward reaches it, so the moments' traffic (read and written
// every step) falls in the forward, the shortest third of the step, and the first group's update
// waits at the step's start with nothing to hide behind. A pinned group's weights and gradients
// save the same bytes of budget worth of traffic, but spread over the whole step.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace starling::swap {

// The optimizer's staging area: kStagingSets sets of one chunk per operand (weight, gradient, two
// moments), one computing while the others load or drain. The deferred update advances only at
// the pump's visits between operators (swapper.h, op_pump.h), and a set is reloaded only at a
// visit after its writes are done, so the sets in flight are what keeps the tier busy meanwhile:
// six sets of chunks of at most 2 MB waited less than three of 4 MB in the same memory
// (docs/swap.md). Small jobs of one group share a set (swap_optimizer.cpp).
inline constexpr int kStagingSets = 6;
inline constexpr int kStagingChunks = kStagingSets * 4;

// A lookup of `tokens` tokens reads at most that many rows of its table; a table with at least
// four times as many rows is updated rows first (swapper.h), a smaller one whole.
inline bool rows_go_first(int64_t table_rows, int64_t tokens) { return table_rows >= 4 * tokens; }

// swap.speculative_update (swapper.h): never, after a step that was not clipped ("auto": while
// guesses there pay, GuessRecord below), or every step.
enum class Speculation : uint8_t { kOff, kAfterUnclipped, kAlways };

// A kept guess must save at least this share of a step without one for "auto" to guess at all:
// the plan's predictions are not finer than that, and a guess costs spare rooms on disk and,
// when redone, time.
inline constexpr double kMinGuessGain = 0.02;

// "auto"'s record of the steps that followed an unclipped step: whether each was unclipped too,
// so that a guess there was (or would have been) kept. Every such step counts, guessed or not:
// the norm is known at the update either way.
class GuessRecord {
 public:
  static constexpr int kWindow = 16;  // the latest steps counted: the norm drifts as training goes
  void add(bool kept);
  // (kept + 1) / (counted + 2): a half before anything is counted, never exactly 0 or 1.
  double keep_rate() const;
  // Guessing pays when more guesses are kept than the plan's break-even share.
  bool worth_guessing(double break_even) const { return keep_rate() > break_even; }
  int counted() const { return static_cast<int>(kept_.size()); }
  int kept() const;

 private:
  std::vector<bool> kept_;  // oldest first, at most kWindow
};

struct NodeCost {
  std::string name;
  double forward_s = 0;     // forward of one micro-batch
  double backward_s = 0;    // backward of one micro-batch, recomputation included
  std::vector<int> params;  // indices of the parameters it reads
  std::vector<int> rows;    // of those, tables it reads by row whose rows go first (graph/op.h)
};

struct SwapProblem {
  std::vector<NodeCost> nodes;
  std::vector<int64_t> param_bytes;    // bytes of each parameter (fp32)
  double optimizer_s = 0;              // one AdamW step over all parameters, everything resident
  double read_bps = 0, write_bps = 0;  // the tier's measured bandwidth
  bool duplex = false;                 // reads and writes run at once, each at its bandwidth
  bool in_place = false;  // the optimizer updates tier-held operands where they lie (tier.h)
  // The tier's copies run on the cores the computation fills (host RAM below a CPU whose threads
  // take every core; tier.h, copies_on_cpu): a copy stalls the computation's parallel regions
  // for its length, so it adds to the compute stream instead of overlapping it.
  bool copies_take_compute = false;
  // How much longer the computation takes while the tier moves data at full speed (0.2: 20%
  // longer), probed (profile.h): on a virtual machine a disk's transfers take the computing
  // cores' time (the hypervisor's and the kernel's work for them) and memory bandwidth. Each
  // second of the tier's work that overlaps computation adds this many seconds to the step.
  double io_slowdown = 0;
  // Each parameter's update starts inside the last backward once its gradient is final, but for
  // the first group's and a spread table's (no clipping; swapper.h, expect_update).
  bool update_in_backward = false;
  // With clipping: the same, speculatively (swapper.h), on a tier that keeps spare rooms for it.
  Speculation speculation = Speculation::kOff;
  std::string tier = "disk";
  int64_t budget = 0;
  int64_t micro_batches = 1;     // per optimizer step (train.grad_accum)
  int64_t group_nodes = 0;       // > 0: fixed grouping (swap.group_nodes)
  int depth = -1;                // >= 0: fixed prefetch depth (swap.depth)
  int moment_groups = -1;        // >= 0: groups keeping their moments (swap.moment_groups)
  bool overlap_update = true;    // swap.overlap_update
  bool rows_first = true;        // swap.rows_first, on a CPU (swapper.h)
  int64_t lookup_tokens = 0;     // tokens of a micro-batch (train.batch_size x model.seq_len)
  double guess_break_even = -1;  // >= 0: fixed (swap.guess_break_even); -1: from the predictions
};

struct SwapGroup {
  int first = 0, last = 0;  // node range
  bool pinned = false;      // weights and gradients never leave
  bool moments = false;     // AdamW's moments of its parameters never leave either
  int64_t bytes = 0;        // weights + gradients of the parameters its nodes read
};

struct SwapPlan {
  std::vector<SwapGroup> groups;
  int depth = 0;
  bool everything_resident = false;  // the budget holds the whole state: no swapping
  bool overlap_update = true;        // the update runs behind the next forward (swapper.h)
  bool rows_first = true;            // a lookup's rows first, its table spread (swapper.h)
  int64_t lookup_tokens = 0;         // of a micro-batch: which tables go rows first
  Speculation speculation = Speculation::kOff;  // with clipping, the update inside the backward
  int64_t chunk_bytes = 0;                      // optimizer staging chunk (per operand)
  int64_t staging_bytes = 0;  // kStagingSets sets of 4 operand chunks; 0 when in place
  int64_t state_bytes = 0;    // weights + gradients + moments, aligned as stored
  int64_t budget = 0;
  int64_t peak_bytes = 0;  // the largest resident set the plan allows
  double compute_s = 0;    // per step, as if nothing moved
  double io_s = 0;  // per step, the tier's time for what moves (duplex: the longer direction)
  double predicted_s = 0;  // per step, loads overlapped with compute
  double slowed_s = 0;     // of predicted_s: the computation slowed by the tier (io_slowdown)
  // With speculation (and anything swapped): predicted_s is a step whose guess is kept; these
  // are one whose guess is redone (the step clipped), and one not guessed.
  double redone_s = 0, unguessed_s = 0;
  // With speculation: the share of guesses that must be kept for guessing to beat not guessing,
  // (redone - unguessed) / (redone - kept); above 1 (never) when a kept guess saves less than
  // kMinGuessGain of a step without one (a step bound by compute hides its update anyway).
  double break_even = 0;
  int64_t read_bytes = 0, write_bytes = 0;  // per step

  // The share of I/O time hidden behind compute, 1 when nothing moves.
  double hidden_share() const;
  // Group of every node.
  std::vector<int> node_groups(int nodes) const;
};

// The fastest feasible plan. ConfigError when the budget cannot hold even one node's weights and
// gradients plus the staging area, if any (and the moments of the first `moment_groups` nodes'
// groups when that is fixed), naming the smallest feasible budget.
SwapPlan plan_swap(const SwapProblem& problem);

// The plan as `starling plan swap` prints it: groups, bytes per tier, predicted step time, the
// share of I/O hidden.
std::string describe_plan(const SwapPlan& plan, const SwapProblem& problem);

}  // namespace starling::swap
