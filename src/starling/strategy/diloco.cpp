#include "starling/strategy/diloco.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>

#include "starling/common/error.h"
#include "starling/net/crc32c.h"
#include "starling/strategy/state_stream.h"
#include "starling/strategy/state_tensors.h"
#include "starling/strategy/strategy_config.h"
#include "starling/train/step_runner.h"

namespace starling::strategy {

DiLoCo::DiLoCo(const train::RunConfig& config, net::Collectives& net)
    : SwarmStrategy(config, net), death_("outer step") {
  if (!death_.announcement().empty()) log(death_.announcement());
}

void DiLoCo::allocate(train::Replica& r) {
  replica_ = &r;
  if (config_.swap.enabled() && r.runner != nullptr) {
    // A swapped replica's budget holds neither vector: the runner keeps a tensor of each per
    // parameter in its tier (their storage never touched), the anchor starting at the
    // parameters and the momentum at zeros (which take no bytes until written).
    at::NoGradGuard no_grad;
    const auto& params = r.params.params();
    for (const int i : flat_->indices()) {
      const at::Tensor& p = params[static_cast<size_t>(i)].value;
      const auto options = p.options().dtype(at::kFloat);
      at::Tensor anchor = at::empty(p.sizes(), options);
      at::Tensor momentum = at::empty(p.sizes(), options);
      if (!r.runner->keep_state(anchor, r.runner->read_state(p)) ||
          !r.runner->keep_state(momentum, at::Tensor()))
        throw std::logic_error("diloco: the swapped replica's runner keeps no state");
      anchors_.push_back(std::move(anchor));
      momenta_.push_back(std::move(momentum));
    }
    return;
  }
  anchor_ = flat_->zeros();
  momentum_ = flat_->zeros();
  delta_.emplace(flat_->device(), flat_->numel(), through_host());
  flat_->gather(anchor_);
}

std::array<float, kAgreementNotes> DiLoCo::round_notes() const {
  return {static_cast<float>(transfer_piece_bytes(config_.strategy) / 1000),
          anchors_.empty() ? 0.f : 1.f, 0.f};
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
  death_.begin();
  if (!anchors_.empty() || a.notes[1] > 0) {
    outer_step_in_pieces(a);
    return;
  }
  death_.maybe_die(0, [this](const std::string& line) { log(line); });
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

void DiLoCo::outer_step_in_pieces(const Agreement& a) {
  if (a.contributors == 0) return;
  train::Replica& r = *replica_;
  const int64_t piece = round_piece_numel(a);
  std::vector<at::Tensor> params;
  for (const int i : flat_->indices())
    params.push_back(r.params.params()[static_cast<size_t>(i)].value);
  StateStream ys(std::move(params), piece), xs(per_param(anchor_, anchors_), piece),
      ms(per_param(momentum_, momenta_), piece);
  const int64_t largest = std::min(ys.piece_numel(), ys.numel());
  if (!piece_ || piece_->numel() < largest) {
    piece_.emplace(flat_->device(), largest, through_host());
    anchor_piece_ = at::empty({largest}, piece_->device().options());
    momentum_piece_ = at::empty({largest}, piece_->device().options());
  }
  train::StepRunner* runner = r.runner;
  const auto read = [runner](const at::Tensor& t) {
    return runner != nullptr ? runner->read_state(t) : t;
  };
  // A peer that sends nothing (it adopted the swarm's state in this agreement) reads no
  // parameters: every element is overwritten by the new anchor before its tensor is written.
  const auto read_params = [&](const at::Tensor& t) {
    return a.contribute ? read(t) : at::empty(t.sizes(), t.options());
  };
  const auto write = [runner](const at::Tensor& t, const at::Tensor& values) {
    if (runner != nullptr)
      runner->write_state(t, values);
    else
      train::copy_state(t, values);
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
    if (k == 1) death_.maybe_die(k, [this](const std::string& line) { log(line); });
    const int64_t n = ys.numel_of(k);
    at::Tensor y = piece_->device().narrow(0, 0, n);
    at::Tensor x = anchor_piece_.narrow(0, 0, n);
    at::Tensor m = momentum_piece_.narrow(0, 0, n);
    ys.update_next(y, read_params, write, [&](at::Tensor& delta) {
      xs.update_next(x, read, write, [&](at::Tensor& anchor) {
        return ms.update_next(m, read, write, [&](at::Tensor& momentum) {
          at::sub_out(delta, anchor, delta);  // delta = x - y
          if (!a.contribute) delta.zero_();
          ok = aggregate(*piece_, n, a, precision_, "pseudo-gradient all-reduce") && ok;
          if (!ok) return false;
          delta.div_(static_cast<double>(a.contributors));  // Delta
          momentum.mul_(beta).add_(delta);
          anchor.sub_(delta.add_(momentum, beta), config_.strategy.outer_lr);  // Nesterov
          return true;
        });
      });
      if (!ok) return false;
      delta.copy_(x);  // the parameters restart from the new anchor
      if (config_.strategy.fingerprint) {
        const at::Tensor host = x.to(at::kCPU).contiguous();
        crc = net::crc32c(host.data_ptr(), static_cast<size_t>(n) * sizeof(float), crc);
      }
      return true;
    });
    if (ok) ++stepped;
  }
  if (ok) {
    ++version_;
    note_round_crc(crc);
  } else if (stepped > 0) {
    log("the outer step broke off after " + std::to_string(stepped) + " of " +
        std::to_string(ys.pieces()) +
        " pieces: the tensors through by then hold the new anchor, the rest their round's own");
  }
}

std::vector<at::Tensor> DiLoCo::per_param(const at::Tensor& flat,
                                          const std::vector<at::Tensor>& kept) {
  if (!kept.empty()) return kept;
  std::vector<at::Tensor> out;
  int64_t at = 0;
  for (const int i : flat_->indices()) {
    const at::Tensor& p = replica_->params.params()[static_cast<size_t>(i)].value;
    out.push_back(flat.narrow(0, at, p.numel()).view(p.sizes()));
    at += p.numel();
  }
  return out;
}

std::vector<at::Tensor> DiLoCo::state_tensors(train::Replica&) {
  if (anchors_.empty()) return {anchor_, momentum_};
  std::vector<at::Tensor> out = anchors_;
  out.insert(out.end(), momenta_.begin(), momenta_.end());
  return out;
}

void DiLoCo::state_adopted(train::Replica& r) {
  if (anchors_.empty()) {
    flat_->scatter(anchor_);  // y = x
    return;
  }
  // A tensor at a time, so the budget holds one of the anchor beside it.
  const auto& params = r.params.params();
  for (size_t k = 0; k < anchors_.size(); ++k) {
    const at::Tensor& p = params[static_cast<size_t>(flat_->indices()[k])].value;
    r.runner->write_state(p, r.runner->read_state(anchors_[k]));
  }
}

void DiLoCo::restore(train::Replica& r, const nlohmann::json&, const SafetensorsFile& tensors) {
  restore_vector(r, tensors, "strategy.anchor", anchor_, anchors_);
  restore_vector(r, tensors, "strategy.momentum", momentum_, momenta_);
}

void DiLoCo::restore_vector(train::Replica& r, const SafetensorsFile& file, const std::string& name,
                            at::Tensor& flat, const std::vector<at::Tensor>& kept) {
  at::NoGradGuard no_grad;
  const bool whole = file.contains(name);
  if (whole && kept.empty()) {
    load_state_tensor(file, name, flat);
    return;
  }
  // A tensor at a time: into the runner's keeping (write_state) or the vector's view of it.
  const auto& params = r.params.params();
  const std::vector<at::Tensor> parts = per_param(flat, kept);
  const at::Tensor* all = whole ? &state_tensor(file, name, flat_->numel()) : nullptr;
  int64_t at = 0;
  for (size_t k = 0; k < parts.size(); ++k) {
    const at::Tensor& part = parts[k];
    const at::Tensor& values =
        all != nullptr
            ? all->narrow(0, at, part.numel())
            : state_tensor(file, name + "." + params[static_cast<size_t>(flat_->indices()[k])].name,
                           part.numel());
    if (kept.empty())
      train::copy_state(part, values);
    else
      r.runner->write_state(part, values);
    at += part.numel();
  }
}

nlohmann::json DiLoCo::checkpoint_state(std::vector<std::pair<std::string, at::Tensor>>& tensors) {
  if (anchors_.empty()) {
    tensors.emplace_back("strategy.anchor", anchor_);
    tensors.emplace_back("strategy.momentum", momentum_);
  } else {
    // A tensor per parameter, which the checkpoint reads from the tier one at a time.
    const auto& params = replica_->params.params();
    for (const auto& [name, list] :
         {std::pair{"strategy.anchor.", &anchors_}, std::pair{"strategy.momentum.", &momenta_}})
      for (size_t k = 0; k < list->size(); ++k)
        tensors.emplace_back(name + params[static_cast<size_t>(flat_->indices()[k])].name,
                             (*list)[k]);
  }
  return round_state("diloco");
}

}  // namespace starling::strategy
