// The swapping runtime: an executor observer that keeps the training state (weights, gradients,
// AdamW moments) under a memory budget by following a SwapPlan. Before a layer group runs it
// makes the group's weights (and, in backward, gradients) resident, starts loading the next
// `depth` groups, and when a group is left it evicts what the next tasks do not need: weights
// are dropped (the tier holds them), gradients written out. The optimizer step streams every
// parameter through a staging area in chunks, running AdamW where the bytes are, so the moments
// never need to be resident (those of the groups the plan keeps them for stay, and are updated in
// place). Gradients are clipped by the global norm as train::clip_grad_norm
// does; the norms are taken while each final gradient is resident, so results are bit-identical
// to unswapped training.
//
// The update is deferred: update() takes the norms, fixes the step's learning rate and clipping
// coefficient, and only starts streaming. The chunks advance, a few at a time, whenever the
// executor moves to another node (on a CPU also between a node's operators), so the update's
// transfers run while the next step's forward computes. It keeps to the forward's window (a group
// starts once the forward enters the group `depth` before it) and updates the weights the window
// loads in place; a group's parameters are finished (at the latest) when a pass enters the group,
// and everything is finished before anything else reads or writes the state (gather_weights,
// read_state, write_state, the exchange, the next update). A table the forward reads by row (the
// token embedding, which the forward reads first) is not finished whole before its lookup: the rows
// the lookup reads go first, and its other chunks are spread between the later groups
// (swap_rows_first.cpp). The arithmetic is the same elementwise AdamW, so results stay
// bit-identical.
//
// Without clipping, a step announced by expect_update() starts its update earlier still: a
// parameter's gradient is final once the last micro-batch's backward has left the group that
// reads it first, and no global norm is waited for, so its chunks join the stream there and run
// while the backward goes on (on a CPU, with the update overlapped; a table whose rows go first
// and the first group's parameters still start after the passes). The next forward then finds
// most of its groups updated.
//
// With clipping, that is a guess: the clipping coefficient is known only once every gradient
// is. A step that expect_update() announces with a limit on the disk tier may guess that the
// norm stays under it (swap.speculative_update: every step, or after a step that was not
// clipped while such guesses have paid lately: GuessRecord against the plan's break-even). Its
// chunks then run inside the backward as above, but write the new weights and moments to spare
// rooms in the tier, leaving the old ones untouched. update() knows the norm: a coefficient of
// exactly 1 (multiplying by it changes no bit) keeps the new values, the spare rooms becoming the
// parameters' rooms; any other drops them and runs the update again, clipped, from the old ones.
// Either way the results are those of unswapped training.
//
// A step is: begin_step(n), then per micro-batch begin_micro_batch(m) + the executor's forward and
// backward + end_pass(), optionally visit_gradients() (an exchange with other replicas), then
// update(). Evaluation forwards work between steps (groups load on demand). gather_weights() makes
// the weights resident for sampling; the next step evicts down to the budget again. A checkpoint
// or a state transfer between replicas reads and writes the state a tensor at a time
// (read_state, write_state), never holding it all.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "starling/graph/executor.h"
#include "starling/swap/buffer_pool.h"
#include "starling/swap/op_pump.h"
#include "starling/swap/swap_plan.h"
#include "starling/swap/swap_slot.h"
#include "starling/swap/tier.h"

namespace starling::graph {
class OpDag;
}
namespace starling::train {
class AdamW;
}

namespace starling::swap {

struct SwapStats {
  int64_t peak_resident = 0;  // the largest resident set of the steps (checkpoints excluded)
  int64_t read_bytes = 0, write_bytes = 0;
  double wait_s = 0;  // time the training thread waited for the tier, in all
  // Where the steps' time went: the micro-batches' passes (begin_step to update) and the
  // optimizer (update), each with the part of it spent waiting for the tier.
  double pass_s = 0, pass_wait_s = 0;
  // The optimizer's time counts the update's chunks wherever they ran, much of it inside the
  // next step's passes when the update overlaps them.
  double update_s = 0, update_wait_s = 0;
  int64_t pumped = 0;  // times the update advanced between a node's operators (op_pump.h)
  // The update's chunks and the staging sets they filled (small ones of a group share a set).
  int64_t update_chunks = 0, update_sets = 0;
  // Bytes of tier-held operands the update read and wrote where they lie (Tier::in_place).
  int64_t in_place_bytes = 0;
  int64_t rows_first = 0;  // updates whose table lookups' rows went first (swap_rows_first.cpp)
  int64_t backward_chunks = 0;  // the update's chunks computed inside the backward (expect_update)
  // Updates begun inside the backward before their clipping was known, and of those the ones
  // run again because the step was clipped; why none was begun where the plan allowed it.
  int64_t speculated = 0, redone = 0;
  std::string speculation_off;
  // Steps after an unclipped one that "auto" did not guess: too few guesses kept lately
  // (GuessRecord, against the plan's break-even).
  int64_t declined = 0;
  // Exchanges of the gradients with other replicas (visit_gradients), the network's time included.
  double exchange_s = 0, exchange_wait_s = 0;
};

// write_state()'s writes to evicted rooms that may be in flight at once (swapper.cpp).
inline constexpr int64_t kStoreAheadBytes = int64_t{64} << 20;

class Swapper final : public graph::NodeObserver {
 public:
  // Adopts every weight and moment (they must be resident, contiguous fp32 tensors on one device:
  // the CPU, whose RAM is then the budget's memory, or a GPU, whose memory is) and evicts down to
  // the plan's budget. The tier lies below that memory (make_tier in pinned_tier.h).
  Swapper(graph::OpDag& dag, train::AdamW& optimizer, SwapPlan plan, std::unique_ptr<Tier> tier);
  ~Swapper() override;

  void before(int node, graph::Phase phase) override;
  void before_forward(int node, const std::vector<at::Tensor>& inputs) override;
  void after(int node, graph::Phase phase) override;

  // train::StepRunner::expect_update: the next step's gradients go unchanged into
  // update(lr, max_norm). Without clipping, the update then starts inside the backward (above);
  // with clipping, where the plan speculates, too.
  void expect_update(double lr, double max_norm);
  // train::StepRunner::unscale_next_step (fp16's loss scaling): the next step's gradients are
  // multiplied by `factor` where their norms are first taken: as each becomes final in the
  // backward (resident then), or, in a step of micro-batches not known in advance, by
  // visit_gradients(), gradients_finite() or update(). Not with expect_update() (logic_error at
  // begin_step).
  void unscale_next_step(double factor) { next_factor_ = factor; }
  // train::StepRunner::gradients_finite: whether every gradient of the step is (from their norms,
  // taken where missing). The previous step's update is completed first.
  bool gradients_finite();
  // A step of `micro_batches` micro-batches, or of as many as the caller runs when 0 (a strategy
  // that decides while it accumulates: gradient norms are then taken by visit_gradients() or
  // update()).
  void begin_step(int64_t micro_batches);
  void begin_micro_batch(int64_t micro);
  void end_pass();
  // train::StepRunner::visit_gradients: the pieces are the parameters each node reads first, in
  // node order (the same on every peer, whatever its plan); each piece's gradients are made
  // resident (the next piece's loading meanwhile), visited, kept as changed, and their norms taken
  // again.
  void visit_gradients(const std::function<void(std::span<const int>)>& visit);
  // Clips to `max_norm` (0 = off) and applies one AdamW update with `lr`, deferred (see above);
  // each gradient goes once its parameter is updated. Returns the gradient norm before clipping
  // (0-dim fp32; 0 without gradients).
  // With `skip` (a ddp or atom step without an average) the gradients are dropped
  // and nothing else changes, AdamW's count included; an update expect_update() announced has
  // begun inside the backward and cannot be skipped (std::logic_error).
  at::Tensor update(double lr, double max_norm, bool skip = false);
  // Completes the deferred update: every weight and moment holds its new value (in memory or in
  // the tier) afterwards.
  void finish_update();
  // Makes the weights resident.
  void gather_weights();
  // train::StepRunner::read_state: a resident slot's tensor as it is; an evicted one's bytes read
  // from the tier into a temporary tensor; any other tensor unchanged.
  at::Tensor read_state(const at::Tensor& t);
  // train::StepRunner::write_state: a resident slot takes the values (written to the tier when
  // evicted); an evicted one's room in the tier is overwritten through a buffer of its size, and
  // it stays out; any other tensor is copied into. The write to an evicted one's room goes on
  // after the call returns (a pass over the state reads the next tensor meanwhile), with at most
  // kStoreAheadBytes (or one tensor) of such writes in flight; whatever next reads or writes that
  // room waits for it first (the update, which may work on a room where it lies, waits for all).
  void write_state(const at::Tensor& t, const at::Tensor& values);
  // train::StepRunner::keep_state: a strategy's tensor (a whole contiguous fp32 tensor in compute
  // memory) gets a room of its own in the tier, which takes `values` (undefined: zeros, which
  // are not written: the room reads as zeros), and its storage empties unread. It never comes
  // back whole: read_state() and write_state() reach it as they reach an evicted weight, and
  // nothing else touches it (no plan counts it, no step loads it).
  void keep_state(const at::Tensor& t, const at::Tensor& values);

  const SwapPlan& plan() const { return plan_; }
  const SwapStats& stats() const { return stats_; }
  int64_t resident_bytes() const { return held_; }
  const Tier& tier() const { return *tier_; }

 private:
  struct Task {
    int group = -1;
    bool backward = false;
  };
  Task task_at(int64_t index) const;
  void enter(int group, bool backward);
  void leave();
  void want(int group, bool backward, bool must);
  void narrow_to(int group, bool backward, int64_t bytes);
  void mark_guard(int group, bool backward);
  bool needed_soon(int group) const;
  void evict(SwapSlot& s);
  void load(SwapSlot& s);
  void write_through(SwapSlot& s);  // resident to out, synchronously, through a pool buffer
  // Writes a pool buffer holding the slot's bytes to its room, waits, and keeps the buffer.
  void store(SwapSlot& s, at::DataPtr buffer);
  // Every transfer to or from a slot's room goes through these: they first wait for a write of
  // write_state() still in flight to that room (await_store).
  Ticket read_room(SwapSlot& s, size_t offset, void* dst, size_t bytes);
  Ticket write_room(SwapSlot& s, uint64_t room, size_t offset, const void* src, size_t bytes);
  void await_store(const SwapSlot& s);
  void retire_store(size_t i);  // waits for stores_[i], and its buffer goes to the pool
  void drain_stores();
  void settle(SwapSlot& s);  // waits for its transfer; resident or out afterwards
  void poll_writes();
  void drain_writes();  // waits for every write in flight and frees its buffer
  bool make_room(int64_t bytes, bool must);
  bool has_room(int64_t bytes);  // fits without evicting anything
  void adopt_grads(int group);
  void track(int64_t delta);
  void fit_pool();            // kept buffers give way to what is held
  void release(SwapSlot& s);  // its buffer goes to the pool; the storage empties
  void drop(SwapSlot& s);     // a resident slot's bytes are not needed: released, out
  // The deferred update (swap_optimizer.cpp).
  void start_update(double lr, const at::Tensor& coef);
  // Appends the chunks of `params` (in that order) to the stream; returns whether a table among
  // them is spread (rows first), whose chunks then need ordering by gate.
  bool queue_jobs(const std::vector<int>& params);
  // The update started inside the backward: its constants, then each group's final parameters
  // as the backward leaves the group; update() adds the rest and puts the chunks not yet issued
  // in the forward's order.
  void start_update_in_backward();
  void queue_final_params(int group);
  void queue_the_rest();
  void order_jobs_by_gate(size_t from);  // the jobs from `from` on, in the forward's order
  // The speculative update: whether a final parameter of `group` may go (its weight and moments
  // in the tier, with spare rooms); keeping the step's new values, or dropping them; a kept
  // parameter's spare rooms becoming its own once all of its writes are through.
  bool speculable(int p, int group) const;
  bool reserve_spare_rooms();  // at the first guess; false where the tier lacks the room
  void keep_speculation();
  void redo_speculation();
  void adopt_spare_rooms(int p);
  void spend_gradient(int p);  // its update is through: the next step starts without one
  // One move of the stream, starting parameters of groups up to `upto` only; returns whether it
  // moved.
  bool advance_update(bool wait, int upto);
  int update_frontier() const;  // the last group the stream may start without a wait
  void pump_update();           // as many moves as need no waiting
  void quiet_pump();            // no moves between operators until the next node runs
  void finish_params(const std::vector<int>& params);
  // A table whose lookup reads some rows (the token embedding), updated rows first: the rows the
  // lookup reads get their new values before it runs, and the rest of its chunks are spread
  // through the stream until its next reader (swap_rows_first.cpp).
  bool spreads(int p) const;
  void update_rows_first(int p, const at::Tensor& ids);
  void update_whole_now(int p);
  at::Tensor slot_rows(SwapSlot& s, const std::vector<int64_t>& rows, const at::Tensor& index,
                       int64_t width);
  // The elements of parameter p's chunk [begin, end) whose rows went first (their offsets from
  // begin, int64), or an undefined tensor: the chunk leaves their weights as they are.
  at::Tensor patched_in(int p, int64_t begin, int64_t end) const;
  void retire_update_writes();
  void end_passes();  // the step's passes are over: their time goes to the stats
  // Before the step's gradients are `reading` ("visited", "checked") after its passes: the last
  // step's update completed and the passes closed (logic_error in a step whose update began
  // inside the backward).
  void close_passes(const char* reading);
  void make_gradient(int p);  // a zero gradient for a parameter the passes gave none
  // Parameter p's gradient of this step is final and resident: unscaled (unscale_next_step) and
  // its norm taken. Where a gradient's norm is taken again (after an exchange) it is not unscaled
  // again.
  void finalize_gradient(int p);
  // The norms of the step's gradients, in parameter order, each gradient finalized where it was
  // not yet (loaded from the tier); with `started` (an update begun inside the backward) those of
  // the parameters updated there too.
  std::vector<at::Tensor> step_norms(bool started);

  graph::OpDag& dag_;
  train::AdamW& optimizer_;
  SwapPlan plan_;
  std::unique_ptr<Tier> tier_;
  int64_t micro_batches_ = 1;  // of the step running; 0: not known in advance
  std::vector<int> node_group_;
  std::vector<std::vector<int>> group_params_;  // parameters each group reads
  std::vector<int> owner_;                      // first group reading each parameter
  std::vector<int> owner_node_;                 // first node reading each parameter
  std::vector<SwapSlot> values_, grads_, exp_avg_, exp_avg_sq_;
  std::deque<SwapSlot> kept_state_;  // keep_state()'s tensors (slot_of_ points into it)
  // Weights, moments and kept state, by TensorImpl.
  std::unordered_map<const void*, SwapSlot*> slot_of_;
  std::vector<at::Tensor> norms_;  // per parameter, taken when its gradient is final
  // fp16's unscaling: the factor for the next step and the running one (1: none), and which of
  // the running step's gradients are finalized (finalize_gradient).
  double next_factor_ = 1, step_factor_ = 1;
  std::vector<bool> finalized_;
  // The deferred update: chunks of the parameters in the order the next forward reads them, the
  // step's constants, and how far the stream has got. A parameter is kQueued until its first
  // chunk is issued, then kStreaming until its last chunk is computed and the staging writes of
  // its tier-held operands are complete. While streaming, its resident operands are `busy` (they
  // stay, updated in place) and the others must not load (the tier is being rewritten).
  enum class Pending : uint8_t { kNone, kQueued, kStreaming };
  struct UpdateJob {
    int p;
    int64_t begin, end;
    bool last;     // the parameter's last chunk
    int gate;      // issued once the forward's frontier reaches this group
    bool spread;   // a chunk of a table updated rows first: gated even once its table streams
    size_t at{0};  // where in its staging set's buffers, once issued (packs share a set)
  };
  struct UpdateWrite {
    Ticket ticket;
    int p;
  };
  // The stream's parts: a parameter's operands (weight, gradient, two moments); the reads of a
  // job into its staging set; AdamW over a job whose reads are in, and its writes.
  std::array<SwapSlot*, 4> update_operands(int p);
  void issue_update_reads(size_t set, const UpdateJob& job);
  void compute_update_job(size_t set, const UpdateJob& job, bool on_device);
  std::vector<Pending> pending_;   // per parameter
  std::vector<int> writes_left_;   // per parameter: its staging writes in flight
  std::vector<bool> chunks_done_;  // per parameter: its last chunk computed
  std::vector<UpdateJob> jobs_;
  std::vector<int> finish_gate_;  // per parameter: the gate of its last chunk
  // Tables read by row (rows_table_: the lookup node's parameter index, or -1) and, for each, the
  // group after which its chunks stop being spread (its next reader's, or the last group).
  std::vector<int> rows_table_, spread_end_;
  std::vector<bool> rows_first_;                    // this update spreads it; its rows may go first
  std::vector<std::vector<int64_t>> patched_rows_;  // rows already updated, kept by the chunks
  std::vector<std::pair<int, at::Tensor>> lookup_;  // the node about to run: parameter, rows read
  // Jobs issued and computed so far. Consecutive small jobs of one group share a staging set (a
  // pack): a set holds the jobs [pack_jobs_[s].first, .second), and packs are issued and computed
  // in order, set after set.
  size_t issued_ = 0, computed_ = 0;
  size_t packs_issued_ = 0, packs_computed_ = 0;
  std::array<std::pair<size_t, size_t>, kStagingSets> pack_jobs_{};
  // The update announced for the next step (expect_update), and whether this step's started
  // inside its backward.
  bool expected_ = false, in_backward_ = false, started_in_backward_ = false;
  double expected_lr_ = 0, expected_max_norm_ = 0, step_max_norm_ = 0;
  // Speculation: whether the plan allows it here and the tier has spare rooms (spare_: a
  // parameter's weight and moments, or none; reserved at the first guess), whether this step
  // speculates, which parameters' chunks write to the spare rooms and,
  // of those, which were kept while still streaming (their rooms change once their writes are
  // through, possibly in the next step), and whether the last step's norm was under its limit.
  bool can_speculate_ = false, spares_reserved_ = false, speculating_ = false;
  bool last_unclipped_ = false;
  GuessRecord guesses_;  // "auto": how often an unclipped step was followed by another
  std::vector<std::array<uint64_t, 3>> spare_;
  std::vector<bool> has_spare_, spec_, kept_;
  double update_lr_ = 0;
  at::Tensor update_coef_;
  int64_t update_steps_ = 0;
  std::array<std::vector<Ticket>, kStagingSets> update_reads_;
  std::array<std::vector<UpdateWrite>, kStagingSets> update_writes_;
  std::vector<SwapSlot*> writing_;
  // write_state()'s writes to evicted slots' rooms, in flight (buffer: the values).
  struct Store {
    const SwapSlot* slot;
    Ticket io;
    at::DataPtr buffer;
    size_t bytes;
  };
  std::deque<Store> stores_;
  int64_t storing_bytes_ = 0;
  c10::Device device_{c10::kCPU};  // where the state is resident: compute memory
  std::vector<at::DataPtr> staging_buffers_;
  std::vector<char*> staging_;  // their addresses
  BufferPool pool_;
  int64_t held_ = 0;
  int64_t reserved_ = 0;  // gradients the running group's backward is about to create
  uint64_t epoch_ = 1;    // slots start with guard 0: unguarded
  bool in_step_ = false;
  int64_t micro_ = 0;
  int current_ = -1;
  bool current_backward_ = false;
  int64_t task_ = -1;
  double step_start_s_ = 0, step_start_wait_s_ = 0;
  SwapStats stats_;
  // On a CPU, the update also advances between the operators of a node (op_pump.h), armed only
  // while a node runs: everywhere else the swapper may be inside its own bookkeeping.
  std::unique_ptr<OpPump> pump_;
};

}  // namespace starling::swap
