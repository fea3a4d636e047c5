#include "starling/strategy/localsgd.h"

#include <ATen/ATen.h>

namespace starling::strategy {

LocalSgd::LocalSgd(const train::RunConfig& config, net::Collectives& net)
    : SwarmStrategy(config, net) {}

void LocalSgd::allocate(train::Replica&) {
  buffer_.emplace(flat_->device(), flat_->numel(), through_host());
}

bool LocalSgd::step_done(train::Replica& r, bool last) {
  if (!last && r.step % config_.strategy.local_steps != 0) return false;
  average(agree(r, true));
  ++rounds_;
  return true;
}

void LocalSgd::started(const Agreement& a) {
  if (a.exchange_follows) average(a);
}

void LocalSgd::average(const Agreement& a) {
  at::Tensor& params = buffer_->device();
  flat_->gather(params);
  if (!a.contribute) params.zero_();
  if (a.contributors > 0 && aggregate(*buffer_, -1, a, precision_, "parameter averaging")) {
    params.div_(static_cast<double>(a.contributors));
    flat_->scatter(params);
    ++version_;
    note_round(params);
  }
  // On failure each peer keeps its own parameters; the next agreement finds the versions apart
  // only if some peer did average, and then hands everyone the root's.
}

// The parameters themselves, in flat_'s order. A peer whose history is the root's keeps its own:
// the round's local steps it took count in the average that follows.
std::vector<at::Tensor> LocalSgd::state_tensors(train::Replica& r) {
  std::vector<at::Tensor> out;
  const auto& params = r.params.params();
  for (const int i : flat_->indices()) out.push_back(params[static_cast<size_t>(i)].value);
  return out;
}

nlohmann::json LocalSgd::checkpoint_state(std::vector<std::pair<std::string, at::Tensor>>&) {
  return round_state("localsgd");
}

}  // namespace starling::strategy
