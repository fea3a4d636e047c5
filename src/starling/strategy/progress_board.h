// How far each peer of an atom swarm has accumulated in the current round: every peer announces
// its sample count and its pace to every other live member after each micro-batch (point-to-point
// messages on the swarm, node.h), and reads what the others announced without ever waiting for
// them. This is what lets peers of unequal speed share one optimizer step: each keeps
// accumulating until the swarm together will hold the target batch by the end of its next
// micro-batch (atom.h: the peer closing the step waits for exact counts).
//
// Counts are projected forward with each peer's announced pace (samples per second) from the
// moment its announcement arrived. Every peer announces the start of its round (0 samples, its
// pace from the last round), so the others project it from when it really started: the exchange
// ends everywhere at once, but a checkpoint, an evaluation or a swapped peer's write-back may hold
// one peer back. A peer not yet heard from in the round counts nothing. Torch-free.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <vector>

#include "starling/net/node.h"

namespace starling::strategy {

class ProgressBoard {
 public:
  // The mailbox tag announcements travel on.
  static constexpr uint64_t kTag = 0x61746f6d70726f67;       // "atomprog"
  static constexpr uint64_t kFenceTag = 0x61746f6d66656e63;  // "atomfenc": to itself (poll)

  // A round on the board: the swarm's update count (the strategy's version) and the trainer's
  // step. A step whose exchange failed everywhere leaves the version as it was; the step tells
  // the next attempt from the failed one, whose last announcements (ready, with their samples)
  // would otherwise count in it until each peer's new start arrived.
  struct Round {
    int64_t version = 0;
    int64_t step = 0;
    auto operator<=>(const Round&) const = default;
  };

  explicit ProgressBoard(net::Node& node);

  // Round `round` starts now on this peer (its exchange just ended). `history` is the history its
  // shared state votes for in a round agreement's root choice (SwarmStrategy::history_, see
  // root_choice.h); its announcements carry it.
  void begin_round(Round round, uint32_t history = 0);

  // Tells every other live member that this peer holds `samples` samples of round `round`, gains
  // `rate` samples per second, and whether it stopped accumulating (`ready`: it waits for the
  // exchange). `closing` (with `ready`): it ended the step early, told to stop, and the others
  // end theirs too (View::closing).
  void announce(Round round, int64_t samples, double rate, bool ready, bool closing = false);

  struct View {
    int64_t samples = 0;   // the other live members' announced counts for the round
    double projected = 0;  // their counts projected to `horizon_s` from now
    double rate = 0;       // the samples per second they gain together (those accumulating)
    int ready = 0;         // how many of them stopped accumulating
    int heard = 0;         // how many of them announced in the round
    // Of those heard in the round, how many have a smaller peer id than this one and still
    // accumulate (atom.h: such a peer, not this one, closes the round on exact counts).
    int smaller_accumulating = 0;
    // The counts above are of peers at this peer's step in a later version: this peer is a
    // round behind them (below).
    bool apart = false;
    // One of them ended the round early (a stop it was told): the step ends with what the
    // swarm holds.
    bool closing = false;
  };
  // Takes every announcement that has arrived (without waiting for any, though a backlog longer
  // than the receives it keeps posted waits for the node's thread to match more) and sums the other
  // live members' progress in the current round. Where some are at the same step in a later
  // version, this peer missed an average that they applied (an exchange that failed on some peers
  // only), and it sums theirs instead (View::apart) when
  // - one of them holds this peer's history: the round's agreement then hands this peer their
  //   state, its own samples unused (among the holders of the winning history, which have done
  //   equal work here, the root holds the highest round: root_choice.h), however many peers
  //   accumulate beside it in its own round (they are behind too: peers a round behind together
  //   used to gather the whole target among themselves while the others waited for them);
  // - or none of the others is heard accumulating in its own round (spectators, ready with no
  //   samples, aside), whatever the history: alone in its round, this peer's state is the least
  //   likely to win, and it used to gather the whole target by itself.
  // atom.cpp stops accumulating on either. Peers of an earlier version are never counted.
  View view(double horizon_s);

  // Malformed announcements dropped so far (the 1st, 2nd, 4th, ... is logged with its sender).
  int64_t rejected() const { return rejected_; }

 private:
  struct Latest {
    Round round{-1, -1};
    uint32_t history = 0;
    int64_t samples = 0;
    bool ready = false;
    bool closing = false;  // ended the round early (announce)
    double rate = 0;       // samples per second
    // When it arrived (train::now_s's clock), as the node's thread stamped it: not when this
    // peer got round to reading it. Peers read only between micro-batches, so stamping at the
    // read made an announcement that arrived just after a read look a micro-batch fresher than
    // it was; projected from then, the sender seemed a micro-batch behind, and a swarm of equal
    // peers gathered one micro-batch too many in most steps.
    double at = 0;
  };
  void poll();
  // Reads the announcements that arrived for `peer`'s posted receives, in order, and posts as
  // many receives again: how many it read, or nullopt where one failed (the peer died or left).
  std::optional<size_t> read_arrived(net::PeerId peer, std::deque<net::Transfer>& posted);
  // Waits (up to 5 s) until the node's thread has taken every receive posted so far: true once
  // it has, or once the node stopped (its receives then fail).
  bool matched_posted_receives();
  // One received announcement, which arrived at `arrived` (train::now_s's clock): checked, then
  // kept as the sender's latest.
  void take(net::PeerId peer, const std::vector<uint8_t>& bytes, double arrived);

  net::Node& node_;
  // Receives posted ahead for each live member, oldest first. Only the node's thread matches a
  // message to a receive: with one receive posted at a time, a poll took one announcement and
  // the next waited for the next poll, so a peer slower than another fell further behind its
  // announcements every micro-batch (four times slower: it read one in four) and stopped on
  // counts that were long stale. With a window posted, a poll takes all that arrived.
  static constexpr size_t kPosted = 64;
  std::map<net::PeerId, std::deque<net::Transfer>> receives_;
  std::map<net::PeerId, Latest> latest_;
  Round round_;
  uint32_t history_ = 0;
  int64_t rejected_ = 0;
};

}  // namespace starling::strategy
