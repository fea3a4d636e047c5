#include "starling/swap/swapper.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <set>
#include <utility>

#include "starling/common/error.h"
#include "starling/graph/dag.h"
#include "starling/swap/swap_config.h"
#include "starling/train/adamw.h"
#include "starling/train/metrics.h"
#include "starling/train/step_runner.h"

namespace starling::swap {

using train::now_s;
Swapper::Swapper(graph::OpDag& dag, train::AdamW& optimizer, SwapPlan plan,
                 std::unique_ptr<Tier> tier)
    : dag_(dag), optimizer_(optimizer), plan_(std::move(plan)), tier_(std::move(tier)) {
  const int n = dag_.size();
  auto& params = dag_.params().params();
  if (!params.empty()) device_ = params.front().value.device();
  pool_ = BufferPool(device_);
  node_group_ = plan_.node_groups(n);
  group_params_.resize(plan_.groups.size());
  owner_.assign(params.size(), -1);
  owner_node_.assign(params.size(), -1);
  for (int node = 0; node < n; ++node) {
    const int g = node_group_[node];
    for (const auto& name : dag_.nodes()[node].op->param_names()) {
      int index = 0;
      while (params[index].name != name) ++index;
      auto& list = group_params_[g];
      if (std::find(list.begin(), list.end(), index) == list.end()) list.push_back(index);
      if (owner_[index] < 0) owner_[index] = g;
      if (owner_node_[index] < 0) owner_node_[index] = node;
    }
  }
  // Tables read by row: the lookup is the only reader in its group, and there is room to spread
  // the table's chunks between the groups after the window and its next reader (swap_rows_first).
  const int G = static_cast<int>(plan_.groups.size());
  rows_table_.assign(params.size(), -1);
  spread_end_.assign(params.size(), G - 1);
  for (int node = 0; node < n; ++node) {
    const auto names = dag_.nodes()[node].op->param_names();
    for (size_t k = 0; k < names.size(); ++k) {
      int index = 0;
      while (params[index].name != names[k]) ++index;
      if (owner_node_[index] == node) {
        if (dag_.nodes()[node].op->reads_rows(k) && params[index].value.dim() == 2 &&
            rows_go_first(params[index].value.size(0), plan_.lookup_tokens))
          rows_table_[index] = static_cast<int>(k);
      } else if (node_group_[node] == owner_[index]) {
        rows_table_[index] = -1;  // read whole in the lookup's own group
      } else {
        spread_end_[index] = std::min(spread_end_[index], node_group_[node] - 1);
      }
    }
  }
  std::vector<bool> pinned(params.size(), false), kept(params.size(), plan_.everything_resident);
  for (size_t g = 0; g < plan_.groups.size(); ++g) {
    if (plan_.groups[g].pinned)
      for (int p : group_params_[g]) pinned[p] = true;
    if (plan_.groups[g].moments)
      for (int p : group_params_[g]) kept[p] = true;
  }

  at::NoGradGuard no_grad;
  // Fresh moments are zeros the optimizer never wrote: they start out in the tier, whose rooms
  // read as zeros, without being held or written (a model whose moments exceed RAM can start).
  const bool zero_moments = optimizer_.claim_zero_state();
  auto slot = [&](const at::Tensor& t, bool pin, bool zero) {
    // Below a GPU, moments may wait in RAM (AdamW's deferred zeros, a checkpoint's mapped
    // moments): each comes over alone and, beyond the budget, goes on to the tier at once, so the
    // GPU never holds more than the budget and one tensor while the state is adopted.
    const bool staged = t.device() != device_ && t.is_cpu();
    if (t.scalar_type() != at::kFloat || (t.device() != device_ && !staged))
      throw std::logic_error("swap: training state must be fp32, on one device");
    SwapSlot s;
    s.tensor = t;
    s.bytes = static_cast<size_t>(t.numel()) * t.element_size();
    s.key = tier_->reserve(s.bytes);
    s.pinned = pin;
    if (staged) {
      // set_data keeps the TensorImpl (the optimizer's and slot_of_'s handle) and gives it a
      // device tensor's storage. Fresh zeros that stay out need no bytes: the storage is emptied
      // at once, and the caching allocator hands the block to the next tensor.
      t.set_data(zero || t.numel() == 0 ? at::empty(t.sizes(), t.options().device(device_))
                                        : t.to(device_));
    }
    if (zero && !pin) {
      free_storage(t);
      s.state = SwapSlot::State::kOut;
      s.dirty = false;
      return s;
    }
    if (zero) t.zero_();
    if (staged && !pin && held_ + static_cast<int64_t>(align_up(s.bytes)) > plan_.budget) {
      write_through(s);
      return s;
    }
    // Only what may go to the tier needs aligned storage; a pinned slot never leaves. Beyond the
    // budget, a tensor that cannot keep its storage (a checkpoint's mapped moments) goes straight
    // to the tier instead of being copied in whole with the rest.
    if (!pin && !can_keep_storage(t)) {
      if (held_ + static_cast<int64_t>(align_up(s.bytes)) > plan_.budget) {
        write_through(s);
        return s;
      }
      adopt_storage(t, pool_.take(s.bytes));
    }
    held_ += s.held();
    return s;
  };
  // The weights first: they are in compute memory already, so a moment staged in RAM is held
  // only where the budget has room beside all of them.
  for (size_t i = 0; i < params.size(); ++i)
    values_.push_back(slot(params[i].value, pinned[i], false));
  for (size_t i = 0; i < params.size(); ++i) {
    // Kept moments (the plan's first groups') never leave: the update finds them resident and
    // runs on them in place, so they neither load nor write back.
    exp_avg_.push_back(slot(optimizer_.exp_avg(i), kept[i], zero_moments));
    exp_avg_sq_.push_back(slot(optimizer_.exp_avg_sq(i), kept[i], zero_moments));
    SwapSlot g;
    g.bytes = values_[i].bytes;
    g.key = tier_->reserve(g.bytes);
    g.pinned = pinned[i];
    g.state = SwapSlot::State::kOut;  // no gradient yet
    grads_.push_back(std::move(g));
  }
  norms_.resize(params.size());
  finalized_.assign(params.size(), false);
  finish_gate_.assign(params.size(), 0);
  rows_first_.assign(params.size(), false);
  patched_rows_.resize(params.size());
  pending_.assign(params.size(), Pending::kNone);
  writes_left_.assign(params.size(), 0);
  chunks_done_.assign(params.size(), false);
  for (auto* list : {&values_, &exp_avg_, &exp_avg_sq_})
    for (SwapSlot& s : *list) slot_of_[s.tensor.unsafeGetTensorImpl()] = &s;
  // A speculative update (on a CPU, where the update is overlapped and the tier is not updated
  // in place) gives a parameter whose weight and moments may leave compute memory a spare room
  // for each, at the first guess (reserve_spare_rooms).
  can_speculate_ = plan_.speculation != Speculation::kOff && device_.is_cpu() &&
                   !plan_.everything_resident && plan_.overlap_update && !params.empty() &&
                   tier_->in_place(grads_[0].key) == nullptr;
  spare_.assign(params.size(), {0, 0, 0});
  has_spare_.assign(params.size(), false);
  for (size_t i = 0; i < params.size(); ++i) has_spare_[i] = !pinned[i] && !kept[i];
  spec_.assign(params.size(), false);
  kept_.assign(params.size(), false);
  // A plan without staging is for a tier the optimizer updates in place (swap_plan.h).
  if (!plan_.everything_resident && plan_.staging_bytes == 0 && !params.empty() &&
      tier_->in_place(grads_[0].key) == nullptr)
    throw std::logic_error("swap: a plan without staging for a tier that is not updated in place");
  if (plan_.staging_bytes > 0)
    for (int i = 0; i < kStagingChunks; ++i) {
      staging_buffers_.push_back(pool_.take(static_cast<size_t>(plan_.chunk_bytes)));
      staging_.push_back(static_cast<char*>(staging_buffers_.back().get()));
      held_ += plan_.chunk_bytes;
    }
  make_room(0, true);
  drain_writes();
  fit_pool();
  // Counted from here: adopting the state briefly held all of it.
  stats_.peak_resident = held_;
  // On a GPU the stream's copies are queued on the device as soon as they are issued, so node
  // boundaries suffice; on a CPU the pump also moves it between a node's operators. 1 ms between
  // runs keeps the pump's own cost (checking completions) out of the step.
  if (device_.is_cpu() && !plan_.everything_resident && plan_.overlap_update)
    pump_ = std::make_unique<OpPump>(
        [this] {
          ++stats_.pumped;
          pump_update();
        },
        1e-3);
}

Swapper::~Swapper() {
  quiet_pump();
  // Transfers in flight read or write buffers owned by the slots or the staging area: let them
  // finish. A deferred update nobody read is dropped.
  for (auto& set : update_reads_)
    for (Ticket t : set) try {
        tier_->wait(t);
      } catch (...) {
      }
  for (auto& set : update_writes_)
    for (const UpdateWrite& w : set) try {
        tier_->wait(w.ticket);
      } catch (...) {
      }
  for (SwapSlot* s : std::vector<SwapSlot*>(writing_)) {
    try {
      tier_->wait(s->io);
    } catch (...) {
    }
  }
  for (const Store& store : stores_) try {
      tier_->wait(store.io);
    } catch (...) {
    }
  for (auto* list : {&values_, &grads_, &exp_avg_, &exp_avg_sq_})
    for (SwapSlot& s : *list)
      if (s.state == SwapSlot::State::kLoading) try {
          tier_->wait(s.io);
        } catch (...) {
        }
  // The staging buffers go with the members.
}

// The peak grows with what is brought in, not with what leaves: after a gather_weights() (whose
// weights the peak leaves out) the resident set shrinks back to the budget through here.
void Swapper::track(int64_t delta) {
  held_ += delta;
  if (delta <= 0) return;
  stats_.peak_resident = std::max(stats_.peak_resident, held_);
  fit_pool();
}

// The room reserved for gradients a backward is about to create is not taken from the pool:
// autograd makes them in its own blocks, which the large ones keep; small ones are copied into kept
// buffers.
void Swapper::fit_pool() { pool_.trim(plan_.budget - held_); }

void Swapper::release(SwapSlot& s) {
  // A pinned gradient's buffer is autograd's and never goes to the tier: it is simply dropped.
  // Other buffers, kept ones from the caching allocator too, serve later loads of their size.
  if (s.pinned)
    free_storage(s.tensor);
  else
    pool_.give(free_storage(s.tensor), s.bytes);
}

// ---- slots ----

void Swapper::store(SwapSlot& s, at::DataPtr buffer) {
  const double t0 = now_s();
  tier_->wait(write_room(s, s.key, 0, buffer.get(), s.bytes));
  stats_.wait_s += now_s() - t0;
  stats_.write_bytes += static_cast<int64_t>(align_up(s.bytes));
  pool_.give(std::move(buffer), s.bytes);
  fit_pool();
  s.dirty = false;
}

void Swapper::write_through(SwapSlot& s) {
  at::DataPtr buffer = pool_.take(s.bytes);
  copy_bytes(device_, buffer.get(), s.tensor.data_ptr(), s.bytes);
  free_storage(s.tensor);  // the original bytes go (a mapping's pages, to the page cache)
  store(s, std::move(buffer));
  s.state = SwapSlot::State::kOut;
}

void Swapper::drop(SwapSlot& s) {
  release(s);
  s.state = SwapSlot::State::kOut;
  track(-static_cast<int64_t>(align_up(s.bytes)));
}

void Swapper::evict(SwapSlot& s) {
  if (s.state != SwapSlot::State::kResident || s.pinned || s.busy) return;
  if (!s.dirty) {
    drop(s);
    return;
  }
  s.io = write_room(s, s.key, 0, storage_data(s.tensor), s.bytes);
  s.state = SwapSlot::State::kWriting;
  stats_.write_bytes += static_cast<int64_t>(align_up(s.bytes));
  writing_.push_back(&s);
}

void Swapper::load(SwapSlot& s) {
  if (s.state != SwapSlot::State::kOut) return;
  allocate_storage(s.tensor, pool_.take(s.bytes), s.bytes);
  track(static_cast<int64_t>(align_up(s.bytes)));
  s.io = read_room(s, 0, storage_data(s.tensor), s.bytes);
  s.state = SwapSlot::State::kLoading;
  s.dirty = false;
  stats_.read_bytes += static_cast<int64_t>(align_up(s.bytes));
}

void Swapper::settle(SwapSlot& s) {
  if (s.state != SwapSlot::State::kWriting && s.state != SwapSlot::State::kLoading) return;
  const double t0 = now_s();
  // On a GPU the compute stream waits for the copy, not the host: kernels queued after this read
  // the bytes once they have landed, and every later copy into or out of the buffer is queued
  // behind those kernels (pinned_tier.h), so the host runs ahead instead of draining the GPU's
  // queue at every load.
  tier_->order_after(s.io);
  stats_.wait_s += now_s() - t0;
  // A write that was waited for keeps its buffer: whoever waited wants the bytes.
  s.state = SwapSlot::State::kResident;
  s.dirty = false;
  std::erase(writing_, &s);
}

void Swapper::poll_writes() {
  std::erase_if(writing_, [&](SwapSlot* s) {
    if (!tier_->done(s->io)) return false;
    if (s->guard == epoch_) {
      // Wanted again while it was being written: keep the bytes, now also safe in the tier.
      s->state = SwapSlot::State::kResident;
      s->dirty = false;
      return true;
    }
    release(*s);
    s->state = SwapSlot::State::kOut;
    s->dirty = false;
    track(-static_cast<int64_t>(align_up(s->bytes)));
    return true;
  });
}

void Swapper::drain_writes() {
  const double t0 = now_s();
  for (SwapSlot* s : writing_) tier_->wait(s->io);
  stats_.wait_s += now_s() - t0;
  poll_writes();
}

// Whether `bytes` more fit the budget without evicting anything.
bool Swapper::has_room(int64_t bytes) {
  poll_writes();
  return held_ + reserved_ + static_cast<int64_t>(align_up(bytes)) <= plan_.budget;
}

// Frees room for `bytes` more: finished writes first, then the slots furthest from use (moments,
// which only the optimizer reads, then gradients and weights of groups outside the current
// window), then waiting for writes in flight. With `must` false (a prefetch) it never waits.
bool Swapper::make_room(int64_t bytes, bool must) {
  const int64_t budget = plan_.budget;
  poll_writes();
  auto fits = [&] { return held_ + reserved_ + bytes <= budget; };
  if (fits()) return true;
  // Writes in flight free their buffers when done, except those of slots wanted again (guarded),
  // which stay resident.
  auto writing_bytes = [&] {
    int64_t b = 0;
    for (SwapSlot* s : writing_)
      if (s->guard != epoch_) b += s->held();
    return b;
  };
  std::vector<std::vector<SwapSlot>*> order = {&exp_avg_, &exp_avg_sq_, &grads_, &values_};
  for (auto* list : order) {
    const int n = static_cast<int>(list->size());
    // Walking away from the current position: forward passes evict the earliest layers first,
    // backward passes the latest.
    for (int k = 0; k < n && held_ - writing_bytes() + reserved_ + bytes > budget; ++k) {
      SwapSlot& s = (*list)[current_backward_ ? n - 1 - k : k];
      if (s.guard == epoch_ || s.pinned || s.busy) continue;
      if (s.state == SwapSlot::State::kLoading) settle(s);  // loaded ahead, no longer wanted
      evict(s);
    }
    poll_writes();
    if (fits()) return true;
  }
  if (!must) return fits();
  if (!jobs_.empty()) {
    // The deferred update holds operands in place: finished, it lets them go.
    finish_update();
    return make_room(bytes, must);
  }
  while (!fits() && !writing_.empty()) {
    const double t0 = now_s();
    tier_->wait(writing_.front()->io);
    stats_.wait_s += now_s() - t0;
    poll_writes();
  }
  if (!fits()) {
    auto sum = [](const std::vector<SwapSlot>& list) {
      int64_t b = 0;
      for (const SwapSlot& s : list) b += s.held();
      return format_bytes(static_cast<double>(b));
    };
    throw Error("swap: the budget of " + format_bytes(static_cast<double>(budget)) +
                " cannot hold what layer group " + std::to_string(current_) + " needs (" +
                format_bytes(static_cast<double>(held_ + reserved_ + bytes)) + " with weights " +
                sum(values_) + ", gradients " + sum(grads_) + " + " +
                format_bytes(static_cast<double>(reserved_)) + " to come, moments " +
                sum(exp_avg_) + " + " + sum(exp_avg_sq_) + ", staging " +
                format_bytes(static_cast<double>(staging_.size() * plan_.chunk_bytes)) +
                "); raise swap.budget or let the planner choose swap.group_nodes");
  }
  return true;
}

// ---- groups ----

// Every micro-batch runs the groups forward, then backward; after a step's last one the next step
// starts the same way.
Swapper::Task Swapper::task_at(int64_t index) const {
  const int G = static_cast<int>(plan_.groups.size());
  const int64_t k = ((index % (2 * G)) + 2 * G) % (2 * G);
  return k < G ? Task{static_cast<int>(k), false} : Task{static_cast<int>(2 * G - 1 - k), true};
}

bool Swapper::needed_soon(int group) const {
  if (!in_step_) return false;
  for (int64_t k = task_ + 1; k <= task_ + plan_.depth + 1; ++k)
    if (task_at(k).group == group) return true;
  return false;
}

void Swapper::mark_guard(int group, bool backward) {
  for (int p : group_params_[group]) {
    values_[p].guard = epoch_;
    if (backward) grads_[p].guard = epoch_;
  }
}

// Groups loaded ahead stand in the way of what group `group` needs now: only it stays guarded,
// and room is made whatever it takes.
void Swapper::narrow_to(int group, bool backward, int64_t bytes) {
  ++epoch_;
  mark_guard(group, backward);
  make_room(bytes, true);
}

// Makes the group's weights (and, for backward, gradients already produced this step) resident
// or loading. `must`: make room whatever it takes.
void Swapper::want(int group, bool backward, bool must) {
  for (int p : group_params_[group]) {
    // The deferred update is rewriting its tier copy: it loads once the update is done.
    if (pending_[p] == Pending::kStreaming) continue;
    std::vector<SwapSlot*> slots = {&values_[p]};
    if (backward && grads_[p].tensor.defined()) slots.push_back(&grads_[p]);
    for (SwapSlot* s : slots) {
      if (s->state != SwapSlot::State::kOut) continue;
      const auto bytes = static_cast<int64_t>(align_up(s->bytes));
      if (!make_room(bytes, false)) {
        if (!must) return;
        narrow_to(group, backward, bytes);
      }
      load(*s);
    }
  }
}

void Swapper::enter(int group, bool backward) {
  // The group reads its parameters' new values; a table looked up by row gets the rows it reads
  // once its weights are resident (below).
  std::vector<int> finish = group_params_[group];
  std::erase_if(finish, [&](int p) {
    return std::any_of(lookup_.begin(), lookup_.end(), [&](const auto& l) { return l.first == p; });
  });
  finish_params(finish);
  current_ = group;
  current_backward_ = backward;
  ++epoch_;
  if (in_step_) {
    const int G = static_cast<int>(plan_.groups.size());
    task_ = micro_ * 2 * G + (backward ? 2 * G - 1 - group : group);
  }
  // The window: this group and the next `depth` tasks' groups.
  std::vector<Task> window = {{group, backward}};
  for (int k = 1; k <= plan_.depth; ++k) {
    if (in_step_) {
      window.push_back(task_at(task_ + k));
    } else {
      const int h = backward ? group - k : group + k;
      if (h >= 0 && h < static_cast<int>(plan_.groups.size())) window.push_back({h, backward});
    }
  }
  for (const Task& t : window) mark_guard(t.group, t.backward);
  // Room for the gradients this backward creates, before anything is loaded ahead.
  reserved_ = 0;
  if (backward)
    for (int p : group_params_[group])
      if (!grads_[p].tensor.defined()) reserved_ += static_cast<int64_t>(align_up(grads_[p].bytes));
  if (!make_room(0, false)) narrow_to(group, backward, 0);
  want(group, backward, true);
  for (size_t i = 1; i < window.size(); ++i) want(window[i].group, window[i].backward, false);
  for (int p : group_params_[group]) {
    settle(values_[p]);
    if (backward && grads_[p].tensor.defined()) settle(grads_[p]);
  }
  for (const auto& [p, ids] : lookup_) update_rows_first(p, ids);
  lookup_.clear();
}

// Gradients autograd just made become slots (aligned storage the tier can write from).
void Swapper::adopt_grads(int group) {
  auto& params = dag_.params().params();
  for (int p : group_params_[group]) {
    SwapSlot& s = grads_[p];
    at::Tensor g = params[p].value.grad();
    if (!g.defined() || s.tensor.defined()) continue;
    if (!g.is_contiguous() || g.storage_offset() != 0 || g.storage().nbytes() != s.bytes) {
      g = g.contiguous().clone();
      params[p].value.mutable_grad() = g;
    }
    // Autograd's buffer is kept when the tier can write from it (a large gradient, from the
    // caching CPU allocator) or when it never goes there (a pinned group's); only small
    // gradients are copied into aligned buffers.
    if (!s.pinned && !can_keep_storage(g)) adopt_storage(g, pool_.take(s.bytes));
    s.tensor = g;
    s.state = SwapSlot::State::kResident;
    s.dirty = true;
    track(static_cast<int64_t>(align_up(s.bytes)));
  }
}

void Swapper::leave() {
  quiet_pump();
  if (current_ < 0) return;
  const int g = current_;
  if (current_backward_) {
    reserved_ = 0;
    adopt_grads(g);
    for (int p : group_params_[g])
      if (grads_[p].tensor.defined()) grads_[p].dirty = true;  // accumulated into
    if (micro_batches_ > 0 && micro_ == micro_batches_ - 1) {
      // The gradient of a parameter is final once its first reader's group has run backward.
      for (int p : group_params_[g])
        if (owner_[p] == g && grads_[p].tensor.defined()) finalize_gradient(p);
      if (in_backward_) queue_final_params(g);  // streamed from the next visit on
    }
  }
  current_ = -1;
  if (plan_.groups[g].pinned || needed_soon(g)) return;
  ++epoch_;  // nothing guarded while leaving
  for (int p : group_params_[g]) {
    evict(values_[p]);
    if (grads_[p].tensor.defined()) evict(grads_[p]);
  }
}

void Swapper::before(int node, graph::Phase phase) {
  quiet_pump();
  if (pump_) pump_->rethrow();  // a transfer's failure inside the last node's operators
  pump_update();
  const int g = node_group_[node];
  const bool backward = phase != graph::Phase::kForward;
  if (g != current_ || backward != current_backward_) {
    leave();
    enter(g, backward);
  }
  if (pump_) pump_->arm(true);
}

void Swapper::before_forward(int node, const std::vector<at::Tensor>& inputs) {
  lookup_.clear();
  const int g = node_group_[node];
  // Entering the table's group at its lookup, before the stream has started the table.
  if (g != current_ || current_backward_) {
    for (int p : group_params_[g])
      // Once per update: a second lookup (an evaluation's, then the step's) reads other rows.
      if (owner_node_[p] == node && rows_first_[p] && pending_[p] == Pending::kQueued &&
          patched_rows_[p].empty())
        if (at::Tensor ids =
                dag_.nodes()[node].op->rows_read(static_cast<size_t>(rows_table_[p]), inputs);
            ids.defined())
          lookup_.emplace_back(p, ids);
  }
  before(node, graph::Phase::kForward);
  lookup_.clear();
}

void Swapper::after(int, graph::Phase) { quiet_pump(); }

void Swapper::quiet_pump() {
  if (pump_) pump_->arm(false);
}

void Swapper::expect_update(double lr, double max_norm) {
  bool worth = plan_.speculation == Speculation::kAlways;
  if (!worth && max_norm > 0 && can_speculate_ && last_unclipped_) {
    worth = guesses_.worth_guessing(plan_.break_even);
    if (!worth) ++stats_.declined;
  }
  const bool speculate = max_norm > 0 && can_speculate_ && worth && reserve_spare_rooms();
  expected_ = (max_norm == 0 || speculate) && device_.is_cpu() && !plan_.everything_resident &&
              plan_.overlap_update;
  expected_lr_ = lr;
  expected_max_norm_ = max_norm;
}

void Swapper::begin_step(int64_t micro_batches) {
  drain_stores();  // the steps' budget holds no buffer of a pass over the state
  leave();
  in_backward_ = expected_ && micro_batches > 0;
  step_factor_ = std::exchange(next_factor_, 1.0);
  if (step_factor_ != 1 && expected_)
    throw std::logic_error("swap: gradients unscaled in a step whose update was announced");
  std::fill(finalized_.begin(), finalized_.end(), false);
  speculating_ = in_backward_ && expected_max_norm_ > 0;
  step_max_norm_ = expected_max_norm_;
  expected_ = false;
  micro_batches_ = micro_batches;
  in_step_ = true;
  step_start_s_ = now_s();
  step_start_wait_s_ = stats_.wait_s;
  auto& params = dag_.params().params();
  for (size_t p = 0; p < params.size(); ++p) {
    SwapSlot& s = grads_[p];
    // A gradient the deferred update has not reached yet stays until it has.
    if (!s.tensor.defined() || pending_[p] != Pending::kNone) continue;
    settle(s);
    spend_gradient(static_cast<int>(p));
    norms_[p].reset();
  }
  // Down to the budget before anything loads: a gather_weights() (a sample) left every weight
  // resident, and the step's peak must not count it.
  ++epoch_;
  make_room(0, true);
}

void Swapper::begin_micro_batch(int64_t micro) { micro_ = micro; }

void Swapper::end_pass() { leave(); }

void Swapper::end_passes() {
  if (!in_step_) return;
  stats_.pass_s += now_s() - step_start_s_;
  stats_.pass_wait_s += stats_.wait_s - step_start_wait_s_;
  in_step_ = false;
}

// ---- the exchange ----

void Swapper::make_gradient(int p) {
  SwapSlot& s = grads_[p];
  at::Tensor& value = dag_.params().params()[p].value;
  make_room(static_cast<int64_t>(align_up(s.bytes)), true);
  at::Tensor g = at::zeros(value.sizes(), value.options());
  if (!s.pinned && !can_keep_storage(g)) adopt_storage(g, pool_.take(s.bytes));
  value.mutable_grad() = g;
  s.tensor = g;
  s.state = SwapSlot::State::kResident;
  s.dirty = true;
  track(static_cast<int64_t>(align_up(s.bytes)));
}

void Swapper::close_passes(const char* reading) {
  if (started_in_backward_)
    throw std::logic_error(std::string("swap: gradients ") + reading +
                           " in a step whose update was announced");
  finish_update();
  leave();
  end_passes();
}

void Swapper::visit_gradients(const std::function<void(std::span<const int>)>& visit) {
  at::NoGradGuard no_grad;
  close_passes("visited");
  const double start = now_s(), start_wait = stats_.wait_s;
  // One piece per node, by the node that reads each parameter first: the pieces are the same on
  // every peer, whatever layer groups its own plan chose (a peer plans from its own budget and
  // timings), and an unswapped peer visits them too when asked (visit_gradients_by_node), so
  // peers that exchange a piece at a time agree on every collective's size.
  const std::vector<std::vector<int>> pieces = dag_.params_by_first_reader();
  // The backward passes ended with the first groups: their gradients are resident, so the walk
  // starts there, and room is made from the pieces already visited (the lowest indices).
  current_backward_ = false;
  auto bring = [&](const std::vector<int>& piece, bool must) {
    for (int p : piece) {
      SwapSlot& s = grads_[p];
      if (!s.tensor.defined()) {
        if (must) make_gradient(p);
        continue;
      }
      if (s.state != SwapSlot::State::kOut) continue;
      if (!make_room(static_cast<int64_t>(align_up(s.bytes)), must)) return;
      load(s);
    }
  };
  for (size_t k = 0; k < pieces.size(); ++k) {
    ++epoch_;
    for (size_t j = k; j < std::min(pieces.size(), k + 2); ++j)
      for (int p : pieces[j]) grads_[p].guard = epoch_;
    bring(pieces[k], true);
    if (k + 1 < pieces.size()) bring(pieces[k + 1], false);  // loads while this piece is visited
    for (int p : pieces[k]) {
      settle(grads_[p]);
      // An open-ended step's gradients are final here; the others' were unscaled already.
      if (step_factor_ != 1 && !finalized_[p]) grads_[p].tensor.mul_(step_factor_);
      finalized_[p] = true;
    }
    visit(pieces[k]);
    for (int p : pieces[k]) {
      grads_[p].dirty = true;
      norms_[p] = at::_foreach_norm({grads_[p].tensor}, 2)[0];
    }
  }
  stats_.exchange_s += now_s() - start;
  stats_.exchange_wait_s += stats_.wait_s - start_wait;
}

// ---- the optimizer ----

at::Tensor Swapper::update(double lr, double max_norm, bool skip) {
  at::NoGradGuard no_grad;
  // A state transfer between the passes and the update (a ddp or atom peer adopting the root's
  // state) may leave writes in flight, and a tier updated in place is updated where they land.
  drain_stores();
  leave();
  end_passes();
  in_backward_ = false;
  const bool started = started_in_backward_;
  if (started && (lr != update_lr_ || max_norm != step_max_norm_ || skip))
    throw std::logic_error("swap: the update differs from the one announced by expect_update");
  if (!started) finish_update();  // the previous step's, were any of it left
  at::Tensor total, coef;
  const std::vector<at::Tensor> norms = step_norms(started);
  const bool any = !norms.empty();  // gradients to update with
  total = norms.empty() ? at::zeros({}, at::TensorOptions(at::kFloat).device(device_))
                        : at::stack(norms).norm(2);
  if (skip) {
    // Nothing to update: the gradients go now rather than at the next step's start, so that
    // what comes between (an exchange, a checkpoint) finds none held.
    for (size_t p = 0; p < grads_.size(); ++p) {
      if (!grads_[p].tensor.defined()) continue;
      settle(grads_[p]);
      spend_gradient(static_cast<int>(p));
      norms_[p].reset();
    }
    return total;
  }
  // As train::clip_grad_norm computes it; a coefficient of exactly 1 leaves every bit as it is.
  if (max_norm > 0) {
    coef = (max_norm / (total + 1e-6)).clamp_max(1.0);
    // (The host reads it only on a CPU, where it is computed already.)
    if (can_speculate_) {
      const bool unclipped = coef.item<float>() == 1.0f;
      if (last_unclipped_) guesses_.add(unclipped);  // a guess here is (or would be) kept
      last_unclipped_ = unclipped;
    }
  }
  bool redone = false;
  if (started && speculating_) {
    ++stats_.speculated;
    if (last_unclipped_) {
      keep_speculation();
    } else {
      ++stats_.redone;
      redo_speculation();
      redone = true;
    }
  }
  speculating_ = false;
  if (started && !redone) {
    queue_the_rest();
    pump_update();
    return total;
  }
  if (!any) return total;
  if (!redone) optimizer_.begin_step();  // a redone update's step was begun in the backward
  start_update(lr, coef);
  // With nothing to move there is nothing to overlap: the update completes here, as it does
  // when swap.overlap_update is off.
  if (plan_.everything_resident || !plan_.overlap_update) finish_update();
  return total;
}

void Swapper::finalize_gradient(int p) {
  SwapSlot& s = grads_[p];
  if (step_factor_ != 1 && !finalized_[p]) {
    s.tensor.mul_(step_factor_);
    s.dirty = true;
  }
  finalized_[p] = true;
  norms_[p] = at::_foreach_norm({s.tensor}, 2)[0];
}

std::vector<at::Tensor> Swapper::step_norms(bool started) {
  const double start = now_s(), start_wait = stats_.wait_s;
  std::vector<at::Tensor> norms;
  for (size_t p = 0; p < grads_.size(); ++p) {
    SwapSlot& g = grads_[p];
    if (!g.tensor.defined()) {
      // Updated inside the backward already: its gradient is spent, its norm kept.
      if (started && chunks_done_[p] && norms_[p].defined()) norms.push_back(norms_[p]);
      continue;
    }
    if (!norms_[p].defined()) {  // an open-ended step's gradient, not exchanged
      settle(g);
      make_room(static_cast<int64_t>(align_up(g.bytes)), true);
      load(g);
      settle(g);
      finalize_gradient(static_cast<int>(p));
    }
    norms.push_back(norms_[p]);
  }
  stats_.update_s += now_s() - start;
  stats_.update_wait_s += stats_.wait_s - start_wait;
  return norms;
}

bool Swapper::gradients_finite() {
  at::NoGradGuard no_grad;
  close_passes("checked");
  const std::vector<at::Tensor> norms = step_norms(false);
  // As train::LossScaler::finite decides: the sum of the norms is finite exactly when every
  // element is.
  return norms.empty() || at::stack(norms).sum().isfinite().item<bool>();
}

void Swapper::gather_weights() {
  // A sample briefly holds every weight; the peak reports the steps.
  const int64_t peak = stats_.peak_resident;
  finish_update();
  drain_stores();
  leave();
  for (SwapSlot& s : values_) {
    settle(s);
    load(s);
  }
  for (SwapSlot& s : values_) settle(s);
  stats_.peak_resident = peak;
}

at::Tensor Swapper::read_state(const at::Tensor& t) {
  const auto it = slot_of_.find(t.unsafeGetTensorImpl());
  if (it == slot_of_.end()) return t;
  finish_update();
  SwapSlot& s = *it->second;
  settle(s);
  if (s.resident()) return t;
  at::Tensor copy;
  void* buffer = nullptr;
  if (device_.is_cpu()) {
    buffer = std::aligned_alloc(kSwapAlign, align_up(s.bytes));
    if (buffer == nullptr) throw std::bad_alloc();
    copy = at::from_blob(
        buffer, t.sizes(), [](void* p) { std::free(p); }, at::TensorOptions(at::kFloat));
  } else {
    copy = at::empty(t.sizes(), t.options());  // a GPU's tier needs no alignment
    buffer = copy.data_ptr();
  }
  const Ticket read = read_room(s, 0, buffer, s.bytes);
  const double t0 = now_s();
  tier_->wait(read);
  stats_.wait_s += now_s() - t0;
  stats_.read_bytes += static_cast<int64_t>(align_up(s.bytes));
  return copy;
}

void Swapper::write_state(const at::Tensor& t, const at::Tensor& values) {
  const auto it = slot_of_.find(t.unsafeGetTensorImpl());
  if (it == slot_of_.end()) {
    train::copy_state(t, values);
    return;
  }
  finish_update();
  SwapSlot& s = *it->second;
  settle(s);  // a load lands, a write completes: the slot is resident or out
  if (s.resident()) {
    train::copy_state(t, values);
    s.dirty = true;
    return;
  }
  // Out: the tier's room takes the new bytes, and the slot stays out, so a transfer of the whole
  // state holds no more than one tensor of it, plus the writes still in flight: the caller goes
  // on (to read the next tensor) while this one is written.
  const size_t bytes = align_up(s.bytes);
  while (!stores_.empty() && storing_bytes_ + static_cast<int64_t>(bytes) > kStoreAheadBytes)
    retire_store(0);
  at::DataPtr buffer = pool_.take(s.bytes);
  at::from_blob(buffer.get(), t.sizes(), t.options()).copy_(values.reshape(t.sizes()));
  const Ticket io = write_room(s, s.key, 0, buffer.get(), s.bytes);
  stats_.write_bytes += static_cast<int64_t>(bytes);
  s.dirty = false;
  stores_.push_back({&s, io, std::move(buffer), bytes});
  storing_bytes_ += static_cast<int64_t>(bytes);
  // Those already through give their buffers back.
  while (!stores_.empty() && tier_->done(stores_.front().io)) retire_store(0);
}

Ticket Swapper::read_room(SwapSlot& s, size_t offset, void* dst, size_t bytes) {
  await_store(s);
  return tier_->read(s.key, offset, dst, bytes);
}

Ticket Swapper::write_room(SwapSlot& s, uint64_t room, size_t offset, const void* src,
                           size_t bytes) {
  if (room == s.key) await_store(s);  // two writes to one room may complete in either order
  return tier_->write(room, offset, src, bytes);
}

void Swapper::await_store(const SwapSlot& s) {
  for (size_t i = 0; i < stores_.size();)
    if (stores_[i].slot == &s)
      retire_store(i);
    else
      ++i;
}

void Swapper::retire_store(size_t i) {
  Store& store = stores_[i];
  const double t0 = now_s();
  tier_->wait(store.io);
  stats_.wait_s += now_s() - t0;
  storing_bytes_ -= static_cast<int64_t>(store.bytes);
  pool_.give(std::move(store.buffer), store.slot->bytes);
  stores_.erase(stores_.begin() + static_cast<std::ptrdiff_t>(i));
  fit_pool();
}

void Swapper::drain_stores() {
  while (!stores_.empty()) retire_store(0);
}

void Swapper::keep_state(const at::Tensor& t, const at::Tensor& values) {
  const size_t bytes = static_cast<size_t>(t.numel()) * t.element_size();
  if (t.scalar_type() != at::kFloat || t.device() != device_ || !t.is_contiguous() ||
      t.storage_offset() != 0 || t.storage().nbytes() != bytes)
    throw std::logic_error("swap: kept state must be a whole contiguous fp32 tensor on " +
                           device_.str());
  SwapSlot& s = kept_state_.emplace_back();
  s.tensor = t;
  s.bytes = bytes;
  s.key = tier_->reserve(bytes);
  free_storage(t);
  if (values.defined()) {
    at::NoGradGuard no_grad;
    at::DataPtr buffer = pool_.take(bytes);
    at::from_blob(buffer.get(), t.sizes(), t.options()).copy_(values.reshape(t.sizes()));
    store(s, std::move(buffer));
    fit_pool();
  }
  s.state = SwapSlot::State::kOut;
  s.dirty = false;
  slot_of_[t.unsafeGetTensorImpl()] = &s;
}

}  // namespace starling::swap
