#include "starling/net/node.h"

#include <algorithm>
#include <random>
#include <thread>

#include "starling/common/error.h"
#include "starling/net/endpoint.h"
#include "starling/net/heap_reuse.h"
#include "starling/net/node_impl.h"
#include "starling/net/quiet_thread.h"

namespace starling::net {
namespace {

using json = nlohmann::json;
using std::chrono::milliseconds;

int64_t wall_ms() {
  return std::chrono::duration_cast<milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Node::Impl::Impl(NodeOptions options) : options_(std::move(options)), table_(MemberInfo{}) {
  if (!options_.log) options_.log = stderr_log(options_.name.empty() ? "peer" : options_.name);
  keep_freed_heap_for_reuse();
  check_tcp_endpoint(options_.listen, "listen address");
  std::vector<EntryPoint> entries;
  for (const auto& j : options_.join) entries.push_back(parse_entry_point(j, "join address"));
  joining_ = !entries.empty();
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
    std::mt19937_64 random(std::random_device{}() ^
                           static_cast<uint64_t>(Clock::now().time_since_epoch().count()));
    self_id_ = random();
  }
  t.self = self_id_;
  t.on_other_version = [this](const std::string& endpoint, int version) {
    std::lock_guard lock(table_.mutex);
    table_.other_versions[endpoint] = version;
    table_.changed.notify_all();
  };
  transport_ = std::make_unique<Transport>(t);
  endpoint_ = advertised_endpoint(transport_->endpoint(), options_.advertise, entries);
  if (options_.direct_data) {
    std::optional<LinkIdentity> identity;
    if (!options_.insecure) {  // sealed links, keyed by the allowlist's CURVE keys
      identity.emplace();
      identity->self = self_id_;
      identity->secret = raw_key(options_.keys.secret_key);
      for (const auto& k : options_.allowlist)
        identity->public_keys[peer_id_from_public_key(k.public_key)] = raw_key(k.public_key);
    }
    direct_ = std::make_unique<DirectLinks>(endpoint_host(transport_->endpoint()), options_.log,
                                            std::move(identity));
  }

  MemberInfo self;
  self.id = self_id_;
  self.name = options_.name;
  self.endpoint = endpoint_;
  self.public_key = options_.insecure ? "" : options_.keys.public_key;
  self.data_port = direct_ ? direct_->port() : 0;
  self.joined_at_ms = wall_ms();
  self.active = options_.active;
  self.role = options_.role;
  self.incarnation = std::mt19937_64(std::random_device{}() ^ static_cast<uint64_t>(wall_ms()))();
  table_.members = Membership(self);

  Gossip::Events events;
  events.joined = [this](PeerId id) {
    p2p_.revive(id);
    agreement_->forget(id);
  };
  events.restarted = [this](PeerId id) {
    const std::string why = "peer " + table_.who(id) + " restarted";
    p2p_.restarted(id, why);
    fail_runs(id, why + " during the operation", false);
  };
  events.back = [this](PeerId id) { p2p_.revive(id); };
  events.dead = [this](PeerId id) {
    const std::string why = "peer " + table_.who(id) + " died";
    p2p_.fail_peer(id, why);
    fail_runs(
        id,
        why + " during the operation (no message for " + seconds_text(options_.peer_timeout) + ")",
        false);
  };
  events.left = [this](PeerId id) {
    p2p_.fail_peer(id, "peer " + table_.who(id) + " left the swarm");
    // A peer that leaves after doing its part is fine; one that quits midway sends an abort.
    // Only our left neighbour's departure means our data will not come.
    fail_runs(id, "peer " + table_.who(id) + " left during the operation", true);
  };
  std::vector<std::string> entry_endpoints;
  for (const auto& e : entries) entry_endpoints.push_back(e.endpoint);
  gossip_ = std::make_unique<Gossip>(options_, std::move(entries), *transport_, table_, events);

  AgreementOptions a;
  a.self = self_id_;
  a.heartbeat_interval = options_.heartbeat_interval;
  a.collective_timeout = options_.collective_timeout;
  a.chunk_bytes = options_.chunk_bytes;
  Agreement::Hooks hooks;
  hooks.send = [this](PeerId to, MsgType type, const json& body, uint64_t op) {
    send_control(to, type, body, op);
  };
  hooks.run = [this](Launched op, Start start) { start_run(std::move(op), std::move(start)); };
  agreement_ = std::make_unique<Agreement>(a, table_, hooks);

  thread_ = quiet_thread([this] { run(); });
  if (joining_) {
    std::unique_lock lock(table_.mutex);
    // Every entry point runs another release: none of them will let this peer in.
    const auto all_other = [&] {
      for (const auto& e : entry_endpoints)
        if (!table_.other_versions.count(e)) return false;
      return true;
    };
    table_.changed.wait_for(lock, options_.join_timeout,
                            [&] { return table_.welcomed || all_other(); });
    if (!table_.welcomed) {
      const bool other_release = all_other();
      std::string others;
      for (const auto& [endpoint, version] : table_.other_versions)
        others += std::string(others.empty() ? "" : ", ") + endpoint + " speaks version " +
                  std::to_string(version);
      lock.unlock();
      stop(false);
      std::string where;
      for (const auto& e : options_.join) where += (where.empty() ? "" : ", ") + e;
      if (other_release)
        throw NetError("could not join the swarm through " + where +
                       ": it runs another Starling release (wire version: " + others +
                       "; this peer speaks version " + std::to_string(kWireVersion) +
                       "); run one release on every peer");
      // Members of releases older than the other_version answer drop the request in silence
      // and say so in their log only.
      throw NetError("could not join the swarm through " + where + ": no answer within " +
                     seconds_text(options_.join_timeout) +
                     " (is the address right, is this peer's key on its allowlist, and does "
                     "the peer there run the same Starling? A member of another release drops "
                     "the messages of this one, and its log says so)" +
                     (others.empty() ? std::string()
                                     : "; " + others + " (this peer speaks version " +
                                           std::to_string(kWireVersion) + ")"));
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

void Node::Impl::send_control(PeerId to, MsgType type, const json& body, uint64_t op) {
  gossip_->send(to, type, json_message(body), op);
}

void Node::Impl::run() {
  if (joining_) gossip_->begin_join();
  while (!stop_) {
    take_requests();
    flush_outbox();
    collect_runs();
    auto now = Clock::now();
    // The loop never waits longer than a heartbeat: a gap beyond the peer timeout means the
    // whole process was paused, and everyone's silence meanwhile is this peer's own.
    if (last_loop_ != Clock::time_point{} && now - last_loop_ > options_.peer_timeout)
      gossip_->resumed_after(now - last_loop_, now);
    last_loop_ = now;
    if (now >= next_tick_) {
      next_tick_ = now + options_.heartbeat_interval;
      gossip_->tick(now);
      agreement_->tick(now);
    }
    now = Clock::now();
    const auto wait = std::max(next_tick_ - now, Clock::duration::zero());
    auto in = transport_->receive(std::chrono::duration_cast<milliseconds>(wait) + milliseconds(1));
    if (!in) continue;
    handle(*in);
    // Drain whatever else is already waiting without blocking, sending what the running
    // collectives queued in between.
    for (int i = 0; i < 64 && !stop_; ++i) {
      if (out_pending_) flush_outbox();
      auto more = transport_->receive(milliseconds(0));
      if (!more) break;
      handle(*more);
    }
  }
  shut_down();
}

void Node::Impl::shut_down() {
  agreement_->stop("the peer stopped before the collective ran");
  {
    std::deque<Launched> launches;
    {
      std::lock_guard lock(mutex_);
      launches.swap(launches_);
    }
    for (auto& op : launches) op.state->finish({}, "the peer stopped before the collective ran");
  }
  for (auto& [op_id, r] : runs_) r->fail("the peer is stopping");
  for (auto& [op_id, r] : runs_) r->finish();
  runs_.clear();
  std::deque<TransferRequest> transfers;
  bool announce = false;
  {
    std::lock_guard lock(mutex_);
    transfers.swap(transfers_);
    announce = announce_leave_;
  }
  for (auto& t : transfers) t.state->finish({}, "the peer has stopped");
  p2p_.fail_all("the peer has stopped");
  if (announce) gossip_->announce_leave();
  transport_->close_all(announce ? milliseconds(1000) : milliseconds(0));
}

void Node::Impl::take_requests() {
  std::deque<Launched> launches;
  std::deque<TransferRequest> transfers;
  std::vector<uint64_t> keep_latest;
  {
    std::lock_guard lock(mutex_);
    launches.swap(launches_);
    transfers.swap(transfers_);
    keep_latest.swap(keep_latest_);
    if (activate_) {
      std::lock_guard table_lock(table_.mutex);
      table_.members.self_info().active = true;
      activate_ = false;
    }
  }
  for (uint64_t tag : keep_latest) p2p_.keep_latest(tag);
  for (auto& op : launches) agreement_->launch(std::move(op));
  for (auto& t : transfers) run_transfer(t);
}

void Node::Impl::run_transfer(TransferRequest& r) {
  if (!r.send) {
    p2p_.expect(r.peer, r.tag, r.state);
    return;
  }
  if (r.peer == self_id_) {
    p2p_.deliver(self_id_, r.tag, std::move(r.bytes));
    r.state->finish({}, "");
    return;
  }
  bool alive = false;
  {
    std::lock_guard lock(table_.mutex);
    const Member* m = table_.members.find(r.peer);
    alive = m != nullptr && m->state == MemberState::alive;
  }
  if (!alive) {
    r.state->finish({}, "send to " + table_.who(r.peer) + ": not a live member");
  } else if (r.bytes.size() > options_.max_message_bytes) {
    r.state->finish({}, "send to " + table_.who(r.peer) + ": " + std::to_string(r.bytes.size()) +
                            " bytes exceed the message limit of " +
                            std::to_string(options_.max_message_bytes));
  } else {
    gossip_->send(r.peer, MsgType::p2p, zmq::message_t(r.bytes.data(), r.bytes.size()), r.tag);
    r.state->finish({}, "");
  }
}

void Node::Impl::flush_outbox() {
  std::vector<Outgoing> out;
  {
    std::lock_guard lock(out_mutex_);
    out.swap(outbox_);
    out_pending_ = false;
  }
  for (auto& o : out) {
    if (transport_->send(slot_of(o.to), o.header, std::move(o.payload))) continue;
    if (auto it = runs_.find(o.header.op); it != runs_.end())
      it->second->fail("no connection to " + table_.who(o.to));
  }
}

void Node::Impl::handle(Incoming& in) {
  const Header& h = in.header;
  const bool known = gossip_->heard(h, Clock::now());
  if (h.type == MsgType::p2p || h.type == MsgType::data) {
    if (!known) {
      log("dropped a " + to_string(h.type) + " message from " + short_peer_id(h.sender) + " at " +
          in.address + ": not a member");
      return;
    }
    if (h.type == MsgType::data) {
      handle_data(in);
      return;
    }
    // Nobody receives them: a peer that keeps sending cannot fill this one's memory, nor its
    // log (the 1st, 2nd, 4th, 8th, ... drop is logged).
    if (!p2p_.has_room_for(h.sender, h.op)) {
      ++dropped_unclaimed_;
      if ((dropped_unclaimed_ & (dropped_unclaimed_ - 1)) == 0)
        log("dropped a message from " + table_.who(h.sender) + " (tag " + std::to_string(h.op) +
            "): " + std::to_string(Mailbox::kMaxUnclaimed) +
            " messages already wait for a receive (" + std::to_string(dropped_unclaimed_) +
            " dropped so far)");
      return;
    }
    const auto* bytes = static_cast<const uint8_t*>(in.payload.data());
    p2p_.deliver(h.sender, h.op, std::vector<uint8_t>(bytes, bytes + in.payload.size()));
    return;
  }
  try {
    if (h.type == MsgType::probe) {
      gossip_->handle_probe(in, known);
      return;
    }
    const char* p = static_cast<const char*>(in.payload.data());
    const json body = in.payload.size() ? json::parse(p, p + in.payload.size()) : json::object();
    if (!body.is_object()) throw NetError("the payload is not a JSON object");
    switch (h.type) {
      case MsgType::ready:
        agreement_->on_ready(h.sender, body);
        break;
      case MsgType::start:
        agreement_->on_start(h.sender, h.op, body);
        break;
      case MsgType::abort:
        handle_abort(h, body);
        break;
      default:
        gossip_->handle(in, body);
    }
    // A fault for tests: this peer's loop is busy right after a member introduced itself, when
    // the member's bandwidth probe comes (as on CPUs taken by the peers' start-up).
    if (h.type == MsgType::hello && options_.hold_after_hello > std::chrono::milliseconds(0))
      std::this_thread::sleep_for(options_.hold_after_hello);
  } catch (const std::exception& e) {
    ++malformed_;
    log("rejected a " + to_string(h.type) + " message from " + short_peer_id(h.sender) + " at " +
        in.address + ": " + e.what());
  }
}

Work Node::Impl::launch(CollectiveKind kind, std::span<float> data,
                        const CollectiveOptions& options) {
  auto state = std::make_shared<Work::State>();
  Launched op;
  op.request.kind = kind;
  op.request.count = data.size();
  op.request.options = options;
  if (kind != CollectiveKind::broadcast) op.request.options.root = 0;
  auto& group = op.request.options.group;
  std::sort(group.begin(), group.end());
  group.erase(std::unique(group.begin(), group.end()), group.end());
  op.data = data;
  op.state = state;
  op.launched = Clock::now();
  {
    std::lock_guard lock(mutex_);
    if (stopping_) {
      state->finish({}, "the peer has stopped");
      return Work(state);
    }
    launches_.push_back(std::move(op));
  }
  transport_->wake();
  return Work(state);
}

void Node::Impl::keep_latest_unclaimed(uint64_t tag) {
  {
    std::lock_guard lock(mutex_);
    keep_latest_.push_back(tag);
  }
  transport_->wake();
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

std::vector<MemberView> Node::Impl::members() const {
  std::lock_guard lock(table_.mutex);
  std::vector<MemberView> out;
  const auto now = Clock::now();
  for (const Member& m : table_.members.all())
    out.push_back(
        {m.info, m.state,
         m.info.id == self_id_ ? 0.0 : std::chrono::duration<double>(now - m.last_heard).count()});
  return out;
}

std::vector<LinkView> Node::Impl::links() const {
  std::lock_guard lock(table_.mutex);
  std::vector<LinkView> out;
  for (const auto& [key, l] : table_.members.links()) out.push_back({key.first, key.second, l});
  return out;
}

bool Node::Impl::wait_for_members(size_t count, milliseconds timeout) const {
  std::unique_lock lock(table_.mutex);
  return table_.changed.wait_for(lock, timeout,
                                 [&] { return table_.members.alive().size() >= count; });
}

void Node::Impl::activate() {
  {
    std::lock_guard lock(mutex_);
    activate_ = true;
  }
  transport_->wake();
}

bool Node::Impl::admit(PeerId peer, uint64_t incarnation) {
  std::lock_guard lock(table_.mutex);
  const Member* m = table_.members.find(peer);
  if (m == nullptr || m->state != MemberState::alive || m->info.incarnation != incarnation)
    return false;
  table_.members.mark_active(peer);
  return true;
}

void Node::Impl::set_role(const std::string& role) {
  {
    std::lock_guard lock(table_.mutex);
    MemberInfo& self = table_.members.self_info();
    if (self.role == role) return;
    self.role = role;
    ++self.role_version;
  }
  table_.changed.notify_all();
}

void Node::Impl::set_progress(const std::string& progress) {
  std::lock_guard lock(table_.mutex);
  MemberInfo& self = table_.members.self_info();
  self.progress = progress;
  ++self.progress_version;
}

void Node::Impl::note_link_rate(PeerId from, double mbit_per_s) {
  if (!(mbit_per_s > 0) || from == self_id_) return;
  std::lock_guard lock(table_.mutex);
  table_.members.set_link(from, self_id_, {-1, mbit_per_s});
}

bool Node::Impl::returning() const {
  std::lock_guard lock(table_.mutex);
  return table_.returning;
}

Node::Counters Node::Impl::counters() const {
  return {transport_->rejected() + malformed_.load(), transport_->refused_connections(),
          transport_->bytes_sent() + direct_bytes_sent_.load(), direct_bytes_sent_.load()};
}

// --- Node --------------------------------------------------------------------------------------

Node::Node(NodeOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
Node::~Node() { impl_->stop(true); }
PeerId Node::id() const { return impl_->id(); }
const std::string& Node::endpoint() const { return impl_->endpoint(); }
std::vector<MemberView> Node::members() const { return impl_->members(); }
bool Node::returning() const { return impl_->returning(); }
std::vector<LinkView> Node::links() const { return impl_->links(); }
void Node::note_link_rate(PeerId from, double mbit_per_s) {
  impl_->note_link_rate(from, mbit_per_s);
}
bool Node::wait_for_members(size_t count, milliseconds timeout) const {
  return impl_->wait_for_members(count, timeout);
}
void Node::activate() { impl_->activate(); }
void Node::set_role(const std::string& role) { impl_->set_role(role); }
void Node::set_progress(const std::string& progress) { impl_->set_progress(progress); }
void Node::leave() { impl_->stop(true); }
bool Node::admit(PeerId peer, uint64_t incarnation) { return impl_->admit(peer, incarnation); }
Node::Counters Node::counters() const { return impl_->counters(); }
PeerId Node::self() const { return id(); }
std::string Node::describe(PeerId id) const { return impl_->who(id); }
uint64_t Node::bytes_sent() const { return counters().bytes_sent; }

int64_t Node::joined_at_ms() const {
  for (const auto& m : members())
    if (m.info.id == id()) return m.info.joined_at_ms;
  return 0;
}

Transfer Node::send(PeerId peer, uint64_t tag, std::vector<uint8_t> bytes) {
  return impl_->post(/*send=*/true, peer, tag, std::move(bytes));
}
Transfer Node::recv(PeerId peer, uint64_t tag) {
  return impl_->post(/*send=*/false, peer, tag, {});
}
void Node::keep_latest_unclaimed(uint64_t tag) { impl_->keep_latest_unclaimed(tag); }

Work Node::launch(CollectiveKind kind, std::span<float> data, const CollectiveOptions& options) {
  return impl_->launch(kind, data, options);
}

}  // namespace starling::net
