// Faults a peer can be told to commit, for tests and the chaos harness (docs/reliability.md):
// set in the environment of one peer, they make it a misbehaving member with a valid key.
//
//   STARLING_FAULT_POISON=scale:K   multiply every round update this peer sends by K (K = -10:
//                                   sign-flipped and ten times too large)
//   STARLING_FAULT_POISON=nan       send NaN in every round update, past this peer's own check
//                                   (a sender that skips it: the others reject it and name it)
//   STARLING_FAULT_POISON=nan:own   NaN in every round update before this peer's own check (a
//                                   fault in its computation: it withholds the update itself)
//   STARLING_FAULT_DIE_IN_TRANSFER=N:K   in the N-th state transfer this peer sends to others
//                                   (from 1), it kills itself (SIGKILL) after K pieces, so its
//                                   receivers hold part of its state
//   STARLING_FAULT_SLOW_TRANSFER=MS  before each piece of a state transfer it sends, this peer
//                                   pauses MS milliseconds (a sender on a slow link: the
//                                   transfer outlasts the collective timeout, say)
//   STARLING_FAULT_REFUSE_STATE=N   in the N-th state transfer this peer takes from another
//                                   (from 1), it refuses the header as malformed, as a peer
//                                   whose header arrived damaged would: the transfer fails for
//                                   it alone while every peer stays alive
//   STARLING_FAULT_STOP_AT_START=1  before its opening agreement (after a joiner was let in),
//                                   this peer stops itself (SIGSTOP), as one whose start-up
//                                   outlasts the swarm's run would; SIGCONT lets it go on
//   STARLING_FAULT_DIE_IN_EXCHANGE=N  in its N-th gradient exchange (ddp, atom; from 1), after
//                                   the round's agreement and before it sends, it kills itself
//                                   (SIGKILL): every other participant's exchange of that round
//                                   fails, and the step has no average. localsgd: in its N-th
//                                   parameter average, after the first piece (and a pause that
//                                   lets its last messages leave) where it averages in pieces
//                                   (a swapped swarm), so the others' average breaks off
//                                   partway; before it sends otherwise. diloco: the same in its
//                                   N-th outer step. co2: in its N-th exchange, before it sends its
//                                   update
//   STARLING_FAULT_LOSE_PIECE=N:K   in its N-th parameter average (localsgd), outer step
//                                   (diloco), gradient exchange (ddp, atom) or exchange (co2),
//                                   from 1, this peer counts the K-th piece's collective (from 1)
//                                   as failed once it completed, as a peer that lost its last
//                                   chunk would: its round breaks off after K-1 pieces (ddp,
//                                   atom: it skips the step; co2: it does not apply the average)
//                                   while the others' go on. co2's exchange is one piece, and so
//                                   is the others' round unless a participant is swapped (a
//                                   node's gradients, or strategy.transfer_piece of parameters,
//                                   at a time)
//   STARLING_FAULT_DIE_ACCUMULATING=N:K  atom: in its N-th step (from 1), once it has announced
//                                   K micro-batches (K >= 1), or its last one where it computes
//                                   fewer, this peer kills itself (SIGKILL) before the exchange:
//                                   the others counted on its samples, which never reach it
//   STARLING_FAULT_ABORT_AGREEMENT=N  this peer fails its N-th round agreement (from 1: its
//                                   opening one is the first) as the agreement's collective
//                                   starts: every participant's attempt fails (told it aborted),
//                                   as when a participant dies in the middle of the ring, and
//                                   every one of them tries again
//
// Unset (the normal case), nothing changes. A malformed value is a ConfigError naming it, raised
// before the peer joins anyone (strategy::check_peer). Torch-free but for apply().
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace at {
class Tensor;
}

namespace starling::strategy {

struct UpdatePoison {
  bool nan = false;
  bool own = false;  // nan:own: the fault is in this peer's computation, before its own check
  double scale = 1;

  // From STARLING_FAULT_POISON; nullopt when it is unset or empty.
  static std::optional<UpdatePoison> from_env();
  static UpdatePoison parse(const std::string& value);
  std::string describe() const;  // "scaled by -10", "NaN", "NaN from its own computation"
  void apply(at::Tensor& update) const;
};

struct TransferDeath {
  long long transfer = 1;  // the transfer this peer sends to others, counted from 1
  long long pieces = 0;    // the pieces it sends before it dies
};

// STARLING_FAULT_DIE_IN_TRANSFER; nullopt when unset or empty. ConfigError naming the value
// unless it is "N:K" with whole numbers N >= 1 and K >= 0.
std::optional<TransferDeath> die_in_transfer_from_env();

// STARLING_FAULT_SLOW_TRANSFER; nullopt when unset or empty. ConfigError naming the value unless
// it is a whole number of milliseconds from 1 to 600000.
std::optional<long long> slow_transfer_from_env();

// STARLING_FAULT_REFUSE_STATE; nullopt when unset or empty. ConfigError naming the value unless it
// is a whole number N >= 1.
std::optional<long long> refuse_state_from_env();

// STARLING_FAULT_STOP_AT_START: whether it is set. ConfigError naming the value unless it is
// unset, empty or 1.
bool stop_at_start_from_env();

// STARLING_FAULT_DIE_IN_EXCHANGE; nullopt when unset or empty. ConfigError naming the value
// unless it is a whole number N >= 1.
std::optional<long long> die_in_exchange_from_env();

struct PieceLoss {
  long long round = 1;  // the round that goes in pieces, counted from 1
  long long piece = 1;  // the piece whose collective counts as failed, counted from 1
};

// STARLING_FAULT_LOSE_PIECE; nullopt when unset or empty. ConfigError naming the value unless it
// is "N:K" with whole numbers N >= 1 and K >= 1.
std::optional<PieceLoss> lose_piece_from_env();

struct AccumulationDeath {
  long long step = 1;           // the step of this process, counted from 1
  long long micro_batches = 1;  // the micro-batches it announces in that step before it dies
};

// STARLING_FAULT_DIE_ACCUMULATING; nullopt when unset or empty. ConfigError naming the value
// unless it is "N:K" with whole numbers N >= 1 and K >= 1.
std::optional<AccumulationDeath> die_accumulating_from_env();

// STARLING_FAULT_ABORT_AGREEMENT; nullopt when unset or empty. ConfigError naming the value
// unless it is a whole number N >= 1.
std::optional<long long> abort_agreement_from_env();

// The faults of a strategy whose round may go in pieces (localsgd's parameter average, diloco's
// outer step, ddp's and atom's gradient exchange; co2's exchange, in one piece), counted by its
// rounds:
// - STARLING_FAULT_DIE_IN_EXCHANGE: the peer dies in its N-th such round, after the first piece
//   where localsgd's or diloco's round goes in pieces (the survivors' round then breaks off
//   partway), before it sends anything otherwise;
// - STARLING_FAULT_LOSE_PIECE: the peer counts a piece of its N-th such round as failed (rounds
//   that do not go in pieces count too, and lose nothing).
class RoundFaults {
 public:
  // `what` names the round in the log ("parameter average").
  explicit RoundFaults(std::string what);
  // What a peer logs at its start when it is told to commit a fault, or "".
  std::string announcement() const;
  void begin() { ++rounds_; }  // a round begins
  // Logs a last line through `log` and dies (SIGKILL) when this round is the one, after
  // `pieces_sent` pieces (with a pause of 0.3 s where some were sent: their last messages may
  // still wait in the sockets' queues, and the others should hold those pieces' result).
  void maybe_die(int64_t pieces_sent, const std::function<void(const std::string&)>& log) const;
  // Whether this peer counts piece `k` (from 0) of this round as failed; logged through `log`.
  bool loses_piece(int64_t k, const std::function<void(const std::string&)>& log) const;

 private:
  std::string what_;
  std::optional<long long> death_round_;
  std::optional<PieceLoss> loss_;
  int64_t rounds_ = 0;  // begun, counted from 1
};

}  // namespace starling::strategy
