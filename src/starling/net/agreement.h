// How the participants of a collective agree to run it, in one round trip and with no peer
// special for longer than one operation: every participant tells the coordinator (the oldest
// alive participant) that it is ready, and once everyone expected is ready the coordinator
// answers each with the ring order, the operation id and the chunk size.
//
// Both halves are explicit state machines driven by the communication thread's events (a launch,
// a message, a timer tick, a finished run); neither waits or pumps the event loop.
//
//   participant, per tag:  idle --launch--> announcing --start--> running --finished--> idle
//                                               \--refused / timed out--> (fails) --> idle
//   coordinator, per (tag, group): collecting readiness --everyone expected is ready--> start sent
//
// Operations on one tag are agreed and run one after another in launch order; different tags
// are independent, so several collectives can be in flight at once. Readiness is repeated every
// heartbeat until answered: a lost message, a coordinator that died before answering, or one that
// briefly took us for dead costs one heartbeat, not the collective timeout.
//
// Collectives on one tag over different groups meet when a peer announces one over a wider group
// (the whole swarm, say) while the others run a narrower one that counts it (a round's exchange
// over the round's participants, which a restarted peer belongs to): each would wait for the
// other until the timeout, so the coordinator refuses the narrower at once. A peer outside the
// narrower group (a newcomer) holds nothing up: its call waits for the others' next one.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "starling/net/collective.h"
#include "starling/net/member_table.h"
#include "starling/net/wire.h"

namespace starling::net {

// What a participant asks for; the coordinator checks that everyone asks for the same thing.
struct Request {
  CollectiveKind kind = CollectiveKind::all_reduce;
  uint64_t count = 0;
  CollectiveOptions options;  // group sorted, root 0 unless a broadcast

  nlohmann::json to_json() const;
  // NetError naming the field when a message carries a malformed request.
  static Request from_json(const nlohmann::json& j);
  bool same_as(const Request& other) const;
  std::string describe() const;  // "all_reduce of 1024 floats at fp32 on tag 3", for errors
};

// The coordinator's answer: run it with these peers in this order.
struct Start {
  uint64_t op_id = 0;
  std::vector<PeerId> ring;
  Request request;
  uint64_t chunk_elements = 0;
};

// A collective launched by a caller: its request, buffer and handle.
struct Launched {
  Request request;
  std::span<float> data;
  std::shared_ptr<Work::State> state;
  Clock::time_point launched;
};

struct AgreementOptions {
  PeerId self = 0;
  std::chrono::milliseconds heartbeat_interval{500};
  std::chrono::milliseconds collective_timeout{300000};
  size_t chunk_bytes = 512 * 1024;  // largest chunk the coordinator picks
};

class Agreement {
 public:
  struct Hooks {
    // Sends a control message to another peer (ready, start, abort).
    std::function<void(PeerId to, MsgType type, const nlohmann::json& body, uint64_t op)> send;
    // The agreement on `op` is done: run it. The caller reports finished(tag) when it ends.
    std::function<void(Launched op, Start start)> run;
  };

  Agreement(AgreementOptions options, MemberTable& table, Hooks hooks);

  // --- participant ---
  // Queues `op` behind the operations of its tag, and announces it when it is first.
  void launch(Launched op);
  // The running operation of `tag` ended: the next one of that tag is announced.
  void finished(uint64_t tag);
  // Re-announces readiness every heartbeat (to the current coordinator) and fails operations
  // that waited longer than the collective timeout.
  void tick(Clock::time_point now);
  // Fails every operation not yet running with `why` (the peer stops).
  void stop(const std::string& why);
  // A start (or refusal) from a coordinator.
  void on_start(PeerId from, uint64_t op_id, const nlohmann::json& body);

  // --- coordinator ---
  void on_ready(PeerId from, const nlohmann::json& body);
  // A participant gave up waiting ("abort" with the attempt it withdraws).
  void on_withdraw(PeerId from, const nlohmann::json& body);
  // A peer restarted (a new incarnation): its attempt numbers start again.
  void forget(PeerId peer);
  // Answers every (tag, group) whose expected participants are all ready.
  void coordinate();

 private:
  struct TagQueue {
    enum class Phase { idle, announcing, running } phase = Phase::idle;
    std::deque<Launched> waiting;  // front: the one being announced
    uint64_t attempt = 0;
    std::optional<PeerId> coordinator;
    Clock::time_point announced_at{};
  };
  struct ReadyFrom {
    uint64_t attempt = 0;
    Request request;
  };
  using GroupKey = std::pair<uint64_t, std::vector<PeerId>>;  // tag, group

  void announce_front(uint64_t tag);
  void announce(TagQueue& q);
  void fail_front(uint64_t tag, const std::string& error);
  void accept_ready(PeerId from, uint64_t attempt, Request request);
  void coordinate(const GroupKey& key);
  void abort_ring(const std::vector<PeerId>& ring, uint64_t op_id, const std::string& reason);

  AgreementOptions options_;
  MemberTable& table_;
  Hooks hooks_;
  std::mt19937_64 random_;
  uint64_t attempts_ = 0;  // our latest attempt number, over every tag
  std::map<uint64_t, TagQueue> tags_;
  std::map<GroupKey, std::map<PeerId, ReadyFrom>> readies_;  // as coordinator
  std::map<std::pair<PeerId, uint64_t>, uint64_t> started_;  // (peer, tag) -> last attempt answered
};

}  // namespace starling::net
