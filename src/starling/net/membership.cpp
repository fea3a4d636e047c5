#include "starling/net/membership.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "starling/common/error.h"

namespace starling::net {
namespace {

PeerId parse_id(const nlohmann::json& j, const char* field) {
  const auto id = j.is_string() ? parse_peer_id(j.get<std::string>()) : std::nullopt;
  if (!id)
    throw NetError(std::string("member field '") + field + "' is not a 16-digit hex peer id");
  return *id;
}

}  // namespace

std::string to_string(MemberState state) {
  switch (state) {
    case MemberState::alive:
      return "alive";
    case MemberState::dead:
      return "dead";
    case MemberState::left:
      return "left";
  }
  return "?";
}

nlohmann::json to_json(const MemberInfo& m) {
  nlohmann::json j = {{"id", format_peer_id(m.id)},
                      {"name", m.name},
                      {"endpoint", m.endpoint},
                      {"key", m.public_key},
                      {"data_port", m.data_port},
                      {"joined_at", m.joined_at_ms},
                      {"active", m.active},
                      {"left", m.left},
                      {"role", m.role},
                      {"role_version", m.role_version},
                      {"incarnation", m.incarnation}};
  if (!m.progress.empty()) {
    j["progress"] = nlohmann::json::parse(m.progress, nullptr, /*allow_exceptions=*/false);
    j["progress_version"] = m.progress_version;
  }
  return j;
}

namespace {

// A progress record as it travels: an object of at most 32 numbers (null for none), 2 KiB.
std::string progress_text(const nlohmann::json& j) {
  if (!j.is_object() || j.size() > 32)
    throw NetError("member field 'progress' is not an object of at most 32 entries");
  for (const auto& [key, value] : j.items())
    if (key.size() > 32 || !(value.is_number() || value.is_null()))
      throw NetError("member field 'progress' holds \"" + key.substr(0, 32) +
                     "\", which is not a number");
  std::string text = j.dump();
  if (text.size() > 2048) throw NetError("member field 'progress' is longer than 2 KiB");
  return text;
}

}  // namespace

MemberInfo member_from_json(const nlohmann::json& j) {
  if (!j.is_object()) throw NetError("member record is not an object");
  const auto str = [&](const char* f) {
    if (!j.contains(f) || !j[f].is_string())
      throw NetError(std::string("member record lacks string field '") + f + "'");
    return j[f].get<std::string>();
  };
  const auto flag = [&](const char* f) {
    if (!j.contains(f) || !j[f].is_boolean())
      throw NetError(std::string("member record lacks boolean field '") + f + "'");
    return j[f].get<bool>();
  };
  MemberInfo m;
  m.id = parse_id(j.value("id", nlohmann::json()), "id");
  m.name = str("name");
  m.endpoint = str("endpoint");
  m.public_key = str("key");
  if (!j.contains("joined_at") || !j["joined_at"].is_number_integer())
    throw NetError("member record lacks integer field 'joined_at'");
  m.joined_at_ms = j["joined_at"].get<int64_t>();
  m.active = flag("active");
  if (j.contains("data_port")) {  // absent: a peer without direct links
    const auto& port = j["data_port"];
    if (!port.is_number_unsigned() || port.get<uint64_t>() > 65535)
      throw NetError("member field 'data_port' is not a port number");
    m.data_port = port.get<uint16_t>();
  }
  m.left = flag("left");
  if (j.contains("incarnation")) {
    if (!j["incarnation"].is_number_unsigned())
      throw NetError("member field 'incarnation' is not an unsigned integer");
    m.incarnation = j["incarnation"].get<uint64_t>();
  }
  if (j.contains("role")) {  // absent: a peer without one
    if (!j["role"].is_string() || j["role"].get_ref<const std::string&>().size() > 128)
      throw NetError("member field 'role' is not a string of at most 128 characters");
    m.role = j["role"].get<std::string>();
  }
  if (j.contains("progress")) {  // absent: a peer that says nothing of its training
    m.progress = progress_text(j["progress"]);
    if (!j.contains("progress_version") || !j["progress_version"].is_number_unsigned())
      throw NetError("member field 'progress_version' is not an unsigned integer");
    m.progress_version = j["progress_version"].get<uint64_t>();
  }
  if (j.contains("role_version")) {  // absent: a role never changed
    if (!j["role_version"].is_number_unsigned())
      throw NetError("member field 'role_version' is not an unsigned integer");
    m.role_version = j["role_version"].get<uint64_t>();
  }
  if (m.endpoint.rfind("tcp://", 0) != 0 || m.endpoint.size() > 256)
    throw NetError("member endpoint '" + m.endpoint.substr(0, 64) + "' is not tcp://HOST:PORT");
  if (m.name.size() > 128) throw NetError("member name is longer than 128 characters");
  return m;
}

Membership::Membership(MemberInfo self) {
  self_.info = std::move(self);
  self_.state = MemberState::alive;
}

bool Membership::merge(const MemberInfo& info, Clock::time_point now) {
  if (info.id == self_.info.id) return false;
  auto it = others_.find(info.id);
  if (it == others_.end()) {
    if (info.left) return false;  // gossip about a departed peer we never knew
    others_[info.id] = Member{info, MemberState::alive, now};
    return true;
  }
  Member& m = it->second;
  if (info.joined_at_ms > m.info.joined_at_ms) {  // restarted: a new incarnation
    m.info = info;
    m.state = info.left ? MemberState::left : MemberState::alive;
    m.last_heard = now;
    return !info.left;
  }
  if (info.joined_at_ms == m.info.joined_at_ms) {
    // Kept in the record too: this peer's heartbeats pass the departure on, and a peer that
    // did not know the member must not take it for an alive one.
    if (info.left) {
      m.state = MemberState::left;
      m.info.left = true;
    }
    if (info.active) m.info.active = true;
    if (info.role_version > m.info.role_version) {
      m.info.role = info.role;
      m.info.role_version = info.role_version;
    }
    if (info.progress_version > m.info.progress_version) {
      m.info.progress = info.progress;
      m.info.progress_version = info.progress_version;
    }
  }
  return false;
}

void Membership::mark_active(PeerId id) {
  if (auto it = others_.find(id); it != others_.end()) it->second.info.active = true;
}

bool Membership::heard_from(PeerId id, Clock::time_point now) {
  auto it = others_.find(id);
  if (it == others_.end()) return false;
  it->second.last_heard = now;
  if (it->second.state == MemberState::dead) {
    it->second.state = MemberState::alive;
    return true;
  }
  return false;
}

void Membership::mark_left(PeerId id) {
  if (auto it = others_.find(id); it != others_.end()) {
    it->second.state = MemberState::left;
    it->second.info.left = true;
  }
}

std::vector<PeerId> Membership::expire(Clock::time_point now, std::chrono::milliseconds timeout) {
  std::vector<PeerId> dead;
  for (auto& [id, m] : others_) {
    if (m.state == MemberState::alive && now - m.last_heard > timeout) {
      m.state = MemberState::dead;
      dead.push_back(id);
    }
  }
  return dead;
}

void Membership::excuse_silence(Clock::time_point now) {
  for (auto& [id, m] : others_)
    if (m.state == MemberState::alive) m.last_heard = std::max(m.last_heard, now);
}

const Member* Membership::find(PeerId id) const {
  if (id == self_.info.id) return &self_;
  auto it = others_.find(id);
  return it == others_.end() ? nullptr : &it->second;
}

bool Membership::is_alive(PeerId id) const {
  const Member* m = find(id);
  return m && m->state == MemberState::alive;
}

std::vector<Member> Membership::all() const {
  std::vector<Member> out{self_};
  for (const auto& [id, m] : others_) out.push_back(m);
  std::sort(out.begin(), out.end(),
            [](const Member& a, const Member& b) { return a.info.id < b.info.id; });
  return out;
}

std::vector<PeerId> Membership::alive() const {
  std::vector<PeerId> out{self_.info.id};
  for (const auto& [id, m] : others_)
    if (m.state == MemberState::alive) out.push_back(id);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<PeerId> Membership::alive_active() const {
  std::vector<PeerId> out;
  if (self_.info.active) out.push_back(self_.info.id);
  for (const auto& [id, m] : others_)
    if (m.state == MemberState::alive && m.info.active) out.push_back(id);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<PeerId> Membership::participants(const std::vector<PeerId>& group) const {
  if (group.empty()) return alive_active();
  std::vector<PeerId> out;
  for (PeerId id : alive_active())
    if (std::find(group.begin(), group.end(), id) != group.end()) out.push_back(id);
  return out;
}

std::optional<PeerId> Membership::coordinator(const std::vector<PeerId>& group) const {
  std::optional<std::pair<int64_t, PeerId>> best;
  for (PeerId id : participants(group)) {
    const Member* m = find(id);
    const std::pair<int64_t, PeerId> key{m->info.joined_at_ms, id};
    if (!best || key < *best) best = key;
  }
  if (!best) return std::nullopt;
  return best->second;
}

void Membership::set_link(PeerId from, PeerId to, LinkStats stats) {
  auto& l = links_[{from, to}];
  if (stats.rtt_ms >= 0) l.rtt_ms = stats.rtt_ms;
  if (stats.mbit_per_s >= 0) l.mbit_per_s = stats.mbit_per_s;
}

LinkStats Membership::link(PeerId from, PeerId to) const {
  auto it = links_.find({from, to});
  return it == links_.end() ? LinkStats{} : it->second;
}

nlohmann::json Membership::links_json(PeerId self) const {
  // Only first-hand measurements: our pings to others (latency of self -> X) and what we
  // received from others (bandwidth of X -> self).
  nlohmann::json out = nlohmann::json::array();
  for (const auto& [key, l] : links_) {
    if (key.first == self && l.rtt_ms >= 0)
      out.push_back({{"from", format_peer_id(key.first)},
                     {"to", format_peer_id(key.second)},
                     {"rtt_ms", l.rtt_ms},
                     {"mbps", -1}});
    if (key.second == self && l.mbit_per_s >= 0)
      out.push_back({{"from", format_peer_id(key.first)},
                     {"to", format_peer_id(key.second)},
                     {"rtt_ms", -1},
                     {"mbps", l.mbit_per_s}});
  }
  return out;
}

void Membership::merge_links_json(const nlohmann::json& j, PeerId sender) {
  if (!j.is_array()) throw NetError("'links' is not an array");
  for (const auto& l : j) {
    if (!l.is_object() || !l.contains("rtt_ms") || !l["rtt_ms"].is_number() ||
        !l.contains("mbps") || !l["mbps"].is_number())
      throw NetError("a link record lacks numeric 'rtt_ms' or 'mbps'");
    const PeerId from = parse_id(l.value("from", nlohmann::json()), "from");
    const PeerId to = parse_id(l.value("to", nlohmann::json()), "to");
    if (sender == self_.info.id) continue;
    // Accept only what the sender can have measured itself.
    if (from == sender) set_link(from, to, {l["rtt_ms"].get<double>(), -1});
    if (to == sender) set_link(from, to, {-1, l["mbps"].get<double>()});
  }
}

}  // namespace starling::net
