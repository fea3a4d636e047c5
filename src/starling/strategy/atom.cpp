#include "starling/strategy/atom.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <stdexcept>
#include <thread>

#include "starling/common/device.h"
#include "starling/train/metrics.h"
#include "starling/train/step_runner.h"
#include "starling/train/stop_request.h"

namespace starling::strategy {

using train::now_s;

namespace {
// Seconds between two "still gathering" lines of a long step.
constexpr double kProgressEveryS = 60;
}  // namespace

Atom::Atom(const train::RunConfig& config, net::Node& node)
    : Ddp(config, node), board_(node), death_(die_accumulating_from_env()) {
  if (death_)
    log("fault injection: this peer dies while it accumulates its step " +
        std::to_string(death_->step) + ", after " + std::to_string(death_->micro_batches) +
        " micro-batch(es) (STARLING_FAULT_DIE_ACCUMULATING)");
}

int64_t Atom::target() const {
  const auto& c = config_;
  if (c.strategy.target_batch > 0) return c.strategy.target_batch;
  return c.train.batch_size * c.train.grad_accum * peers_;
}

double Atom::pace() const {
  return micro_s_ > 0 ? static_cast<double>(config_.train.batch_size) / micro_s_ : 0;
}

train::StepHooks::StepWork Atom::run_step(train::StepRunner& runner, train::Replica& r,
                                          double loss_scale) {
  const int64_t batch = config_.train.batch_size;
  ++steps_run_;
  // Micro-batches are timed on the device's work (below): the previous step's update, which may
  // still be queued on a GPU, is waited for before this peer says it has started, since the
  // others project it from then on, and before its first micro-batch's clock starts.
  const c10::Device device(config_.train.device);
  synchronize_current_stream(device);
  round_ = {.version = version_, .step = r.step};
  board_.begin_round(round_, history_);
  // The others project this peer from the moment they hear it has started, not from their own
  // starts: a peer may begin a round late (a longer checkpoint, evaluation or swap write-back).
  // A peer that will adopt the swarm's state contributes nothing: it says so at once, as a
  // ready peer with no samples, so that nobody counts on it. So does one whose first exchange
  // is the others' already agreed one (joined_round_): it computes one micro-batch, on the
  // parameters it adopted, and its samples count in that exchange.
  const bool spectator = need_state_ || joined_round_.has_value();
  board_.announce(round_, 0, pace(), spectator);
  runner.begin_accumulation();
  at::Tensor loss_sum;
  int64_t mine = 0, micro = 0;
  const auto compute = [&](int64_t sequences) {
    const double t0 = now_s();
    // Each micro-batch's loss is weighted by its samples (StepRunner::accumulate), so the
    // gradients add up to a sum over samples that the exchange divides by the swarm's count.
    const at::Tensor loss = runner.accumulate(loss_scale, sequences);
    // The pace, the projections and the smaller last micro-batches all rest on this time: on a
    // GPU the passes return once queued, so the time is taken when the device has run them.
    synchronize_current_stream(device);
    const at::Tensor weighted = loss * static_cast<double>(sequences);
    loss_sum = loss_sum.defined() ? loss_sum + weighted : weighted;
    ++micro;
    mine += sequences;
    last_sequences_ = sequences;
    const double took = now_s() - t0;
    compute_s_ += took;
    // A smaller micro-batch says little about a whole one's time (each has a fixed cost too).
    if (sequences == batch) micro_s_ = micro_s_ > 0 ? 0.7 * micro_s_ + 0.3 * took : took;
  };
  // A step may be long (a large strategy.target_batch on slow peers): it says how it goes now
  // and then, and a stop asked for ends it early, with the samples gathered so far, for every
  // peer: the stopped one says so on the board (closing), and the others end theirs too.
  double said_s = now_s();
  bool told = false;
  closing_ = false;
  for (int64_t sequences = batch; sequences > 0;) {
    compute(sequences);
    // Its own stop first: told, it closes the round even where another peer closed it too.
    if (!spectator && train::stop_requested()) {
      sequences = 0;
      told = true;
      log("step " + std::to_string(r.step + 1) +
          ": a stop was asked for; this peer ends its step with the " + std::to_string(mine) +
          " samples it has, and so do the others (the swarm's count may fall short of its "
          "target of " +
          std::to_string(target()) + " this once)");
    } else {
      sequences = spectator ? 0 : next_sequences(mine);
      if (closing_ && !spectator)
        log("step " + std::to_string(r.step + 1) +
            ": a peer told to stop ended the step early; this peer ends it too, with the " +
            std::to_string(mine) + " samples it has");
    }
    if (sequences > 0 && now_s() - said_s >= kProgressEveryS) {
      said_s = now_s();
      log("step " + std::to_string(r.step + 1) + ": still gathering, this peer at " +
          std::to_string(mine) + " samples, the swarm about " +
          std::to_string(mine + std::llround(board_.view(0).projected)) + " of its target of " +
          std::to_string(target()));
    }
    board_.announce(round_, spectator ? 0 : mine, pace(), sequences == 0, told);
    // A peer told to die after more micro-batches than it computes in the step dies at its last.
    if (death_ && death_->step == steps_run_ &&
        (death_->micro_batches == micro || sequences == 0)) {
      log("fault injection: dying while accumulating step " + std::to_string(steps_run_) +
          ", after " + std::to_string(micro) + " micro-batch(es) and " + std::to_string(mine) +
          " samples announced");
      // The announcement is queued on the connections: it leaves before the end.
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      std::raise(SIGKILL);
    }
  }
  // The exchange's agreement, here rather than in gradients_ready: its notes carry every
  // participant's count (round_notes), and a count short of the target is made up before the
  // exchange, its micro-batches part of this step's loss and tokens.
  local_samples_ = mine;
  agreement_ = exchange_agreement(r);
  const std::optional<Count> count = step_count(*agreement_);
  // A step ended early (this peer told to stop, or another: closing) is not made up.
  const bool early_end = told || train::stop_requested() || closing_ || board_.view(0).closing;
  if (count && count->samples < target() && agreement_->contribute && !early_end) {
    const int64_t missing = target() - count->samples;
    int64_t share = top_up_share(missing, count->paces, count->contributors);
    log("step " + std::to_string(r.step + 1) + ": the swarm gathered " +
        std::to_string(count->samples) + " of its target of " + std::to_string(target()) +
        " samples (" +
        (count->checked ? "a peer left while it accumulated, or computed its samples on a state "
                          "the agreement replaced"
                        : "a peer left while it accumulated") +
        "); this peer adds " + std::to_string(share) + " before the exchange");
    ++topped_up_steps_;
    while (share > 0) {
      const int64_t sequences = std::min(share, batch);
      compute(sequences);
      share -= sequences;
    }
    local_samples_ = mine;
  }
  micro_batches_ = micro;
  return {.loss = loss_sum / static_cast<double>(mine),
          .tokens = static_cast<uint64_t>(mine * config_.model.seq_len)};
}

std::array<float, kAgreementNotes> Atom::round_notes() const {
  std::array<float, kAgreementNotes> notes = Ddp::round_notes();
  notes[0] = static_cast<float>(local_samples_);  // exact below 2^24 samples a step
  notes[2] = static_cast<float>(pace());
  return notes;
}

std::optional<int64_t> Atom::agreed_count(const Agreement& a) const {
  // A participant outside this exchange's agreement (a joiner, whose opening agreement it is:
  // it computes its samples after it) or one that does not contribute (it adopted the state)
  // makes the notes' sum other than the exchange's count; every participant sees that alike.
  if (a.exchange_voters != a.peers || a.contributors != a.peers || a.peers == 0)
    return std::nullopt;
  return std::llround(a.notes[0]);
}

std::optional<Atom::Count> Atom::step_count(const Agreement& a) {
  if (const std::optional<int64_t> agreed = agreed_count(a))
    return Count{.samples = *agreed, .paces = a.notes[2], .contributors = a.peers};
  // No exchange follows where nobody contributes (gradients_ready): every participant sees that
  // alike, as it sees whether the notes settled the count.
  if (a.contributors == 0) return std::nullopt;
  // The agreement handed some participant the swarm's state (its samples, computed on other
  // parameters, do not count), or it is a joiner's first exchange (its samples come after the
  // agreement): the contributors' own count and paces, in one more tiny all-reduce, taken by
  // every participant alike. Rare: a step that follows a fault or a join.
  // Four numbers, the last one 1 from every participant: no other collective of a round has
  // this length, so no peer's call can pair with another's of a different kind.
  const bool mine = a.contribute;
  at::Tensor sums = at::tensor({mine ? static_cast<float>(local_samples_) : 0.f,
                                mine ? static_cast<float>(pace()) : 0.f, mine ? 1.f : 0.f, 1.f});
  if (!wait(net_.all_reduce(as_span(sums), options(net::WirePrecision::fp32, a.ring)),
            "sample count check", &a.ring))
    return std::nullopt;  // the exchange will most likely fail too; nothing is made up
  const float* c = sums.data_ptr<float>();
  if (std::lround(c[3]) != static_cast<long>(a.ring.size())) return std::nullopt;
  return Count{.samples = std::llround(c[0]),
               .paces = c[1],
               .contributors = static_cast<int>(std::lround(c[2])),
               .checked = true};
}

int64_t Atom::top_up_share(int64_t missing, double paces, int contributors) const {
  const double mine = pace();
  const double share = paces > 0 && mine > 0
                           ? static_cast<double>(missing) * mine / paces
                           : static_cast<double>(missing) / std::max(1, contributors);
  int64_t n = std::clamp<int64_t>(static_cast<int64_t>(std::ceil(share)), 1, missing);
  // With whole micro-batches only, so is the top-up.
  const int64_t batch = config_.train.batch_size;
  if (!config_.strategy.partial_micro_batches) n = (n + batch - 1) / batch * batch;
  return n;
}

int64_t Atom::next_sequences(int64_t mine) {
  const int64_t batch = config_.train.batch_size;
  const auto short_by = [&](double others) {
    return static_cast<double>(target()) - static_cast<double>(mine) - others;
  };
  // The sequences this peer gains until the swarm, going on at everyone's pace, holds the
  // target: a whole micro-batch while that is more than one, else that many, rounded, so that
  // its micro-batch ends nearest to that moment. With whole micro-batches only
  // (strategy.partial_micro_batches = false): none when the others alone will have made up the
  // difference within half of this peer's next one (its boundary nearest to that moment).
  const bool partial = config_.strategy.partial_micro_batches;
  const auto gained_until_target = [&](const ProgressBoard::View& v) -> int64_t {
    if (!partial) return short_by(v.projected + v.rate * micro_s_ / 2) <= 0 ? 0 : batch;
    const double r = pace();
    if (r <= 0) return batch;
    const double sequences = r * short_by(v.projected) / (v.rate + r);
    if (sequences >= static_cast<double>(batch)) return batch;
    return std::llround(std::max(0.0, sequences));
  };
  ProgressBoard::View v = board_.view(0);
  // A peer told to stop ended the round early: so does this one (run_step says so).
  if (v.closing) {
    closing_ = true;
    return 0;
  }
  if (v.apart) {
    // A round behind others at this step, of its own history or alone in its round: the
    // agreement will most likely hand this peer their state and leave its samples unused, so it
    // computes no more of them (nor do the peers behind with it).
    // (Where it keeps its state after all, the others having gone, its agreement may find the
    // step short and make it up: run_step.)
    if (behind_step_ != steps_run_) {
      behind_step_ = steps_run_;
      ++behind_steps_;
      log("step " + std::to_string(round_.step + 1) +
          ": the others at this step are a round ahead (they applied an average this peer's "
          "exchange missed); it stops accumulating and expects to take their state at the "
          "agreement");
    }
    return 0;
  }
  // Announced counts only grow: on them alone the target is certain.
  if (short_by(static_cast<double>(v.samples)) <= 0) return 0;
  if (const int64_t n = gained_until_target(v); n > 0) return n;
  // On a projection, two peers stopping at the same moment could each count on the other and
  // leave the step short. So the peer with the smallest id still accumulating never stops on a
  // projection: every chain of peers stopping on projections ends with one (smaller ids each
  // time) that stopped on exact counts, and the step gathers the target.
  if (v.smaller_accumulating > 0) return 0;
  // This peer closes the round. It waits for the others to stop (the exchange would wait for
  // them anyway), saying it gains nothing meanwhile so that they do not count on it, for at
  // most one of its micro-batches; then computes what the count still lacks.
  board_.announce(round_, mine, 0.0, false);
  const double until = now_s() + micro_s_;
  do {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    v = board_.view(0);
    if (v.closing) {
      closing_ = true;
      return 0;
    }
    if (short_by(static_cast<double>(v.samples)) <= 0 || v.smaller_accumulating > 0) return 0;
  } while (v.ready < v.heard && now_s() < until);
  ++extra_micro_batches_;
  // With everyone else stopped, exactly the missing samples; else what the projection asks.
  const double missing = v.ready == v.heard ? short_by(static_cast<double>(v.samples))
                                            : static_cast<double>(gained_until_target(v));
  return partial ? std::clamp<int64_t>(static_cast<int64_t>(std::ceil(missing)), 1, batch) : batch;
}

bool Atom::gradients_ready(train::Replica& r) {
  if (!agreement_) throw std::logic_error("atom: gradients exchanged before the step ran");
  const Agreement a = *agreement_;
  agreement_.reset();
  // A peer that just adopted the swarm's parameters computed its gradients on other ones.
  const int64_t counted = a.contribute ? local_samples_ : 0;
  // The sample counts travel in fp32, whatever the gradients' wire precision: launched first,
  // waited for after the first piece of gradients. Like the gradients, they go over the round's
  // participants only: a peer that becomes a member after this agreement waits for the next.
  // Always, even where the agreement's notes gave the count: whether they did depends on the
  // target, which is each peer's own setting (a joiner may have another), and a collective that
  // some peers skipped would fail the exchange.
  at::Tensor count = at::full({1}, static_cast<float>(counted), at::kFloat);
  std::optional<net::Work> counting;
  if (a.contributors > 0)
    counting = net_.all_reduce(as_span(count), options(net::WirePrecision::fp32, a.ring));
  swarm_samples_ = 0;
  const bool ok = average_gradients(r, a, [&] {
    if (!counting || !wait(*counting, "sample count all-reduce", &a.ring)) return 0.0;
    swarm_samples_ = static_cast<int64_t>(count.item<float>());
    return static_cast<double>(swarm_samples_);
  });
  if (!ok) swarm_samples_ = 0;
  return update_applies(r, ok);
}

nlohmann::json Atom::checkpoint_state(std::vector<std::pair<std::string, at::Tensor>>&) {
  return round_state("atom");
}

train::StrategyReport Atom::report() const {
  train::StrategyReport rep = Ddp::report();
  rep.figures["swarm_samples"] = static_cast<double>(swarm_samples_);
  rep.figures["samples"] = static_cast<double>(local_samples_);
  rep.figures["micro_batches"] = static_cast<double>(micro_batches_);
  rep.figures["target_batch"] = static_cast<double>(target());
  rep.figures["last_micro_batch"] = static_cast<double>(last_sequences_);
  rep.figures["compute_s"] = compute_s_;
  if (topped_up_steps_ > 0) rep.figures["topped_up_steps"] = static_cast<double>(topped_up_steps_);
  if (behind_steps_ > 0) rep.figures["behind_steps"] = static_cast<double>(behind_steps_);
  if (extra_micro_batches_ > 0)
    rep.figures["closing_micro_batches"] = static_cast<double>(extra_micro_batches_);
  if (board_.rejected() > 0) rep.figures["rejected"] = static_cast<double>(board_.rejected());
  return rep;
}

}  // namespace starling::strategy
