#include "starling/strategy/co2.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "starling/common/error.h"
#include "starling/strategy/state_tensors.h"
#include "starling/strategy/strategy_config.h"
#include "starling/swap/swap_config.h"
#include "starling/train/metrics.h"

namespace starling::strategy {
namespace {
constexpr double kGapEps = 1e-8;
// Adaptive overlap: the apply point is this many times the exchange's measured length in steps.
constexpr double kApplyMargin = 1.25;
}  // namespace

Co2::Co2(const train::RunConfig& config, net::Collectives& net)
    : SwarmStrategy(config, net), faults_("exchange") {
  if (!faults_.announcement().empty()) log(faults_.announcement());
}

void Co2::allocate(train::Replica& r) {
  replica_ = &r;
  exchange_.emplace(flat_->device(), flat_->numel(), through_host());
  shard_end_ = flat_->numel();
  average_ = exchange_->device();
  flags_ = at::zeros({2}, average_.options());
  offsets_.clear();
  int64_t at = 0;
  for (const int i : flat_->indices()) {
    offsets_.push_back(at);
    at += r.params.params()[static_cast<size_t>(i)].value.numel();
  }
  const bool swapped = config_.swap.enabled() && r.runner != nullptr;
  if (zero()) {
    // The shards are cut at the first agreement (set_shard) or restored from a checkpoint.
    anchor_shard_ = at::zeros({0}, average_.options());
    momentum_shard_ = at::zeros({0}, average_.options());
    previous_shard_ = at::zeros({0}, average_.options());
    params_by_tensor_ = swapped;
    if (swapped)
      log("the shards of the anchor, outer momentum and previous average and the exchange "
          "buffer stay in memory beside swap.budget (" +
          swap::format_bytes(4.0 * static_cast<double>(flat_->numel())) +
          " for the buffer, 12 bytes a parameter over the peers for the shards)");
  } else {
    // A swapped replica's runner keeps the four vectors in its tier.
    const bool keep = swapped;
    using Start = OuterVector::Start;
    anchor_ = OuterVector(*flat_, r.params, r.runner, keep, Start::parameters);
    momentum_ = OuterVector(*flat_, r.params, r.runner, keep, Start::zeros);
    previous_ = OuterVector(*flat_, r.params, r.runner, keep, Start::zeros);
    own_ = OuterVector(*flat_, r.params, r.runner, keep, Start::zeros);
    if (keep)
      log("the anchor, outer momentum, previous average and own delta are kept in the swap "
          "tier; the average in flight stays in memory beside swap.budget (" +
          swap::format_bytes(4.0 * static_cast<double>(flat_->numel())) + ")");
  }
  const auto& s = config_.strategy;
  if (model_part() && s.overlap_steps > 0 && s.overlap_steps < s.local_steps)
    throw ConfigError(
        "strategy.overlap_steps < strategy.local_steps is not supported on a "
        "pipeline's stages yet; set overlap_steps = 0");
  if (early() && overlap_steps() > 0)
    log("each round's average is applied " + std::to_string(overlap_steps()) +
        " steps into the next round (strategy.overlap_steps)");
  if (s.outer_nesterov && !early())
    log("each round's average is applied a round late, so the anchor takes the heavy ball's "
        "outer step (strategy.outer_nesterov is for averages applied inside the round)");
}

int64_t Co2::overlap_steps() const { return co2_overlap_steps(config_.strategy, model_part()); }

bool Co2::early() const {
  const int64_t k = overlap_steps();
  return k < 0 || (k > 0 && k < config_.strategy.local_steps);
}

std::array<float, kAgreementNotes> Co2::round_notes() const {
  if (exchange_s_ <= 0 || step_s_ <= 0) return {0.f, 0.f, 0.f};
  return {static_cast<float>(exchange_s_ / step_s_), 1.f, 0.f};
}

int64_t Co2::choose_apply_point(const Agreement& a) {
  const int64_t tau = config_.strategy.local_steps;
  const int64_t fixed = overlap_steps();
  if (fixed >= 0) return fixed;
  // Adaptive: the participants' mean of how many steps their last exchange took, with a margin
  // for a link whose speed varies; a round without measurements (the first) waits the longest.
  int64_t k = tau - 1;
  if (a.notes[1] > 0) {
    const double steps = a.notes[0] / a.notes[1];
    k = std::clamp(static_cast<int64_t>(std::ceil(steps * kApplyMargin)), int64_t{1}, tau - 1);
    if (k != logged_k_)
      log("each round's average is now applied " + std::to_string(k) +
          (k == 1 ? " step" : " steps") + " into the next round (the last exchanges took " +
          train::fmt("%.1f", steps) + " steps; strategy.overlap_steps = -1)");
    logged_k_ = k;
  }
  return k;
}

void Co2::set_shard(const std::vector<net::PeerId>& ring) {
  ring_ = ring;
  if (!zero()) return;
  const auto pos = std::find(ring.begin(), ring.end(), net_.self()) - ring.begin();
  const net::Shard s = net::shard_of(static_cast<size_t>(flat_->numel()),
                                     static_cast<int>(ring.size()), static_cast<int>(pos));
  shard_begin_ = static_cast<int64_t>(s.begin);
  shard_end_ = static_cast<int64_t>(s.end);
  const int64_t n = shard_end_ - shard_begin_;
  // The shard of the current parameters (the shared anchor at a boundary); momentum restarts.
  anchor_shard_ = at::empty({n}, average_.options());
  read_params(anchor_shard_, shard_begin_);
  momentum_shard_ = at::zeros({n}, anchor_shard_.options());
  previous_shard_ = at::zeros({n}, anchor_shard_.options());
  average_ = exchange_->device().narrow(0, shard_begin_, n);
  has_previous_ = false;
  has_average_ = false;
}

void Co2::started(const Agreement& a) {
  if (zero() && (a.synced || a.ring != ring_)) set_shard(a.ring);
  ring_ = a.ring;
  // Joining a running swarm at its round boundary: the others launch an exchange now (applied a
  // few steps into the round, or at its end), so this peer takes part, sending zeros, and applies
  // the average it adopted with them. (A peer that becomes a member after the others' agreement
  // is not in that exchange, which runs over the round's participants: its opening agreement
  // waits for their next one.)
  if (!a.exchange_follows) return;
  if (early())
    launch_early(a);
  else
    launch_at_boundary(a);
}

void Co2::launch_at_boundary(const Agreement& a) {
  const bool apply = has_average_ && a.previous_on_all;
  has_average_ = apply;
  launch(a, apply);
}

at::Tensor Co2::sum_over_shards(const at::Tensor& local) {
  if (!zero()) return local;
  at::Tensor v = local.detach().to(net_device(), at::kFloat).reshape({1}).contiguous();
  if (!all_reduce(v, net::WirePrecision::fp32, "norm all-reduce", &ring_))
    return at::full({}, std::nan(""), local.options());
  return v.reshape({}).to(local.device());
}

at::Tensor Co2::squares(const at::Tensor& part) {
  const int64_t begin = zero() ? shard_begin_ : 0;
  return sum_over_model(sum_over_shards(counted(part, begin).pow(2).sum()));
}

void Co2::advance() {
  if (launched_early_ && has_in_flight_ && landed_s_ == 0 && in_flight_.test())
    landed_s_ = train::now_s();
  if (pending_launch_ && exchange_->download_done()) {
    pending_launch_ = false;
    net::CollectiveOptions o = options(precision_, in_flight_ring_);
    std::span<float> data = as_span(exchange_->host());
    in_flight_ = zero() ? net_.reduce_scatter(data, o) : net_.all_reduce(data, o);
    has_in_flight_ = true;
    uploading_ = false;
  }
  // The average is back: send this peer's part to the device now, while the round still computes.
  if (has_in_flight_ && !uploading_ && exchange_->separate() && in_flight_.test()) {
    exchange_->upload(shard_begin_, shard_end_ - shard_begin_);
    uploading_ = true;
  }
}

bool Co2::collect() {
  if (has_average_) return true;  // collected before a checkpoint
  if (pending_launch_) {
    exchange_->wait_download();
    advance();
  }
  if (!has_in_flight_) return false;
  has_in_flight_ = false;
  bool ok = wait(in_flight_, zero() ? "reduce-scatter of the update" : "all-reduce of the update",
                 &in_flight_ring_);
  if (ok && faults_.loses_piece(0, [this](const std::string& line) { log(line); })) ok = false;
  if (ok && !uploading_) exchange_->upload(shard_begin_, shard_end_ - shard_begin_);
  uploading_ = false;
  // Even after a failure an upload may have started (advance() saw the exchange end): the compute
  // stream must not write the buffer again before it lands.
  exchange_->use_upload();
  if (!ok) return false;
  average_.div_(static_cast<double>(in_flight_contributors_));
  // Zero sends e = x_{t+1} - y_t: the average of x_t - y_t is mean(e) + alpha*m (zero applies
  // its averages a round late, so its step is always the heavy ball's: see nesterov()).
  if (zero() && in_flight_shifted_) average_.add_(momentum_shard_, config_.strategy.outer_lr);
  has_average_ = true;
  return true;
}

void Co2::update_momentum() {
  if (!zero()) {
    update_momentum_by_part();
    return;
  }
  const auto& s = config_.strategy;
  at::Tensor gap = at::zeros({}, momentum_shard_.options());
  // The penalty damps a stale average; applied inside the next round, an average is not stale
  // (and damping it cost 6% of validation loss in the sweep of docs/results.md).
  const double penalty = early() ? 0.0 : s.staleness_penalty;
  if (has_previous_) {
    const at::Tensor diff = squares(average_ - previous_shard_);
    const at::Tensor prev = squares(previous_shard_);
    gap = diff.sqrt() / (prev.sqrt() + kGapEps);
    gap = at::where(at::isfinite(gap), gap, at::zeros_like(gap));  // a failed norm exchange
  }
  penalty_factor_ = (gap * penalty + 1.0).reciprocal();
  momentum_shard_.mul_(s.outer_momentum).addcmul_(average_, penalty_factor_);
  if (s.clip == "value") {
    momentum_shard_.clamp_(-s.clip_threshold, s.clip_threshold);
  } else if (s.clip == "norm") {
    const at::Tensor norm = squares(momentum_shard_).sqrt();
    const at::Tensor over = at::isfinite(norm).logical_and(norm > s.clip_threshold);
    momentum_shard_.mul_(
        at::where(over, norm.reciprocal() * s.clip_threshold, at::ones_like(norm)));
  }
  previous_shard_.copy_(average_);
  has_previous_ = true;
  has_average_ = false;
  gap_.set(gap);
}

// Nesterov's step only on averages applied inside the round: on a round-late one (the published
// form) it overshoots, 2.898 against the heavy ball's 2.411 at 400 steps (docs/results.md).
bool Co2::nesterov() const { return config_.strategy.outer_nesterov && early(); }

// With zero (whose averages are always round-late: see nesterov()).
void Co2::move_anchor() {
  const auto& s = config_.strategy;
  if (final_round_ && s.final_step == "average") {
    anchor_shard_.sub_(previous_shard_);  // x_{T+1} = x_T - Delta_T: where the peers' mean lies
  } else {
    anchor_shard_.sub_(momentum_shard_, s.outer_lr);
  }
  ++version_;  // the fingerprint once the shards are gathered (gather_anchor)
}

bool Co2::gather_anchor() {
  const int64_t n = shard_end_ - shard_begin_;
  exchange_->device().narrow(0, shard_begin_, n).copy_(anchor_shard_);
  exchange_->download(shard_begin_, n);
  exchange_->wait_download();
  if (!wait(net_.all_gather(as_span(exchange_->host()), options(net::WirePrecision::fp32, ring_)),
            "all-gather of the anchor", &ring_))
    return false;
  exchange_->upload();
  exchange_->use_upload();
  return true;
}

void Co2::read_params(at::Tensor& out, int64_t begin) {
  const int64_t n = out.numel();
  if (!params_by_tensor_) {
    at::Tensor params = flat_->zeros();
    flat_->gather(params);
    out.copy_(params.narrow(0, begin, n));
    return;
  }
  at::NoGradGuard no_grad;
  for (size_t k = 0; k < offsets_.size(); ++k) {
    const int64_t numel = param(k).numel();
    const int64_t from = std::max(begin, offsets_[k]);
    const int64_t to = std::min(begin + n, offsets_[k] + numel);
    if (from >= to) continue;  // outside the range: an evicted weight is not read
    out.narrow(0, from - begin, to - from)
        .copy_(read_state(param(k)).reshape({-1}).narrow(0, from - offsets_[k], to - from));
  }
  release_pass_blocks();
}

void Co2::write_params(const at::Tensor& in) {
  if (!params_by_tensor_) {
    flat_->scatter(in);
    return;
  }
  at::NoGradGuard no_grad;
  for (size_t k = 0; k < offsets_.size(); ++k)
    write_state(param(k), in.narrow(0, offsets_[k], param(k).numel()));
  release_pass_blocks();
}

void Co2::start_from_anchor(at::Tensor& buffer) {
  if (!params_by_tensor_) {
    at::Tensor y = flat_->zeros();
    flat_->gather(y);
    flat_->scatter(buffer);  // the next tau steps start from x_{t+1}
    buffer.sub_(y);          // e_t = x_{t+1} - y_t
    return;
  }
  at::NoGradGuard no_grad;
  for (size_t k = 0; k < offsets_.size(); ++k) {
    // A resident parameter reads as itself: e_t is taken before x_{t+1} is written over y_t.
    const at::Tensor y = read_state(param(k)).reshape({-1});
    at::Tensor part = buffer.narrow(0, offsets_[k], y.numel());
    const at::Tensor x = part.clone();
    part.sub_(y);
    write_state(param(k), x);
  }
  release_pass_blocks();
}

void Co2::launch(const Agreement& a, bool apply) {
  at::Tensor& buffer = exchange_->device();
  if (!zero()) {
    launch_by_part(a, apply);
  } else {
    if (apply) {
      update_momentum();
      move_anchor();
    }
    if (!gather_anchor()) {  // buffer = x_{t+1}
      need_state_ = true;    // keep y; the next agreement hands out the root's state
      return;
    }
    if (apply) note_round(buffer);  // the whole new anchor, every shard of it
    start_from_anchor(buffer);
  }
  if (!a.contribute) buffer.zero_();
  if (a.contributors == 0) return;
  in_flight_contributors_ = a.contributors;
  in_flight_ring_ = a.ring;
  in_flight_shifted_ = apply;
  faults_.begin();
  faults_.maybe_die(0, [this](const std::string& line) { log(line); });
  exchange_->download();
  pending_launch_ = true;
  advance();  // on a CPU the exchange starts here
}

train::StepHooks::StepWork Co2::run_step(train::StepRunner& runner, train::Replica& r,
                                         double loss_scale) {
  restore_offset();
  const double t0 = train::now_s();
  StepWork work = SwarmStrategy::run_step(runner, r, loss_scale);
  pass_s_ += train::now_s() - t0;
  ++passes_;
  return work;
}

void Co2::restore_offset() {
  if (!offset_pending_) return;
  offset_pending_ = false;
  restore_offset_by_part();
}

void Co2::launch_early(const Agreement& a) {
  restore_offset();  // a peer restored at an apply point launches from its whole progress
  launch_early_by_part(a);
  own_part_ = a.contribute;
  if (!a.contribute) exchange_->device().zero_();
  if (a.contributors == 0) return;
  in_flight_contributors_ = a.contributors;
  in_flight_ring_ = a.ring;
  in_flight_shifted_ = false;
  round_k_ = choose_apply_point(a);
  faults_.begin();
  faults_.maybe_die(0, [this](const std::string& line) { log(line); });
  exchange_->download();
  pending_launch_ = true;
  launched_early_ = true;
  launched_s_ = train::now_s();
  landed_s_ = 0;
  advance();
}

bool Co2::apply_early() {
  launched_early_ = false;
  // A failed exchange: the anchor stays x_t and the parameters go on from this peer's own, so
  // the next launch measures both rounds' progress from x_t and nothing computed is lost.
  const bool ok = collect();
  exchange_s_ = ok ? (landed_s_ > 0 ? landed_s_ : train::now_s()) - launched_s_ : 0;
  if (!ok) return false;
  apply_early_by_part();
  offset_pending_ = true;
  return true;
}

bool Co2::step_done_early(train::Replica& r, bool last) {
  const int64_t tau = config_.strategy.local_steps;
  const int64_t pos = r.step % tau;
  bool shared = false;
  if (launched_early_ && (pos == round_k_ || pos == 0 || last)) shared = apply_early();
  if (!last && pos != 0) return shared;
  // A round boundary: the launch measures this peer's progress from its own parameters.
  restore_offset();
  if (passes_ > 0) step_s_ = pass_s_ / static_cast<double>(passes_);
  pass_s_ = 0;
  passes_ = 0;
  const Agreement a = agree(r, true);
  ring_ = a.ring;
  launch_early(a);
  ++rounds_;
  // The final round's average is applied at once: the run ends on x_{T+1}.
  if (last || met_the_last_round(r, a)) {
    end_run(r);
    return true;
  }
  return shared;
}

bool Co2::step_done(train::Replica& r, bool last) {
  advance();
  if (early()) return step_done_early(r, last);
  if (!last && r.step % config_.strategy.local_steps != 0) return false;
  collect();
  Agreement a = agree(r, true);
  if (zero() && a.ring != ring_ && !a.synced) {
    // Membership changed: shard boundaries move, so every peer restarts its outer state from the
    // root's parameters (each peer sees the same change, so all take this branch).
    need_state_ = true;
    a = agree(r, true);
  }
  if (zero() && (a.synced || a.ring != ring_)) set_shard(a.ring);
  ring_ = a.ring;
  launch_at_boundary(a);
  // A peer stopped past the peer timeout while the others trained to the end meets them at its
  // next boundary, in their last one, and adopts their state: no step follows, so it drains and
  // closes the run with them. Without this it stopped after the exchange and ended a round short
  // of them, without the last average.
  if (last || met_the_last_round(r, a)) end_run(r);
  ++rounds_;
  return true;
}

bool Co2::drain() {
  if (!drain_on_all(collect())) return false;
  // Drain: the final round's average is applied at once, so the run ends on x_{T+1}.
  final_round_ = true;
  update_momentum();
  if (!zero()) {
    step_anchor_by_part();
    carry_ = false;  // the delta is in the anchor now: a run that goes on must not send it again
    return true;
  }
  move_anchor();
  if (gather_anchor()) {
    note_round(exchange_->device());
    write_params(exchange_->device());
  } else {
    need_state_ = true;  // the closing agreement hands this peer the root's parameters
  }
  return true;
}

bool Co2::drain_early() {
  if (!launched_early_) return false;
  final_round_ = true;
  if (!apply_early()) return false;
  own_part_ = false;  // in the anchor now
  return true;
}

void Co2::end_run(train::Replica& r) {
  for (int settle = 0;; ++settle) {
    const bool applied = early() ? drain_early() : drain();
    // Every participant holds the same state after the closing agreement: the drained one, if
    // the drain went through on any of them (its notes say so alike to all).
    const Agreement closing = close_run(r, applied);
    if (zero() && (closing.synced || closing.ring != ring_)) set_shard(closing.ring);
    ring_ = closing.ring;
    if (closing.notes[kClosingNote] > 0 || zero()) return;
    if (settle == kSettleRounds) break;
    log("the last round went through on no peer; one more round without local steps, so that "
        "the peers end on one model (" +
        std::to_string(settle + 1) + " of " + std::to_string(kSettleRounds) + ")");
    // A peer that took another's state in the closing agreement (one whose state was not the
    // root's) holds no part of the round: it takes the state again and sends nothing, so that
    // the average divides only the parts sent.
    if (!(early() ? own_part_ : carry_)) need_state_ = true;
    const Agreement a = agree(r, true);
    ring_ = a.ring;
    if (a.contributors == 0) break;  // nobody holds a part: every peer sees it, and stops
    if (early())
      launch_early(a);
    else
      launch_at_boundary(a);  // the parameters hold the anchor: the delta sent again, alone
    ++rounds_;
  }
  // The early form's parameters still hold this peer's own last round: every peer goes back to
  // the anchor before it (which the published form's parameters hold), so that the peers still
  // end on one model.
  if (early()) {
    log("the last round's average did not arrive: this peer ends on the anchor before it");
    adopt_anchor_by_part();
  }
}

void Co2::end_in_last_round(train::Replica& r, int64_t) {
  end_run(r);
  ++rounds_;
}

bool Co2::drain_on_all(bool collected) {
  if (!zero()) return collected;
  at::Tensor count = at::full({1}, collected ? 1.f : 0.f, at::kFloat).to(net_device());
  if (!all_reduce(count, net::WirePrecision::fp32, "count of the drained averages", &ring_))
    return false;
  const bool all = count.item<float>() == static_cast<float>(ring_.size());
  if (!all && collected)
    log("the last average did not reach every peer: none applies it, and the run ends on the "
        "anchor before it");
  return all;
}

void Co2::finish(train::Replica&) {
  if (pending_launch_) {  // the peers expect this exchange: take part, then leave
    exchange_->wait_download();
    advance();
  }
  if (has_in_flight_) wait(in_flight_, "the last update");  // a stopped peer leaves cleanly
  has_in_flight_ = false;
}

std::vector<at::Tensor> Co2::state_tensors(train::Replica&) {
  // Zero: the root's parameters, which every peer takes (keeps_own_state), a tensor at a time.
  if (zero()) {
    std::vector<at::Tensor> params;
    for (size_t k = 0; k < offsets_.size(); ++k) params.push_back(param(k));
    return params;
  }
  // Nothing is in flight at an agreement (collected before it): the buffer holds the average
  // when has_average_ says so (otherwise scratch, which the writer's flags tell it to ignore).
  flags_.copy_(at::tensor({has_previous_ ? 1.f : 0.f, has_average_ ? 1.f : 0.f}));
  std::vector<at::Tensor> out;
  for (const OuterVector* v : {&anchor_, &momentum_, &previous_}) v->append_to(out);
  out.push_back(exchange_->device());
  out.push_back(flags_);
  return out;
}

void Co2::state_adopted(train::Replica&) {
  if (zero()) {
    has_average_ = false;
    has_previous_ = false;  // set_shard() follows in step_done/started, on every peer
    return;
  }
  const at::Tensor flags = flags_.cpu();
  has_previous_ = flags[0].item<float>() != 0;
  has_average_ = flags[1].item<float>() != 0;
  // The root's anchor, without this peer's progress since the launch, and no part of an old
  // exchange of its own to send again (it belongs to another state).
  adopt_anchor_by_part();
  offset_pending_ = false;
  carry_ = false;
  own_part_ = false;
}

nlohmann::json Co2::checkpoint_state(std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  collect();  // what is in flight now would be lost on a restart: wait for it
  if (zero()) {
    tensors.emplace_back("strategy.anchor", anchor_shard_);
    tensors.emplace_back("strategy.momentum", momentum_shard_);
    tensors.emplace_back("strategy.previous", previous_shard_);
  } else {
    // Kept in the tier: a tensor per parameter, which the checkpoint reads one at a time.
    anchor_.checkpoint(tensors, "strategy.anchor");
    momentum_.checkpoint(tensors, "strategy.momentum");
    previous_.checkpoint(tensors, "strategy.previous");
  }
  tensors.emplace_back("strategy.average", average_.clone());
  nlohmann::json ring = nlohmann::json::array();
  for (net::PeerId id : ring_) ring.push_back(std::to_string(id));
  nlohmann::json state = round_state("co2");
  state["zero"] = zero();
  state["has_previous"] = has_previous_;
  state["has_average"] = has_average_;
  state["shard"] = {shard_begin_, shard_end_};
  state["ring"] = ring;
  // Early: the checkpoint's parameters are the anchor; the progress since the launch goes on.
  // Otherwise: this peer's part of the last exchange, sent again if its average is not applied.
  if (offset_pending_ || carry_) own_.checkpoint(tensors, "strategy.own");
  state["has_offset"] = offset_pending_;
  state["carry"] = carry_;
  return state;
}

void Co2::restore(train::Replica& r, const nlohmann::json& state, const SafetensorsFile& tensors) {
  if (state.value("zero", false) != zero())
    throw CheckpointError(tensors.file.string() +
                          ": the checkpoint's strategy.zero differs from the config's");
  if (zero()) {
    const auto shard = state.at("shard");
    shard_begin_ = shard.at(0).get<int64_t>();
    shard_end_ = shard.at(1).get<int64_t>();
    const int64_t n = shard_end_ - shard_begin_;
    if (shard_begin_ < 0 || n < 0 || shard_end_ > flat_->numel())
      throw CheckpointError(tensors.file.string() + ": strategy shard is out of range");
    const auto on_device = at::TensorOptions().dtype(at::kFloat).device(flat_->device());
    anchor_shard_ = at::zeros({n}, on_device);
    momentum_shard_ = at::zeros({n}, on_device);
    previous_shard_ = at::zeros({n}, on_device);
    average_ = exchange_->device().narrow(0, shard_begin_, n);
    ring_.clear();
    for (const auto& id : state.at("ring")) ring_.push_back(std::stoull(id.get<std::string>()));
    load_state_tensor(tensors, "strategy.anchor", anchor_shard_);
    load_state_tensor(tensors, "strategy.momentum", momentum_shard_);
    load_state_tensor(tensors, "strategy.previous", previous_shard_);
  } else {
    // Either form: one tensor each (an unswapped run's) or one per parameter (a swapped run's).
    anchor_.restore(tensors, "strategy.anchor", r.runner);
    momentum_.restore(tensors, "strategy.momentum", r.runner);
    previous_.restore(tensors, "strategy.previous", r.runner);
  }
  load_state_tensor(tensors, "strategy.average", average_);
  has_previous_ = state.value("has_previous", false);
  has_average_ = state.value("has_average", false);
  offset_pending_ = state.value("has_offset", false);
  carry_ = state.value("carry", false) && !zero();
  if (offset_pending_ && !early())
    throw CheckpointError(tensors.file.string() +
                          ": the checkpoint was taken inside a round of co2 with "
                          "strategy.overlap_steps < local_steps; resume it with the same "
                          "overlap_steps");
  if (offset_pending_ || carry_) own_.restore(tensors, "strategy.own", r.runner);
}

int64_t Co2::state_bytes() const {
  int64_t numel = exchange_->numel();
  if (zero())
    numel += anchor_shard_.numel() + momentum_shard_.numel() + previous_shard_.numel();
  else if (!anchor_.kept())
    numel += 4 * flat_->numel();  // anchor, momentum, previous, own
  return 4 * numel;
}

train::StrategyReport Co2::report() const {
  train::StrategyReport r = SwarmStrategy::report();
  r.figures["gap"] = gap_.value();
  r.figures["state_bytes"] = static_cast<double>(state_bytes());
  return r;
}

}  // namespace starling::strategy
