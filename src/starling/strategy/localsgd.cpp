#include "starling/strategy/localsgd.h"

#include <ATen/ATen.h>

#include "starling/strategy/state_stream.h"
#include "starling/strategy/strategy_config.h"
#include "starling/train/step_runner.h"

namespace starling::strategy {

LocalSgd::LocalSgd(const train::RunConfig& config, net::Collectives& net)
    : SwarmStrategy(config, net) {}

void LocalSgd::allocate(train::Replica& r) {
  replica_ = &r;
  // A swapped replica's parameters are averaged a piece at a time (average_in_pieces): its
  // budget holds no second copy of them.
  if (config_.swap.enabled()) return;
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
  if (!buffer_) {
    average_in_pieces(*replica_, a);
    return;
  }
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

void LocalSgd::average_in_pieces(train::Replica& r, const Agreement& a) {
  if (a.contributors == 0) return;
  // The parameters as one vector (flat_'s order, the same on every peer whatever its plan), cut
  // into pieces of strategy.transfer_piece: each is read from wherever the runner keeps it,
  // averaged, and written back there a tensor at a time, so the average holds one piece and one
  // tensor beside the budget.
  StateStream stream(state_tensors(r),
                     std::max<int64_t>(1, transfer_piece_bytes(config_.strategy) /
                                              static_cast<int64_t>(sizeof(float))));
  const int64_t largest = std::min(stream.piece_numel(), stream.numel());
  if (!pieces_ || pieces_->numel() < largest)
    pieces_.emplace(flat_->device(), largest, through_host());
  const auto read = [&r](const at::Tensor& t) { return r.runner->read_state(t); };
  const auto write = [&r](const at::Tensor& t, const at::Tensor& values) {
    r.runner->write_state(t, values);
  };
  for (int64_t k = 0; k < stream.pieces(); ++k) {
    const int64_t n = stream.numel_of(k);
    at::Tensor part = pieces_->device().narrow(0, 0, n);
    // A failure leaves the tensors written before it averaged on the peers that got them, the
    // rest their own: as good a start for the next round as the parameters before it (they
    // differ between peers anyway), and the next agreement hands everyone the root's if some
    // peer did get every piece.
    const bool averaged = stream.update_next(part, read, write, [&](at::Tensor& values) {
      if (!a.contribute) values.zero_();
      if (!aggregate(*pieces_, n, a, precision_, "parameter averaging")) return false;
      values.div_(static_cast<double>(a.contributors));
      return true;
    });
    if (!averaged) return;
  }
  ++version_;
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
