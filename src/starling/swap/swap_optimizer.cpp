// The swapped optimizer step, deferred (Swapper::start_update and what advances it): every
// parameter goes through AdamW in chunks, each operand (weight, gradient, two moments) read where
// it is: in place when resident, otherwise through a staging buffer loaded from the tier and, for
// the weight and moments, written back; or, where the tier is memory the compute device addresses
// (host RAM below a CPU), updated where it lies in the tier. kStagingSets sets of staging buffers
// pipeline the chunks: one computing, the next ones loading, the previous ones draining.
// Consecutive small chunks of one group (a layer's norms and biases) share a set, side by side in
// its buffers.
//
// The chunks run in the order the next forward reads the parameters, and the swapper advances the
// stream whenever the executor moves to another node: the update's transfers then overlap the
// next step's computation instead of leaving the cores idle between steps, and a layer group
// waits only for its own parameters' chunks. A weight the forward's window loads is updated in
// place as it lands (update_frontier).
#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <limits>

#include "starling/graph/dag.h"
#include "starling/swap/swap_config.h"
#include "starling/swap/swapper.h"
#include "starling/train/adamw.h"
#include "starling/train/metrics.h"

namespace starling::swap {
namespace {

constexpr int kSets = kStagingSets;
enum Operand { kWeight, kGrad, kMoment1, kMoment2, kOperands };

size_t chunk_bytes(int64_t begin, int64_t end) { return static_cast<size_t>(end - begin) * 4; }

// The written operands' places among a parameter's spare rooms (Swapper::spare_).
int spare_index(int op) { return op == kWeight ? 0 : op == kMoment1 ? 1 : 2; }

// The optimizer's time, wherever its chunks run.
struct UpdateTimer {
  SwapStats& st;
  double start = train::now_s(), start_wait = st.wait_s;
  ~UpdateTimer() {
    st.update_s += train::now_s() - start;
    st.update_wait_s += st.wait_s - start_wait;
  }
};

}  // namespace

bool Swapper::queue_jobs(const std::vector<int>& order) {
  auto& params = dag_.params().params();
  const int64_t chunk = plan_.everything_resident ? INT64_MAX : plan_.chunk_bytes / 4;
  bool spread = false;
  for (int p : order) {
    pending_[p] = Pending::kQueued;
    chunks_done_[p] = false;
    writes_left_[p] = 0;
    patched_rows_[p].clear();
    rows_first_[p] = spreads(p);
    spread = spread || rows_first_[p];
    const int64_t n = params[p].value.numel();
    const int64_t chunks = (n + chunk - 1) / chunk;
    // A table updated rows first: its chunks go between the groups after the lookup's window and
    // its next reader, evenly, each after that group's own parameters (where the stream would
    // otherwise wait for the forward). The others: in the forward's order, each gated by its group.
    const int lo = owner_[p] + plan_.depth + 1, groups = spread_end_[p] - lo + 1;
    for (int64_t i = 0, b = 0; b < n; ++i, b += chunk) {
      const int gate = rows_first_[p] ? lo + static_cast<int>(i * groups / chunks) : owner_[p];
      jobs_.push_back({p, b, std::min(n, b + chunk), b + chunk >= n, gate, rows_first_[p]});
      finish_gate_[p] = gate;
    }
  }
  return spread;
}

// Jobs from `from` on in the forward's order: by gate, a spread table's chunk after its gate
// group's own parameters (stable: a parameter's chunks stay in order).
void Swapper::order_jobs_by_gate(size_t from) {
  std::stable_sort(jobs_.begin() + static_cast<std::ptrdiff_t>(from), jobs_.end(),
                   [](const UpdateJob& a, const UpdateJob& b) {
                     return 2 * a.gate + a.spread < 2 * b.gate + b.spread;
                   });
}

void Swapper::start_update(double lr, const at::Tensor& coef) {
  auto& params = dag_.params().params();
  update_lr_ = lr;
  update_coef_ = coef;
  update_steps_ = optimizer_.steps();
  jobs_.clear();
  issued_ = computed_ = packs_issued_ = packs_computed_ = 0;
  // The next forward reads the parameters by their first reader's group (unread ones first).
  std::vector<int> order;
  for (size_t p = 0; p < params.size(); ++p)
    if (grads_[p].tensor.defined()) order.push_back(static_cast<int>(p));
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return owner_[a] < owner_[b]; });
  if (queue_jobs(order)) order_jobs_by_gate(0);
  pump_update();
}

void Swapper::start_update_in_backward() {
  finish_update();  // the previous step's, were any of it left
  drain_stores();   // a tier updated in place is updated where write_state's writes land
  optimizer_.begin_step();
  update_lr_ = expected_lr_;
  update_coef_.reset();  // no clipping
  update_steps_ = optimizer_.steps();
  jobs_.clear();
  issued_ = computed_ = packs_issued_ = packs_computed_ = 0;
  // Marks which parameters this update has finished (queue_the_rest).
  std::fill(chunks_done_.begin(), chunks_done_.end(), false);
  started_in_backward_ = true;
}

// The parameters the group reads first have their final gradients once the last micro-batch's
// backward leaves it. A table updated rows first waits for update(): its rows go first only
// just before the next lookup.
void Swapper::queue_final_params(int group) {
  if (!started_in_backward_) start_update_in_backward();
  std::vector<int> final;
  for (int p : group_params_[group])
    if (owner_[p] == group && grads_[p].tensor.defined() && pending_[p] == Pending::kNone &&
        !chunks_done_[p] && !spreads(p) && (!speculating_ || speculable(p, group)))
      final.push_back(p);
  if (speculating_)
    for (int p : final) spec_[p] = true;
  queue_jobs(final);
}

// A guess must leave the old values untouched: the weight and moments go through staging to the
// spare rooms, so none of them may be resident, where the chunks would update them in place.
// The group's weights leave as the backward leaves it, unless the next forward's window wants
// them (and then they stay resident); moments are resident only where the plan keeps them.
bool Swapper::speculable(int p, int group) const {
  return has_spare_[p] && !needed_soon(group) && !exp_avg_[p].resident() &&
         exp_avg_[p].state != SwapSlot::State::kLoading && !exp_avg_sq_[p].resident() &&
         exp_avg_sq_[p].state != SwapSlot::State::kLoading;
}

// The spare rooms: reserved when a guess is first made, so a run that never gets under its limit
// (one from scratch, early on) takes no more of the disk than the state. "auto" makes them only
// where the disk keeps room for as much again (a checkpoint holds the same weights and moments),
// and otherwise guesses nothing; "always" was checked for room at the start.
bool Swapper::reserve_spare_rooms() {
  if (spares_reserved_) return true;
  int64_t bytes = 0;
  for (size_t p = 0; p < has_spare_.size(); ++p)
    if (has_spare_[p]) bytes += 3 * static_cast<int64_t>(align_up(values_[p].bytes));
  const int64_t free = tier_->free_bytes();
  if (plan_.speculation == Speculation::kAfterUnclipped && free >= 0 && free < 2 * bytes) {
    can_speculate_ = false;
    stats_.speculation_off =
        "no update guessed: the tier had " + format_bytes(static_cast<double>(free)) +
        " free, and its spare rooms take " + format_bytes(static_cast<double>(bytes)) +
        " with as much again kept free";
    return false;
  }
  for (size_t p = 0; p < has_spare_.size(); ++p)
    if (has_spare_[p])
      for (auto& key : spare_[p]) key = tier_->reserve(values_[p].bytes);
  spares_reserved_ = true;
  return true;
}

// The norm is under the limit: the chunks computed so far stand, the ones still to come of a
// parameter already streaming go on writing to its spare rooms, and a parameter not started yet
// is updated as any other, in its own rooms.
void Swapper::keep_speculation() {
  retire_update_writes();
  for (size_t p = 0; p < spec_.size(); ++p) {
    if (!spec_[p]) continue;
    if (pending_[p] == Pending::kQueued)
      spec_[p] = false;
    else if (pending_[p] == Pending::kNone)
      adopt_spare_rooms(static_cast<int>(p));
    else
      kept_[p] = true;  // its rooms change when its last write is through
  }
}

// The step is clipped: the chunks issued finish (into the spare rooms, which are then ignored),
// the rest are dropped, and every guessed parameter is updated again by update() from its own
// rooms, which nothing has touched. Its gradient is still there.
void Swapper::redo_speculation() {
  quiet_pump();
  jobs_.resize(issued_);
  while (advance_update(true, std::numeric_limits<int>::max())) {
  }
  for (size_t p = 0; p < spec_.size(); ++p) {
    if (!spec_[p]) continue;
    spec_[p] = false;
    pending_[p] = Pending::kNone;
    chunks_done_[p] = false;
    writes_left_[p] = 0;
    for (SwapSlot* slot : update_operands(static_cast<int>(p))) slot->busy = false;
  }
  started_in_backward_ = false;
}

// A kept guess whose writes are all through: the spare rooms hold the parameter's new weight and
// moments and become its rooms (the old ones are the next guess's spares). A copy of the weight
// the window loaded meanwhile holds the old values and is dropped; the next load reads the new.
void Swapper::adopt_spare_rooms(int p) {
  auto slots = update_operands(p);
  for (int op : {kWeight, kMoment1, kMoment2}) {
    SwapSlot& slot = *slots[op];
    settle(slot);
    if (slot.resident()) drop(slot);
    std::swap(slot.key, spare_[p][spare_index(op)]);
  }
  spend_gradient(p);
  spec_[p] = kept_[p] = false;
}

void Swapper::spend_gradient(int p) {
  SwapSlot& g = grads_[p];
  track(-g.held());
  if (g.resident()) release(g);
  dag_.params().params()[p].value.mutable_grad().reset();
  g.tensor.reset();
  g.state = SwapSlot::State::kOut;
}

// update() after an update started inside the backward: the parameters not queued yet join the
// stream, and the chunks not issued yet go in the forward's order, after the rest of the
// parameters already streaming (which hold their resident operands until their last chunk).
void Swapper::queue_the_rest() {
  std::vector<int> rest;
  for (size_t p = 0; p < grads_.size(); ++p)
    if (grads_[p].tensor.defined() && pending_[p] == Pending::kNone && !chunks_done_[p])
      rest.push_back(static_cast<int>(p));
  std::stable_sort(rest.begin(), rest.end(), [&](int a, int b) { return owner_[a] < owner_[b]; });
  const auto from = jobs_.begin() + static_cast<std::ptrdiff_t>(issued_);
  const auto queued = std::stable_partition(
      from, jobs_.end(), [&](const UpdateJob& j) { return pending_[j.p] == Pending::kStreaming; });
  const auto first_queued = static_cast<size_t>(queued - jobs_.begin());
  queue_jobs(rest);
  order_jobs_by_gate(first_queued);
  started_in_backward_ = false;
}

std::array<SwapSlot*, 4> Swapper::update_operands(int p) {
  return {&values_[p], &grads_[p], &exp_avg_[p], &exp_avg_sq_[p]};
}

// Retires the staging writes that are complete; a parameter whose chunks are all computed is done
// once its last write is.
void Swapper::retire_update_writes() {
  for (auto& set : update_writes_)
    std::erase_if(set, [&](const UpdateWrite& w) {
      if (!tier_->done(w.ticket)) return false;
      if (--writes_left_[w.p] == 0 && chunks_done_[w.p]) {
        pending_[w.p] = Pending::kNone;
        if (kept_[w.p]) adopt_spare_rooms(w.p);
      }
      return true;
    });
}

bool Swapper::advance_update(bool wait, int upto) {
  if (jobs_.empty()) return false;
  at::NoGradGuard no_grad;
  UpdateTimer timer{stats_};
  auto waited = [&](Ticket t) {
    const double t0 = train::now_s();
    tier_->wait(t);
    stats_.wait_s += train::now_s() - t0;
  };
  auto ordered = [&](Ticket t) {  // a wait, except where the tier orders on the device
    const double t0 = train::now_s();
    tier_->order_after(t);
    stats_.wait_s += train::now_s() - t0;
  };

  retire_update_writes();
  bool moved = false;
  // A tier that orders its copies on the device (a GPU's) needs no host waits in the stream: a
  // set's reads are queued behind its previous writes, the chunk's kernels behind its reads.
  const bool on_device = tier_->orders_on_device();
  // A job may start once its group is within `upto`, or when its parameter is already streaming.
  // In an update started inside the backward, a parameter whose gradient (or weight) is still
  // being written out, as its group was left, starts once that write is through: its chunks read
  // it back from the tier rather than hold it in memory.
  if (started_in_backward_) poll_writes();
  auto held_by_write = [&](size_t j) {
    if (!started_in_backward_ || pending_[jobs_[j].p] != Pending::kQueued) return false;
    auto slots = update_operands(jobs_[j].p);
    return std::any_of(slots.begin(), slots.end(),
                       [](SwapSlot* s) { return s->state == SwapSlot::State::kWriting; });
  };
  auto startable = [&](size_t j) {
    const UpdateJob& job = jobs_[j];
    if (held_by_write(j)) return false;
    return job.gate <= upto || (!job.spread && pending_[job.p] != Pending::kQueued);
  };
  // Reads for every free set: a set is free once its previous pack is computed and written. A
  // pack is the next job and, while they fit in the set's chunk, the small ones after it that
  // start with it (same group; a spread table's chunks go alone): a layer's norms and biases
  // would otherwise take a set each, for a few kilobytes, and leave the tier idle meanwhile.
  while (issued_ < jobs_.size() && packs_issued_ < packs_computed_ + kSets &&
         (on_device || update_writes_[packs_issued_ % kSets].empty()) && startable(issued_)) {
    const size_t set = packs_issued_++ % kSets;
    if (const auto& earlier = update_writes_[set]; !earlier.empty())
      tier_->order_copies_after(earlier.back().ticket);  // the latest of the set's writes
    auto staged = [&](size_t j) { return align_up(chunk_bytes(jobs_[j].begin, jobs_[j].end)); };
    size_t end = issued_ + 1, used = staged(issued_);
    jobs_[issued_].at = 0;
    while (end < jobs_.size() && !jobs_[issued_].spread && !jobs_[end].spread &&
           jobs_[end].gate == jobs_[issued_].gate && startable(end) &&
           used + staged(end) <= static_cast<size_t>(plan_.chunk_bytes)) {
      jobs_[end].at = used;
      used += staged(end++);
    }
    pack_jobs_[set] = {issued_, end};
    ++stats_.update_sets;
    stats_.update_chunks += static_cast<int64_t>(end - issued_);
    for (; issued_ < end; ++issued_) issue_update_reads(set, jobs_[issued_]);
    moved = true;
  }

  if (packs_computed_ < packs_issued_) {
    const size_t set = packs_computed_ % kSets;
    auto& reads = update_reads_[set];
    // A tier that orders the compute after its copies on the device lets the pack be queued at
    // once; the others compute it when its reads are in.
    const bool ready = on_device || std::all_of(reads.begin(), reads.end(),
                                                [&](Ticket t) { return tier_->done(t); });
    if (ready || wait) {
      ++packs_computed_;
      for (Ticket t : reads) ordered(t);
      reads.clear();
      for (; computed_ < pack_jobs_[set].second; ++computed_)
        compute_update_job(set, jobs_[computed_], on_device);
      return true;
    }
  }
  if (moved || !wait) return moved;

  // Nothing moves without waiting: for the writes that keep the next set busy, or the last ones.
  for (int k = 0; k < kSets; ++k) {
    auto& set = update_writes_[(packs_issued_ + k) % kSets];
    if (set.empty()) continue;
    waited(set.front().ticket);
    retire_update_writes();
    return true;
  }
  if (issued_ < jobs_.size() && held_by_write(issued_)) {
    for (SwapSlot* s : update_operands(jobs_[issued_].p))
      if (s->state == SwapSlot::State::kWriting) waited(s->io);
    poll_writes();
    return true;
  }
  if (issued_ < jobs_.size()) return false;  // the rest waits for the forward's window
  jobs_.clear();                             // every chunk computed and written
  issued_ = computed_ = packs_issued_ = packs_computed_ = 0;
  update_coef_.reset();
  return false;
}

// Queues the reads of one job's tier-held operands into its set's staging, at the job's place.
void Swapper::issue_update_reads(size_t set, const UpdateJob& job) {
  auto slots = update_operands(job.p);
  if (pending_[job.p] == Pending::kQueued) {
    // A weight the forward's window will hold is loaded into place where the budget has room
    // now, as the window would load it.
    const int reader = rows_first_[job.p] ? spread_end_[job.p] + 1 : owner_[job.p];
    // (A tier updated in place needs no load: the window's own load will bring the new weight.)
    // (Inside the backward it goes through staging: the window is far.)
    if (SwapSlot& w = values_[job.p]; w.state == SwapSlot::State::kOut && !started_in_backward_ &&
                                      tier_->in_place(w.key) == nullptr &&
                                      reader <= update_frontier() && has_room(w.bytes))
      load(w);
    // Where each operand is now decides how all of its chunks are read: a resident one stays
    // (busy) and is updated in place, and so does a loading one (its chunks wait for the load);
    // the others go through staging.
    for (SwapSlot* s : slots) {
      if (s->state != SwapSlot::State::kLoading) settle(*s);
      s->busy = s->state == SwapSlot::State::kLoading || s->resident();
    }
    // A guess reads the gradient only; the others must come from, and go to, the tier. The
    // window may have loaded the weight since it was queued: that copy goes (it is clean).
    if (spec_[job.p])
      for (int op : {kWeight, kMoment1, kMoment2}) {
        SwapSlot& slot = *slots[op];
        slot.busy = false;
        settle(slot);
        evict(slot);
        settle(slot);
        if (slot.state != SwapSlot::State::kOut)
          throw std::logic_error("swap: a speculative update met a resident operand of parameter " +
                                 std::to_string(job.p));
      }
    pending_[job.p] = Pending::kStreaming;
  }
  for (int op = 0; op < kOperands; ++op) {
    SwapSlot& s = *slots[op];
    if (s.busy) {
      if (s.state == SwapSlot::State::kLoading) update_reads_[set].push_back(s.io);
      continue;
    }
    if (tier_->in_place(s.key) != nullptr) continue;  // updated where it lies
    update_reads_[set].push_back(read_room(s, static_cast<size_t>(job.begin) * 4,
                                           staging_[set * kOperands + op] + job.at,
                                           chunk_bytes(job.begin, job.end)));
    stats_.read_bytes += static_cast<int64_t>(align_up(chunk_bytes(job.begin, job.end)));
  }
}

// AdamW over one job's elements (its reads are in), then the writes of its tier-held operands.
void Swapper::compute_update_job(size_t set, const UpdateJob& job, bool on_device) {
  auto& params = dag_.params().params();
  auto slots = update_operands(job.p);
  for (SwapSlot* s : slots)
    if (s->busy) settle(*s);  // a window's load, waited for above: now resident
  const int64_t len = job.end - job.begin;
  std::array<at::Tensor, kOperands> t;
  for (int op = 0; op < kOperands; ++op) {
    SwapSlot& s = *slots[op];
    const auto options = at::TensorOptions(at::kFloat).device(device_);
    if (char* room = s.busy ? nullptr : tier_->in_place(s.key)) {
      t[op] = at::from_blob(room + static_cast<size_t>(job.begin) * 4, {len}, options);
      stats_.in_place_bytes += len * 4;
    } else if (!s.busy) {
      t[op] = at::from_blob(staging_[set * kOperands + op] + job.at, {len}, options);
    } else if (rows_first_[job.p]) {
      // A table whose lookup has run: its saved weight must not see the chunks' writes (an
      // aliasing tensor with its own version counter; the lookup read rows already final).
      t[op] =
          at::from_blob(static_cast<float*>(storage_data(s.tensor)) + job.begin, {len}, options);
    } else {
      t[op] = s.tensor.view({-1}).narrow(0, job.begin, len);
    }
  }
  // Rows that went first keep their new weights (their moments come out the same again).
  const at::Tensor kept =
      patched_rows_[job.p].empty() ? at::Tensor() : patched_in(job.p, job.begin, job.end);
  const at::Tensor kept_weights = kept.defined() ? t[kWeight].index_select(0, kept) : kept;
  if (update_coef_.defined()) t[kGrad].mul_(update_coef_);
  if (started_in_backward_ && in_step_) ++stats_.backward_chunks;
  optimizer_.update_part(t[kWeight], t[kGrad], t[kMoment1], t[kMoment2], update_lr_,
                         params[job.p].decay, update_steps_);
  if (kept.defined()) t[kWeight].index_copy_(0, kept, kept_weights);
  for (int op : {kWeight, kMoment1, kMoment2}) {
    SwapSlot& s = *slots[op];
    if (s.busy) {
      s.dirty = true;
      continue;
    }
    if (tier_->in_place(s.key) != nullptr) continue;  // already where it lives
    const uint64_t room = spec_[job.p] ? spare_[job.p][spare_index(op)] : s.key;
    update_writes_[set].push_back(
        {write_room(s, room, static_cast<size_t>(job.begin) * 4,
                    staging_[set * kOperands + op] + job.at, chunk_bytes(job.begin, job.end)),
         job.p});
    ++writes_left_[job.p];
    stats_.write_bytes += static_cast<int64_t>(align_up(chunk_bytes(job.begin, job.end)));
  }
  if (job.last) {
    for (SwapSlot* s : slots) s->busy = false;
    // The gradient is spent: the next step starts without one. A guess's stays until it is
    // kept (it is spent then) or redone.
    if (!spec_[job.p]) spend_gradient(job.p);
    // update() still adds up the norms of an update that started inside the backward.
    if (!started_in_backward_) norms_[job.p].reset();
    patched_rows_[job.p].clear();
    rows_first_[job.p] = false;
    chunks_done_[job.p] = true;
    if (writes_left_[job.p] == 0) {
      pending_[job.p] = Pending::kNone;
    } else if (on_device) {
      // Its operands' loads may be queued now: on the device they wait for these writes (the
      // last chunk's, which land after the earlier ones).
      tier_->order_copies_after(update_writes_[set].back().ticket);
      pending_[job.p] = Pending::kNone;
    }
  }
}

// The stream keeps to the forward's window: the group running and the `depth` after it, whose
// weights the window loads anyway (the chunks then update them in place: one read serves both,
// and they are written once, when the forward leaves the group). A stream running further ahead
// reads and writes those weights through staging, the window reads them again, and its loads
// queue behind the stream's transfers for groups the forward will not reach for a while. Before
// the forward starts, the window is the first groups; in a backward nothing holds it back.
int Swapper::update_frontier() const {
  if (current_ >= 0 && current_backward_) return std::numeric_limits<int>::max();
  return std::max(current_, 0) + plan_.depth;
}

void Swapper::pump_update() {
  while (advance_update(false, update_frontier())) {
  }
}

void Swapper::finish_params(const std::vector<int>& list) {
  int upto = update_frontier();
  for (int p : list)
    if (pending_[p] != Pending::kNone) upto = std::max(upto, finish_gate_[p]);
  for (int p : list)
    while (pending_[p] != Pending::kNone)
      if (!advance_update(true, upto) && pending_[p] != Pending::kNone)
        throw std::logic_error("swap: the deferred update lost parameter " + std::to_string(p) +
                               " (state " + std::to_string(static_cast<int>(pending_[p])) +
                               ", writes " + std::to_string(writes_left_[p]) + ", chunks done " +
                               std::to_string(chunks_done_[p]) + ", jobs " +
                               std::to_string(jobs_.size()) + ")");
}

void Swapper::finish_update() {
  quiet_pump();
  while (advance_update(true, std::numeric_limits<int>::max())) {
  }
}

}  // namespace starling::swap
