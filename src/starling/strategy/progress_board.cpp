#include "starling/strategy/progress_board.h"

#include <cmath>
#include <cstring>
#include <iostream>
#include <optional>
#include <vector>

#include "starling/train/metrics.h"

namespace starling::strategy {
namespace {

// An announcement: the round's version and step, samples and the ready flag as little-endian
// int64, then the rate as a double, then the sender's history in an int64 (every platform
// Starling builds on is little-endian; the size check catches the rest).
struct Message {
  int64_t version = 0, step = 0, samples = 0, ready = 0;
  double rate = 0;
  int64_t history = 0;
};
static_assert(sizeof(Message) == 48);

}  // namespace

ProgressBoard::ProgressBoard(net::Node& node) : node_(node) {
  // Each announcement replaces its sender's last (take), so the node keeps the latest of what
  // waits beyond the posted receives: after however long a pause, a poll reads every sender's
  // progress now. Dropped at the node's bound on unclaimed messages instead, a pause of 4096
  // announcements left the board with rounds long past until each sender's next one, and a peer
  // waiting for the exchange announces nothing more.
  node_.keep_latest_unclaimed(kTag);
}

void ProgressBoard::begin_round(Round round, uint32_t history) {
  round_ = round;
  history_ = history;
}

void ProgressBoard::announce(Round round, int64_t samples, double rate, bool ready, bool closing) {
  // `ready` is 0 (accumulating), 1 (waiting for the exchange) or 2 (and closing the round).
  const Message m{round.version, round.step, samples, closing ? 2 : ready ? 1 : 0, rate, history_};
  std::vector<uint8_t> bytes(sizeof m);
  std::memcpy(bytes.data(), &m, sizeof m);
  for (const net::MemberView& member : node_.members()) {
    if (member.info.id == node_.id() || member.state != net::MemberState::alive) continue;
    // Queued on the connection; a member that died meanwhile fails the send, which is harmless.
    node_.send(member.info.id, kTag, bytes);
  }
}

void ProgressBoard::take(net::PeerId peer, const std::vector<uint8_t>& bytes, double arrived) {
  Message m;
  if (bytes.size() == sizeof m) std::memcpy(&m, bytes.data(), sizeof m);
  if (bytes.size() != sizeof m || m.samples < 0 || m.ready < 0 || m.ready > 2 ||
      !std::isfinite(m.rate) || m.rate < 0 || m.history < 0 || m.history > UINT32_MAX) {
    // A peer of another build (announcements of another size) sends one after every
    // micro-batch: the 1st, 2nd, 4th, 8th, ... drop is logged, with the count so far.
    ++rejected_;
    if ((rejected_ & (rejected_ - 1)) == 0)
      std::cerr << "[atom] dropped a malformed progress announcement (" << bytes.size()
                << " bytes, " << sizeof m << " expected) from peer " << net::short_peer_id(peer)
                << " (" << rejected_ << " dropped so far)" << std::endl;
    return;
  }
  // Messages of one sender arrive in order (one connection; a restarted sender's old messages
  // are dropped): the last is its progress now, even in an earlier round than its previous one
  // (after a partition heals, a peer of the smaller side adopts the larger side's state, whose
  // round may be lower). Keeping the highest round instead left such a peer unheard until its
  // rounds passed the old one.
  latest_[peer] = {{m.version, m.step},
                   static_cast<uint32_t>(m.history),
                   m.samples,
                   m.ready >= 1,
                   m.ready == 2,
                   m.rate,
                   arrived};
}

bool ProgressBoard::matched_posted_receives() {
  // The node's thread takes requests in the order they were posted and matches each receive with
  // a message that already arrived at once: when a message this peer sends itself is received,
  // every receive posted before it is matched or waits for a message still to come.
  net::Transfer fence = node_.recv(node_.id(), kFenceTag);
  node_.send(node_.id(), kFenceTag, {});
  return fence.wait_for(std::chrono::seconds(5));
}

std::optional<size_t> ProgressBoard::read_arrived(net::PeerId peer,
                                                  std::deque<net::Transfer>& posted) {
  size_t taken = 0;
  while (!posted.empty() && posted.front().test()) {
    std::vector<uint8_t> bytes;
    double arrived = 0;
    try {
      bytes = posted.front().wait();
      arrived = train::seconds_of(posted.front().finished_at());
    } catch (const std::exception&) {
      return std::nullopt;  // the peer died or left
    }
    posted.pop_front();
    take(peer, bytes, arrived);
    ++taken;
  }
  while (posted.size() < kPosted) posted.push_back(node_.recv(peer, kTag));
  return taken;
}

void ProgressBoard::poll() {
  std::map<net::PeerId, bool> alive;
  for (const net::MemberView& m : node_.members())
    if (m.info.id != node_.id()) alive[m.info.id] = m.state == net::MemberState::alive;
  // Where every receive posted for a peer held a message, another may wait in the node (the
  // latest of a backlog: keep_latest_unclaimed) after a pause (a joiner building and profiling
  // its model while the others train, a long checkpoint). Read kPosted a poll, announcements of
  // rounds long past stood for their senders' progress for as many micro-batches. So once the
  // node has matched the receives just posted (one wait for every such peer), those holding a
  // message are read on. The second pass reads the latest; more are for senders that announced
  // kPosted more meanwhile. None after a wait that timed out.
  constexpr size_t kMaxPasses = 4;
  for (size_t pass = 0; pass < kMaxPasses; ++pass) {
    bool backlog = false;
    for (auto it = receives_.begin(); it != receives_.end();) {
      const std::optional<size_t> taken = read_arrived(it->first, it->second);
      if (!taken) {  // forget it until it is alive again
        latest_.erase(it->first);
        it = receives_.erase(it);
        continue;
      }
      backlog = backlog || *taken == kPosted;
      ++it;
    }
    if (!backlog || !matched_posted_receives()) break;
  }
  for (const auto& [peer, is_alive] : alive) {
    if (!is_alive) {
      latest_.erase(peer);
      continue;
    }
    if (receives_.contains(peer)) continue;
    std::deque<net::Transfer>& posted = receives_[peer];
    while (posted.size() < kPosted) posted.push_back(node_.recv(peer, kTag));
  }
}

ProgressBoard::View ProgressBoard::view(double horizon_s) {
  poll();
  const double until = train::now_s() + horizon_s;
  // `active`: the peers in this peer's round that accumulate or gathered samples (not a
  // spectator, ready with none: a joiner or a peer that will adopt the state says so at its
  // start). `kin_ahead`: the peers at this peer's step in a later version that hold its history.
  int active = 0, kin_ahead = 0;
  const auto sum = [&](bool apart) {
    View v;
    v.apart = apart;
    for (const auto& [peer, l] : latest_) {
      if (!receives_.contains(peer)) continue;
      // Not heard from in this round yet (l.round < round_): every peer announces the start of
      // its round, so it has not started (or its start is still in flight): it may be
      // checkpointing, evaluating or writing back, and nothing of it can be counted on.
      // Crediting it at its old pace from this peer's start made every peer stop at its first
      // micro-batch after a checkpoint that took some peers longer. Apart: the same step, a
      // later version.
      const bool ahead = l.round.step == round_.step && l.round.version > round_.version;
      if (!apart && ahead && l.history == history_) ++kin_ahead;
      if (!(apart ? ahead : l.round == round_)) continue;
      v.samples += l.samples;
      v.ready += l.ready ? 1 : 0;
      v.closing = v.closing || l.closing;
      ++v.heard;
      if (!apart && !(l.ready && l.samples == 0)) ++active;
      if (!l.ready && peer < node_.id()) ++v.smaller_accumulating;
      v.projected += static_cast<double>(l.samples) + (l.ready ? 0.0 : l.rate * (until - l.at));
      v.rate += l.ready ? 0.0 : l.rate;
    }
    return v;
  };
  const View in_round = sum(false);
  if (active > 0 && kin_ahead == 0) return in_round;
  const View apart = sum(true);
  return apart.heard > 0 ? apart : in_round;
}

}  // namespace starling::strategy
