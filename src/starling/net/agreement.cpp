#include "starling/net/agreement.h"

#include <algorithm>

#include "starling/common/error.h"
#include "starling/net/control_message.h"
#include "starling/net/ring_order.h"

namespace starling::net {
namespace {

using json = nlohmann::json;

// Chunk size for one operation, decided by the coordinator so every participant cuts the same
// way. Each segment gets at least ~16 chunks, so even a small tensor keeps every link busy
// (a link idles for a round trip whenever it waits for a whole segment), but no chunk is
// smaller than 64 KiB (per-message costs) or larger than the configured size.
uint64_t choose_chunk_elements(uint64_t count, size_t peers, size_t max_chunk_bytes) {
  const uint64_t most = std::max<uint64_t>(max_chunk_bytes / sizeof(float), 1);
  const uint64_t least = std::min<uint64_t>(16 * 1024, most);
  return std::clamp<uint64_t>(count / std::max<size_t>(peers, 1) / 16, least, most);
}

uint64_t unsigned_field(const json& body, const char* field) {
  if (!body.contains(field) || !body[field].is_number_unsigned())
    throw NetError(std::string("field '") + field + "' is missing or not an unsigned integer");
  return body[field].get<uint64_t>();
}

// Whether a collective over `group` is over a strictly narrower set of peers than one over
// `wider` (an empty group is the whole swarm). Both sorted.
bool narrower(const std::vector<PeerId>& group, const std::vector<PeerId>& wider) {
  if (group.empty()) return false;
  if (wider.empty()) return true;
  return group.size() < wider.size() &&
         std::includes(wider.begin(), wider.end(), group.begin(), group.end());
}

}  // namespace

// --- Request -----------------------------------------------------------------------------------

json Request::to_json() const {
  json group = json::array();
  for (PeerId id : options.group) group.push_back(format_peer_id(id));
  return {{"kind", static_cast<int>(kind)},
          {"count", count},
          {"precision", static_cast<int>(options.precision)},
          {"op", static_cast<int>(options.op)},
          {"root", format_peer_id(options.root)},
          {"order", static_cast<int>(options.order)},
          {"tag", options.tag},
          {"finite", options.reject_non_finite},
          {"group", group}};
}

Request Request::from_json(const json& j) {
  const auto small = [&](const char* f, int max) {
    if (!j.contains(f) || !j[f].is_number_integer() || j[f].get<int>() < 0 || j[f].get<int>() > max)
      throw NetError(std::string("field '") + f + "' is missing or out of range");
    return j[f].get<int>();
  };
  Request r;
  r.kind = static_cast<CollectiveKind>(small("kind", 3));
  r.count = unsigned_field(j, "count");
  r.options.precision = static_cast<WirePrecision>(small("precision", 3));
  r.options.op = static_cast<ReduceOp>(small("op", 1));
  r.options.root = parse_hex_id(j.value("root", json()), "root");
  r.options.order = static_cast<RingOrder>(small("order", 1));
  r.options.tag = unsigned_field(j, "tag");
  if (j.contains("finite")) {
    if (!j["finite"].is_boolean()) throw NetError("field 'finite' is not a boolean");
    r.options.reject_non_finite = j["finite"].get<bool>();
  }
  if (!j.contains("group") || !j["group"].is_array() || j["group"].size() > 4096)
    throw NetError("field 'group' is missing or not a list of at most 4096 peers");
  for (const auto& id : j["group"]) r.options.group.push_back(parse_hex_id(id, "group"));
  if (!std::is_sorted(r.options.group.begin(), r.options.group.end()))
    throw NetError("field 'group' is not sorted");
  return r;
}

bool Request::same_as(const Request& o) const {
  return kind == o.kind && count == o.count && options.precision == o.options.precision &&
         options.op == o.options.op && options.root == o.options.root &&
         options.order == o.options.order && options.tag == o.options.tag &&
         options.reject_non_finite == o.options.reject_non_finite &&
         options.group == o.options.group;
}

std::string Request::describe() const {
  std::string s = to_string(kind) + " of " + std::to_string(count) + " floats at " +
                  std::string(compress::to_string(options.precision));
  if (kind == CollectiveKind::broadcast) s += " from " + short_peer_id(options.root);
  if (options.tag != 0) s += " on tag " + std::to_string(options.tag);
  if (!options.group.empty()) s += " over a group of " + std::to_string(options.group.size());
  return s;
}

// --- Agreement: participant ----------------------------------------------------------------------

Agreement::Agreement(AgreementOptions options, MemberTable& table, Hooks hooks)
    : options_(options),
      table_(table),
      hooks_(std::move(hooks)),
      random_(std::random_device{}() ^ options.self) {}

void Agreement::launch(Launched op) {
  const auto& group = op.request.options.group;
  if (!group.empty() && !std::binary_search(group.begin(), group.end(), options_.self)) {
    op.state->finish({}, op.request.describe() + ": this peer is not in the group");
    return;
  }
  const uint64_t tag = op.request.options.tag;
  TagQueue& q = tags_[tag];
  q.waiting.push_back(std::move(op));
  if (q.phase == TagQueue::Phase::idle) announce_front(tag);
}

void Agreement::finished(uint64_t tag) {
  TagQueue& q = tags_[tag];
  q.phase = TagQueue::Phase::idle;
  if (!q.waiting.empty()) announce_front(tag);
}

void Agreement::announce_front(uint64_t tag) {
  TagQueue& q = tags_[tag];
  const Request& r = q.waiting.front().request;
  q.phase = TagQueue::Phase::announcing;
  q.attempt = ++attempts_;
  {
    std::lock_guard lock(table_.mutex);
    // Calling a collective means taking part in collectives (the swarm's, or the group's).
    table_.members.self_info().active = true;
    q.coordinator = table_.members.coordinator(r.options.group);
  }
  announce(q);
}

void Agreement::announce(TagQueue& q) {
  q.announced_at = Clock::now();
  if (!q.coordinator) return;  // nobody alive to ask yet; the next tick asks again
  const Request& r = q.waiting.front().request;
  if (*q.coordinator == options_.self) {
    accept_ready(options_.self, q.attempt, r);
    coordinate();
  } else {
    json ready = r.to_json();
    ready["attempt"] = q.attempt;
    hooks_.send(*q.coordinator, MsgType::ready, ready, 0);
  }
}

void Agreement::tick(Clock::time_point now) {
  // Collected first: failing an operation announces the next one of its tag.
  std::vector<std::pair<uint64_t, std::string>> failed;
  for (auto& [tag, q] : tags_) {
    if (q.phase != TagQueue::Phase::announcing) continue;
    const Launched& op = q.waiting.front();
    const std::chrono::milliseconds limit = op.request.options.wait_limit.count() > 0
                                                ? op.request.options.wait_limit
                                                : options_.collective_timeout;
    if (now > op.launched + limit) {
      std::string missing;
      if (q.coordinator == options_.self) {
        std::vector<PeerId> expected;
        {
          std::lock_guard lock(table_.mutex);
          expected = table_.members.participants(op.request.options.group);
        }
        const GroupKey key{tag, op.request.options.group};
        for (PeerId id : expected)
          if (!readies_[key].count(id)) missing += (missing.empty() ? "" : ", ") + table_.who(id);
      }
      failed.emplace_back(tag, "timed out after " + std::to_string(limit.count() / 1000) +
                                   " s waiting for every peer to call " + op.request.describe() +
                                   (missing.empty() ? "" : " (not ready: " + missing + ")"));
      continue;
    }
    if (now - q.announced_at < options_.heartbeat_interval) continue;
    std::optional<PeerId> coordinator;
    {
      std::lock_guard lock(table_.mutex);
      coordinator = table_.members.coordinator(op.request.options.group);
    }
    if (coordinator != q.coordinator && q.coordinator == options_.self)
      readies_[{tag, op.request.options.group}].erase(options_.self);
    q.coordinator = coordinator;
    announce(q);
  }
  for (const auto& [tag, error] : failed) fail_front(tag, error);
  coordinate();  // a peer that died may have been the last one not ready
}

void Agreement::fail_front(uint64_t tag, const std::string& error) {
  TagQueue& q = tags_[tag];
  if (q.phase != TagQueue::Phase::announcing) return;
  Launched op = std::move(q.waiting.front());
  q.waiting.pop_front();
  // Withdraw our readiness so a late decision does not count us in.
  if (q.coordinator == options_.self) {
    readies_[{tag, op.request.options.group}].erase(options_.self);
  } else if (q.coordinator) {
    hooks_.send(*q.coordinator, MsgType::abort,
                {{"attempt", q.attempt}, {"tag", tag}, {"reason", error}}, 0);
  }
  op.state->finish({}, error);
  finished(tag);
}

void Agreement::stop(const std::string& why) {
  for (auto& [tag, q] : tags_) {
    for (auto& op : q.waiting) op.state->finish({}, why);
    q.waiting.clear();
    if (q.phase == TagQueue::Phase::announcing) q.phase = TagQueue::Phase::idle;
  }
}

void Agreement::on_start(PeerId from, uint64_t op_id, const json& body) {
  const uint64_t attempt = unsigned_field(body, "attempt");
  if (!body.contains("ring") || !body["ring"].is_array())
    throw NetError("field 'ring' is missing or not an array");
  const uint64_t tag = unsigned_field(body, "tag");
  const auto it = tags_.find(tag);
  const bool awaited = it != tags_.end() && it->second.phase == TagQueue::Phase::announcing &&
                       it->second.attempt == attempt;
  if (body.contains("refused") && body["refused"].is_string()) {
    if (awaited)
      fail_front(tag, "coordinator " + table_.who(from) +
                          " refused the collective: " + body["refused"].get<std::string>());
    return;
  }
  Start s;
  s.op_id = op_id;
  for (const auto& id : body["ring"]) s.ring.push_back(parse_hex_id(id, "ring"));
  s.request = Request::from_json(body);
  s.chunk_elements = unsigned_field(body, "chunk");
  if (s.chunk_elements == 0 || s.chunk_elements > (1ull << 28))
    throw NetError("field 'chunk' is out of range");
  if (!awaited) {
    // Our attempt already failed: tell the others at once instead of letting them wait.
    abort_ring(s.ring, op_id, "peer " + table_.who(options_.self) + " had already given up on it");
    return;
  }
  const Request& mine = it->second.waiting.front().request;
  std::string error;
  if (std::find(s.ring.begin(), s.ring.end(), options_.self) == s.ring.end())
    error = "the coordinator left this peer out of the ring";
  else if (!s.request.same_as(mine))
    error =
        "the coordinator started " + s.request.describe() + ", this peer called " + mine.describe();
  if (!error.empty()) {
    error = to_string(mine.kind) + " failed: " + error;
    abort_ring(s.ring, op_id, error);
    fail_front(tag, error);
    return;
  }
  TagQueue& q = it->second;
  q.phase = TagQueue::Phase::running;
  Launched op = std::move(q.waiting.front());
  q.waiting.pop_front();
  hooks_.run(std::move(op), std::move(s));
}

void Agreement::abort_ring(const std::vector<PeerId>& ring, uint64_t op_id,
                           const std::string& reason) {
  for (PeerId id : ring)
    if (id != options_.self) hooks_.send(id, MsgType::abort, {{"reason", reason}}, op_id);
}

// --- Agreement: coordinator ----------------------------------------------------------------------

void Agreement::on_ready(PeerId from, const json& body) {
  // Parsed before touching the table, so a malformed request leaves no entry behind.
  const uint64_t attempt = unsigned_field(body, "attempt");
  accept_ready(from, attempt, Request::from_json(body));
  coordinate();
}

void Agreement::accept_ready(PeerId from, uint64_t attempt, Request request) {
  const uint64_t tag = request.options.tag;
  // Readiness is repeated until answered; a repeat of an attempt already started is stale.
  if (auto it = started_.find({from, tag}); it != started_.end() && attempt <= it->second) return;
  GroupKey key{tag, request.options.group};
  // A participant announces one operation per tag at a time: a newer readiness on this tag
  // over another group replaces an older one (whose withdrawal may have been lost).
  for (auto& [other, ready] : readies_)
    if (other.first == tag && other != key)
      if (auto it = ready.find(from); it != ready.end() && it->second.attempt < attempt)
        ready.erase(it);
  readies_[key].insert_or_assign(from, ReadyFrom{attempt, std::move(request)});
  // A member calling collectives takes part in them from now on, whatever the gossip about it
  // says yet: the next operation waits for it rather than running without it.
  if (from != options_.self) {
    std::lock_guard lock(table_.mutex);
    table_.members.mark_active(from);
  }
}

void Agreement::on_withdraw(PeerId from, const json& body) {
  if (!body.contains("attempt") || !body["attempt"].is_number_unsigned()) return;
  const uint64_t attempt = body["attempt"].get<uint64_t>();
  for (auto& [key, ready] : readies_)
    if (auto it = ready.find(from); it != ready.end() && it->second.attempt == attempt)
      ready.erase(it);
}

void Agreement::forget(PeerId peer) {
  for (auto it = started_.begin(); it != started_.end();)
    it = it->first.first == peer ? started_.erase(it) : std::next(it);
  for (auto& [key, ready] : readies_) ready.erase(peer);
}

void Agreement::coordinate() {
  std::vector<GroupKey> keys;
  for (const auto& [key, ready] : readies_)
    if (!ready.empty()) keys.push_back(key);
  for (const auto& key : keys) coordinate(key);
  for (auto it = readies_.begin(); it != readies_.end();)
    it = it->second.empty() ? readies_.erase(it) : std::next(it);
}

void Agreement::coordinate(const GroupKey& key) {
  auto& ready = readies_[key];
  const std::vector<PeerId>& group = key.second;
  std::vector<PeerId> expected;
  {
    std::lock_guard lock(table_.mutex);
    if (table_.members.coordinator(group) != options_.self) return;
    // Readies of peers that died or left no longer count.
    for (auto it = ready.begin(); it != ready.end();)
      it = table_.members.is_alive(it->first) ? std::next(it) : ready.erase(it);
    expected = table_.members.participants(group);
  }
  std::string refusal;
  bool all_ready = true;
  for (PeerId id : expected) {
    if (ready.count(id)) continue;
    all_ready = false;
    // Someone has not called the collective yet. If it waits on this tag for a collective over
    // a wider group (a round's exchange meets a newcomer's or a restarted peer's opening
    // agreement), each waits for the other: that one needs the peers waiting here, and this
    // one waits for it until the collective timeout. The narrower gives way, at once. Every
    // missing member is looked at: members refused a moment ago are missing too, and a member
    // of the group whose readiness arrives after theirs must be refused as well.
    for (const auto& [other, waiting] : readies_)
      if (other.first == key.first && narrower(group, other.second) && waiting.count(id))
        refusal = "peer " + table_.who(id) + " waits on this tag for " +
                  waiting.at(id).request.describe() +
                  ", which needs the peers that called this one";
    if (!refusal.empty()) break;
  }
  if (!all_ready && (refusal.empty() || ready.empty())) return;
  std::vector<PeerId> participants;
  for (const auto& [id, r] : ready) participants.push_back(id);
  const Request& first = ready.begin()->second.request;
  for (const auto& [id, r] : ready) {
    if (!r.request.same_as(first))
      refusal = "peers disagree: " + table_.who(ready.begin()->first) + " called " +
                first.describe() + ", " + table_.who(id) + " called " + r.request.describe();
    else if (!group.empty() && !std::binary_search(group.begin(), group.end(), id))
      refusal = "peer " + table_.who(id) + " is not in the group";
  }
  if (refusal.empty() && first.kind == CollectiveKind::broadcast &&
      std::find(participants.begin(), participants.end(), first.options.root) == participants.end())
    refusal = "the broadcast root " + short_peer_id(first.options.root) +
              " is not among the participants";
  std::vector<PeerId> ring;
  if (refusal.empty()) {
    std::lock_guard lock(table_.mutex);
    ring = choose_ring(participants, first.options.order,
                       [&](PeerId a, PeerId b) { return table_.members.link(a, b).mbit_per_s; });
  }
  const uint64_t op_id = random_() | 1;  // never 0
  const uint64_t chunk =
      choose_chunk_elements(first.count, participants.size(), options_.chunk_bytes);
  json ring_json = json::array();
  for (PeerId id : ring) ring_json.push_back(format_peer_id(id));
  // Moved out first: answering ourselves may launch our next operation on this tag.
  const auto answered = std::move(ready);
  ready.clear();
  for (const auto& [id, r] : answered) {
    started_[{id, key.first}] = r.attempt;
    json body = first.to_json();
    body["attempt"] = r.attempt;
    body["ring"] = ring_json;
    body["chunk"] = chunk;
    if (!refusal.empty()) body["refused"] = refusal;
    if (id == options_.self) {
      on_start(id, op_id, body);
    } else {
      hooks_.send(id, MsgType::start, body, op_id);
    }
  }
}

}  // namespace starling::net
