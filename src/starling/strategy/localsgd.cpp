#include "starling/strategy/localsgd.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "starling/strategy/fault_injection.h"
#include "starling/strategy/state_stream.h"
#include "starling/strategy/strategy_config.h"
#include "starling/train/step_runner.h"

namespace starling::strategy {

LocalSgd::LocalSgd(const train::RunConfig& config, net::Collectives& net)
    : SwarmStrategy(config, net), faults_("parameter average") {
  if (!faults_.announcement().empty()) log(faults_.announcement());
}

std::array<float, kAgreementNotes> LocalSgd::round_notes() const {
  return {static_cast<float>(transfer_piece_bytes(config_.strategy) / 1000),
          config_.swap.enabled() ? 1.f : 0.f, 0.f};
}

void LocalSgd::allocate(train::Replica& r) {
  replica_ = &r;
  // A swapped replica's parameters are averaged a piece at a time (average_in_pieces): its
  // budget holds no second copy of them.
  if (config_.swap.enabled()) return;
  buffer_.emplace(flat_->device(), flat_->numel() + 1, through_host());
}

bool LocalSgd::step_done(train::Replica& r, bool last) {
  if (!last && r.step % config_.strategy.local_steps != 0) return false;
  boundary_round(r, last, [this](const Agreement& a) { average(a); });
  ++rounds_;
  return true;
}

void LocalSgd::started(const Agreement& a) {
  if (a.exchange_follows) average(a);
}

void LocalSgd::end_in_last_round(train::Replica& r, int64_t agreed_version) {
  settle_last_round(
      r, [this](const Agreement& a) { average(a); }, agreed_version);
  ++rounds_;
}

void LocalSgd::average(const Agreement& a) {
  faults_.begin();
  if (!buffer_ || a.notes[1] > 0) {
    average_in_pieces(*replica_, a);
    return;
  }
  faults_.maybe_die(0, [this](const std::string& line) { log(line); });
  at::Tensor params = buffer_->device().narrow(0, 0, flat_->numel());
  flat_->gather(params);
  if (!a.contribute) params.zero_();
  if (a.contributors > 0 && sum_with_senders(*buffer_, params.numel(), a)) {
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
  // into pieces of the participants' mean transfer_piece (the same sum on every peer): each is
  // read from wherever the runner keeps it, averaged, and written back there a tensor at a time,
  // so the average holds one piece and at most two tensors beside the budget.
  StateStream stream(state_tensors(r), round_piece_numel(a));
  const int64_t largest = std::min(stream.piece_numel(), stream.numel());
  if (!pieces_ || pieces_->numel() < largest + 1)
    pieces_.emplace(flat_->device(), largest + 1, through_host());
  // A peer that sends nothing (it adopted the swarm's state in this agreement) reads nothing:
  // every element it would read is overwritten by the average before its tensor is written.
  const auto read = [this, &a](const at::Tensor& t) {
    if (!a.contribute) return at::empty(t.sizes(), t.options());
    return read_state(t);
  };
  const auto write = [this](const at::Tensor& t, const at::Tensor& values) {
    write_state(t, values);
  };
  // A failure leaves the tensors written before it averaged on the peers that got them, the rest
  // their own: as good a start for the next round as the parameters before it (they differ
  // between peers anyway), and the next agreement hands everyone the root's if some peer did get
  // every piece. The pieces after it are still read and sent, and none is written: a peer whose
  // collective failed while another's completed (a timeout on one side) stays in step with it,
  // and sends it what it would have, so that peer's average is still right.
  bool ok = true;
  int64_t averaged = 0;  // pieces
  uint32_t crc = 0;      // of the average, for the fingerprint
  for (int64_t k = 0; k < stream.pieces(); ++k) {
    if (k == 1) faults_.maybe_die(k, [this](const std::string& line) { log(line); });
    const int64_t n = stream.numel_of(k);
    at::Tensor part = pieces_->device().narrow(0, 0, n);
    stream.update_next(part, read, write, [&](at::Tensor& values) {
      if (!a.contribute) values.zero_();
      ok = sum_with_senders(*pieces_, n, a) && ok;  // sent even after a failure (above)
      if (ok && faults_.loses_piece(k, [this](const std::string& line) { log(line); })) ok = false;
      if (ok && config_.strategy.fingerprint) crc = chain_crc(values, crc);
      return ok;
    });
    if (ok) ++averaged;
  }
  if (ok) {
    ++version_;
    note_round_crc(crc);
  } else if (averaged > 0) {
    log("the parameter average broke off after " + std::to_string(averaged) + " of " +
        std::to_string(stream.pieces()) +
        " pieces: the tensors through by then hold the average, the rest this peer's own");
  }
}

bool LocalSgd::sum_with_senders(Staging& staged, int64_t n, const Agreement& a) {
  at::Tensor all = staged.device();
  all.narrow(0, n, 1).fill_(a.contribute ? 1.f : 0.f);
  if (!aggregate(staged, n + 1, a, precision_, "parameter averaging")) return false;
  // Whole numbers, a few at most, even through int8's scales.
  const double senders = std::round(all[n].item<double>());
  if (senders < 1) {
    log("parameter averaging: no peer sent finite parameters this round; each keeps its own");
    return false;
  }
  all.narrow(0, 0, n).div_(senders);
  return true;
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
