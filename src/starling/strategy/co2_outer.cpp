// co2's outer update without zero, a parameter tensor at a time (co2.h): each pass reads the
// tensors it needs of the parameters and of the outer vectors (the anchor x, momentum m, previous
// average and own delta) through the step runner, computes, and writes back what changed. In
// memory the tensors are views of the flat vectors and the reads and writes cost nothing; a
// swapped replica reads its tier's tensors one at a time and stores them again. The elementwise
// arithmetic is the flat vectors' own, and the sums of squares are added a tensor at a time in
// flat_'s order on every peer, so both kinds of peer compute the same bits.
#include <ATen/ATen.h>

#include "starling/strategy/co2.h"

namespace starling::strategy {
namespace {
constexpr double kOuterGapEps = 1e-8;

// Sum of squares of a flat tensor's elements, as a 0-dim tensor.
at::Tensor square_sum(const at::Tensor& t) { return t.pow(2).sum(); }
}  // namespace

const at::Tensor& Co2::param(size_t k) const {
  return replica_->params.params()[static_cast<size_t>(flat_->indices()[k])].value;
}

at::Tensor Co2::exchange_part(size_t k) {
  const at::Tensor& p = param(k);
  return exchange_->device().narrow(0, offsets_[k], p.numel()).view(p.sizes());
}

void Co2::update_momentum_by_part() {
  at::NoGradGuard no_grad;
  const auto& s = config_.strategy;
  const auto options = average_.options();
  const size_t parts = offsets_.size();
  at::Tensor gap = at::zeros({}, options);
  // The penalty damps a stale average; applied inside the next round, an average is not stale
  // (and damping it cost 6% of validation loss in the sweep of docs/results.md).
  const double penalty = early() ? 0.0 : s.staleness_penalty;
  if (has_previous_) {
    at::Tensor diff = at::zeros({}, options), prev = at::zeros({}, options);
    for (size_t k = 0; k < parts; ++k) {
      const at::Tensor p = read_state(previous_.parts()[k]).reshape({-1});
      const at::Tensor a = exchange_part(k).reshape({-1});
      diff.add_(square_sum(counted(a - p, offsets_[k])));
      prev.add_(square_sum(counted(p, offsets_[k])));
    }
    gap = sum_over_model(diff).sqrt() / (sum_over_model(prev).sqrt() + kOuterGapEps);
    gap = at::where(at::isfinite(gap), gap, at::zeros_like(gap));  // a failed norm exchange
  }
  penalty_factor_ = (gap * penalty + 1.0).reciprocal();
  at::Tensor squares = at::zeros({}, options);
  for (size_t k = 0; k < parts; ++k) {
    const at::Tensor average = exchange_part(k);
    at::Tensor m = read_state(momentum_.parts()[k]);
    m.mul_(s.outer_momentum).addcmul_(average, penalty_factor_);
    if (s.clip == "value")
      m.clamp_(-s.clip_threshold, s.clip_threshold);
    else if (s.clip == "norm")
      squares.add_(square_sum(counted(m.reshape({-1}), offsets_[k])));
    write_state(momentum_.parts()[k], m);
    write_state(previous_.parts()[k], average);
  }
  momentum_scale_ = at::Tensor();
  if (s.clip == "norm") {
    const at::Tensor norm = sum_over_model(squares).sqrt();
    const at::Tensor over = at::isfinite(norm).logical_and(norm > s.clip_threshold);
    momentum_scale_ = at::where(over, norm.reciprocal() * s.clip_threshold, at::ones_like(norm));
  }
  has_previous_ = true;
  has_average_ = false;
  gap_.set(gap);
}

// Nesterov's step only on averages applied inside the round (see nesterov() in co2.cpp).
void Co2::step_anchor_part(size_t k, at::Tensor& x) {
  const auto& s = config_.strategy;
  const bool final_average = final_round_ && s.final_step == "average";
  at::Tensor m;
  if (momentum_scale_.defined() || !final_average) {
    m = read_state(momentum_.parts()[k]);
    if (momentum_scale_.defined()) {
      m.mul_(momentum_scale_);  // clipping by norm (update_momentum_by_part)
      write_state(momentum_.parts()[k], m);
    }
  }
  if (final_average) {
    x.sub_(read_state(previous_.parts()[k]));  // x_{T+1} = x_T - Delta_T: the peers' mean
  } else if (nesterov()) {
    // x -= alpha (beta m + Delta'): the previous average holds Delta' (the average
    // update_momentum() just added to m, as it was added: divided by the staleness penalty).
    x.sub_(m, s.outer_lr * s.outer_momentum)
        .sub_(read_state(previous_.parts()[k]) * penalty_factor_, s.outer_lr);
  } else {
    x.sub_(m, s.outer_lr);
  }
}

void Co2::stepped(uint32_t crc) {
  momentum_scale_ = at::Tensor();
  ++version_;
  note_round_crc(crc);
}

void Co2::launch_by_part(const Agreement& a, bool apply) {
  at::NoGradGuard no_grad;
  if (apply) update_momentum();  // reads Delta_{t-1} from the buffer before it is reused
  // The previous round's average was not applied (its exchange failed, or a participant lacks
  // it): this peer's part of it goes out again with this round's, so no progress is lost.
  const bool resend = !apply && carry_ && a.contribute;
  if (resend)
    log("the last round's average was not applied on every participant (a failed exchange, "
        "or a peer without it); this peer's part of it goes out again with this round's");
  carry_ = a.contribute;
  const bool fingerprint = apply && config_.strategy.fingerprint;
  uint32_t crc = 0;
  for (size_t k = 0; k < offsets_.size(); ++k) {
    const at::Tensor y = read_state(param(k));  // y_t
    at::Tensor x = read_state(anchor_.parts()[k]);
    at::Tensor delta = exchange_part(k);
    at::sub_out(delta, x, y);  // delta_t = x_t - y_t
    if (resend) delta.add_(read_state(own_.parts()[k]));
    if (carry_) write_state(own_.parts()[k], delta);
    if (apply) {
      step_anchor_part(k, x);  // x_{t+1}
      write_state(anchor_.parts()[k], x);
      if (fingerprint) crc = chain_crc(x, crc);
    }
    write_state(param(k), x);  // the next tau steps start from x_{t+1}
  }
  if (apply) stepped(crc);
  release_pass_blocks();
}

void Co2::launch_early_by_part(const Agreement& a) {
  at::NoGradGuard no_grad;
  for (size_t k = 0; k < offsets_.size(); ++k) {
    at::Tensor y = read_state(param(k));
    const at::Tensor x = read_state(anchor_.parts()[k]);
    if (!a.contribute) {  // its own progress does not count: drop it
      write_state(param(k), x);
      y = x;
    }
    write_state(own_.parts()[k], y);  // y_t
    at::Tensor delta = exchange_part(k);
    at::sub_out(delta, x, y);  // delta_t = x_t - y_t
  }
  release_pass_blocks();
}

void Co2::apply_early_by_part() {
  at::NoGradGuard no_grad;
  update_momentum();  // reads Delta_t from the buffer
  step_anchor_by_part([this](size_t k) {
    const at::Tensor z = read_state(param(k));
    at::Tensor own = read_state(own_.parts()[k]);
    at::sub_out(own, z, own);  // z - y_t: the progress since the launch, put back later
    write_state(own_.parts()[k], own);
  });
}

void Co2::restore_offset_by_part() {
  at::NoGradGuard no_grad;
  for (size_t k = 0; k < offsets_.size(); ++k) {
    at::Tensor y = read_state(param(k));
    y.add_(read_state(own_.parts()[k]));
    write_state(param(k), y);
  }
  release_pass_blocks();
}

void Co2::step_anchor_by_part(const std::function<void(size_t)>& before) {
  at::NoGradGuard no_grad;
  const bool fingerprint = config_.strategy.fingerprint;
  uint32_t crc = 0;
  for (size_t k = 0; k < offsets_.size(); ++k) {
    if (before) before(k);
    at::Tensor x = read_state(anchor_.parts()[k]);
    step_anchor_part(k, x);
    write_state(anchor_.parts()[k], x);
    if (fingerprint) crc = chain_crc(x, crc);
    write_state(param(k), x);
  }
  stepped(crc);
  release_pass_blocks();
}

void Co2::adopt_anchor_by_part() {
  at::NoGradGuard no_grad;
  for (size_t k = 0; k < offsets_.size(); ++k)
    write_state(param(k), read_state(anchor_.parts()[k]));
  release_pass_blocks();
}

}  // namespace starling::strategy
