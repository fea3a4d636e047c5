#include "starling/net/gossip.h"

#include <algorithm>
#include <cstring>

#include "starling/common/error.h"
#include "starling/net/control_message.h"

namespace starling::net {
namespace {

using json = nlohmann::json;

// A receiver asks for probes up to this many times the first one's size (NodeOptions::probe_bytes).
constexpr uint64_t kProbeGrowthLimit = 16;
// Whatever a member asks for, no probe is larger, and no more are answered to one process of it
// (a receiver asks for a few a meeting, link_probe.h, and meets each process once: introduce()).
constexpr uint64_t kMaxProbeBytes = 16ull << 20;
constexpr int kMaxProbeAnswers = 16;

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

}  // namespace

Gossip::Gossip(const NodeOptions& options, std::vector<EntryPoint> entries, Transport& transport,
               MemberTable& table, Events events)
    : options_(options),
      entries_(std::move(entries)),
      transport_(transport),
      table_(table),
      events_(std::move(events)),
      random_(std::random_device{}() ^ static_cast<uint64_t>(steady_ns())),
      probes_({.first_bytes = std::min<uint64_t>(options.probe_bytes, kMaxProbeBytes),
               .max_bytes = std::min(kProbeGrowthLimit * options.probe_bytes, kMaxProbeBytes),
               .patience = std::max(10 * options.heartbeat_interval, 2 * options.peer_timeout)}) {
  std::lock_guard lock(table_.mutex);
  self_ = table_.members.self().id;
}

void Gossip::send(PeerId peer, MsgType type, zmq::message_t payload, uint64_t op) {
  Header h;
  h.type = type;
  h.sender = self_;
  h.op = op;
  transport_.send(slot_of(peer), h, std::move(payload));
}

void Gossip::begin_join() {
  // Without the entry's key we try every allowlisted key at once: only the right one completes
  // the CURVE handshake, the others never deliver anything and are closed once we are welcomed.
  json hello;
  {
    std::lock_guard lock(table_.mutex);
    hello = {{"member", to_json(table_.members.self())}};
  }
  int n = 0;
  for (const auto& e : entries_) {
    for (const auto& key : candidate_server_keys(e, options_.insecure, options_.keys.public_key,
                                                 options_.allowlist)) {
      const std::string slot = std::string("j").append(std::to_string(n++));
      transport_.connect(slot, e.endpoint, key);
      // A member of another release answers here, in its own version (Transport::receive).
      transport_.watch_replies(slot);
      Header h;
      h.type = MsgType::hello;
      h.sender = self_;
      transport_.send(slot, h, json_message(hello));
      join_slots_.push_back(slot);
    }
  }
}

Gossip::Known Gossip::known_as(const Member* before, const MemberInfo& now) {
  if (before == nullptr) return Known::no;
  return before->info.incarnation != now.incarnation ? Known::restarted : Known::moved;
}

void Gossip::introduce(const MemberInfo& info, Known known) {
  const bool restarted = known == Known::restarted;
  if (restarted && events_.restarted) events_.restarted(info.id);
  events_.joined(info.id);
  // A restarted peer may listen elsewhere now. The same address keeps its connection: closing it
  // would drop what is already queued to the peer (a joiner that moved, Known::moved, listens
  // where it did).
  if (!transport_.connected_to(slot_of(info.id), info.endpoint, info.public_key)) {
    transport_.disconnect(slot_of(info.id));
    transport_.connect(slot_of(info.id), info.endpoint, info.public_key);
  }
  json hello;
  {
    std::lock_guard lock(table_.mutex);
    hello = {{"member", to_json(table_.members.self())}};
  }
  send(info.id, MsgType::hello, json_message(hello));
  if (known == Known::moved) return;
  // Bandwidth probe: a marker, then a bulk payload right behind it; the receiver times the gap.
  if (restarted) probe_answers_.erase(info.id);  // a new process: a new meeting
  if (options_.probe_bytes > 0)
    send_probe(info.id, random_(), std::min<uint64_t>(options_.probe_bytes, kMaxProbeBytes));
  log("peer " + table_.who(info.id) + " at " + info.endpoint + " is a member");
}

void Gossip::send_probe(PeerId peer, uint64_t id, uint64_t bytes) {
  send(peer, MsgType::probe, zmq::message_t(), id);
  Header h;
  h.type = MsgType::probe;
  h.sender = self_;
  h.op = id;
  h.chunk = 1;
  zmq::message_t bulk(bytes);
  std::memset(bulk.data(), 0x5A, bulk.size());
  transport_.send(slot_of(peer), h, std::move(bulk));
}

bool Gossip::heard(const Header& h, Clock::time_point now) {
  bool known = false, back = false;
  {
    std::lock_guard lock(table_.mutex);
    known = table_.members.find(h.sender) != nullptr && h.sender != self_;
    back = known && table_.members.heard_from(h.sender, now);
  }
  if (back) {
    log("peer " + table_.who(h.sender) + " is alive again");
    // After a long silence this side stopped writing to it (tick): connect again, so the
    // heartbeats that tell it this peer lives get through too.
    reconnect(h.sender);
    events_.back(h.sender);
  }
  return known;
}

void Gossip::reconnect(PeerId id) {
  MemberInfo info;
  {
    std::lock_guard lock(table_.mutex);
    const Member* m = table_.members.find(id);
    if (m == nullptr) return;
    info = m->info;
  }
  if (!transport_.connected_to(slot_of(id), info.endpoint, info.public_key)) {
    transport_.disconnect(slot_of(id));
    transport_.connect(slot_of(id), info.endpoint, info.public_key);
  }
}

void Gossip::resumed_after(Clock::duration paused, Clock::time_point now) {
  {
    std::lock_guard lock(table_.mutex);
    table_.members.excuse_silence(now);
  }
  log("this peer did not run for " +
      seconds_text(std::chrono::duration_cast<std::chrono::milliseconds>(paused)) +
      " (stopped, suspended or starved of CPU): the members it could not hear meanwhile get a "
      "fresh timeout");
}

void Gossip::tick(Clock::time_point now) {
  std::vector<PeerId> dead;
  {
    std::lock_guard lock(table_.mutex);
    dead = table_.members.expire(now, options_.peer_timeout);
  }
  for (PeerId id : dead) {
    log("peer " + table_.who(id) + " is dead: no message for " +
        seconds_text(options_.peer_timeout));
    events_.dead(id);
  }
  if (!dead.empty()) table_.changed.notify_all();

  json members = json::array();
  std::vector<std::pair<PeerId, Clock::time_point>> targets;
  json body;
  {
    std::lock_guard lock(table_.mutex);
    for (const Member& m : table_.members.all()) {
      if (m.state != MemberState::dead) members.push_back(to_json(m.info));
      if (m.info.id != self_ && m.state != MemberState::left)
        targets.emplace_back(m.info.id, m.last_heard);
    }
    body = {
        {"members", members}, {"links", table_.members.links_json(self_)}, {"ping", steady_ns()}};
  }
  for (const auto& [id, last] : targets) {
    // A peer silent for ten timeouts is most likely gone for good: drop its queue and stop
    // writing to it. But it may be alive across a network split that lasts: once every ten
    // timeouts a fresh connection carries one heartbeat, so the two sides find each other within
    // that long of the network's return, however long the split was.
    if (now - last > 10 * options_.peer_timeout) {
      // No entry yet means no try yet: due now (a default time point is the clock's zero, the
      // boot, which is within ten timeouts of now on a freshly started machine).
      const auto retry = retries_.find(id);
      if (retry != retries_.end() && now - retry->second < 10 * options_.peer_timeout) continue;
      retries_[id] = now;
      transport_.disconnect(slot_of(id));
      reconnect(id);
    }
    send(id, MsgType::heartbeat, json_message(body));
  }
  send_probe_requests();
}

void Gossip::announce_leave() {
  // Every member the heartbeats still go to, the ones found dead too: a peer paused past the
  // timeout (stopped, starved of CPU) reads the message from its connection when it goes on, and
  // learns that this one finished rather than died (a joiner that finds every member gone this
  // way knows the swarm has ended: SwarmStrategy::refuse_to_start_alone).
  std::vector<PeerId> others;
  {
    std::lock_guard lock(table_.mutex);
    for (const Member& m : table_.members.all())
      if (m.info.id != self_ && m.state != MemberState::left) others.push_back(m.info.id);
  }
  for (PeerId id : others) send(id, MsgType::leave, zmq::message_t());
}

void Gossip::handle_probe(const Incoming& in, bool member) {
  const Header& h = in.header;
  switch (h.chunk) {
    case 0:
      probes_.marker(h.sender, h.op, in.not_before, in.arrived);
      return;
    case 1: {
      const auto r = probes_.payload(h.sender, h.op, in.payload.size(), in.arrived);
      if (r.given_up)
        log("the link from " + table_.who(h.sender) +
            ": no more bandwidth probes asked for; the last ones came while this peer was busy or "
            "stopped (long transfers will measure the link)");
      if (!r.mbit_per_s) return;
      std::lock_guard lock(table_.mutex);
      table_.members.set_link(h.sender, self_, {-1, *r.mbit_per_s});
      return;
    }
    case 2:
      if (member) answer_probe_request(in);
      return;
    default:
      throw NetError("a probe's chunk is 0 (marker), 1 (payload) or 2 (request), not " +
                     std::to_string(h.chunk));
  }
}

void Gossip::answer_probe_request(const Incoming& in) {
  const Header& h = in.header;
  if (in.payload.size() != 8)
    throw NetError("a probe request carries 8 bytes (the size wanted), not " +
                   std::to_string(in.payload.size()));
  uint64_t bytes = 0;
  for (int i = 7; i >= 0; --i)
    bytes = bytes << 8 | static_cast<const uint8_t*>(in.payload.data())[i];
  if (bytes == 0 || bytes > kMaxProbeBytes)
    throw NetError("a probe request asks for " + std::to_string(bytes) + " bytes; 1 to " +
                   std::to_string(kMaxProbeBytes) + " are answered");
  const int answered = ++probe_answers_[h.sender];
  if (answered == kMaxProbeAnswers + 1)
    log("peer " + table_.who(h.sender) + " asked for more than " +
        std::to_string(kMaxProbeAnswers) + " bandwidth probes since it was met: no more answered");
  if (answered > kMaxProbeAnswers) return;
  send_probe(h.sender, h.op, bytes);
}

void Gossip::send_probe_requests() {
  for (const auto& q : probes_.take_requests(Clock::now(), random_)) {
    {
      std::lock_guard lock(table_.mutex);
      const Member* m = table_.members.find(q.peer);
      if (m == nullptr || m->state != MemberState::alive) continue;
    }
    zmq::message_t body(8);
    for (int i = 0; i < 8; ++i)
      static_cast<uint8_t*>(body.data())[i] = static_cast<uint8_t>(q.bytes >> (8 * i));
    Header h;
    h.type = MsgType::probe;
    h.sender = self_;
    h.op = q.id;
    h.chunk = 2;
    transport_.send(slot_of(q.peer), h, std::move(body));
  }
  for (const PeerId peer : probes_.take_given_up()) {
    {
      std::lock_guard lock(table_.mutex);
      const Member* m = table_.members.find(peer);
      if (m == nullptr || m->state != MemberState::alive) continue;  // gone: nothing to say
    }
    log("the link from " + table_.who(peer) +
        ": no more bandwidth probes asked for; the last requests went unanswered (lost, or "
        "refused; long transfers will measure the link)");
  }
}

void Gossip::handle(Incoming& in, const json& body) {
  const Header& h = in.header;
  const auto now = Clock::now();
  const auto member_list = [&](const char* field) {
    if (!body.contains(field) || !body[field].is_array())
      throw NetError(std::string("field '") + field + "' is missing or not an array");
    std::vector<MemberInfo> out;
    for (const auto& m : body[field]) out.push_back(member_from_json(m));
    return out;
  };
  switch (h.type) {
    case MsgType::hello: {
      if (!body.contains("member")) throw NetError("field 'member' is missing");
      const MemberInfo m = member_from_json(body["member"]);
      if (m.id != h.sender) throw NetError("a hello must describe its sender");
      if (!options_.insecure && peer_id_from_public_key(m.public_key) != m.id)
        throw NetError("member " + short_peer_id(m.id) + "'s id does not match its key");
      bool added;
      Known known;
      json list = json::array();
      {
        std::lock_guard lock(table_.mutex);
        known = known_as(table_.members.find(m.id), m);
        added = table_.members.merge(m, now);
      }
      if (added) introduce(m, known);
      {
        std::lock_guard lock(table_.mutex);
        // The living only, as in heartbeats, each with how long this peer has not heard from it:
        // a joiner takes a member it is told of for alive until that silence reaches a timeout,
        // and a dead one it kept longer could become its coordinator, which it would wait for
        // while the real one waits for it.
        for (const Member& x : table_.members.all()) {
          if (x.state != MemberState::alive) continue;
          json j = to_json(x.info);
          if (x.info.id != self_)
            j["silent_ms"] =
                std::chrono::duration_cast<std::chrono::milliseconds>(now - x.last_heard).count();
          list.push_back(std::move(j));
        }
      }
      send(h.sender, MsgType::welcome,
           json_message({{"members", list}, {"returning", known == Known::restarted}}));
      table_.changed.notify_all();
      break;
    }
    case MsgType::welcome:
    case MsgType::heartbeat: {
      const auto list = member_list("members");
      std::vector<std::pair<MemberInfo, Known>> added;
      {
        std::lock_guard lock(table_.mutex);
        for (size_t i = 0; i < list.size(); ++i) {
          const MemberInfo& m = list[i];
          if (!options_.insecure && peer_id_from_public_key(m.public_key) != m.id) continue;
          const Known known = known_as(table_.members.find(m.id), m);
          // A member new to us was last heard by the sender `silent_ms` ago (at most a timeout).
          const json& entry = body["members"][i];
          int64_t silent = 0;
          if (entry.contains("silent_ms") && entry["silent_ms"].is_number_integer())
            silent = std::clamp<int64_t>(entry["silent_ms"].get<int64_t>(), 0,
                                         options_.peer_timeout.count());
          if (table_.members.merge(m, now - std::chrono::milliseconds(silent)))
            added.emplace_back(m, known);
        }
        if (h.type == MsgType::heartbeat && body.contains("links"))
          table_.members.merge_links_json(body["links"], h.sender);
        if (h.type == MsgType::welcome && !table_.welcomed && !entries_.empty()) {
          table_.welcomed = true;
          table_.returning = body.contains("returning") && body["returning"].is_boolean() &&
                             body["returning"].get<bool>();
          // The coordinator is the oldest member; a joiner must be younger than everyone it
          // finds, whatever its clock says. Only once, on the welcome that completes the join:
          // every later change would look like a restart to the others.
          int64_t newest = 0;
          for (const auto& m : list)
            if (m.id != self_) newest = std::max(newest, m.joined_at_ms);
          auto& self = table_.members.self_info();
          if (self.joined_at_ms <= newest) self.joined_at_ms = newest + 1;
        }
      }
      for (const auto& [m, known] : added) introduce(m, known);
      if (h.type == MsgType::welcome && !join_slots_.empty()) {
        for (const auto& s : join_slots_) transport_.disconnect(s);
        join_slots_.clear();
        log("joined the swarm through " + table_.who(h.sender));
      }
      if (h.type == MsgType::heartbeat && body.contains("ping") && body["ping"].is_number_integer())
        send(h.sender, MsgType::pong, json_message({{"ping", body["ping"]}}));
      table_.changed.notify_all();
      break;
    }
    case MsgType::pong: {
      if (!body.contains("ping") || !body["ping"].is_number_integer())
        throw NetError("field 'ping' is missing");
      const double rtt_ms = (steady_ns() - body["ping"].get<int64_t>()) / 1e6;
      if (rtt_ms >= 0 && rtt_ms < 600000) {
        std::lock_guard lock(table_.mutex);
        table_.members.set_link(self_, h.sender, {rtt_ms, -1});
      }
      break;
    }
    case MsgType::leave: {
      {
        std::lock_guard lock(table_.mutex);
        table_.members.mark_left(h.sender);
      }
      log("peer " + table_.who(h.sender) + " left the swarm");
      events_.left(h.sender);
      table_.changed.notify_all();
      break;
    }
    case MsgType::status_request:
      transport_.reply(in.routing, Header{MsgType::status_reply, 0, self_},
                       json_message(status_json()));
      break;
    default:
      throw NetError("unexpected message type");
  }
}

json Gossip::status_json() const {
  std::lock_guard lock(table_.mutex);
  json members = json::array();
  const auto now = Clock::now();
  for (const Member& m : table_.members.all()) {
    json j = to_json(m.info);
    j["state"] = to_string(m.state);
    j["heard_s"] =
        m.info.id == self_ ? 0.0 : std::chrono::duration<double>(now - m.last_heard).count();
    members.push_back(j);
  }
  json links = json::array();
  for (const auto& [key, l] : table_.members.links())
    links.push_back({{"from", format_peer_id(key.first)},
                     {"to", format_peer_id(key.second)},
                     {"rtt_ms", l.rtt_ms},
                     {"mbps", l.mbit_per_s}});
  return {{"self", format_peer_id(self_)}, {"members", members}, {"links", links}};
}

}  // namespace starling::net
