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
  const Agreement a = agree(r);
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
  ++rounds_;
  return true;
}

void DiLoCo::pack_state(train::Replica&, at::Tensor& out) {
  const int64_t n = flat_->numel();
  out.narrow(0, 0, n).copy_(anchor_);
  out.narrow(0, n, n).copy_(momentum_);
}

void DiLoCo::unpack_state(train::Replica&, const at::Tensor& in) {
  const int64_t n = flat_->numel();
  anchor_.copy_(in.narrow(0, 0, n));
  momentum_.copy_(in.narrow(0, n, n));
  flat_->scatter(anchor_);
}

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
