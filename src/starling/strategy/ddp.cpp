#include "starling/strategy/ddp.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "starling/train/step_runner.h"

namespace starling::strategy {

Ddp::Ddp(const train::RunConfig& config, net::Collectives& net) : SwarmStrategy(config, net) {}

// The gradient buffer is sized by the first exchange, when the runner's pieces are known.
void Ddp::allocate(train::Replica&) {}

bool Ddp::average_gradients(train::Replica& r, const Agreement& a,
                            const std::function<double()>& divisor) {
  if (r.runner == nullptr) throw std::logic_error("ddp: gradients exchanged before the first step");
  ++rounds_;
  if (a.contributors == 0) {
    r.runner->visit_gradients([&](std::span<const int> piece) {
      for (int i : piece) r.params.params()[i].value.mutable_grad().zero_();
    });
    return false;
  }
  bool ok = true;
  double d = 0;
  bool asked = false;
  r.runner->visit_gradients([&](std::span<const int> piece) {
    const int64_t n = flat_->numel(piece);
    if (!grads_ || grads_->numel() < n) grads_.emplace(flat_->device(), n, through_host());
    at::Tensor grads = grads_->device().narrow(0, 0, n);
    flat_->gather_grads(piece, grads);
    // A peer that just adopted the swarm's parameters computed its gradients on other ones.
    if (!a.contribute) grads.zero_();
    ok = aggregate(*grads_, n, a, precision_, "gradient all-reduce") && ok;
    if (!asked) {
      d = divisor();
      asked = true;
      ok = ok && d > 0;
    }
    if (ok) {
      grads.div_(d);
    } else {
      // No average this step: every peer that got here without one steps with zeroed
      // gradients, and the next agreement brings any peer whose step went through differently
      // back in line.
      grads.zero_();
    }
    flat_->scatter_grads(piece, grads);
  });
  if (!ok) need_state_ = true;
  return ok;
}

void Ddp::started(const Agreement& a) {
  // Some participants agreed before their exchange; this peer, in its opening agreement, joins
  // them there (a swarm starting together agrees in start() everywhere: no exchange follows).
  if (a.exchange_follows) joined_round_ = a;
}

Agreement Ddp::exchange_agreement(train::Replica& r) {
  if (joined_round_) {
    const Agreement a = *joined_round_;
    joined_round_.reset();
    return a;
  }
  return agree(r, true);
}

void Ddp::gradients_ready(train::Replica& r) {
  const Agreement a = exchange_agreement(r);
  average_gradients(r, a, [&a] { return static_cast<double>(a.contributors); });
}

bool Ddp::step_done(train::Replica&, bool) {
  ++version_;
  if (config_.strategy.fingerprint) {
    at::Tensor params = flat_->zeros();
    flat_->gather(params);
    note_round(params);
  }
  return true;
}

std::vector<at::Tensor> Ddp::state_tensors(train::Replica& r) {
  // The weights, then every first moment, then every second, in flat_'s order: the tensors
  // themselves, which a swapping runner recognizes (StepRunner::read_state, write_state).
  std::unordered_map<std::string, at::Tensor> moments;
  for (auto& [name, t] : r.optimizer.state()) moments.emplace(name, t);
  std::vector<at::Tensor> out;
  const auto& params = r.params.params();
  for (const int i : flat_->indices()) out.push_back(params[static_cast<size_t>(i)].value);
  for (const char* prefix : {"exp_avg.", "exp_avg_sq."})
    for (const int i : flat_->indices())
      out.push_back(moments.at(prefix + params[static_cast<size_t>(i)].name));
  return out;
}

nlohmann::json Ddp::checkpoint_state(std::vector<std::pair<std::string, at::Tensor>>&) {
  return round_state("ddp");
}

}  // namespace starling::strategy
