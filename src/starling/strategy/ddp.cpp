#include "starling/strategy/ddp.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <string>
#include <unordered_map>
#include <vector>

#include "starling/strategy/fault_injection.h"
#include "starling/train/step_runner.h"

namespace starling::strategy {

Ddp::Ddp(const train::RunConfig& config, net::Collectives& net)
    : SwarmStrategy(config, net), faults_("gradient exchange") {
  if (!faults_.announcement().empty()) log(faults_.announcement());
}

// The gradient buffer is sized by the first exchange, when the runner's pieces are known.
void Ddp::allocate(train::Replica&) {}

bool Ddp::average_gradients(train::Replica& r, const Agreement& a,
                            const std::function<double()>& divisor) {
  if (r.runner == nullptr) throw std::logic_error("ddp: gradients exchanged before the first step");
  ++rounds_;
  faults_.begin();
  faults_.maybe_die(0, [this](const std::string& line) { log(line); });
  if (a.contributors == 0) return false;
  bool ok = true;
  double d = 0;
  bool asked = false;
  int64_t k = 0;  // the piece
  const auto exchange = [&](std::span<const int> piece) {
    const int64_t n = flat_->numel(piece);
    if (!grads_ || grads_->numel() < n) grads_.emplace(flat_->device(), n, through_host());
    at::Tensor grads = grads_->device().narrow(0, 0, n);
    flat_->gather_grads(piece, grads);
    // A peer that just adopted the swarm's parameters computed its gradients on other ones.
    if (!a.contribute) grads.zero_();
    ok = aggregate(*grads_, n, a, precision_, "gradient all-reduce") && ok;
    if (ok && faults_.loses_piece(k, [this](const std::string& line) { log(line); })) ok = false;
    ++k;
    if (!asked) {
      d = divisor();
      asked = true;
      ok = ok && d > 0;
    }
    // Without an average the step is skipped (update_applies): what the gradients hold then is
    // never used.
    if (ok) grads.div_(d);
    flat_->scatter_grads(piece, grads);
  };
  if (a.notes[1] > 0)
    r.runner->visit_gradients_by_node(exchange);
  else
    r.runner->visit_gradients(exchange);
  return ok;
}

train::StrategyReport Ddp::report() const {
  train::StrategyReport rep = SwarmStrategy::report();
  rep.figures["applied_steps"] = static_cast<double>(applied_steps_);
  return rep;
}

std::array<float, kAgreementNotes> Ddp::round_notes() const {
  return {0.f, config_.swap.enabled() ? 1.f : 0.f, 0.f};
}

bool Ddp::update_applies(train::Replica& r, bool averaged) {
  bool applies = averaged;
  if (r.runner->trained_params()) {
    at::Tensor missing = at::full({1}, averaged ? 0.f : 1.f, at::kFloat);
    r.runner->sum_over_model(missing);
    applies = missing.item<float>() == 0;
  }
  applied_ = applies;
  if (!applies)
    log("step " + std::to_string(r.step + 1) + ": no average of the swarm's gradients" +
        (averaged ? " for another part of the model" : "") +
        "; the update is skipped (AdamW's count stays at " + std::to_string(r.optimizer.steps()) +
        ")");
  return applies;
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

bool Ddp::gradients_ready(train::Replica& r) {
  const Agreement a = exchange_agreement(r);
  return update_applies(
      r, average_gradients(r, a, [&a] { return static_cast<double>(a.contributors); }));
}

bool Ddp::step_done(train::Replica& r, bool last) {
  if (applied_) {
    ++version_;
    ++applied_steps_;
  }
  if (last) close_run(r);
  // A peer that knows its state may differ from the swarm's notes nothing (note_round).
  if (!config_.strategy.fingerprint || need_state_) return true;
  if (config_.swap.enabled()) {
    // A swapped replica's weights, read back a tensor at a time in flat_'s order (the update
    // finishes first): the whole vector's CRC without holding the vector.
    uint32_t crc = 0;
    const auto& params = r.params.params();
    for (const int i : flat_->indices())
      crc = chain_crc(read_state(params[static_cast<size_t>(i)].value), crc);
    note_round_crc(crc);
    return true;
  }
  at::Tensor params = flat_->zeros();
  flat_->gather(params);
  note_round(params);
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
