// The sockets of one peer. It listens on one ROUTER endpoint (every message to this peer arrives
// there) and keeps one DEALER per remote peer it sends to. With CURVE, the ROUTER is a CURVE
// server that accepts only allowlisted keys (ZapHandler) and every DEALER is a CURVE client that
// checks the remote peer's public key, so an outsider can neither deliver nor receive a message.
//
// Not thread-safe: one thread (the peer's communication thread) owns it. Other threads wake that
// thread through wake(), which is safe from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>
#include <zmq.hpp>

#include "starling/net/keys.h"
#include "starling/net/log.h"
#include "starling/net/wire.h"
#include "starling/net/zap_handler.h"

namespace starling::net {

struct TransportOptions {
  std::string listen = "tcp://127.0.0.1:0";  // port 0 picks a free port (see endpoint())
  bool insecure = false;                     // plain TCP, no authentication
  KeyPair keys;                              // required unless insecure
  std::set<std::string> allowed_keys;        // public keys allowed to connect (CURVE)
  uint64_t max_payload_bytes = 256ull << 20;
  LogFn log;
  PeerId self = 0;  // the sender of the replies the transport makes itself (other_version)
  // Called (on the receiving thread) when a socket opened with watch_replies() gets a reply in
  // another wire version: the peer at `endpoint` runs another Starling release.
  std::function<void(const std::string& endpoint, int version)> on_other_version;
};

struct Incoming {
  Header header;
  zmq::message_t payload;
  zmq::message_t routing;  // the ROUTER's id of the connection, for reply()
  std::string address;     // remote IP, for logs
  // When receive() found the message complete (before its frames were read and checked).
  std::chrono::steady_clock::time_point arrived{};
  // Whether receive() was already waiting when the message completed: then `arrived` is within
  // the thread's wake-up of the moment its last byte came. If not, it waited queued while the
  // thread was busy, since some moment after `not_before`.
  bool waited = false;
  // The message completed after this: the last moment receive() found nothing queued (`arrived`
  // for a message it waited for).
  std::chrono::steady_clock::time_point not_before{};
};

class Transport {
 public:
  explicit Transport(TransportOptions options);
  ~Transport();

  // The endpoint others reach this peer at, with the picked port (tcp://HOST:PORT).
  const std::string& endpoint() const { return endpoint_; }
  const std::string& public_key() const { return options_.keys.public_key; }
  bool insecure() const { return options_.insecure; }

  // Opens (or keeps) a sending socket named `slot` to `endpoint`. `server_key` is the public key
  // the listener there must prove it holds (CURVE); a wrong key means nothing gets through.
  void connect(const std::string& slot, const std::string& endpoint, const std::string& server_key);
  void disconnect(const std::string& slot);
  // receive() also reads what comes back on `slot` (a join request's): a peer of another release
  // answers there in its own version, and on_other_version hears of it. Nothing else is expected
  // there; anything else is logged and dropped. Ends with disconnect().
  void watch_replies(const std::string& slot);
  bool connected(const std::string& slot) const { return dealers_.count(slot) > 0; }
  // Whether `slot` is open to exactly this endpoint and key.
  bool connected_to(const std::string& slot, const std::string& endpoint,
                    const std::string& server_key) const;

  // Queues a message on `slot` (connect() first). ZeroMQ owns `payload` from here: no copy.
  // Returns false if no such socket is open.
  bool send(const std::string& slot, Header header, zmq::message_t payload);

  // Closes every sending socket, giving queued messages up to `linger` to leave.
  void close_all(std::chrono::milliseconds linger);

  // Answers the connection a message came in on (used for clients that are not members).
  void reply(const zmq::message_t& routing, Header header, zmq::message_t payload);

  // Waits up to `timeout` for one valid message. Invalid messages are logged with the sender's
  // address and reason, counted, and dropped; one of another wire version is answered with
  // other_version, once per connection. Returns nullopt on timeout or wake().
  std::optional<Incoming> receive(std::chrono::milliseconds timeout);

  // Interrupts a receive() in progress (any thread).
  void wake();

  uint64_t rejected() const { return rejected_.load(); }
  uint64_t refused_connections() const { return zap_ ? zap_->refused() : 0; }
  uint64_t bytes_sent() const { return bytes_sent_.load(); }

 private:
  void reject(const std::string& address, const std::string& reason);
  // Tells the connection `routing` (once) that this peer speaks another wire version.
  void answer_other_version(const zmq::message_t& routing);
  // Reads one message from the watched socket `slot`.
  void read_reply(const std::string& slot, zmq::socket_t& socket);

  TransportOptions options_;
  zmq::context_t context_;
  std::unique_ptr<ZapHandler> zap_;
  zmq::socket_t router_;
  zmq::socket_t wake_pull_;
  std::mutex wake_mutex_;
  zmq::socket_t wake_push_;
  std::map<std::string, zmq::socket_t> dealers_;
  std::map<std::string, std::pair<std::string, std::string>> targets_;  // slot -> endpoint, key
  std::set<std::string> watched_;                                       // slots
  // The last moment receive() found no message queued (Incoming::not_before).
  std::chrono::steady_clock::time_point seen_empty_ = std::chrono::steady_clock::now();
  std::vector<zmq::pollitem_t> poll_items_;  // receive()'s, kept to spare an allocation a call
  std::vector<std::string> poll_slots_;      // the watched slots of poll_items_[2...]
  std::set<std::string> answered_;           // routing ids told of another version (bounded)
  std::string endpoint_;
  std::atomic<uint64_t> rejected_{0};  // read by other threads for counters
  std::atomic<uint64_t> bytes_sent_{0};
};

}  // namespace starling::net
