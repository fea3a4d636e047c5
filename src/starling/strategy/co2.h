// co2: local updates whose averaging is fully overlapped by computation (DESIGN.md, CO2).
//
// Round t, at the boundary after tau inner AdamW steps from the anchor x_t reach y_t:
//   - the average Delta_{t-1} launched one round ago is collected (it travelled while the tau
//     steps computed);
//   - delta_t = x_t - y_t is launched as a non-blocking all-reduce (sum over contributors);
//   - the stale Delta_{t-1} is applied with the staleness gap penalty and momentum clipping:
//       s = |Delta_{t-1} - Delta_{t-2}| / (|Delta_{t-2}| + eps)
//       m <- beta*m + Delta_{t-1} / (1 + gamma*s);  m <- clip(m, phi);  x_{t+1} = x_t - alpha*m
//   - the next tau steps start from x_{t+1} while delta_t is in flight.
// The final boundary also waits for the last average and applies it, so no round is dropped: by
// default as x_{T+1} = x_T - Delta_T, the peers' mean (strategy.final_step = "average"), not an
// outer step that the momentum carries past it ("outer").
// When a round's average is not applied (its exchange failed when a peer died, or with zero a
// joiner lacks it), each peer sends its part of that round again with the next round's delta, so
// the progress of the survivors is not lost (without zero). Where the last round's average goes
// through on no peer, the survivors run that round again among themselves, with no local steps
// (end_run).
//
// With strategy.overlap_steps = K < tau the average is applied K inner steps into the next round
// instead of at its end (overlapped like Streaming DiLoCo's exchange): at the boundary the peer
// launches delta_t = x_t - y_t and goes on training from its own y_t; after K steps, at z, it
// collects Delta_t, moves the anchor to x_{t+1} and continues from x_{t+1} + (z - y_t), so its K
// steps of progress count in the next round's delta and no round's progress reaches the anchor
// late. Evaluation and checkpoints happen there, on x_{t+1} (the K steps' progress is put back
// before the next step). A failed exchange loses nothing: the anchor stays x_t and the peer goes
// on from its own parameters, so the next round's delta carries both rounds' progress.
//
// With zero = true each peer keeps only its shard (1/N, by peer id) of x, m and Delta_{t-2}: it
// sends e_t = x_{t+1} - y_t by reduce-scatter, recovers its shard of the average as
// mean(e_t) + alpha*m (since x_t - x_{t+1} = alpha*m), updates its shard, and the next anchor is
// rebuilt by an all-gather. The all-gather is on the critical path; the reduce-scatter overlaps.
// Norms for the gap and for clipping by norm are summed over shards with a two-float all-reduce.
// A pipeline stage's co2 averages that stage with its counterparts, and its norms are summed over
// the pipeline's stages too, so they are the whole model's.
// A change of membership moves the shard boundaries: the outer momentum restarts then.
//
// Without zero the outer state (the anchor, outer momentum, previous average and this peer's own
// last delta) is updated a parameter tensor at a time (co2_outer.cpp), and the norms are summed a
// tensor at a time in that order, the same on every peer. So a swapped replica keeps the four
// vectors in its tier (outer_vector.h: 16 bytes a parameter the budget never holds) and
// trains bit for bit as an unswapped one. The average in flight stays in memory beside the
// budget: the network reads it while the next steps compute (4 bytes a parameter).
//
// On a GPU the outer state and the math stay on the device; only the exchange crosses to pinned
// host memory (staging.h). The download of delta_t is started at the boundary and the all-reduce
// launched from a later step once it has landed, and the average is uploaded as soon as it has
// arrived, so neither the host nor the compute stream waits for a copy (ZeRO's norm sums and its
// all-gather still do).
#pragma once

#include <functional>

#include "starling/strategy/outer_vector.h"
#include "starling/strategy/swarm_strategy.h"

namespace starling::strategy {

class Co2 final : public SwarmStrategy {
 public:
  Co2(const train::RunConfig& config, net::Collectives& net);
  bool gradients_ready(train::Replica&) override {
    advance();
    return true;
  }
  StepWork run_step(train::StepRunner& runner, train::Replica& r, double loss_scale) override;
  bool step_done(train::Replica& r, bool last) override;
  nlohmann::json checkpoint_state(
      std::vector<std::pair<std::string, at::Tensor>>& tensors) override;
  void finish(train::Replica& r) override;
  train::StrategyReport report() const override;

  // Bytes of outer state this peer holds in memory (anchor, momentum, previous average, send
  // buffer, and without zero its own part of the last exchange; a swapped peer: the send buffer).
  int64_t state_bytes() const;

 protected:
  void allocate(train::Replica& r) override;
  // The anchor, outer momentum, previous average, the average ready to apply and two flags
  // saying whether those last two hold values, in pieces. A peer whose history is the root's keeps
  // its own state and its parameters: the round's local steps it took count in the delta it
  // launches next. With zero the state is the root's parameters, which every peer takes (the
  // shards move, and the sharded outer state restarts from them).
  std::vector<at::Tensor> state_tensors(train::Replica& r) override;
  void state_adopted(train::Replica& r) override;
  bool keeps_own_state() const override { return !zero(); }
  bool has_previous() const override { return has_average_; }
  void restore(train::Replica& r, const nlohmann::json& state,
               const SafetensorsFile& tensors) override;
  void started(const Agreement& a) override;
  // A joiner of the last round: its drain and the closing agreement, as the others do.
  void end_in_last_round(train::Replica& r, int64_t agreed_version) override;

 private:
  bool zero() const { return config_.strategy.zero; }
  // strategy.overlap_steps in effect (co2_overlap_steps); early: the average is applied inside
  // the next round.
  int64_t overlap_steps() const;
  bool early() const;
  bool nesterov() const;  // whether the outer step is Nesterov's (strategy.outer_nesterov)
  bool step_done_early(train::Replica& r, bool last);
  // Whether the last round's average is applied (drained), from whether this peer `collected`
  // it. With zero, only where every participant did (one tiny all-reduce): each applies its own
  // shard and gathers the others', so a peer without its shard would fail the others' drain,
  // and its collectives would meet their closing agreement. Without zero each peer decides for
  // itself, and the closing agreement hands one whose drain went through to the others.
  bool drain_on_all(bool collected);
  // The last round's drain, after its launch: its average is collected and applied at once, so
  // the run ends on x_{T+1}; whether it was (drain_on_all). A peer that lacks it keeps the
  // anchor x_T, which its parameters hold since the launch, and its delta to send again.
  bool drain();
  // The early form's: the parameters hold this peer's own last round (y_T), and stay so where
  // the average does not arrive; whether it was applied.
  bool drain_early();
  // The run's end, from the last round's launch: the drain and the closing agreement (with zero,
  // the shards of a state it moved). Where the drain went through on no peer (a peer died in the
  // last exchange), the round runs again among the peers still there, with no local steps, up to
  // kSettleRounds times, each sending its part of it again (the published form its delta, the
  // early form its parameters y_T), as localsgd and diloco run their last round again. zero
  // sends no part of a round twice: its peers end on the anchor before it. So does the early
  // form, going back to it, where no run of the round goes through.
  void end_run(train::Replica& r);
  // Early: launches delta_t = x_t - y_t; the parameters stay y_t.
  void launch_early(const Agreement& a);
  // Early: collects the average and applies it; the parameters become x_{t+1} and the progress
  // since the launch waits in own_ (false, parameters untouched, if the exchange failed).
  bool apply_early();
  // Puts the pending progress back into the parameters.
  void restore_offset();
  // Early: the step of the round (counted from its launch) where this exchange's average is
  // applied: overlap_steps, or with -1 chosen from the participants' notes (below).
  int64_t choose_apply_point(const Agreement& a);
  // How many steps this peer's last exchange took (its duration over the mean forward and
  // backward time of the round's steps), for the adaptive apply point.
  std::array<float, kAgreementNotes> round_notes() const override;
  // Collects the in-flight average into average_ (this peer's part of it); false if none.
  bool collect();
  // Moves the exchange on without waiting: launches the all-reduce once the download has landed,
  // and starts the upload once the average has arrived. Called every step.
  void advance();
  // m <- beta*m + Delta/(1 + gamma*gap), clipped; previous <- Delta.
  void update_momentum();
  // x <- x - alpha*m: one more average applied to the shared state.
  void move_anchor();
  // Without zero (co2_outer.cpp), a parameter tensor at a time. update_momentum() leaves
  // clipping by norm's factor in momentum_scale_, which the next pass that steps the anchor
  // (step_anchor_part, then stepped()) applies as it reads the momentum.
  void update_momentum_by_part();
  void step_anchor_part(size_t k, at::Tensor& x);
  void stepped(uint32_t crc);  // the anchor's pass is through: version, fingerprint
  void launch_by_part(const Agreement& a, bool apply);
  void launch_early_by_part(const Agreement& a);
  void apply_early_by_part();
  void restore_offset_by_part();
  // The anchor steps, the parameters follow (the final drain; apply_early_by_part, whose
  // `before(k)` first reads parameter k as it was).
  void step_anchor_by_part(const std::function<void(size_t)>& before = {});
  void adopt_anchor_by_part();  // parameters <- anchor
  // The parameter tensor k of flat_, and this exchange buffer's view of its elements.
  const at::Tensor& param(size_t k) const;
  at::Tensor exchange_part(size_t k);
  // Launches this round's exchange from y (the parameters) and moves y to the new anchor.
  void launch(const Agreement& a, bool apply);
  // At a round boundary (not early): applies the last average if every participant holds it,
  // then launch().
  void launch_at_boundary(const Agreement& a);
  // Zero: rebuilds the full anchor into buffer_ by all-gather; false on failure.
  bool gather_anchor();
  // Zero's reads and writes of the parameters as one flat vector (Flat's order): Flat's copies,
  // or on a swapped replica a tensor at a time through the step runner, the evicted ones from and
  // to its tier. read_params fills `out` with the elements from `begin` on (a shard reads only
  // the tensors it covers); start_from_anchor makes `buffer` (x_{t+1}) the parameters and leaves
  // e_t = x_{t+1} - y_t in it.
  void read_params(at::Tensor& out, int64_t begin);
  void write_params(const at::Tensor& in);
  void start_from_anchor(at::Tensor& buffer);
  void set_shard(const std::vector<net::PeerId>& ring);
  // A 0-dim device sum over every peer's shard (itself without zero; NaN if the exchange fails).
  at::Tensor sum_over_shards(const at::Tensor& local);
  // The sum of squares of `part` (the full vector, or this peer's shard with zero) over the whole
  // model: every shard, and every stage of a pipeline (a tied weight counted once).
  at::Tensor squares(const at::Tensor& part);

  train::Replica* replica_ = nullptr;  // the replica start() was given
  // Without zero: the anchor, outer momentum and previous average, in memory or kept in a
  // swapped replica's tier; and (with zero too) the first element of each parameter in flat_.
  OuterVector anchor_, momentum_, previous_;
  std::vector<int64_t> offsets_;
  at::Tensor momentum_scale_;  // clipping by norm's factor, still to apply (update_momentum)
  // With zero: this peer's shard of each (device), and whether the parameters go through the
  // step runner a tensor at a time (a swapped replica: read_params).
  at::Tensor anchor_shard_, momentum_shard_, previous_shard_;
  bool params_by_tensor_ = false;
  at::Tensor flags_;                 // the transfer's [has_previous_, has_average_] (state_tensors)
  at::Tensor penalty_factor_;        // 1 / (1 + gamma * gap) of the average update_momentum() added
  std::optional<Staging> exchange_;  // the exchange in flight (always full size)
  at::Tensor average_;               // view: the part of exchange_->device() we own
  net::Work in_flight_;
  bool pending_launch_ = false;  // downloading; the collective starts once it has landed
  bool has_in_flight_ = false;
  bool uploading_ = false;     // the in-flight result has arrived and is on its way to the device
  bool has_average_ = false;   // average_ holds Delta_{t-1}, ready to apply
  bool has_previous_ = false;  // previous_ holds Delta_{t-2}
  int in_flight_contributors_ = 0;
  std::vector<net::PeerId> in_flight_ring_;  // the participants of the round that launched it
  bool in_flight_shifted_ = false;  // zero: the anchor moved by alpha*m when it was launched
  int64_t shard_begin_ = 0, shard_end_ = 0;
  std::vector<net::PeerId> ring_;
  mutable LazyScalar gap_;
  // Without zero, this peer's own part of the last launch. Early: the parameters at the launch
  // (y_t), then, once applied, the progress made since. Otherwise: the delta it sent, kept until
  // its average is applied (carry_), and sent again with the next round's if it is not.
  OuterVector own_;
  bool carry_ = false;
  // Early: this peer's part of the last launch (its parameters y_t) is its own still, to send
  // again where the last round runs again (end_run); a state it takes drops it.
  bool own_part_ = false;
  bool launched_early_ = false;  // an exchange awaits its apply point
  bool final_round_ = false;     // the run's last average is being applied (strategy.final_step)
  int64_t round_k_ = 0;          // where it is applied, in steps after its launch
  int64_t logged_k_ = -1;        // the last adaptive choice the log reported
  // Timing for the adaptive apply point: the launch and landing of the exchange in flight (0:
  // not yet seen), the last exchange's duration, the passes' time and count since the launch,
  // and the mean step of the last round.
  double launched_s_ = 0, landed_s_ = 0, exchange_s_ = 0, pass_s_ = 0, step_s_ = 0;
  int64_t passes_ = 0;
  bool offset_pending_ = false;  // own_ holds progress to put back before the next step
  // STARLING_FAULT_DIE_IN_EXCHANGE (before this peer sends) and STARLING_FAULT_LOSE_PIECE (its
  // exchange is one piece), counted by the exchanges it launches.
  RoundFaults faults_;
};

}  // namespace starling::strategy
