// What every data-parallel strategy shares: the collectives it talks through (Starling's swarm, or
// a fixed c10d group: see net/collective.h), the agreement that opens
// each round, the state transfer that lets a new or out-of-step peer adopt the swarm's state, and
// the counters the progress display shows.
//
// Each round boundary opens with a tiny all-reduce (the agreement) of
//   [needs state, 1, anchor version, has the previous round's average, votes to admit,
//    an exchange follows, then each byte b of the state's lineage as b and b*b, then the
//    strategy's notes]
// and the peer's share of the data (strategy/data_redeal.h),
// so every peer learns, from bit-identical sums, how many take part and whether all of them hold
// the same shared state (and whether all of them would admit waiting peers now: see
// StepRunner::admission_ready). The lineage names the history of the shared state: every agreed
// round mixes in its participants, so the two sides of a partition, which count the same rounds
// among different peers, hold different lineages, and the sums of b and b*b show any difference
// exactly (n * sum(b*b) == sum(b)^2 only when all are equal). If any peer lacks the state (a
// joiner, a restarted swarm), or the versions or lineages disagree (a peer missed an average when
// another died, a healed partition), the root broadcasts its state and everyone adopts it. The
// root holds the history most participants hold (each participant with a state votes for its
// history, its lineage before any broken-off round marked it: the larger side of a partition
// wins, and a straggler back from a pause is outvoted), then the most work (the contributors
// summed over its rounds), then the highest round, then step, then the further tie-breaks of
// root_choice.h; only peers whose own state matched the root's contribute local progress to the
// round. A failed collective never stops the run: the peer notes it, and the next agreement repairs
// whatever diverged (after the last round, the closing one: close_run). On a fixed group (not
// elastic) there is nothing to repair: a failed collective ends the run with a NetError.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "starling/net/collective.h"
#include "starling/strategy/data_redeal.h"
#include "starling/strategy/fault_injection.h"
#include "starling/strategy/flat.h"
#include "starling/strategy/root_choice.h"
#include "starling/strategy/staging.h"
#include "starling/train/step_hooks.h"

namespace starling::data {
class TokenLoader;
}

namespace starling::strategy {

// How many numbers each agreement carries besides its control fields (SwarmStrategy::round_notes):
// the strategy's, but for the last one (kClosingNote), which is SwarmStrategy's own.
inline constexpr int kAgreementNotes = 4;
inline constexpr int kClosingNote = kAgreementNotes - 1;

struct Agreement {
  int peers = 0;                 // participants of the round
  int contributors = 0;          // peers whose local progress counts this round
  bool contribute = false;       // whether this peer's progress counts
  bool synced = false;           // the root's state was broadcast and adopted
  bool previous_on_all = false;  // every participant holds the previous round's average
  // Some participant goes on to its round's exchange right after this agreement (agree()'s
  // exchange_follows): a peer for which it was the opening agreement (a joiner, a restarted
  // peer) takes part in that exchange in started() (sending nothing unless it kept its own
  // state, the root's), rather than call its own next agreement into it, which would fail the
  // exchange and cost a second transfer.
  bool exchange_follows = false;
  int exchange_voters = 0;        // how many participants said so
  std::vector<net::PeerId> ring;  // participants by id (shard order)
  // The sums over the participants of their round_notes() (the same on every participant). In
  // the closing agreement (close_run), notes[kClosingNote] counts the participants whose last
  // round went through; 0 in any other.
  std::array<double, kAgreementNotes> notes{};
};

class SwarmStrategy : public train::StepHooks {
 public:
  SwarmStrategy(const train::RunConfig& config, net::Collectives& net);

  // The collectives run among these peers only, this one among them (a pipeline stage's
  // counterparts in the other pipeline replicas); by default the whole swarm. Set before start().
  void restrict_to(std::vector<net::PeerId> group) { group_ = std::move(group); }

  train::StrategyReport report() const override;
  bool ended_in_start() const override { return ended_in_start_; }
  void start(train::Replica& r, const nlohmann::json& state,
             const SafetensorsFile* tensors) override;
  void finish(train::Replica& r) override;

 protected:
  // Allocates the strategy's buffers for the model (flat_ is set); called once, in start().
  virtual void allocate(train::Replica& r) = 0;
  // The shared state a joiner adopts, as the tensors that hold it (in their order; sharing the
  // replica's and optimizer's storage): the transfer streams them in pieces of
  // strategy.transfer_piece (state_stream.h), reading and writing through the step runner, so
  // a swapped replica's state stays in its tier. A peer whose state is the root's already
  // (same history, round, step, work and AdamW count) takes no part in the transfer, unless
  // keeps_own_state() says otherwise.
  virtual std::vector<at::Tensor> state_tensors(train::Replica& r) = 0;
  // Whether such a peer keeps its own state in a transfer. co2 with zero says no: its state
  // tensors are the parameters, which hold each peer's own progress since the round began, and
  // every peer takes the root's (the shards move, and the sharded outer state restarts from them).
  virtual bool keeps_own_state() const { return true; }
  // This peer wrote the root's state_tensors() (the whole transfer): a strategy whose replica
  // follows from them sets it here (diloco: the parameters from the anchor).
  virtual void state_adopted(train::Replica&) {}
  // Whether this peer holds the previous round's average (co2 only).
  virtual bool has_previous() const { return false; }
  // Whether a peer that adopts the swarm's state in its opening agreement counts in the exchange
  // that follows it (Agreement::exchange_follows). It does where its share of that exchange is
  // computed after its opening, on the state it adopted (ddp's and atom's gradients of the
  // step); not where the share is progress made before the agreement (a round's local steps).
  virtual bool counts_from_opening() const { return false; }
  // Restores strategy tensors from a checkpoint (the strategy's own "strategy." names).
  virtual void restore(train::Replica& r, const nlohmann::json& state,
                       const SafetensorsFile& tensors) = 0;
  // The opening agreement is done (co2 with zero notes its shard here; a strategy whose
  // participants exchange right after their agreement joins that exchange when
  // a.exchange_follows).
  virtual void started(const Agreement&) {}
  // The opening agreement was the others' last round (a peer that joined in it, whose adopted
  // step is already the run's last) and started() took part in its exchange: this peer has no
  // step left, so it ends the round as the others do after that exchange. `agreed_version`: its
  // round before the exchange. By default the closing agreement (close_run); localsgd and diloco
  // settle as last_round() does, co2 drains its last average first.
  virtual void end_in_last_round(train::Replica& r, int64_t agreed_version) {
    close_run(r, version_ > agreed_version);
  }
  // Numbers this peer adds to the agreement, summed over the participants into Agreement::notes,
  // so that every participant decides alike from them (co2: how long its last exchange took, in
  // steps). The last one (kClosingNote) is SwarmStrategy's: what a strategy puts there is ignored.
  virtual std::array<float, kAgreementNotes> round_notes() const { return {}; }
  // Whether every participant draws as many batches per round as the others, so that the swarm's
  // reading position is known and the data can be dealt again when the peers change
  // (strategy.redeal_data); atom's peers read at their own pace.
  virtual bool lockstep_data() const { return true; }

  // The round's agreement, with a state transfer when needed; retried until it succeeds.
  // `exchange_follows`: this peer goes on to the round's exchange (over the agreement's ring)
  // right after it (Agreement::exchange_follows). `opening`: this peer's first agreement (in
  // start()), before it has trained anything (counts_from_opening()).
  Agreement agree(train::Replica& r, bool exchange_follows, bool opening = false) {
    return agree(r, exchange_follows, opening, std::nullopt);
  }
  // Waits for `work`, counting the time as network wait; false (logged) if it failed, or if
  // `ring` is given and the collective ran among other peers than those (a round's collectives
  // must run among the round's participants: when a peer is found dead or comes back between the
  // agreement and an exchange, the exchange may run among fewer, and its sum is not the round's).
  bool wait(const net::Work& work, const char* what,
            const std::vector<net::PeerId>* ring = nullptr);
  // Launches and waits; false (logged) if it failed (or ran among other peers than `ring`).
  bool all_reduce(at::Tensor& flat, net::WirePrecision precision, const char* what,
                  const std::vector<net::PeerId>* ring = nullptr);
  // The same for a staged vector: its device copy's first `n` elements (-1: all) are summed
  // (through the host copy on a GPU).
  bool all_reduce(Staging& staged, net::WirePrecision precision, const char* what);
  bool all_reduce(Staging& staged, int64_t n, net::WirePrecision precision, const char* what);
  // A round's update in `staged` (its first `n` elements, -1: all; zeroed by a peer that does not
  // contribute): summed over the swarm (strategy.aggregation = "mean"), or, with
  // "trimmed_mean", the robust average of the contributors' updates times a.contributors, so the
  // caller's division by the contributors gives that average either way. A non-finite update is
  // rejected and its sender named in the log. This peer's own non-finite update is withheld
  // before it leaves (zeros in the mean, so that round's average is over all contributors but
  // lacks this one's share; not counted in the trimmed mean), and the round goes on (not with
  // fp16). False (logged) if the exchange failed.
  bool aggregate(Staging& staged, int64_t n, const Agreement& a, net::WirePrecision precision,
                 const char* what);
  // Waits like wait() and returns the result; nullopt (logged) if it failed.
  std::optional<net::CollectiveResult> wait_result(const net::Work& work, const char* what,
                                                   const std::vector<net::PeerId>* ring = nullptr);

  // The elements of a slice of the flat vector (`part`, starting at element `begin`) that count
  // in model-wide sums: all of them, unless the replica trains a pipeline stage whose tied weight
  // another stage counts (those lie at the end of flat_).
  at::Tensor counted(const at::Tensor& part, int64_t begin) const;
  // Adds up a small float tensor over the other parts of the model (a pipeline's stages: see
  // StepRunner::sum_over_model); a no-op when the replica holds the whole model.
  at::Tensor sum_over_model(const at::Tensor& t) const;

  // A tensor of the replica's state (a parameter, or a part of an OuterVector) as its values
  // now, and written back: through the step runner, which reads an evicted tensor from its tier
  // and stores one there, or as itself (copied into) without one. What read_state() returned
  // as the tensor itself and was changed in place must be written back too: a swapped replica's
  // runner then knows to store it.
  at::Tensor read_state(const at::Tensor& t) const;
  void write_state(const at::Tensor& t, const at::Tensor& values) const;
  // After a pass over a swapped replica's state outside the steps (an outer step): the CPU
  // cache's free blocks, mostly the pass's copies of the state's tensors, go back to the system
  // instead of staying cached beside the budget for the rest of the run. Nothing unswapped.
  void release_pass_blocks() const;

  // Whether the replica trains part of the model (a pipeline stage); known from start() on.
  bool model_part() const { return model_part_; }
  net::CollectiveOptions options(net::WirePrecision precision) const;
  // A round's collective (its exchange, root choice, state transfer): on an elastic swarm it
  // runs over the round's participants (`ring`) only, so a peer that joins after the round's
  // agreement does not hold it up or fail it: its opening agreement waits for their next one.
  net::CollectiveOptions options(net::WirePrecision precision,
                                 const std::vector<net::PeerId>& ring) const;
  // Where the vectors handed to the collectives live: the CPU, or the model's device for a
  // backend that works on device memory (then Staging keeps no host copy).
  c10::Device net_device() const;
  bool through_host() const { return net_.buffers() == net::BufferPlace::host; }
  void log(const std::string& line) const;

  const train::RunConfig& config_;
  net::Collectives& net_;
  // The parameters the replica trains (all of them, or a pipeline stage's) as one vector (set in
  // start()).
  std::optional<Flat> flat_;
  net::WirePrecision precision_;
  int64_t version_ = 0;           // averages applied to the shared state so far
  int64_t work_ = 0;              // contributors summed over the rounds agreed on the shared state
  int contributors_ = 0;          // the last agreed round's (reported as "contributors")
  size_t most_participants_ = 0;  // the most peers any of this peer's agreements had
  bool said_alone_ = false;       // close_run() said this peer ends the run alone
  uint32_t lineage_ = 0;          // the shared state's history: each agreed round mixes in its ring
  // lineage_ before broke_off_after marked it: the history this peer votes for in the root
  // choice, so that a peer whose round went through and one whose round broke off count as one
  // history (the one further on is sent), while their lineages still tell them apart.
  uint32_t history_ = 0;
  bool ended_in_start_ = false;  // start() took part in the swarm's last round: no step is left
  bool holds_state_ = false;     // restored from a checkpoint or adopted from the swarm: it votes
  bool need_state_ = true;       // this peer's shared state is not known to match the swarm's
  int peers_ = 1;
  int64_t rounds_ = 0;
  double net_wait_s_ = 0;

  // Non-finite updates the trimmed mean rejected over the run (each logged with its sender).
  int64_t rejected_updates_ = 0;
  // Rounds in which this peer withheld its own non-finite update (aggregate()), counted once a
  // round however many pieces the round goes in, and the last such round (rounds_).
  int64_t withheld_updates_ = 0, withheld_round_ = -1;
  // Times the data was dealt again among a round's peers (redeal()).
  int64_t redeals_ = 0;

  // The elements of a piece of a round that goes in pieces (localsgd's average, diloco's outer
  // step, where a participant is swapped): the participants' mean strategy.transfer_piece, from
  // the sum of their round_notes()[0] (in units of 1000 bytes), at least 1000. The pieces are the
  // round's collectives, so every participant cuts them alike.
  static int64_t round_piece_numel(const Agreement& a);

  // The checkpoint fields every strategy shares: {"kind": kind, "version", "work", "lineage"}.
  nlohmann::json round_state(const char* kind) const;

  // The shared state has just become round version_'s (an average applied): with
  // strategy.fingerprint, notes its CRC-32C for the reports, unless this peer knows its state
  // may differ from the swarm's (a failed exchange; the next agreement repairs it).
  void note_round(const at::Tensor& shared);
  // The same from the CRC-32C of the shared state's bytes, taken a piece at a time.
  void note_round_crc(uint32_t crc);
  // This peer's round broke off after the first `tensors` tensors of its shared state had
  // stepped (diloco's outer step): the rest hold the old state. Peers that broke off after as
  // many tensors hold the same state, others not, although the round is the same: the count goes
  // into the lineage, so the next agreement finds the peers apart and the state most of them hold
  // is sent to the others.
  void broke_off_after(int64_t tensors);
  // The run's last step is done on this peer, its exchange through or not: one more agreement,
  // the closing one. A round can go through on some peers and fail on others (a collective that
  // completes on one side of a timeout, a piece one peer counts as lost), and no round follows to
  // repair it: without this those peers would end on different models. Like any agreement, the
  // closing one finds them apart and hands the others the state of the peer furthest on (its
  // round went through). When all agree it moves nothing: one tiny all-reduce. Nobody admits
  // waiting peers in it (a pipeline admitted then would find the others gone). Returns the
  // agreement (Agreement::synced where it moved a state), whose notes[kClosingNote] counts the
  // participants that said `round_through`.
  Agreement close_run(train::Replica& r, bool round_through = true);
  // The last round of a strategy that averages every few steps (localsgd, diloco): runs
  // `round(agree(r, true))`, then close_run(), which tells whether the round reached its version
  // on any participant. Where it did on none (a peer died in it, say, and the tensors after the
  // break hold each peer's own parameters), all of them run it again with no local steps in
  // between, among the peers still there, up to kSettleRounds times.
  void last_round(train::Replica& r, const std::function<void(const Agreement&)>& round);
  // A round boundary of localsgd or diloco: last_round() where `last`, else `round(agree(r,
  // true))`, then the settling and closing of a last round where that agreement handed this peer
  // the state of peers in theirs (met_the_last_round).
  void boundary_round(train::Replica& r, bool last,
                      const std::function<void(const Agreement&)>& round);
  // last_round() after its first `round`: the closing agreement, and the round again where it
  // went through on no participant. `agreed_version`: this peer's round before that first one.
  void settle_last_round(train::Replica& r, const std::function<void(const Agreement&)>& round,
                         int64_t agreed_version);
  static constexpr int kSettleRounds = 3;
  // After a boundary's agreement that was not this peer's last round: whether it handed this
  // peer the state of peers in their last round (it was stopped while they trained to the end),
  // so that it ends the run with them, as a peer that joins in that round does. Every
  // participant of a last round says an exchange follows; where some did not, the agreement met
  // their closing one (the state taken is the run's final one already) or a joiner's opening one,
  // and this peer ends as before, on the state it took.
  bool met_the_last_round(const train::Replica& r, const Agreement& a) const;
  // `crc` carried over the bytes of `part` (any dtype or device): chained over the pieces or
  // tensors of a vector in order, the CRC-32C of the whole vector, as note_round takes it.
  static uint32_t chain_crc(const at::Tensor& part, uint32_t crc);

 private:
  // agree(), and with `closing` the closing agreement (close_run): this peer's last round went
  // through or not.
  // Throws NetError ("could not join ...") when this peer joined through another, holds no
  // state of the swarm's, and its opening agreement finds it alone with every other member
  // departed (left, not dead): the swarm has ended, and it would otherwise train a fresh run from
  // step 0 on its own.
  void refuse_to_start_alone() const;
  Agreement agree(train::Replica& r, bool exchange_follows, bool opening,
                  std::optional<bool> closing);
  // The root of a state transfer and its participants, from an all-gather of every participant's
  // row (root_choice.h); nullopt (logged) if that exchange failed.
  std::optional<RootChoice> choose_root(const train::Replica& r, const Agreement& a);
  // The collective options of a transfer over `ring` from `root`: a tag of its own on Starling's
  // swarm, so that the peers outside it may wait for its end in a collective of the round.
  net::CollectiveOptions transfer_options(const std::vector<net::PeerId>& ring,
                                          net::PeerId root) const;
  // A taker's part of a transfer (the root's too, which sends): the root's header, then its
  // state (transfer_state), and this peer's step, round, work, lineage and AdamW count set from
  // the header. Whether this peer holds the root's state afterwards: false for a taker (logged,
  // and need_state_ set) if either failed or the header is malformed; always true for the root,
  // whose own state a failed transfer leaves whole.
  bool take_state(train::Replica& r, Agreement& a, const RootChoice& choice, bool opening);
  // The root's state after the header, over `ring`: `piece_numel` elements at a time
  // (state_tensors). `keep_own`: this peer's state is the root's already and stays as it is.
  // False (logged) if the transfer failed; a peer that had written part of a state of its own
  // by then holds neither its own nor the root's (holds_state_ turns false).
  bool transfer_state(train::Replica& r, const std::vector<net::PeerId>& ring, net::PeerId root,
                      int64_t piece_numel, bool keep_own);
  // `sending`: this peer's row counts (it contributes, and its update is finite).
  bool trimmed_mean_all_reduce(at::Tensor& host, const Agreement& a, bool sending,
                               net::WirePrecision precision, const char* what);

  std::vector<net::PeerId> group_;                // empty: the whole swarm
  std::optional<UpdatePoison> poison_;            // STARLING_FAULT_POISON (fault_injection.h)
  std::optional<TransferDeath> die_in_transfer_;  // STARLING_FAULT_DIE_IN_TRANSFER
  std::optional<long long> slow_transfer_ms_;     // STARLING_FAULT_SLOW_TRANSFER
  std::optional<long long> refuse_state_;         // STARLING_FAULT_REFUSE_STATE
  bool stop_at_start_ = false;                    // STARLING_FAULT_STOP_AT_START
  std::optional<long long> abort_agreement_;      // STARLING_FAULT_ABORT_AGREEMENT
  long long agreements_ = 0;                      // agree() calls so far (for abort_agreement_)
  long long transfers_sent_ = 0;                  // state transfers sent to other peers
  long long transfers_taken_ = 0;                 // headers received from other peers
  // Transfers this peer sent since its last whole one that failed for some taker, or whose
  // count failed: the root choice prefers the holder with the fewest (choose_root).
  int64_t failed_sends_ = 0;
  // Set when a transfer broke off after this peer wrote part of it (what it wrote), cleared by
  // the next whole one: if this peer is then chosen as the root, no whole state is left.
  std::string torn_;
  at::Tensor gathered_;             // trimmed_mean: every peer's update and flag
  int64_t fingerprint_round_ = -1;  // note_round(): the round and its state's CRC-32C
  uint32_t fingerprint_ = 0;
  uint32_t fingerprint_lineage_ = 0;  // the lineage of fingerprint_round_'s state
  train::StepRunner* runner_ = nullptr;
  bool model_part_ = false;    // the replica trains part of the model (a pipeline stage)
  int64_t counted_numel_ = 0;  // the leading elements of flat_ that count in model-wide sums
  // The agreement is done: its participants join the state's lineage and its contributors its
  // work, the same on every participant.
  void agreed(const Agreement& a);
  // The loader whose share the agreements may deal again; nullptr when they do not.
  data::TokenLoader* dealt_loader(train::Replica& r) const;
  // Deals the rest of the data again among the round's participants when the sums of their
  // shares say the peers changed (data_redeal.h).
  void redeal(data::TokenLoader& loader, const Agreement& a,
              const std::array<double, kRedealNotes>& shares);

  // A transfer's header, broadcast before the state: step, version, work (two floats each), the
  // lineage (two 16-bit halves), the elements of a piece and AdamW's count (two floats each).
  static constexpr int64_t kHeader = 12;
  // The tag of a state transfer's header and pieces ("swstate").
  static constexpr uint64_t kTransferTag = 0x73'7773'7461'7465ULL;
};

// Reads strategy.precision.
net::WirePrecision parse_precision(const std::string& name);

}  // namespace starling::strategy
