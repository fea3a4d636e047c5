// The member table of one peer: who is in the swarm, how to reach them, whether they are alive,
// and the links measured between them. Liveness is each peer's own observation (any message
// counts as a sign of life; silence for the timeout means dead); membership itself (joins and
// announced departures) spreads by gossip in heartbeats.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "starling/net/peer_id.h"

namespace starling::net {

using Clock = std::chrono::steady_clock;

enum class MemberState : uint8_t { alive, dead, left };
std::string to_string(MemberState state);

// What a peer says about itself; travels in hello, welcome and heartbeat messages.
struct MemberInfo {
  PeerId id = 0;
  std::string name;
  std::string endpoint;      // tcp://HOST:PORT
  std::string public_key;    // Z85; empty in --insecure swarms
  uint16_t data_port = 0;    // direct data links' listener (direct_links.h); 0 = none
  int64_t joined_at_ms = 0;  // wall clock when it joined; orders coordinators (oldest first)
  // Random per start of the peer: a new value under a known id is a restart (joined_at_ms alone
  // also moves once when a joiner makes itself younger than the members it found).
  uint64_t incarnation = 0;
  bool active = true;  // takes part in collectives (an inactive peer is not waited for)
  bool left = false;   // announced its departure
  // What the peer does, for peers that must find one another by it (a pipeline stage:
  // "pipeline stage S replica R"); "" = nothing in particular. Set when it joins, and changed by
  // the peer itself (Node::set_role): each change counts up `role_version`, and gossip keeps the
  // role of the highest version it has seen.
  std::string role;
  uint64_t role_version = 0;
  // How its training goes, as the peer last said (Node::set_progress): a compact JSON object of
  // numbers (step, loss, tokens/s, ...), "" = nothing said; gossip keeps the highest version.
  std::string progress;
  uint64_t progress_version = 0;
};

nlohmann::json to_json(const MemberInfo& m);
// Throws NetError naming the field when `j` is not a valid member record.
MemberInfo member_from_json(const nlohmann::json& j);

// A directed link measurement; -1 = not measured.
struct LinkStats {
  double rtt_ms = -1;
  double mbit_per_s = -1;
};

struct Member {
  MemberInfo info;
  MemberState state = MemberState::alive;
  Clock::time_point last_heard;
};

class Membership {
 public:
  explicit Membership(MemberInfo self);

  const MemberInfo& self() const { return self_.info; }
  MemberInfo& self_info() { return self_.info; }

  // Adds or refreshes a member from what it (or gossip about it) says. Returns true when the
  // member is new or came back under a newer join time (the caller connects to it). A member
  // once active stays so until it restarts: gossip older than what this peer saw it do (its
  // readiness for a collective) cannot make it inactive again.
  bool merge(const MemberInfo& info, Clock::time_point now);
  // The member was seen taking part in a collective (its readiness arrived): it is active.
  void mark_active(PeerId id);
  // Any message from `id` is a sign of life. Returns true if it had been marked dead.
  bool heard_from(PeerId id, Clock::time_point now);
  void mark_left(PeerId id);
  // Marks members silent for longer than `timeout` dead and returns them.
  std::vector<PeerId> expire(Clock::time_point now, std::chrono::milliseconds timeout);
  // Counts every live member as heard at `now`: this peer could not hear anyone for a while (it
  // was paused), so their silence says nothing about them.
  void excuse_silence(Clock::time_point now);

  const Member* find(PeerId id) const;
  bool is_alive(PeerId id) const;
  // Every member including this peer, by id.
  std::vector<Member> all() const;
  // Alive members (self included), by id.
  std::vector<PeerId> alive() const;
  // Alive active members (self included), by id.
  std::vector<PeerId> alive_active() const;
  // Who takes part in a collective over `group`: the alive active members of the whole swarm
  // (an empty group), or of the group. By id.
  std::vector<PeerId> participants(const std::vector<PeerId>& group) const;
  // The peer that agrees the participants of a collective over `group`: the oldest of
  // participants(group).
  std::optional<PeerId> coordinator(const std::vector<PeerId>& group = {}) const;

  // Link measurements, from -> to.
  void set_link(PeerId from, PeerId to, LinkStats stats);
  LinkStats link(PeerId from, PeerId to) const;
  const std::map<std::pair<PeerId, PeerId>, LinkStats>& links() const { return links_; }

  // This peer's own measurements, for gossip; and merging another peer's.
  nlohmann::json links_json(PeerId self) const;
  void merge_links_json(const nlohmann::json& j, PeerId sender);

 private:
  Member self_;
  std::map<PeerId, Member> others_;
  std::map<std::pair<PeerId, PeerId>, LinkStats> links_;
};

}  // namespace starling::net
