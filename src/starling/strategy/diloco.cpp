#include "starling/strategy/diloco.h"

#include <ATen/ATen.h>

#include "starling/strategy/state_tensors.h"

namespace starling::strategy {

DiLoCo::DiLoCo(const train::RunConfig& config, net::Collectives& net)
    : SwarmStrategy(config, net) {}

void DiLoCo::allocate(train::Replica&) {
  anchor_ = flat_->zeros();
  momentum_ = flat_->zeros();
  delta_.emplace(flat_->device(), flat_->numel(), through_host());
  flat_->gather(anchor_);
}

bool DiLoCo::step_done(train::Replica& r, bool last) {
  if (!last && r.step % config_.strategy.local_steps != 0) return false;
  outer_step(agree(r, true));
  ++rounds_;
  return true;
}

void DiLoCo::started(const Agreement& a) {
  if (a.exchange_follows) outer_step(a);
}

void DiLoCo::outer_step(const Agreement& a) {
  at::Tensor& delta = delta_->device();
  flat_->gather(delta);                // y
  at::sub_out(delta, anchor_, delta);  // delta = x - y
  if (!a.contribute) delta.zero_();
  if (a.contributors > 0 && aggregate(*delta_, -1, a, precision_, "pseudo-gradient all-reduce")) {
    delta.div_(static_cast<double>(a.contributors));  // Delta
    const double beta = config_.strategy.outer_momentum;
    momentum_.mul_(beta).add_(delta);
    anchor_.sub_(delta.add_(momentum_, beta), config_.strategy.outer_lr);  // Nesterov
    ++version_;
    flat_->scatter(anchor_);
    note_round(anchor_);
  }
  // On failure the local progress is kept: the next round's delta covers both rounds.
}

void DiLoCo::state_adopted(train::Replica&) { flat_->scatter(anchor_); }  // y = x

void DiLoCo::restore(train::Replica&, const nlohmann::json&, const SafetensorsFile& tensors) {
  load_state_tensor(tensors, "strategy.anchor", anchor_);
  load_state_tensor(tensors, "strategy.momentum", momentum_);
}

nlohmann::json DiLoCo::checkpoint_state(std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  tensors.emplace_back("strategy.anchor", anchor_);
  tensors.emplace_back("strategy.momentum", momentum_);
  return round_state("diloco");
}

}  // namespace starling::strategy
