// ZeroMQ's authentication hook (ZAP). Every incoming CURVE handshake on a context asks the handler
// bound at inproc://zeromq.zap.01; this one accepts only public keys on the swarm's allowlist and
// tags accepted connections with the key (read back as the message property "User-Id"), so a
// message's claimed sender can be checked against the key that authenticated it.
#pragma once

#include <atomic>
#include <set>
#include <string>
#include <thread>
#include <zmq.hpp>

#include "starling/net/log.h"

namespace starling::net {

class ZapHandler {
 public:
  // Binds the handler on `context` (must happen before any CURVE server socket binds).
  ZapHandler(zmq::context_t& context, std::set<std::string> allowed_keys, LogFn log);
  ~ZapHandler();
  ZapHandler(const ZapHandler&) = delete;
  ZapHandler& operator=(const ZapHandler&) = delete;

  uint64_t refused() const { return refused_.load(); }

 private:
  void run();

  zmq::socket_t socket_;
  std::set<std::string> allowed_;
  LogFn log_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> refused_{0};
  std::thread thread_;
};

}  // namespace starling::net
