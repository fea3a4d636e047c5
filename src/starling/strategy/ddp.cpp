#include "starling/strategy/ddp.h"

#include <ATen/ATen.h>

namespace starling::strategy {

Ddp::Ddp(const train::RunConfig& config, net::Collectives& net) : SwarmStrategy(config, net) {}

void Ddp::allocate(train::Replica&) {
  grads_.emplace(flat_->device(), flat_->numel(), through_host());
}

void Ddp::gradients_ready(train::Replica& r) {
  const Agreement a = agree(r);
  at::Tensor& grads = grads_->device();
  flat_->gather_grads(grads);
  // A peer that just adopted the swarm's parameters computed its gradients on other ones.
  if (!a.contribute) grads.zero_();
  if (a.contributors > 0 && all_reduce(*grads_, precision_, "gradient all-reduce")) {
    grads.div_(static_cast<double>(a.contributors));
  } else {
    // No average this step: every peer that got here without one skips the update, and the
    // next agreement brings any peer whose step went through differently back in line.
    grads.zero_();
    need_state_ = true;
  }
  flat_->scatter_grads(grads);
  ++rounds_;
}

bool Ddp::step_done(train::Replica&, bool) {
  ++version_;
  return true;
}

void Ddp::pack_state(train::Replica& r, at::Tensor& out) {
  const int64_t n = flat_->numel();
  at::Tensor part = out.narrow(0, 0, n);
  flat_->gather(part);
  int64_t offset = n;
  for (const char* prefix : {"exp_avg.", "exp_avg_sq."}) {
    for (const auto& [name, t] : r.optimizer.state()) {
      if (name.rfind(prefix, 0) != 0) continue;
      out.narrow(0, offset, t.numel()).copy_(t.reshape({t.numel()}));
      offset += t.numel();
    }
  }
}

void Ddp::unpack_state(train::Replica& r, const at::Tensor& in) {
  const int64_t n = flat_->numel();
  flat_->scatter(in.narrow(0, 0, n));
  int64_t offset = n;
  for (const char* prefix : {"exp_avg.", "exp_avg_sq."}) {
    for (auto& [name, t] : r.optimizer.state()) {
      if (name.rfind(prefix, 0) != 0) continue;
      at::Tensor dst = t;  // shares the optimizer's storage
      dst.copy_(in.narrow(0, offset, t.numel()).view(t.sizes()));
      offset += t.numel();
    }
  }
}

nlohmann::json Ddp::checkpoint_state(std::vector<std::pair<std::string, at::Tensor>>&) {
  return {{"kind", "ddp"}, {"version", version_}};
}

}  // namespace starling::strategy
