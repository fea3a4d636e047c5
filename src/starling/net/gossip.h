// The membership protocol of a swarm peer: joining through entry points, introducing itself to
// new members (with a bandwidth probe), heartbeats that spread the member list and link
// measurements, round-trip pings, departures, liveness, and answers to `starling status`.
//
// Runs on the peer's communication thread, which owns the transport; the member table it keeps
// is shared (member_table.h). What other parts must react to (a member joined, died, came back
// or left) is reported through Events.
#pragma once

#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "starling/net/endpoint.h"
#include "starling/net/link_probe.h"
#include "starling/net/member_table.h"
#include "starling/net/node_options.h"
#include "starling/net/transport.h"

namespace starling::net {

class Gossip {
 public:
  struct Events {
    // A new member, a new incarnation of a restarted one, or a joiner that made itself younger
    // (Known::moved).
    std::function<void(PeerId)> joined;
    // Before `joined` for a restarted member (a new MemberInfo::incarnation under a known id):
    // what was under way with the old one will not finish.
    std::function<void(PeerId)> restarted;
    std::function<void(PeerId)> back;  // a member taken for dead spoke again
    std::function<void(PeerId)> dead;  // silent for the peer timeout
    std::function<void(PeerId)> left;  // announced its departure
  };

  Gossip(const NodeOptions& options, std::vector<EntryPoint> entries, Transport& transport,
         MemberTable& table, Events events);

  // Says hello through every entry point (and every candidate key of each).
  void begin_join();
  // Any message from a member is a sign of life. True when the sender is another known member.
  bool heard(const Header& header, Clock::time_point now);
  // Handles a membership message: hello, welcome, heartbeat, pong, leave, status_request (with a
  // JSON body). Throws NetError for a malformed body.
  void handle(Incoming& in, const nlohmann::json& body);
  // A bandwidth probe's marker, payload or request (link_probe.h); `member`: the sender is a
  // known member (only they are answered). Throws NetError for a malformed one.
  void handle_probe(const Incoming& in, bool member);
  // Expires silent members, sends heartbeats and the probe requests due; call every heartbeat
  // interval.
  void tick(Clock::time_point now);
  // This peer's own event loop did not run for `paused` (the process was stopped, suspended or
  // starved of CPU): the members it did not hear from meanwhile get a fresh timeout instead of
  // all being declared dead at once. Those really gone expire one timeout later.
  void resumed_after(Clock::duration paused, Clock::time_point now);
  // Tells every live member this peer leaves.
  void announce_leave();

  void send(PeerId peer, MsgType type, zmq::message_t payload, uint64_t op = 0);
  nlohmann::json status_json() const;

 private:
  // How a member that merge() added was known before.
  enum class Known {
    no,
    restarted,  // as an earlier process under the same id
    // as the same process, which has since made itself younger than the members it found (a
    // joiner's second announcement of itself): the link was probed when it was met
    moved,
  };
  static Known known_as(const Member* before, const MemberInfo& now);
  // Connect, say hello, and probe the link, unless `known` is moved.
  void introduce(const MemberInfo& info, Known known);
  // A marker, then `bytes` right behind it, under probe id `id`.
  void send_probe(PeerId peer, uint64_t id, uint64_t bytes);
  // A member asks for a probe (payload: the bytes wanted, u64 little-endian).
  void answer_probe_request(const Incoming& in);
  // Asks the members whose last probe gave no trustworthy reading for another (LinkProbe).
  void send_probe_requests();
  void log(const std::string& line) { options_.log(line); }

  const NodeOptions& options_;
  std::vector<EntryPoint> entries_;
  Transport& transport_;
  MemberTable& table_;
  Events events_;
  PeerId self_ = 0;
  std::mt19937_64 random_;
  std::vector<std::string> join_slots_;
  LinkProbe probes_;
  // The probe requests of each member answered since it was met (or restarted): a few at most.
  std::map<PeerId, int> probe_answers_;
  // When a heartbeat last went to each member silent for over ten timeouts (tick).
  std::map<PeerId, Clock::time_point> retries_;
  // Connects to the member's current endpoint and key unless already connected there.
  void reconnect(PeerId id);
};

}  // namespace starling::net
