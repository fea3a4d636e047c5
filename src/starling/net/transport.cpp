#include "starling/net/transport.h"

#include <algorithm>
#include <cerrno>
#include <vector>

#include "starling/common/error.h"
#include "starling/net/zmq_frames.h"

namespace starling::net {
namespace {

void set_common_options(zmq::socket_t& s) {
  s.set(zmq::sockopt::linger, 0);
  // Collectives queue a whole segment at once; a high-water mark would block the communication
  // thread (which must keep receiving) or drop messages, so queues are bounded by the algorithms.
  s.set(zmq::sockopt::sndhwm, 0);
  s.set(zmq::sockopt::rcvhwm, 0);
  s.set(zmq::sockopt::sndbuf, 4 << 20);
  s.set(zmq::sockopt::rcvbuf, 4 << 20);
}

}  // namespace

Transport::Transport(TransportOptions options)
    : options_(std::move(options)),
      context_(1),
      router_(context_, zmq::socket_type::router),
      wake_pull_(context_, zmq::socket_type::pull),
      wake_push_(context_, zmq::socket_type::push) {
  if (!options_.log) options_.log = stderr_log("transport");
  if (!options_.insecure) {
    if (options_.keys.secret_key.empty())
      throw NetError("a secure peer needs a key pair (generate one with `starling keygen`)");
    zap_ = std::make_unique<ZapHandler>(context_, options_.allowed_keys, options_.log);
    router_.set(zmq::sockopt::curve_server, 1);
    router_.set(zmq::sockopt::curve_secretkey, options_.keys.secret_key);
    router_.set(zmq::sockopt::zap_domain, "starling");
  }
  set_common_options(router_);
  router_.set(zmq::sockopt::router_mandatory, 0);
  try {
    router_.bind(options_.listen);
  } catch (const zmq::error_t& e) {
    // ZeroMQ binds to an address or an interface's name: a name it cannot take as either (a
    // host name, a malformed address, IPv6, which it is not set up for) is ENODEV, an address
    // of another machine EADDRNOTAVAIL.
    if (e.num() == ENODEV || e.num() == EADDRNOTAVAIL)
      throw NetError("cannot listen on " + options_.listen + ": its host is not an IPv4 address " +
                     "of this machine or the name of one of its interfaces (e.g. " +
                     "tcp://127.0.0.1:5555, tcp://eth0:5555, or tcp://*:5555 for all of them)");
    throw NetError("cannot listen on " + options_.listen + ": " + e.what());
  }
  endpoint_ = router_.get(zmq::sockopt::last_endpoint);
  const std::string wake_address = "inproc://wake";
  wake_pull_.bind(wake_address);
  wake_push_.connect(wake_address);
}

Transport::~Transport() = default;

void Transport::connect(const std::string& slot, const std::string& endpoint,
                        const std::string& server_key) {
  if (dealers_.count(slot)) return;
  zmq::socket_t s(context_, zmq::socket_type::dealer);
  set_common_options(s);
  if (!options_.insecure) {
    s.set(zmq::sockopt::curve_serverkey, server_key);
    s.set(zmq::sockopt::curve_publickey, options_.keys.public_key);
    s.set(zmq::sockopt::curve_secretkey, options_.keys.secret_key);
  }
  try {
    s.connect(endpoint);
  } catch (const zmq::error_t& e) {
    options_.log("cannot connect to " + endpoint + ": " + e.what());
    return;
  }
  dealers_.emplace(slot, std::move(s));
  targets_[slot] = {endpoint, server_key};
}

bool Transport::connected_to(const std::string& slot, const std::string& endpoint,
                             const std::string& server_key) const {
  const auto it = targets_.find(slot);
  return dealers_.count(slot) > 0 && it != targets_.end() && it->second.first == endpoint &&
         it->second.second == server_key;
}

void Transport::disconnect(const std::string& slot) {
  dealers_.erase(slot);
  targets_.erase(slot);
  watched_.erase(slot);
}

void Transport::watch_replies(const std::string& slot) {
  if (dealers_.count(slot)) watched_.insert(slot);
}

void Transport::close_all(std::chrono::milliseconds linger) {
  for (auto& [slot, s] : dealers_) s.set(zmq::sockopt::linger, static_cast<int>(linger.count()));
  dealers_.clear();
  targets_.clear();
  watched_.clear();
}

bool Transport::send(const std::string& slot, Header header, zmq::message_t payload) {
  const auto it = dealers_.find(slot);
  if (it == dealers_.end()) return false;
  std::byte raw[kHeaderBytes];
  seal_header(header, {static_cast<const std::byte*>(payload.data()), payload.size()}, raw,
              carries_checksum(header.type, options_.insecure));
  bytes_sent_ += kHeaderBytes + payload.size();
  it->second.send(zmq::const_buffer(raw, kHeaderBytes), zmq::send_flags::sndmore);
  it->second.send(payload, zmq::send_flags::none);
  return true;
}

void Transport::reply(const zmq::message_t& routing, Header header, zmq::message_t payload) {
  std::byte raw[kHeaderBytes];
  seal_header(header, {static_cast<const std::byte*>(payload.data()), payload.size()}, raw,
              carries_checksum(header.type, options_.insecure));
  zmq::message_t id(routing.data(), routing.size());
  router_.send(id, zmq::send_flags::sndmore);
  router_.send(zmq::const_buffer(raw, kHeaderBytes), zmq::send_flags::sndmore);
  router_.send(payload, zmq::send_flags::none);
}

void Transport::wake() {
  std::lock_guard lock(wake_mutex_);
  wake_push_.send(zmq::const_buffer("", 0), zmq::send_flags::dontwait);
}

void Transport::reject(const std::string& address, const std::string& reason) {
  ++rejected_;
  options_.log("rejected a message from " + address + ": " + reason);
}

void Transport::answer_other_version(const zmq::message_t& routing) {
  // Once per connection: a peer of another release that keeps sending (heartbeats to a member
  // it was told of) gets one answer; each of its messages costs this peer a set lookup and the
  // log line of its rejection.
  std::string id(static_cast<const char*>(routing.data()), routing.size());
  if (!answered_.insert(std::move(id)).second) return;
  if (answered_.size() > 4096) answered_.clear();
  reply(routing, Header{MsgType::other_version, 0, options_.self}, zmq::message_t());
}

void Transport::read_reply(const std::string& slot, zmq::socket_t& socket) {
  const std::vector<zmq::message_t> frames = read_frames(socket);
  if (frames.empty()) return;
  const auto target = targets_.find(slot);
  const std::string endpoint = target != targets_.end() ? target->second.first : slot;
  const std::span<const std::byte> header{static_cast<const std::byte*>(frames[0].data()),
                                          frames[0].size()};
  if (const auto version = other_wire_version(header)) {
    options_.log("the peer at " + endpoint + " speaks wire version " + std::to_string(*version) +
                 " and this peer version " + std::to_string(kWireVersion) +
                 ": it runs another Starling release");
    if (options_.on_other_version) options_.on_other_version(endpoint, *version);
    return;
  }
  reject(endpoint, "a message came back on a join request's connection (none is expected there)");
}

std::optional<Incoming> Transport::receive(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    std::vector<zmq::pollitem_t>& items = poll_items_;
    items.assign({{router_.handle(), 0, ZMQ_POLLIN, 0}, {wake_pull_.handle(), 0, ZMQ_POLLIN, 0}});
    poll_slots_.assign(watched_.begin(), watched_.end());
    for (const auto& slot : poll_slots_)
      items.push_back({dealers_.at(slot).handle(), 0, ZMQ_POLLIN, 0});
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    // First what is already queued, then (with time left) a wait: a message the wait returns
    // for came while this thread was waiting (Incoming::waited).
    bool waited = false;
    try {
      zmq::poll(items.data(), items.size(), std::chrono::milliseconds(0));
      if (!(items[0].revents & ZMQ_POLLIN)) seen_empty_ = std::chrono::steady_clock::now();
      const bool any =
          std::any_of(items.begin(), items.end(), [](const auto& i) { return i.revents != 0; });
      if (!any && left > std::chrono::milliseconds(0)) {
        zmq::poll(items.data(), items.size(), left);
        waited = true;
      }
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) throw;
      continue;  // a signal (or a stop and continue): poll again for the time left
    }
    const auto arrived = std::chrono::steady_clock::now();
    const auto not_before = waited ? arrived : seen_empty_;
    // What the wait returned for came about now: the queue was empty until then.
    if (waited) seen_empty_ = arrived;
    for (size_t i = 0; i < poll_slots_.size(); ++i) {
      const auto it = dealers_.find(poll_slots_[i]);
      if ((items[2 + i].revents & ZMQ_POLLIN) && it != dealers_.end())
        read_reply(it->first, it->second);
    }
    if (items[1].revents & ZMQ_POLLIN) {
      zmq::message_t drop;
      while (wake_pull_.recv(drop, zmq::recv_flags::dontwait)) {
      }
      return std::nullopt;
    }
    if (!(items[0].revents & ZMQ_POLLIN)) return std::nullopt;

    // A ROUTER delivers [routing id][frames...]; read every frame of the message.
    std::vector<zmq::message_t> frames = read_frames(router_);
    std::string address = "unknown address";
    if (frames.size() >= 2) {
      try {
        address = frames[1].gets("Peer-Address");
      } catch (const zmq::error_t&) {
      }
    }
    // Another release's message is answered whatever its shape: the version says why it fails.
    if (frames.size() >= 2) {
      if (const auto version = other_wire_version(
              {static_cast<const std::byte*>(frames[1].data()), frames[1].size()})) {
        reject(address, other_wire_version_error(*version));
        answer_other_version(frames[0]);
        continue;
      }
    }
    if (frames.size() != 3) {
      reject(address, "expected 2 frames (header, payload), got " +
                          std::to_string(frames.empty() ? 0 : frames.size() - 1));
      continue;
    }
    auto decoded =
        decode_header({static_cast<const std::byte*>(frames[1].data()), frames[1].size()},
                      options_.max_payload_bytes);
    if (!decoded.ok()) {
      reject(address, decoded.error);
      continue;
    }
    const Header& h = decoded.header;
    const std::string from =
        address + " (peer " + short_peer_id(h.sender) + ", " + to_string(h.type) + ")";
    if (auto bad =
            check_payload(h, {static_cast<const std::byte*>(frames[2].data()), frames[2].size()},
                          carries_checksum(h.type, options_.insecure));
        !bad.empty()) {
      reject(from, bad);
      continue;
    }
    if (!options_.insecure) {
      // The claimed sender must be the key that authenticated this connection.
      std::string key;
      try {
        key = frames[1].gets("User-Id");
      } catch (const zmq::error_t&) {
      }
      if (key.size() != 40 || peer_id_from_public_key(key) != h.sender) {
        reject(from, "sender id does not match the connection's CURVE key");
        continue;
      }
    }
    Incoming in;
    in.header = h;
    in.payload = std::move(frames[2]);
    in.routing = std::move(frames[0]);
    in.address = std::move(address);
    in.arrived = arrived;
    in.waited = waited;
    in.not_before = not_before;
    return in;
  }
}

}  // namespace starling::net
