// Point-to-point messages between members of a swarm, matched by (peer, tag): what a pipeline
// sends between stages (activations forward, their gradients back), beside the collectives.
//
// Transfer is the caller's handle to one send or receive. Mailbox is the matching table the
// communication thread keeps: messages that arrived before anyone asked for them, and receives
// posted before their message arrived. Messages of one (peer, tag) pair are delivered in the order
// they arrived (the order they were sent: one connection per pair of peers); different tags are
// independent, so receives may be posted in any order across tags.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "starling/net/handle.h"
#include "starling/net/peer_id.h"

namespace starling::net {

// A handle to one send or receive (handle.h): wait() returns a receive's message (empty for a
// send) or throws NetError with the reason.
// A point-to-point send or receive. A receive's finished_at() is when its message arrived.
class Transfer : public Handle<std::vector<uint8_t>> {
 public:
  using Handle::Handle;
};

// Not thread-safe: owned and used by one thread (the node's communication thread).
class Mailbox {
 public:
  // The node keeps at most this many messages that arrived before their receive, and drops what
  // arrives beyond them (a peer that keeps sending cannot fill this one's memory): has_room_for.
  static constexpr size_t kMaxUnclaimed = 4096;
  // Messages of `tag` that wait unclaimed keep only the latest of each sender (those waiting now
  // too): a status that each message replaces (atom's progress announcements), however long
  // nobody receives it. The bound never drops them: they add at most one message a sender.
  // Receives posted before their messages still take every one, in order.
  void keep_latest(uint64_t tag);
  // Whether a message from `sender` would be kept: a receive waits for it, its tag keeps the
  // latest, or fewer than kMaxUnclaimed wait.
  bool has_room_for(PeerId sender, uint64_t tag) const;
  // A message from `sender` arrived: it completes the oldest receive waiting for it, or waits
  // (where its tag keeps the latest, in place of the one that waited).
  void deliver(PeerId sender, uint64_t tag, std::vector<uint8_t> bytes);
  // A receive: completes at once when its message is already here.
  void expect(PeerId sender, uint64_t tag, std::shared_ptr<Transfer::State> receive);
  // The peer died or left: receives waiting on it fail with `why`, and so do later ones, except
  // for messages it sent before (those still arrive) and after revive().
  void fail_peer(PeerId peer, const std::string& why);
  // The peer is a live member (again).
  void revive(PeerId peer) { gone_.erase(peer); }
  // The peer restarted: receives waiting on it fail with `why`, and what its old incarnation
  // sent and no one claimed is dropped; its new incarnation's messages are received as usual.
  void restarted(PeerId peer, const std::string& why);
  // Every waiting receive fails (the node stops).
  void fail_all(const std::string& why);
  // Messages that arrived and wait for a receive (a bound on what a careless caller piles up).
  size_t unclaimed() const { return unclaimed_; }

 private:
  using Key = std::pair<PeerId, uint64_t>;
  struct Arrived {
    std::vector<uint8_t> bytes;
    std::chrono::steady_clock::time_point at;
  };
  std::map<Key, std::deque<Arrived>> arrived_;
  std::map<Key, std::deque<std::shared_ptr<Transfer::State>>> waiting_;
  std::map<PeerId, std::string> gone_;  // peers that died or left, with the reason
  std::set<uint64_t> keep_latest_;
  size_t unclaimed_ = 0;
};

}  // namespace starling::net
