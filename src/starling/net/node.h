// A peer of the swarm: membership (join, gossip, heartbeats, leave), link measurements,
// point-to-point messages, and Starling's fault-tolerant ring collectives. One communication
// thread owns the sockets and dispatches to the parts (gossip.h, agreement.h, mailbox.h); each
// agreed collective runs on a thread of its own (ring_run.h), so the caller's thread only
// launches operations and later waits for them, and collectives on different tags overlap.
//
// Each collective is agreed in one round trip: every participant tells the coordinator (the
// oldest alive participant; no peer is special for longer than that) that it is ready, and the
// coordinator answers with the participants and their ring order. A collective spans the whole
// swarm or a group (CollectiveOptions::group). A peer that dies or leaves makes every survivor's
// operation fail within the peer timeout with a message naming it; the next operation runs among
// the survivors. A peer that joins takes part from the next operation.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "starling/net/collective.h"
#include "starling/net/mailbox.h"
#include "starling/net/membership.h"
#include "starling/net/node_options.h"

namespace starling::net {

struct MemberView {
  MemberInfo info;
  MemberState state = MemberState::alive;
  double seconds_since_heard = 0;
};

struct LinkView {
  PeerId from = 0, to = 0;
  LinkStats stats;
};

class Node : public Collectives {
 public:
  // Binds, starts the communication thread and, with entry points, joins through them; throws
  // NetError if no entry point answers within join_timeout, ConfigError for bad options.
  explicit Node(NodeOptions options);
  // Announces the departure (if leave() was not called) and stops.
  ~Node() override;
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  PeerId id() const;
  const std::string& endpoint() const;

  std::vector<MemberView> members() const;
  // Whether the swarm knew this peer's id before this start (its key ran in a process that died
  // or left): this peer comes back in that one's place. Known once the join completed.
  bool returning() const;
  std::vector<LinkView> links() const;
  // Records a bandwidth this peer measured on the link from `from` to itself (from its own
  // traffic, such as a pipeline's tensors): links() shows it, replacing the earlier figure, and
  // the heartbeats carry it to the other members, so `from` learns the rate it sends at.
  void note_link_rate(PeerId from, double mbit_per_s);
  // Waits until at least `count` members (this one included) are alive.
  bool wait_for_members(size_t count, std::chrono::milliseconds timeout) const;

  // Point-to-point messages (mailbox.h): a message sent with tag T to member P is received by P's
  // recv(this node's id, T); messages of one (sender, tag) arrive in send order, and receives may
  // be posted before or after their message arrives, in any order across tags. A send completes
  // once it is queued on the connection (encrypted like all traffic) and fails at once for a peer
  // that is not a live member or a message over max_message_bytes; a receive fails when its peer
  // dies or leaves first, or when this node stops. Sends to this node's own id are delivered
  // locally. Both work while a collective runs.
  Transfer send(PeerId peer, uint64_t tag, std::vector<uint8_t> bytes);
  Transfer recv(PeerId peer, uint64_t tag);
  // Messages of `tag` that arrive before their receive keep only the latest of each sender, in
  // place of the earlier ones (Mailbox::keep_latest): for a status each message replaces, which
  // a long pause of the receiver must not turn stale. The node drops other messages that
  // nobody asked for beyond Mailbox::kMaxUnclaimed waiting, never such a tag's latest (one a
  // sender), nor a message that a posted receive waits for.
  void keep_latest_unclaimed(uint64_t tag);

  // Starts taking part in collectives (a peer that joined with NodeOptions::active = false, to
  // fetch state or wait for others first; calling a collective does the same). Once active, a
  // peer counts in every collective of the swarm or of its groups until it leaves or restarts.
  void activate();
  // Counts the alive member `peer` (in its start `incarnation`: MemberInfo::incarnation) as active
  // from now on, in the collectives this peer coordinates and in whom it takes for their
  // coordinator, without waiting for its readiness or its gossip to say so. For peers that agree
  // among themselves on the step at which an inactive member joins their collectives (a
  // replacement pipeline stage): each marks it at that step, then the member calls one. False
  // when `peer` is not an alive member in that incarnation.
  bool admit(PeerId peer, uint64_t incarnation);
  // Changes the role this peer announces (MemberInfo::role; NodeOptions::role set the first):
  // its next heartbeats carry the new one, so the other members see it within about one
  // heartbeat interval, and later gossip never brings the old one back.
  void set_role(const std::string& role);
  // What this peer says of its training (MemberInfo::progress): a JSON object of at most 32
  // numbers, such as {"step": 40, "loss": 2.31, "tokens_per_s": 5120}. Its next heartbeats carry
  // it, and `starling status` shows it for every member.
  void set_progress(const std::string& progress);
  // Tells every member this peer leaves, then stops. Pending collectives fail.
  void leave();

  std::string backend_name() const override { return "starling"; }
  PeerId self() const override;
  // "6df6641f (rank-2)": the short id and the name the member announced (this peer's own too).
  std::string describe(PeerId id) const override;
  int64_t joined_at_ms() const override;
  bool elastic() const override { return true; }
  uint64_t bytes_sent() const override;

  struct Counters {
    uint64_t rejected_messages = 0;    // malformed or unauthenticated messages dropped
    uint64_t refused_connections = 0;  // CURVE handshakes with a key not on the allowlist
    uint64_t bytes_sent = 0;           // every path: ZeroMQ and direct data links
    uint64_t direct_bytes_sent = 0;    // of those, on direct data links (direct_links.h)
  };
  Counters counters() const;

  class Impl;

 protected:
  Work launch(CollectiveKind kind, std::span<float> data,
              const CollectiveOptions& options) override;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace starling::net
