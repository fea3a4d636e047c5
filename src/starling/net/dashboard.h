// A live web page of a swarm: its members and their state, the measured link matrix, each
// member's training (step, loss and tokens/s curves, network wait, the strategy's round and
// staleness) and its checkpoints, with the JSON API the page reads. Served over HTTP by
// cpp-httplib from a thread of its own, on loopback unless told otherwise.
//
// The dashboard samples a swarm view (a StatusReport) every `every`: from a member's own node
// (`[net] dashboard` on a peer) or by asking a member over the wire (`starling dashboard --join`).
// It keeps each member's history itself, so the curves start when the dashboard does.
//
//   GET /              the page (it polls the API once a second)
//   GET /api/swarm     the latest view: members (their progress as the members said it), links
//   GET /api/history   per member: {t, step, loss, tokens_per_s, val_loss, net_wait_s} points
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "starling/net/status_client.h"

namespace starling::net {

class Node;

struct DashboardOptions {
  std::string listen = "127.0.0.1:8080";  // HOST:PORT; port 0 = any free port
  std::chrono::milliseconds every{1000};  // between two samples of the swarm
  size_t history = 5000;                  // points kept per member (the oldest go first)
  std::string source;                     // what the page names as its source
};

// The view a member's own node has, as `starling status` would get it from that member.
StatusReport status_of(const Node& node);

// The JSON of a view (GET /api/swarm without the dashboard's own fields).
nlohmann::json status_json(const StatusReport& report);

struct NetConfig;

// The node a member's own dashboard samples. A member that replaces its node (a pipeline stage
// that leaves and joins again) sets the new one, and clears it in between, under the lock every
// sample takes.
class CurrentNode {
 public:
  explicit CurrentNode(const Node* node) : node_(node) {}
  void set(const Node* node);
  // status_of the node; NetError while there is none.
  StatusReport status() const;

 private:
  mutable std::mutex mutex_;
  const Node* node_;
};

class Dashboard;
// A member's own dashboard as `[net] dashboard` asks (nullptr when it is ""), sampling `node`.
std::unique_ptr<Dashboard> serve_dashboard(const NetConfig& config,
                                           std::shared_ptr<const CurrentNode> node);

class Dashboard {
 public:
  using Source = std::function<StatusReport()>;

  // Binds `options.listen` (NetError naming it when it cannot) and starts sampling `source`;
  // a source that throws is shown as the page's error until it answers again.
  Dashboard(Source source, DashboardOptions options);
  ~Dashboard();
  Dashboard(const Dashboard&) = delete;
  Dashboard& operator=(const Dashboard&) = delete;

  // "http://HOST:PORT/" with the port it bound.
  std::string url() const;

  // What the API serves (also for tests).
  nlohmann::json swarm() const;
  nlohmann::json history() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace starling::net
