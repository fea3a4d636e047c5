#include "starling/net/node.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "starling/common/error.h"
#include "starling/net/endpoint.h"
#include "starling/net/ring_channel.h"
#include "starling/net/ring_order.h"
#include "starling/net/transport.h"

namespace starling::net {
namespace {

using json = nlohmann::json;
using std::chrono::milliseconds;

int64_t wall_ms() {
  return std::chrono::duration_cast<milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

// (Built with append: GCC 12 warns falsely about "literal" + std::string.)
std::string slot_of(PeerId id) { return std::string("m").append(format_peer_id(id)); }

zmq::message_t json_message(const json& j) {
  const std::string s = j.dump();
  return zmq::message_t(s.data(), s.size());
}

PeerId parse_hex_id(const json& j, const char* field) {
  if (!j.is_string() || j.get<std::string>().size() != 16 ||
      j.get<std::string>().find_first_not_of("0123456789abcdef") != std::string::npos)
    throw NetError(std::string("field '") + field + "' is not a 16-digit hex id");
  return std::stoull(j.get<std::string>(), nullptr, 16);
}

// What a participant asks for; the coordinator checks that everyone asks for the same thing.
struct Request {
  CollectiveKind kind = CollectiveKind::all_reduce;
  uint64_t count = 0;
  CollectiveOptions options;

  json to_json() const {
    return {{"kind", static_cast<int>(kind)},
            {"count", count},
            {"precision", static_cast<int>(options.precision)},
            {"op", static_cast<int>(options.op)},
            {"root", format_peer_id(options.root)},
            {"order", static_cast<int>(options.order)}};
  }
  static Request from_json(const json& j) {
    const auto small = [&](const char* f, int max) {
      if (!j.contains(f) || !j[f].is_number_integer() || j[f].get<int>() < 0 ||
          j[f].get<int>() > max)
        throw NetError(std::string("field '") + f + "' is missing or out of range");
      return j[f].get<int>();
    };
    Request r;
    r.kind = static_cast<CollectiveKind>(small("kind", 3));
    if (!j.contains("count") || !j["count"].is_number_unsigned())
      throw NetError("field 'count' is missing or not an unsigned integer");
    r.count = j["count"].get<uint64_t>();
    r.options.precision = static_cast<WirePrecision>(small("precision", 3));
    r.options.op = static_cast<ReduceOp>(small("op", 1));
    r.options.root = parse_hex_id(j.value("root", json()), "root");
    r.options.order = static_cast<RingOrder>(small("order", 1));
    return r;
  }
  bool same_as(const Request& o) const {
    return kind == o.kind && count == o.count && options.precision == o.options.precision &&
           options.op == o.options.op && options.root == o.options.root &&
           options.order == o.options.order;
  }
  std::string describe() const {
    std::string s = to_string(kind) + " of " + std::to_string(count) + " floats at " +
                    std::string(compress::to_string(options.precision));
    if (kind == CollectiveKind::broadcast) s += " from " + short_peer_id(options.root);
    return s;
  }
};

struct Pending {
  Request request;
  std::span<float> data;
  std::shared_ptr<Work::State> state;
  Clock::time_point launched;
};

struct Start {
  uint64_t op_id = 0;
  std::vector<PeerId> ring;
  Request request;
  uint64_t chunk_elements = 0;
};

// Chunk size for one operation, decided by the coordinator so every participant cuts the same
// way. Each segment gets at least ~16 chunks, so even a small tensor keeps every link busy
// (a link idles for a round trip whenever it waits for a whole segment), but no chunk is
// smaller than 64 KiB (per-message costs) or larger than the configured size.
uint64_t choose_chunk_elements(uint64_t count, size_t peers, size_t max_chunk_bytes) {
  const uint64_t most = std::max<uint64_t>(max_chunk_bytes / sizeof(float), 1);
  const uint64_t least = std::min<uint64_t>(16 * 1024, most);
  return std::clamp<uint64_t>(count / std::max<size_t>(peers, 1) / 16, least, most);
}

}  // namespace

// Point-to-point messages that arrived and wait for a receive, at most.
constexpr size_t kMaxUnclaimed = 4096;

class Node::Impl : public RingChannel {
 public:
  explicit Impl(NodeOptions options);
  ~Impl() override { stop(false); }

  void stop(bool announce);
  Work launch(CollectiveKind kind, std::span<float> data, const CollectiveOptions& options);
  Transfer post(bool send, PeerId peer, uint64_t tag, std::vector<uint8_t> bytes);

  std::vector<MemberView> members() const;
  std::vector<LinkView> links() const;
  bool wait_for_members(size_t count, milliseconds timeout) const;
  void set_active(bool active);
  Node::Counters counters() const;

  PeerId id() const { return self_id_; }
  const std::string& endpoint() const { return endpoint_; }

  // RingChannel, used by the algorithms on the communication thread.
  void send_right(uint32_t step, uint32_t chunk, zmq::message_t payload) override;
  zmq::message_t receive_left(uint32_t step, uint32_t chunk, size_t expected_bytes) override;

 private:
  void run();
  void begin_join();
  void pump(Clock::time_point until);
  void handle(Incoming& in);
  void handle_control(Incoming& in, const json& body);
  void on_timers(Clock::time_point now);
  void send_heartbeats(Clock::time_point now);
  void send_to(PeerId peer, MsgType type, zmq::message_t payload, uint64_t op = 0);
  void introduce(const MemberInfo& info);  // a new member: connect, probe, say hello
  void coordinate();
  void run_collective(Pending& p);
  void run_transfers();  // point-to-point requests queued by callers
  json status_json() const;
  void log(const std::string& line) { options_.log(line); }
  std::string who(PeerId id) const;

  NodeOptions options_;
  std::unique_ptr<Transport> transport_;
  PeerId self_id_ = 0;
  std::string endpoint_;
  std::vector<EntryPoint> entries_;

  mutable std::mutex mutex_;  // guards membership_, queue_, flags below
  mutable std::condition_variable changed_;
  Membership membership_;
  std::deque<Pending> queue_;
  struct TransferRequest {
    bool send = false;
    PeerId peer = 0;
    uint64_t tag = 0;
    std::vector<uint8_t> bytes;
    std::shared_ptr<Transfer::State> state;
  };
  std::deque<TransferRequest> transfers_;
  bool welcomed_ = false;
  bool stopping_ = false;
  bool announce_leave_ = false;
  std::optional<bool> requested_active_;

  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> malformed_{0};  // well-framed messages with an invalid body
  std::mt19937_64 random_;

  // Communication-thread state.
  Clock::time_point next_heartbeat_{};
  std::vector<std::string> join_slots_;
  std::map<std::pair<PeerId, uint64_t>, Clock::time_point> probe_marks_;
  struct ReadyFrom {
    uint64_t attempt;
    Request request;
  };
  std::map<PeerId, ReadyFrom> readies_;         // as coordinator
  std::map<PeerId, uint64_t> started_attempt_;  // as coordinator: last attempt answered, per peer
  uint64_t attempt_ = 0;                        // our latest collective attempt
  std::optional<Start> start_;                  // the coordinator's answer to our attempt
  bool awaiting_start_ = false;
  std::optional<std::string> start_refused_;
  // Running operation.
  uint64_t op_id_ = 0;
  PeerId left_ = 0, right_ = 0;
  std::vector<PeerId> ring_;
  Clock::time_point last_progress_{};
  std::map<uint64_t, std::deque<Incoming>> mailbox_;  // collective chunks, by operation
  Mailbox p2p_;                                       // point-to-point messages, by (peer, tag)
  std::map<uint64_t, std::string> aborted_;
  std::deque<uint64_t> finished_ops_;
  // Passive bandwidth measurement of the link from our left neighbour.
  Clock::time_point first_chunk_at_{};
  uint64_t first_chunk_bytes_ = 0, received_bytes_ = 0;
};

Node::Impl::Impl(NodeOptions options)
    : options_(std::move(options)),
      membership_(MemberInfo{}),
      random_(std::random_device{}() ^ static_cast<uint64_t>(steady_ns())) {
  if (!options_.log) options_.log = stderr_log(options_.name.empty() ? "peer" : options_.name);
  check_tcp_endpoint(options_.listen, "listen address");
  for (const auto& j : options_.join) entries_.push_back(parse_entry_point(j, "join address"));
  if (options_.chunk_bytes < 1024 || options_.chunk_bytes % 4 != 0)
    throw ConfigError("chunk size " + std::to_string(options_.chunk_bytes) +
                      " bytes: it must be a multiple of 4 and at least 1024");
  if (options_.peer_timeout < 2 * options_.heartbeat_interval)
    throw ConfigError("the peer timeout must be at least two heartbeat intervals");

  TransportOptions t;
  t.listen = options_.listen;
  t.insecure = options_.insecure;
  t.keys = options_.keys;
  for (const auto& k : options_.allowlist) t.allowed_keys.insert(k.public_key);
  t.max_payload_bytes = options_.max_message_bytes;
  t.log = options_.log;
  if (!options_.insecure) {
    if (!t.allowed_keys.count(options_.keys.public_key))
      throw ConfigError("this peer's own public key is not on the allowlist");
    self_id_ = peer_id_from_public_key(options_.keys.public_key);
  } else {
    self_id_ = random_();
  }
  transport_ = std::make_unique<Transport>(t);
  endpoint_ = advertised_endpoint(transport_->endpoint(), options_.advertise, entries_);

  MemberInfo self;
  self.id = self_id_;
  self.name = options_.name;
  self.endpoint = endpoint_;
  self.public_key = options_.insecure ? "" : options_.keys.public_key;
  self.joined_at_ms = wall_ms();
  self.active = options_.active;
  membership_ = Membership(self);

  thread_ = std::thread([this] { run(); });
  if (!entries_.empty()) {
    std::unique_lock lock(mutex_);
    if (!changed_.wait_for(lock, options_.join_timeout, [&] { return welcomed_; })) {
      lock.unlock();
      stop(false);
      std::string where;
      for (const auto& e : entries_) where += (where.empty() ? "" : ", ") + e.endpoint;
      throw NetError("could not join the swarm through " + where + ": no answer within " +
                     std::to_string(options_.join_timeout.count() / 1000.0).substr(0, 4) +
                     " s (is the address right, and is this peer's key on its allowlist?)");
    }
  }
}

void Node::Impl::stop(bool announce) {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
    announce_leave_ = announce_leave_ || announce;
  }
  stop_ = true;
  if (transport_) transport_->wake();
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

std::string Node::Impl::who(PeerId id) const {
  const Member* m = membership_.find(id);
  std::string s = short_peer_id(id);
  if (m && !m->info.name.empty()) s += " (" + m->info.name + ")";
  return s;
}

void Node::Impl::send_to(PeerId peer, MsgType type, zmq::message_t payload, uint64_t op) {
  Header h;
  h.type = type;
  h.sender = self_id_;
  h.op = op;
  transport_->send(slot_of(peer), h, std::move(payload));
}

void Node::Impl::introduce(const MemberInfo& info) {
  p2p_.revive(info.id);
  // New, or a new incarnation of a restarted peer: its attempt numbers start again.
  started_attempt_.erase(info.id);
  readies_.erase(info.id);
  // A restarted peer may listen elsewhere now. The same address keeps its connection: closing it
  // would drop what is already queued to the peer (a joiner's second announcement of itself
  // looks like a new incarnation too).
  if (!transport_->connected_to(slot_of(info.id), info.endpoint, info.public_key)) {
    transport_->disconnect(slot_of(info.id));
    transport_->connect(slot_of(info.id), info.endpoint, info.public_key);
  }
  send_to(info.id, MsgType::hello, json_message({{"member", to_json(membership_.self())}}));
  // Bandwidth probe: a marker, then a bulk payload right behind it; the receiver times the gap.
  if (options_.probe_bytes > 0) {
    const uint64_t probe_id = random_();
    Header h;
    h.type = MsgType::probe;
    h.sender = self_id_;
    h.op = probe_id;
    h.chunk = 0;
    transport_->send(slot_of(info.id), h, zmq::message_t());
    h.chunk = 1;
    zmq::message_t bulk(options_.probe_bytes);
    std::memset(bulk.data(), 0x5A, bulk.size());
    transport_->send(slot_of(info.id), h, std::move(bulk));
  }
  log("peer " + who(info.id) + " at " + info.endpoint + " is a member");
}

void Node::Impl::begin_join() {
  // Without the entry's key we try every allowlisted key at once: only the right one completes
  // the CURVE handshake, the others never deliver anything and are closed once we are welcomed.
  int n = 0;
  for (const auto& e : entries_) {
    for (const auto& key : candidate_server_keys(e, options_.insecure, options_.keys.public_key,
                                                 options_.allowlist)) {
      const std::string slot = std::string("j").append(std::to_string(n++));
      transport_->connect(slot, e.endpoint, key);
      Header h;
      h.type = MsgType::hello;
      h.sender = self_id_;
      transport_->send(slot, h, json_message({{"member", to_json(membership_.self())}}));
      join_slots_.push_back(slot);
    }
  }
}

void Node::Impl::run() {
  if (!entries_.empty()) begin_join();
  while (!stop_) {
    std::optional<Pending> job;
    {
      std::lock_guard lock(mutex_);
      if (requested_active_) {
        membership_.self_info().active = *requested_active_;
        requested_active_.reset();
      }
      if (!queue_.empty()) {
        job = std::move(queue_.front());
        queue_.pop_front();
      }
    }
    if (job) {
      run_collective(*job);
    } else {
      pump(Clock::now() + milliseconds(100));
    }
  }
  // Shutting down: fail what is queued, say goodbye if asked, let the goodbyes leave.
  std::deque<Pending> left_over;
  bool announce = false;
  std::vector<PeerId> others;
  {
    std::lock_guard lock(mutex_);
    left_over.swap(queue_);
    announce = announce_leave_;
    for (PeerId id : membership_.alive())
      if (id != self_id_) others.push_back(id);
  }
  for (auto& p : left_over) p.state->finish({}, "the peer stopped before the collective ran");
  std::deque<TransferRequest> transfers;
  {
    std::lock_guard lock(mutex_);
    transfers.swap(transfers_);
  }
  for (auto& t : transfers) t.state->finish({}, "the peer has stopped");
  p2p_.fail_all("the peer has stopped");
  if (announce)
    for (PeerId id : others) send_to(id, MsgType::leave, zmq::message_t());
  transport_->close_all(announce ? milliseconds(1000) : milliseconds(0));
}

void Node::Impl::pump(Clock::time_point until) {
  run_transfers();  // here, so they also move while a collective pumps
  const auto now = Clock::now();
  if (now >= next_heartbeat_) on_timers(now);
  auto wait = std::min(until, next_heartbeat_) - now;
  if (wait < std::chrono::nanoseconds(0)) wait = std::chrono::nanoseconds(0);
  auto in = transport_->receive(std::chrono::duration_cast<milliseconds>(wait) + milliseconds(1));
  if (in) handle(*in);
  // Drain whatever else is already waiting without blocking.
  for (int i = 0; i < 64 && !stop_; ++i) {
    auto more = transport_->receive(milliseconds(0));
    if (!more) break;
    handle(*more);
  }
  if (Clock::now() >= next_heartbeat_) on_timers(Clock::now());
}

void Node::Impl::on_timers(Clock::time_point now) {
  next_heartbeat_ = now + options_.heartbeat_interval;
  std::vector<PeerId> dead;
  {
    std::lock_guard lock(mutex_);
    dead = membership_.expire(now, options_.peer_timeout);
  }
  for (PeerId id : dead)
    log("peer " + who(id) + " is dead: no message for " +
        std::to_string(options_.peer_timeout.count() / 1000.0).substr(0, 4) + " s");
  for (PeerId id : dead) p2p_.fail_peer(id, "peer " + who(id) + " died");
  if (!dead.empty()) changed_.notify_all();
  send_heartbeats(now);
  coordinate();
}

void Node::Impl::send_heartbeats(Clock::time_point now) {
  json members = json::array();
  std::vector<std::pair<PeerId, Clock::time_point>> targets;
  json body;
  {
    std::lock_guard lock(mutex_);
    for (const Member& m : membership_.all()) {
      if (m.state != MemberState::dead) members.push_back(to_json(m.info));
      if (m.info.id != self_id_ && m.state != MemberState::left)
        targets.emplace_back(m.info.id, m.last_heard);
    }
    body = {
        {"members", members}, {"links", membership_.links_json(self_id_)}, {"ping", steady_ns()}};
  }
  for (const auto& [id, last] : targets) {
    // A peer silent for ten timeouts is gone for good: drop its queue and stop writing to it.
    if (now - last > 10 * options_.peer_timeout) {
      transport_->disconnect(slot_of(id));
      continue;
    }
    send_to(id, MsgType::heartbeat, json_message(body));
  }
}

void Node::Impl::handle(Incoming& in) {
  const Header& h = in.header;
  const auto now = Clock::now();
  bool known = false;
  {
    std::lock_guard lock(mutex_);
    known = membership_.find(h.sender) != nullptr && h.sender != self_id_;
    if (known && membership_.heard_from(h.sender, now)) {
      log("peer " + who(h.sender) + " is alive again");
      p2p_.revive(h.sender);
    }
  }
  if (h.type == MsgType::p2p) {
    if (!known) {
      log("dropped a message from " + short_peer_id(h.sender) + " at " + in.address +
          ": not a member");
      return;
    }
    // Nobody receives them: a peer that keeps sending cannot fill this one's memory.
    if (p2p_.unclaimed() >= kMaxUnclaimed) {
      log("dropped a message from " + who(h.sender) + " (tag " + std::to_string(h.op) +
          "): " + std::to_string(kMaxUnclaimed) + " messages already wait for a receive");
      return;
    }
    const auto* bytes = static_cast<const uint8_t*>(in.payload.data());
    p2p_.deliver(h.sender, h.op, std::vector<uint8_t>(bytes, bytes + in.payload.size()));
    return;
  }
  if (h.type == MsgType::data) {
    if (!known) {
      log("dropped a data chunk from " + short_peer_id(h.sender) + " at " + in.address +
          ": not a member");
      return;
    }
    if (std::find(finished_ops_.begin(), finished_ops_.end(), h.op) != finished_ops_.end())
      return;  // late chunk of an operation that already failed here
    auto& box = mailbox_[h.op];
    box.push_back(std::move(in));
    if (mailbox_.size() > 16) mailbox_.erase(mailbox_.begin());  // stale ops never run here
    return;
  }
  if (h.type == MsgType::probe) {
    const auto key = std::make_pair(h.sender, h.op);
    if (h.chunk == 0) {
      probe_marks_[key] = now;
      if (probe_marks_.size() > 256) probe_marks_.clear();
    } else if (auto it = probe_marks_.find(key); it != probe_marks_.end()) {
      const double secs = std::chrono::duration<double>(now - it->second).count();
      if (secs > 0 && in.payload.size() > 0) {
        std::lock_guard lock(mutex_);
        membership_.set_link(h.sender, self_id_,
                             {-1, static_cast<double>(in.payload.size()) * 8 / secs / 1e6});
      }
      probe_marks_.erase(it);
    }
    return;
  }
  json body;
  try {
    const char* p = static_cast<const char*>(in.payload.data());
    body = in.payload.size() ? json::parse(p, p + in.payload.size()) : json::object();
    if (!body.is_object()) throw NetError("the payload is not a JSON object");
    handle_control(in, body);
  } catch (const std::exception& e) {
    ++malformed_;
    log("rejected a " + to_string(h.type) + " message from " + short_peer_id(h.sender) + " at " +
        in.address + ": " + e.what());
  }
}

void Node::Impl::handle_control(Incoming& in, const json& body) {
  const Header& h = in.header;
  const auto now = Clock::now();
  const auto member_list = [&](const char* field) {
    if (!body.contains(field) || !body[field].is_array())
      throw NetError(std::string("field '") + field + "' is missing or not an array");
    std::vector<MemberInfo> out;
    for (const auto& m : body[field]) out.push_back(member_from_json(m));
    return out;
  };
  const auto check_sender_key = [&](const MemberInfo& m) {
    if (m.id != h.sender && h.type == MsgType::hello)
      throw NetError("a hello must describe its sender");
    if (!options_.insecure && peer_id_from_public_key(m.public_key) != m.id)
      throw NetError("member " + short_peer_id(m.id) + "'s id does not match its key");
  };
  switch (h.type) {
    case MsgType::hello: {
      if (!body.contains("member")) throw NetError("field 'member' is missing");
      const MemberInfo m = member_from_json(body["member"]);
      check_sender_key(m);
      bool added;
      {
        std::lock_guard lock(mutex_);
        added = membership_.merge(m, now);
      }
      if (added) introduce(m);
      json list = json::array();
      {
        std::lock_guard lock(mutex_);
        for (const Member& x : membership_.all())
          if (x.state != MemberState::left) list.push_back(to_json(x.info));
      }
      send_to(h.sender, MsgType::welcome, json_message({{"members", list}}));
      changed_.notify_all();
      break;
    }
    case MsgType::welcome:
    case MsgType::heartbeat: {
      const auto list = member_list("members");
      std::vector<MemberInfo> added;
      {
        std::lock_guard lock(mutex_);
        for (const auto& m : list) {
          if (!options_.insecure && peer_id_from_public_key(m.public_key) != m.id) continue;
          if (membership_.merge(m, now)) added.push_back(m);
        }
        if (h.type == MsgType::heartbeat && body.contains("links"))
          membership_.merge_links_json(body["links"], h.sender);
        if (h.type == MsgType::welcome && !welcomed_ && !entries_.empty()) {
          welcomed_ = true;
          // The coordinator is the oldest member; a joiner must be younger than everyone it
          // finds, whatever its clock says. Only once, on the welcome that completes the join:
          // every later change would look like a restart to the others.
          int64_t newest = 0;
          for (const auto& m : list)
            if (m.id != self_id_) newest = std::max(newest, m.joined_at_ms);
          auto& self = membership_.self_info();
          if (self.joined_at_ms <= newest) self.joined_at_ms = newest + 1;
        }
      }
      for (const auto& m : added) introduce(m);
      if (h.type == MsgType::welcome && !join_slots_.empty()) {
        for (const auto& s : join_slots_) transport_->disconnect(s);
        join_slots_.clear();
        log("joined the swarm through " + who(h.sender));
      }
      if (h.type == MsgType::heartbeat && body.contains("ping") && body["ping"].is_number_integer())
        send_to(h.sender, MsgType::pong, json_message({{"ping", body["ping"]}}));
      changed_.notify_all();
      break;
    }
    case MsgType::pong: {
      if (!body.contains("ping") || !body["ping"].is_number_integer())
        throw NetError("field 'ping' is missing");
      const double rtt_ms = (steady_ns() - body["ping"].get<int64_t>()) / 1e6;
      if (rtt_ms >= 0 && rtt_ms < 600000) {
        std::lock_guard lock(mutex_);
        membership_.set_link(self_id_, h.sender, {rtt_ms, -1});
      }
      break;
    }
    case MsgType::leave: {
      {
        std::lock_guard lock(mutex_);
        membership_.mark_left(h.sender);
      }
      log("peer " + who(h.sender) + " left the swarm");
      p2p_.fail_peer(h.sender, "peer " + who(h.sender) + " left the swarm");
      changed_.notify_all();
      break;
    }
    case MsgType::status_request:
      transport_->reply(in.routing, Header{MsgType::status_reply, 0, self_id_},
                        json_message(status_json()));
      break;
    case MsgType::ready: {
      if (!body.contains("attempt") || !body["attempt"].is_number_unsigned())
        throw NetError("field 'attempt' is missing");
      // Parsed before touching the table, so a malformed request leaves no entry behind.
      ReadyFrom ready{body["attempt"].get<uint64_t>(), Request::from_json(body)};
      // Readiness is repeated until answered; a repeat of an attempt already started is stale.
      if (auto it = started_attempt_.find(h.sender);
          it != started_attempt_.end() && ready.attempt <= it->second)
        break;
      readies_.insert_or_assign(h.sender, std::move(ready));

      coordinate();
      break;
    }
    case MsgType::start: {
      if (!body.contains("attempt") || !body["attempt"].is_number_unsigned() ||
          !body.contains("ring") || !body["ring"].is_array())
        throw NetError("fields 'attempt' and 'ring' are required");
      if (body.contains("refused") && body["refused"].is_string()) {
        if (awaiting_start_ && body["attempt"].get<uint64_t>() == attempt_)
          start_refused_ = "coordinator " + who(h.sender) +
                           " refused the collective: " + body["refused"].get<std::string>();
        break;
      }
      Start s;
      s.op_id = h.op;
      for (const auto& id : body["ring"]) s.ring.push_back(parse_hex_id(id, "ring"));
      s.request = Request::from_json(body);
      if (!body.contains("chunk") || !body["chunk"].is_number_unsigned() ||
          body["chunk"].get<uint64_t>() == 0 || body["chunk"].get<uint64_t>() > (1ull << 28))
        throw NetError("field 'chunk' is missing or out of range");
      s.chunk_elements = body["chunk"].get<uint64_t>();
      if (awaiting_start_ && body["attempt"].get<uint64_t>() == attempt_ && !start_) {
        start_ = std::move(s);
      } else {
        // Our attempt already failed: tell the others at once instead of letting them wait.
        const std::string reason = "peer " + who(self_id_) + " had already given up on it";
        for (PeerId id : s.ring)
          if (id != self_id_)
            send_to(id, MsgType::abort, json_message({{"reason", reason}}), s.op_id);
      }
      break;
    }
    case MsgType::abort: {
      const std::string reason = body.contains("reason") && body["reason"].is_string()
                                     ? body["reason"].get<std::string>()
                                     : "no reason given";
      if (h.op != 0)
        aborted_.insert_or_assign(h.op, "peer " + who(h.sender) + " aborted it: " + reason);
      if (aborted_.size() > 64) aborted_.erase(aborted_.begin());
      if (body.contains("attempt") && body["attempt"].is_number_unsigned()) {
        auto it = readies_.find(h.sender);
        if (it != readies_.end() && it->second.attempt == body["attempt"].get<uint64_t>())
          readies_.erase(it);
      }
      break;
    }
    default:
      throw NetError("unexpected message type");
  }
}

void Node::Impl::coordinate() {
  if (readies_.empty()) return;
  std::vector<PeerId> expected;
  std::map<PeerId, ReadyFrom> ready;
  {
    std::lock_guard lock(mutex_);
    if (membership_.coordinator() != self_id_) return;
    // Readies of peers that died or left no longer count.
    for (auto it = readies_.begin(); it != readies_.end();)
      it = membership_.is_alive(it->first) ? std::next(it) : readies_.erase(it);
    expected = membership_.alive_active();
  }
  for (PeerId id : expected)
    if (!readies_.count(id)) return;  // someone has not called the collective yet
  std::vector<PeerId> participants;
  for (const auto& [id, r] : readies_) participants.push_back(id);
  const Request& first = readies_.begin()->second.request;
  std::string refusal;
  for (const auto& [id, r] : readies_)
    if (!r.request.same_as(first))
      refusal = "peers disagree: " + who(readies_.begin()->first) + " called " + first.describe() +
                ", " + who(id) + " called " + r.request.describe();
  if (refusal.empty() && first.kind == CollectiveKind::broadcast &&
      std::find(participants.begin(), participants.end(), first.options.root) == participants.end())
    refusal = "the broadcast root " + short_peer_id(first.options.root) +
              " is not among the participants";
  std::vector<PeerId> ring;
  if (refusal.empty()) {
    std::lock_guard lock(mutex_);
    ring = choose_ring(participants, first.options.order,
                       [&](PeerId a, PeerId b) { return membership_.link(a, b).mbit_per_s; });
  }
  const uint64_t op_id = random_() | 1;  // never 0
  const uint64_t chunk =
      choose_chunk_elements(first.count, participants.size(), options_.chunk_bytes);
  json ring_json = json::array();
  for (PeerId id : ring) ring_json.push_back(format_peer_id(id));
  for (const auto& [id, r] : readies_) {
    started_attempt_[id] = r.attempt;
    json body = first.to_json();
    body["attempt"] = r.attempt;
    body["ring"] = ring_json;
    body["chunk"] = chunk;
    if (!refusal.empty()) body["refused"] = refusal;
    if (id == self_id_) {
      if (r.attempt != attempt_) continue;
      if (!refusal.empty()) {
        start_refused_ = refusal;
      } else {
        start_ = Start{op_id, ring, first, chunk};
      }
    } else {
      send_to(id, MsgType::start, json_message(body), op_id);
    }
  }
  readies_.clear();
}

void Node::Impl::run_collective(Pending& p) {
  const Request& req = p.request;
  ++attempt_;
  start_.reset();
  start_refused_.reset();
  CollectiveResult result;
  std::string error;
  std::optional<PeerId> coordinator;
  {
    std::lock_guard lock(mutex_);
    membership_.self_info().active = true;  // calling a collective means taking part
    coordinator = membership_.coordinator();
  }
  json ready = req.to_json();
  ready["attempt"] = attempt_;
  // Tells the current coordinator we are ready. Repeated every heartbeat until the answer comes:
  // a lost message, a coordinator that died before starting, or one that had briefly taken us
  // for dead all cost one heartbeat instead of the collective timeout.
  const auto announce = [&] {
    if (*coordinator == self_id_) {
      readies_.insert_or_assign(self_id_, ReadyFrom{attempt_, req});
      coordinate();
    } else {
      send_to(*coordinator, MsgType::ready, json_message(ready));
    }
  };
  announce();
  auto announced_at = Clock::now();
  const auto deadline = p.launched + options_.collective_timeout;
  awaiting_start_ = true;
  while (!start_ && !start_refused_) {
    if (stop_) {
      error = "the peer is stopping";
      break;
    }
    if (Clock::now() - announced_at >= options_.heartbeat_interval) {
      std::optional<PeerId> now_coordinator;
      {
        std::lock_guard lock(mutex_);
        now_coordinator = membership_.coordinator();
      }
      if (now_coordinator != coordinator && *coordinator == self_id_) readies_.erase(self_id_);
      coordinator = now_coordinator;
      announce();
      announced_at = Clock::now();
      if (start_ || start_refused_) break;
    }
    if (Clock::now() > deadline) {
      std::string missing;
      if (*coordinator == self_id_) {
        std::lock_guard lock(mutex_);
        for (PeerId id : membership_.alive_active())
          if (!readies_.count(id)) missing += (missing.empty() ? "" : ", ") + who(id);
      }
      error = "timed out after " + std::to_string(options_.collective_timeout.count() / 1000) +
              " s waiting for every peer to call " + req.describe() +
              (missing.empty() ? "" : " (not ready: " + missing + ")");
      break;
    }
    pump(Clock::now() + milliseconds(50));
  }
  awaiting_start_ = false;
  if (start_refused_) error = *start_refused_;
  if (!error.empty()) {
    // Withdraw our readiness so a late decision does not count us in.
    if (*coordinator == self_id_) {
      readies_.erase(self_id_);
    } else {
      send_to(*coordinator, MsgType::abort,
              json_message({{"attempt", attempt_}, {"reason", error}}));
    }
    p.state->finish({}, error);
    return;
  }

  const Start s = *start_;
  const auto pos_it = std::find(s.ring.begin(), s.ring.end(), self_id_);
  const int P = static_cast<int>(s.ring.size());
  const int pos = static_cast<int>(pos_it - s.ring.begin());
  op_id_ = s.op_id;
  ring_ = s.ring;
  left_ = s.ring[(pos - 1 + P) % P];
  right_ = s.ring[(pos + 1) % P];
  last_progress_ = Clock::now();
  first_chunk_at_ = {};
  first_chunk_bytes_ = received_bytes_ = 0;
  std::string unknown;
  {
    std::lock_guard lock(mutex_);
    for (PeerId id : {left_, right_}) {
      const Member* m = membership_.find(id);
      if (!m)
        unknown = short_peer_id(id);
      else if (id != self_id_)
        transport_->connect(slot_of(id), m->info.endpoint, m->info.public_key);
    }
  }
  RingSpec spec;
  spec.position = pos;
  spec.size = P;
  spec.chunk_elements = s.chunk_elements;
  spec.precision = req.options.precision;
  spec.op = req.options.op;
  try {
    if (pos_it == s.ring.end()) throw NetError("the coordinator left this peer out of the ring");
    if (!unknown.empty()) throw NetError("the ring names peer " + unknown + ", unknown here");
    if (!s.request.same_as(req))
      throw NetError("the coordinator started " + s.request.describe() + ", this peer called " +
                     req.describe());
    switch (req.kind) {
      case CollectiveKind::all_reduce:
        ring_all_reduce(p.data, spec, *this);
        break;
      case CollectiveKind::reduce_scatter:
        ring_reduce_scatter(p.data, spec, *this);
        break;
      case CollectiveKind::all_gather:
        ring_all_gather(p.data, spec, *this);
        break;
      case CollectiveKind::broadcast: {
        const int root = static_cast<int>(
            std::find(s.ring.begin(), s.ring.end(), req.options.root) - s.ring.begin());
        chain_broadcast(p.data, spec, root, *this);
        break;
      }
    }
  } catch (const NetError& e) {
    error = to_string(req.kind) + " failed: " + e.what();
    for (PeerId id : s.ring)
      if (id != self_id_)
        send_to(id, MsgType::abort, json_message({{"reason", e.what()}}), s.op_id);
  }
  // The passive measurement of our incoming link, when the transfer was long enough to mean it.
  if (error.empty() && received_bytes_ > first_chunk_bytes_ && P > 1) {
    const double secs = std::chrono::duration<double>(last_progress_ - first_chunk_at_).count();
    if (secs > 0.05) {
      std::lock_guard lock(mutex_);
      const double mbps = (received_bytes_ - first_chunk_bytes_) * 8 / secs / 1e6;
      const LinkStats old = membership_.link(left_, self_id_);
      if (mbps > old.mbit_per_s) membership_.set_link(left_, self_id_, {-1, mbps});
    }
  }
  mailbox_.erase(s.op_id);
  finished_ops_.push_back(s.op_id);
  if (finished_ops_.size() > 64) finished_ops_.pop_front();
  op_id_ = 0;
  result.ring = s.ring;
  result.position = pos;
  result.shard = shard_of(p.data.size(), P, pos);
  result.op_id = s.op_id;
  result.seconds = std::chrono::duration<double>(Clock::now() - p.launched).count();
  p.state->finish(result, error);
}

void Node::Impl::send_right(uint32_t step, uint32_t chunk, zmq::message_t payload) {
  Header h;
  h.type = MsgType::data;
  h.precision = 0;
  h.sender = self_id_;
  h.op = op_id_;
  h.step = step;
  h.chunk = chunk;
  if (!transport_->send(slot_of(right_), h, std::move(payload)))
    throw NetError("no connection to " + who(right_));
}

zmq::message_t Node::Impl::receive_left(uint32_t step, uint32_t chunk, size_t expected_bytes) {
  while (true) {
    auto box = mailbox_.find(op_id_);
    if (box != mailbox_.end() && !box->second.empty()) {
      Incoming in = std::move(box->second.front());
      box->second.pop_front();
      const Header& h = in.header;
      if (h.sender != left_)
        throw NetError("peer " + who(h.sender) + " sent a chunk out of turn (expected one from " +
                       who(left_) + ")");
      if (h.step != step || h.chunk != chunk)
        throw NetError("peer " + who(h.sender) + " sent step " + std::to_string(h.step) +
                       " chunk " + std::to_string(h.chunk) + ", expected step " +
                       std::to_string(step) + " chunk " + std::to_string(chunk));
      if (in.payload.size() != expected_bytes)
        throw NetError("peer " + who(h.sender) + " sent a chunk of " +
                       std::to_string(in.payload.size()) + " bytes, expected " +
                       std::to_string(expected_bytes) + " (do all peers pass the same size?)");
      last_progress_ = Clock::now();
      if (received_bytes_ == 0) {
        first_chunk_at_ = last_progress_;
        first_chunk_bytes_ = in.payload.size();
      }
      received_bytes_ += in.payload.size();
      return std::move(in.payload);
    }
    if (auto a = aborted_.find(op_id_); a != aborted_.end()) throw NetError(a->second);
    if (stop_) throw NetError("the peer is stopping");
    {
      std::lock_guard lock(mutex_);
      for (PeerId id : ring_) {
        const Member* m = membership_.find(id);
        if (!m || m->state == MemberState::dead)
          throw NetError("peer " + who(id) + " died during the operation (no message for " +
                         std::to_string(options_.peer_timeout.count() / 1000.0).substr(0, 4) +
                         " s)");
        // A peer that leaves after doing its part is fine; one that quits midway sends an
        // abort. Only our left neighbour's departure means our data will not come.
        if (m->state == MemberState::left && id == left_)
          throw NetError("peer " + who(id) + " left during the operation");
      }
    }
    if (Clock::now() - last_progress_ > options_.peer_timeout)
      throw NetError("no data from " + who(left_) + " for " +
                     std::to_string(options_.peer_timeout.count() / 1000.0).substr(0, 4) + " s");
    pump(Clock::now() + milliseconds(50));
  }
}

json Node::Impl::status_json() const {
  std::lock_guard lock(mutex_);
  json members = json::array();
  const auto now = Clock::now();
  for (const Member& m : membership_.all()) {
    json j = to_json(m.info);
    j["state"] = to_string(m.state);
    j["heard_s"] =
        m.info.id == self_id_ ? 0.0 : std::chrono::duration<double>(now - m.last_heard).count();
    members.push_back(j);
  }
  json links = json::array();
  for (const auto& [key, l] : membership_.links())
    links.push_back({{"from", format_peer_id(key.first)},
                     {"to", format_peer_id(key.second)},
                     {"rtt_ms", l.rtt_ms},
                     {"mbps", l.mbit_per_s}});
  return {{"self", format_peer_id(self_id_)}, {"members", members}, {"links", links}};
}

Work Node::Impl::launch(CollectiveKind kind, std::span<float> data,
                        const CollectiveOptions& options) {
  auto state = std::make_shared<Work::State>();
  Pending p;
  p.request.kind = kind;
  p.request.count = data.size();
  p.request.options = options;
  if (kind != CollectiveKind::broadcast) p.request.options.root = 0;
  p.data = data;
  p.state = state;
  p.launched = Clock::now();
  {
    std::lock_guard lock(mutex_);
    if (stopping_) {
      state->finish({}, "the peer has stopped");
      return Work(state);
    }
    queue_.push_back(std::move(p));
  }
  transport_->wake();
  return Work(state);
}

Transfer Node::Impl::post(bool send, PeerId peer, uint64_t tag, std::vector<uint8_t> bytes) {
  auto state = std::make_shared<Transfer::State>();
  {
    std::lock_guard lock(mutex_);
    if (stopping_) {
      state->finish({}, "the peer has stopped");
      return Transfer(state);
    }
    transfers_.push_back({send, peer, tag, std::move(bytes), state});
  }
  transport_->wake();
  return Transfer(state);
}

void Node::Impl::run_transfers() {
  std::deque<TransferRequest> requests;
  {
    std::lock_guard lock(mutex_);
    requests.swap(transfers_);
  }
  for (auto& r : requests) {
    if (!r.send) {
      p2p_.expect(r.peer, r.tag, r.state);
      continue;
    }
    if (r.peer == self_id_) {
      p2p_.deliver(self_id_, r.tag, std::move(r.bytes));
      r.state->finish({}, "");
      continue;
    }
    bool alive = false;
    {
      std::lock_guard lock(mutex_);
      const Member* m = membership_.find(r.peer);
      alive = m != nullptr && m->state == MemberState::alive;
    }
    if (!alive) {
      r.state->finish({}, "send to " + who(r.peer) + ": not a live member");
    } else if (r.bytes.size() > options_.max_message_bytes) {
      r.state->finish({}, "send to " + who(r.peer) + ": " + std::to_string(r.bytes.size()) +
                              " bytes exceed the message limit of " +
                              std::to_string(options_.max_message_bytes));
    } else {
      send_to(r.peer, MsgType::p2p, zmq::message_t(r.bytes.data(), r.bytes.size()), r.tag);
      r.state->finish({}, "");
    }
  }
}

std::vector<MemberView> Node::Impl::members() const {
  std::lock_guard lock(mutex_);
  std::vector<MemberView> out;
  const auto now = Clock::now();
  for (const Member& m : membership_.all())
    out.push_back(
        {m.info, m.state,
         m.info.id == self_id_ ? 0.0 : std::chrono::duration<double>(now - m.last_heard).count()});
  return out;
}

std::vector<LinkView> Node::Impl::links() const {
  std::lock_guard lock(mutex_);
  std::vector<LinkView> out;
  for (const auto& [key, l] : membership_.links()) out.push_back({key.first, key.second, l});
  return out;
}

bool Node::Impl::wait_for_members(size_t count, milliseconds timeout) const {
  std::unique_lock lock(mutex_);
  return changed_.wait_for(lock, timeout, [&] { return membership_.alive().size() >= count; });
}

void Node::Impl::set_active(bool active) {
  std::lock_guard lock(mutex_);
  requested_active_ = active;
}

Node::Counters Node::Impl::counters() const {
  return {transport_->rejected() + malformed_.load(), transport_->refused_connections(),
          transport_->bytes_sent()};
}

// --- Node --------------------------------------------------------------------------------------

Node::Node(NodeOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
Node::~Node() { impl_->stop(true); }
PeerId Node::id() const { return impl_->id(); }
const std::string& Node::endpoint() const { return impl_->endpoint(); }
std::vector<MemberView> Node::members() const { return impl_->members(); }
std::vector<LinkView> Node::links() const { return impl_->links(); }
bool Node::wait_for_members(size_t count, milliseconds timeout) const {
  return impl_->wait_for_members(count, timeout);
}
void Node::set_active(bool active) { impl_->set_active(active); }
void Node::leave() { impl_->stop(true); }
Node::Counters Node::counters() const { return impl_->counters(); }
PeerId Node::self() const { return id(); }
uint64_t Node::bytes_sent() const { return counters().bytes_sent; }

PeerId Node::longest_standing(const std::vector<PeerId>& participants) const {
  PeerId best = participants.empty() ? id() : participants.front();
  int64_t oldest = std::numeric_limits<int64_t>::max();
  for (const auto& m : members())
    if (std::find(participants.begin(), participants.end(), m.info.id) != participants.end() &&
        (m.info.joined_at_ms < oldest || (m.info.joined_at_ms == oldest && m.info.id < best))) {
      oldest = m.info.joined_at_ms;
      best = m.info.id;
    }
  return best;
}

Transfer Node::send(PeerId peer, uint64_t tag, std::vector<uint8_t> bytes) {
  return impl_->post(/*send=*/true, peer, tag, std::move(bytes));
}
Transfer Node::recv(PeerId peer, uint64_t tag) {
  return impl_->post(/*send=*/false, peer, tag, {});
}

Work Node::launch(CollectiveKind kind, std::span<float> data, const CollectiveOptions& options) {
  return impl_->launch(kind, data, options);
}

}  // namespace starling::net
