#include "starling/strategy/diloco.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>

#include "starling/common/error.h"
#include "starling/strategy/state_stream.h"
#include "starling/strategy/state_tensors.h"
#include "starling/strategy/strategy_config.h"
#include "starling/train/step_runner.h"

namespace starling::strategy {

DiLoCo::DiLoCo(const train::RunConfig& config, net::Collectives& net)
    : SwarmStrategy(config, net), faults_("outer step") {
  if (!faults_.announcement().empty()) log(faults_.announcement());
}

void DiLoCo::allocate(train::Replica& r) {
  replica_ = &r;
  // A swapped replica's budget holds neither vector: the runner keeps them in its tier, the
  // anchor starting at the parameters and the momentum at zeros (which take no bytes until
  // written).
  const bool keep = config_.swap.enabled() && r.runner != nullptr;
  anchor_ = OuterVector(*flat_, r.params, r.runner, keep, OuterVector::Start::parameters);
  momentum_ = OuterVector(*flat_, r.params, r.runner, keep, OuterVector::Start::zeros);
  if (!keep) delta_.emplace(flat_->device(), flat_->numel(), through_host());
}

std::array<float, kAgreementNotes> DiLoCo::round_notes() const {
  return {static_cast<float>(transfer_piece_bytes(config_.strategy) / 1000),
          anchor_.kept() ? 1.f : 0.f, 0.f};
}

bool DiLoCo::step_done(train::Replica& r, bool last) {
  if (!last && r.step % config_.strategy.local_steps != 0) return false;
  boundary_round(r, last, [this](const Agreement& a) { outer_step(a); });
  ++rounds_;
  return true;
}

void DiLoCo::started(const Agreement& a) {
  if (a.exchange_follows) outer_step(a);
}

void DiLoCo::end_in_last_round(train::Replica& r, int64_t agreed_version) {
  settle_last_round(
      r, [this](const Agreement& a) { outer_step(a); }, agreed_version);
  ++rounds_;
}

void DiLoCo::outer_step(const Agreement& a) {
  faults_.begin();
  if (anchor_.kept() || a.notes[1] > 0) {
    outer_step_in_pieces(a);
    return;
  }
  faults_.maybe_die(0, [this](const std::string& line) { log(line); });
  at::Tensor& delta = delta_->device();
  const at::Tensor& anchor = anchor_.flat();
  flat_->gather(delta);               // y
  at::sub_out(delta, anchor, delta);  // delta = x - y
  if (!a.contribute) delta.zero_();
  if (a.contributors > 0 && aggregate(*delta_, -1, a, precision_, "pseudo-gradient all-reduce")) {
    delta.div_(static_cast<double>(a.contributors));  // Delta
    const double beta = config_.strategy.outer_momentum;
    at::Tensor momentum = momentum_.flat();
    momentum.mul_(beta).add_(delta);
    anchor.sub_(delta.add_(momentum, beta), config_.strategy.outer_lr);  // Nesterov
    ++version_;
    flat_->scatter(anchor);
    note_round(anchor);
  }
  // On failure the local progress is kept: the next round's delta covers both rounds.
}

void DiLoCo::outer_step_in_pieces(const Agreement& a) {
  if (a.contributors == 0) return;
  train::Replica& r = *replica_;
  const int64_t piece = round_piece_numel(a);
  std::vector<at::Tensor> params;
  for (const int i : flat_->indices())
    params.push_back(r.params.params()[static_cast<size_t>(i)].value);
  StateStream ys(std::move(params), piece), xs(anchor_.parts(), piece),
      ms(momentum_.parts(), piece);
  const int64_t largest = std::min(ys.piece_numel(), ys.numel());
  if (!piece_ || piece_->numel() < largest) {
    piece_.emplace(flat_->device(), largest, through_host());
    anchor_piece_ = at::empty({largest}, piece_->device().options());
    momentum_piece_ = at::empty({largest}, piece_->device().options());
  }
  const auto read = [this](const at::Tensor& t) { return read_state(t); };
  // A peer that sends nothing (it adopted the swarm's state in this agreement) reads no
  // parameters: every element is overwritten by the new anchor before its tensor is written.
  const auto read_params = [&](const at::Tensor& t) {
    return a.contribute ? read(t) : at::empty(t.sizes(), t.options());
  };
  const auto write = [this](const at::Tensor& t, const at::Tensor& values) {
    write_state(t, values);
  };
  // A tensor is written once its last element has stepped: the anchor's tensors written tell
  // what a step that broke off changed.
  int64_t anchors_written = 0;
  const auto write_anchor = [&](const at::Tensor& t, const at::Tensor& values) {
    ++anchors_written;
    write(t, values);
  };
  const double beta = config_.strategy.outer_momentum;
  // As in localsgd's average in pieces: a failure leaves the pieces before it stepped and the
  // rest as they were (the next round's delta covers both rounds there); the later pieces are
  // still read and sent, and none is written, so a peer whose collective completed where this
  // one's failed still gets its right average.
  bool ok = true;
  int64_t stepped = 0;  // pieces
  uint32_t crc = 0;     // of the new anchor, for the fingerprint
  for (int64_t k = 0; k < ys.pieces(); ++k) {
    if (k == 1) faults_.maybe_die(k, [this](const std::string& line) { log(line); });
    const int64_t n = ys.numel_of(k);
    at::Tensor y = piece_->device().narrow(0, 0, n);
    at::Tensor x = anchor_piece_.narrow(0, 0, n);
    at::Tensor m = momentum_piece_.narrow(0, 0, n);
    ys.update_next(y, read_params, write, [&](at::Tensor& delta) {
      xs.update_next(x, read, write_anchor, [&](at::Tensor& anchor) {
        return ms.update_next(m, read, write, [&](at::Tensor& momentum) {
          at::sub_out(delta, anchor, delta);  // delta = x - y
          if (!a.contribute) delta.zero_();
          ok = aggregate(*piece_, n, a, precision_, "pseudo-gradient all-reduce") && ok;
          if (ok && faults_.loses_piece(k, [this](const std::string& line) { log(line); }))
            ok = false;
          if (!ok) return false;
          delta.div_(static_cast<double>(a.contributors));  // Delta
          momentum.mul_(beta).add_(delta);
          anchor.sub_(delta.add_(momentum, beta), config_.strategy.outer_lr);  // Nesterov
          return true;
        });
      });
      if (!ok) return false;
      delta.copy_(x);  // the parameters restart from the new anchor
      if (config_.strategy.fingerprint) crc = chain_crc(x, crc);
      return true;
    });
    if (ok) ++stepped;
  }
  release_pass_blocks();
  if (ok) {
    ++version_;
    note_round_crc(crc);
  } else if (stepped > 0) {
    log("the outer step broke off after " + std::to_string(stepped) + " of " +
        std::to_string(ys.pieces()) + " pieces: the tensors through by then (" +
        std::to_string(anchors_written) + " of " + std::to_string(anchor_.parts().size()) +
        ") hold the new anchor, the rest their round's own");
    // A collective that completed on some peers only (a chunk lost on one side) breaks the step
    // off at different pieces on different peers, whose anchors may then differ under one round.
    if (anchors_written > 0) broke_off_after(anchors_written);
  }
}

std::vector<at::Tensor> DiLoCo::state_tensors(train::Replica&) {
  std::vector<at::Tensor> out;
  anchor_.append_to(out);
  momentum_.append_to(out);
  return out;
}

void DiLoCo::state_adopted(train::Replica& r) {
  if (!anchor_.kept()) {
    flat_->scatter(anchor_.flat());  // y = x
    return;
  }
  // A tensor at a time, so the budget holds one of the anchor beside it.
  const auto& params = r.params.params();
  for (size_t k = 0; k < anchor_.parts().size(); ++k)
    write_state(params[static_cast<size_t>(flat_->indices()[k])].value,
                read_state(anchor_.parts()[k]));
}

void DiLoCo::restore(train::Replica& r, const nlohmann::json&, const SafetensorsFile& tensors) {
  anchor_.restore(tensors, "strategy.anchor", r.runner);
  momentum_.restore(tensors, "strategy.momentum", r.runner);
}

nlohmann::json DiLoCo::checkpoint_state(std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  // Kept in the tier: a tensor per parameter, which the checkpoint reads one at a time.
  anchor_.checkpoint(tensors, "strategy.anchor");
  momentum_.checkpoint(tensors, "strategy.momentum");
  return round_state("diloco");
}

}  // namespace starling::strategy
