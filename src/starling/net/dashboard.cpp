#include "starling/net/dashboard.h"

#include <httplib.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "starling/common/error.h"
#include "starling/net/dashboard_page.h"
#include "starling/net/net_config.h"
#include "starling/net/node.h"
#include "starling/net/quiet_thread.h"

namespace starling::net {
namespace {

using Clock = std::chrono::steady_clock;

// The figures of a member's progress that its curves and table show over time.
constexpr const char* kHistoryKeys[] = {"step", "loss", "tokens_per_s", "val_loss", "net_wait_s"};

nlohmann::json progress_of(const MemberInfo& info) {
  auto said = nlohmann::json::parse(info.progress.empty() ? "{}" : info.progress, nullptr,
                                    /*allow_exceptions=*/false);
  return said.is_object() ? said : nlohmann::json::object();
}

std::pair<std::string, int> split_listen(const std::string& listen) {
  const auto colon = listen.rfind(':');
  const std::string why =
      "dashboard address \"" + listen + "\": expected HOST:PORT, e.g. 127.0.0.1:8080";
  if (colon == std::string::npos || colon == 0 || colon + 1 == listen.size())
    throw ConfigError(why);
  // The peers' addresses are tcp://HOST:PORT; the dashboard's is HTTP's, without a scheme.
  if (const auto scheme = listen.find("://"); scheme != std::string::npos)
    throw ConfigError(why + " without a scheme (\"" + listen.substr(0, scheme + 3) +
                      "\": the dashboard serves HTTP on HOST:PORT)");
  const std::string port = listen.substr(colon + 1);
  if (port.find_first_not_of("0123456789") != std::string::npos || port.size() > 5)
    throw ConfigError(why);
  const int p = std::stoi(port);
  if (p > 65535) throw ConfigError(why + " (port above 65535)");
  return {listen.substr(0, colon), p};
}

}  // namespace

StatusReport status_of(const Node& node) {
  StatusReport r;
  r.answered_by = node.id();
  for (const MemberView& m : node.members())
    r.members.push_back({m.info, to_string(m.state), m.seconds_since_heard});
  for (const LinkView& l : node.links()) r.links.push_back({l.from, l.to, l.stats});
  return r;
}

nlohmann::json status_json(const StatusReport& r) {
  nlohmann::json members = nlohmann::json::array();
  for (const StatusMember& m : r.members)
    members.push_back({{"id", short_peer_id(m.info.id)},
                       {"name", m.info.name},
                       {"state", m.state},
                       {"active", m.info.active},
                       {"role", m.info.role},
                       {"endpoint", m.info.endpoint},
                       {"heard_s", m.seconds_since_heard},
                       {"progress", progress_of(m.info)}});
  nlohmann::json links = nlohmann::json::array();
  for (const StatusLink& l : r.links) {
    nlohmann::json link = {{"from", short_peer_id(l.from)}, {"to", short_peer_id(l.to)}};
    // -1 = not measured: null in JSON.
    link["mbit_per_s"] = l.stats.mbit_per_s >= 0 ? nlohmann::json(l.stats.mbit_per_s) : nullptr;
    link["rtt_ms"] = l.stats.rtt_ms >= 0 ? nlohmann::json(l.stats.rtt_ms) : nullptr;
    links.push_back(std::move(link));
  }
  return {{"answered_by", short_peer_id(r.answered_by)}, {"members", members}, {"links", links}};
}

struct Dashboard::Impl {
  Source source;
  DashboardOptions options;
  httplib::Server server;
  std::string host;
  int port = 0;
  Clock::time_point started = Clock::now();

  mutable std::mutex mutex;
  std::condition_variable wake;
  bool stopping = false;
  nlohmann::json latest = nlohmann::json::object();  // status_json of the last answer
  std::string error;                                 // of the last sample; "" = it answered
  Clock::time_point updated{};
  std::map<std::string, std::deque<nlohmann::json>> history;  // by short member id
  std::thread sampler, http;
  std::atomic<bool> http_ended{false};  // listen_after_bind returned

  double since_start() const {
    return std::chrono::duration<double>(Clock::now() - started).count();
  }

  void sample() {
    nlohmann::json view;
    std::string failed;
    try {
      view = status_json(source());
    } catch (const std::exception& e) {
      failed = e.what();
    }
    std::lock_guard lock(mutex);
    error = failed;
    if (!failed.empty()) return;
    latest = std::move(view);
    updated = Clock::now();
    const double t = since_start();
    for (const auto& m : latest["members"]) {
      const auto& said = m["progress"];
      if (!said.contains("step")) continue;  // not training (yet): no point to draw
      auto& points = history[m["id"].get<std::string>()];
      // One point per step the member reports (a member says each step once, or less often).
      if (!points.empty() && points.back()["step"] == said["step"]) continue;
      nlohmann::json point = {{"t", t}};
      for (const char* key : kHistoryKeys)
        if (said.contains(key)) point[key] = said[key];
      points.push_back(std::move(point));
      while (points.size() > options.history) points.pop_front();
    }
  }

  void run_sampler() {
    std::unique_lock lock(mutex);
    while (!stopping) {
      lock.unlock();
      sample();
      lock.lock();
      wake.wait_for(lock, options.every, [&] { return stopping; });
    }
  }
};

Dashboard::Dashboard(Source source, DashboardOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& d = *impl_;
  d.source = std::move(source);
  d.options = std::move(options);
  const auto [host, port] = split_listen(d.options.listen);
  d.host = host;
  // httplib's default also sets SO_REUSEPORT, which lets a second server share a port that is
  // taken (each would get half of the requests): only SO_REUSEADDR, so a taken port is an error.
  d.server.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
  });
  d.server.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(dashboard_page(), "text/html; charset=utf-8");
  });
  d.server.Get("/api/swarm", [this](const httplib::Request&, httplib::Response& res) {
    res.set_header("Cache-Control", "no-store");
    res.set_content(swarm().dump(), "application/json");
  });
  d.server.Get("/api/history", [this](const httplib::Request&, httplib::Response& res) {
    res.set_header("Cache-Control", "no-store");
    res.set_content(history().dump(), "application/json");
  });
  d.port = port == 0 ? d.server.bind_to_any_port(host) : port;
  if (d.port <= 0 || (port != 0 && !d.server.bind_to_port(host, port)))
    throw NetError("dashboard: cannot listen on " + d.options.listen +
                   " (is the port taken, or the host not an address of this machine?)");
  d.http = quiet_thread([&d] {
    d.server.listen_after_bind();
    d.http_ended = true;
  });
  d.sampler = quiet_thread([&d] { d.run_sampler(); });
}

Dashboard::~Dashboard() {
  Impl& d = *impl_;
  {
    std::lock_guard lock(d.mutex);
    d.stopping = true;
  }
  d.wake.notify_all();
  // httplib's stop() does nothing until the server thread has begun to listen, and that thread
  // would then listen forever: a dashboard stopped as soon as it started hung here.
  while (!d.http_ended && !d.server.is_running())
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  d.server.stop();
  if (d.http.joinable()) d.http.join();
  if (d.sampler.joinable()) d.sampler.join();
}

std::string Dashboard::url() const {
  return "http://" + impl_->host + ":" + std::to_string(impl_->port) + "/";
}

nlohmann::json Dashboard::swarm() const {
  const Impl& d = *impl_;
  std::lock_guard lock(d.mutex);
  nlohmann::json out = d.latest;
  out["source"] = d.options.source;
  out["error"] = d.error;
  out["uptime_s"] = d.since_start();
  out["age_s"] =
      d.updated == Clock::time_point{}
          ? nlohmann::json(nullptr)
          : nlohmann::json(std::chrono::duration<double>(Clock::now() - d.updated).count());
  if (!out.contains("members")) out["members"] = nlohmann::json::array();
  if (!out.contains("links")) out["links"] = nlohmann::json::array();
  return out;
}

nlohmann::json Dashboard::history() const {
  const Impl& d = *impl_;
  std::lock_guard lock(d.mutex);
  nlohmann::json members = nlohmann::json::object();
  for (const auto& [id, points] : d.history)
    members[id] = nlohmann::json(std::vector<nlohmann::json>(points.begin(), points.end()));
  return {{"members", members}};
}

void CurrentNode::set(const Node* node) {
  std::lock_guard lock(mutex_);
  node_ = node;
}

StatusReport CurrentNode::status() const {
  std::lock_guard lock(mutex_);
  if (node_ == nullptr) throw NetError("this peer is between two joins of the swarm");
  return status_of(*node_);
}

std::unique_ptr<Dashboard> serve_dashboard(const NetConfig& config,
                                           std::shared_ptr<const CurrentNode> node) {
  if (config.dashboard.empty()) return nullptr;
  const std::string source = "peer " + short_peer_id(node->status().answered_by);
  return std::make_unique<Dashboard>(
      [node] { return node->status(); },
      DashboardOptions{.listen = config.dashboard, .source = source});
}

}  // namespace starling::net
