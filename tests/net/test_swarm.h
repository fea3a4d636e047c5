// Peers of one swarm inside a test process (each with its own ZeroMQ context, as separate
// processes would have), with short timeouts and small chunks, and a sink for their log lines.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "starling/net/node.h"

namespace starling::net::testing {

using namespace std::chrono_literals;

// Collects log lines so tests can look for a reason.
struct LogSink {
  std::mutex mutex;
  std::vector<std::string> lines;
  net::LogFn fn() {
    return [this](const std::string& l) {
      std::lock_guard lock(mutex);
      lines.push_back(l);
    };
  }
  bool contains(const std::string& needle) {
    std::lock_guard lock(mutex);
    for (const auto& l : lines)
      if (l.find(needle) != std::string::npos) return true;
    return false;
  }
};

class Swarm {
 public:
  explicit Swarm(int keys) {
    for (int i = 0; i < keys; ++i) keys_.push_back(net::generate_keypair());
    for (const auto& k : keys_) allow_.push_back({k.public_key, ""});
  }

  net::NodeOptions options(int i, const std::string& join = "") {
    net::NodeOptions o;
    o.name = "p" + std::to_string(i);
    o.keys = keys_[i];
    o.allowlist = allow_;
    if (!join.empty()) o.join = {join};
    o.heartbeat_interval = 100ms;
    o.peer_timeout = 1000ms;
    o.join_timeout = 3000ms;
    o.collective_timeout = 10000ms;
    o.chunk_bytes = 4096;
    o.probe_bytes = 4096;
    o.log = sink.fn();
    return o;
  }

  // Starts `n` peers, the first a new swarm, the others joining through it.
  std::vector<std::unique_ptr<net::Node>> start(int n) {
    std::vector<std::unique_ptr<net::Node>> nodes;
    nodes.push_back(std::make_unique<net::Node>(options(0)));
    for (int i = 1; i < n; ++i)
      nodes.push_back(std::make_unique<net::Node>(options(i, nodes[0]->endpoint())));
    for (auto& node : nodes) EXPECT_TRUE(node->wait_for_members(n, 5s));
    return nodes;
  }

  std::vector<net::KeyPair> keys_;
  std::vector<net::AllowedKey> allow_;
  LogSink sink;
};

}  // namespace starling::net::testing
