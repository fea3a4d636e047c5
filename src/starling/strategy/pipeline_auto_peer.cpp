#include "starling/strategy/pipeline_auto_peer.h"

#include <algorithm>
#include <cmath>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <thread>

#include "starling/common/error.h"
#include "starling/sched/workload.h"
#include "starling/strategy/pipeline_config.h"
#include "starling/strategy/plan_trials.h"
#include "starling/train/config.h"
#include "starling/train/metrics.h"

namespace starling::strategy {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

// Mailbox tags: a peer's measurements to the planner, and the plan back.
constexpr uint64_t kReportTag = 0x706970656175'7472;  // "pipeautr"
constexpr uint64_t kPlanTag = 0x706970656175'7470;    // "pipeautp"
// A round trip longer than this is no link's delay but a peer that stalled: a report leaves it out
// (gossip keeps longer ones), and one received with it is refused.
constexpr double kMaxRttS = 60;

std::string who(net::PeerId id, const std::string& name) {
  return "peer " + net::short_peer_id(id) + (name.empty() ? std::string() : " (" + name + ")");
}

// What a trial measured, to the planner.
constexpr uint64_t kTimingTag = 0x706970656175'7474;  // "pipeautt"

// The bytes of a received message, or NetError saying what did not come from whom within the
// config key `key`'s `timeout`.
std::vector<uint8_t> receive(net::Node& node, net::PeerId from, uint64_t tag, milliseconds timeout,
                             const std::string& what, const char* key = "net.join_timeout_s") {
  net::Transfer t = node.recv(from, tag);
  if (!t.wait_for(timeout))
    throw NetError("pipeline: " + what + " did not come from peer " + net::short_peer_id(from) +
                   " within " + key + " = " + std::to_string(timeout.count() / 1000) + " s");
  return t.wait();
}

std::vector<uint8_t> encode_timing(net::PeerId id, int trial, double seconds_per_micro_batch) {
  const std::string text = nlohmann::json{{"id", net::format_peer_id(id)},
                                          {"trial", trial},
                                          {"seconds_per_micro_batch", seconds_per_micro_batch}}
                               .dump();
  return {text.begin(), text.end()};
}

// The compute per micro-batch `sender` measured in trial `trial`, or NetError naming it.
double decode_timing(std::span<const uint8_t> bytes, net::PeerId sender, int trial) {
  const std::string where = "pipeline: what peer " + net::short_peer_id(sender) +
                            " measured in trial " + std::to_string(trial);
  double seconds = 0;
  try {
    const auto j = nlohmann::json::parse(bytes.begin(), bytes.end());
    if (j.at("id").get<std::string>() != net::format_peer_id(sender))
      throw NetError(where + " speaks of another peer");
    if (j.at("trial").get<int>() != trial)
      throw NetError(where + " is about trial " + std::to_string(j.at("trial").get<int>()));
    seconds = j.at("seconds_per_micro_batch").get<double>();
  } catch (const nlohmann::json::exception& e) {
    throw NetError(where + " is malformed: " + e.what());
  }
  if (!(seconds > 0) || !std::isfinite(seconds))
    throw NetError(where + " is a compute time of " + std::to_string(seconds) + " s");
  return seconds;
}

// The plan a peer received from the planner, checked to place this swarm's peers (`self` is
// left for set_self).
AutoPipeline received_plan(const std::vector<uint8_t>& bytes, net::PeerId planner,
                           const std::vector<std::string>& expected_ids) {
  AutoPipeline plan = parse_auto_pipeline(std::string(bytes.begin(), bytes.end()),
                                          "the plan from peer " + net::short_peer_id(planner));
  if (plan.peer_ids != expected_ids)
    throw NetError("pipeline: the plan from peer " + net::short_peer_id(planner) +
                   " places other peers than the swarm's");
  return plan;
}

void set_self(AutoPipeline& plan, net::PeerId me) {
  const auto at = std::find(plan.peer_ids.begin(), plan.peer_ids.end(), net::format_peer_id(me));
  plan.self = static_cast<int>(at - plan.peer_ids.begin());
}

// The bandwidth this peer measured from each of `others` (gossip's probes) and the shortest round
// trip of its pings to each: heartbeats carry a ping every net.heartbeat_ms, and one queued behind
// a probe on a slow link reads long, so the shortest of several is the link's own delay. Waits
// for probes still on their way (a newcomer's arrive right behind its hello) and for
// kRttSamples pings to every other peer once its probe has been read (the ones before count for
// the shortest, not for the number), up to kMeasureLimit.
void measure_links(const net::Node& node, const std::vector<net::PeerId>& others, PeerReport& r) {
  constexpr int kRttSamples = 4;
  constexpr auto kMeasureLimit = std::chrono::seconds(10);
  const auto start = steady_clock::now();
  std::map<net::PeerId, std::pair<double, int>> seen;  // the latest round trip, how many so far
  for (;;) {
    for (const net::LinkView& l : node.links()) {
      if (l.to == node.id() && l.stats.mbit_per_s > 0)
        r.inbound_bytes_per_s[l.from] = l.stats.mbit_per_s * 1e6 / 8;
      if (l.from == node.id() && l.stats.rtt_ms >= 0) {
        const double rtt = l.stats.rtt_ms / 1e3;
        auto& [latest, count] = seen[l.to];
        if (rtt == latest) continue;  // the same pong as before
        latest = rtt;
        if (r.inbound_bytes_per_s.count(l.to) != 0) ++count;
        const auto it = r.rtt_s.find(l.to);
        if (it == r.rtt_s.end() || rtt < it->second) r.rtt_s[l.to] = rtt;
      }
    }
    const bool all = std::all_of(others.begin(), others.end(), [&](net::PeerId p) {
      const auto it = seen.find(p);
      return r.inbound_bytes_per_s.count(p) != 0 && it != seen.end() &&
             it->second.second >= kRttSamples;
    });
    if (all || steady_clock::now() - start > kMeasureLimit) return;
    std::this_thread::sleep_for(milliseconds(100));
  }
}

}  // namespace

std::vector<uint8_t> encode_report(const PeerReport& r) {
  nlohmann::json in = nlohmann::json::object(), rtt = nlohmann::json::object();
  for (const auto& [from, rate] : r.inbound_bytes_per_s) in[net::format_peer_id(from)] = rate;
  for (const auto& [to, seconds] : r.rtt_s)
    if (seconds >= 0 && seconds <= kMaxRttS) rtt[net::format_peer_id(to)] = seconds;
  const nlohmann::json j = {{"id", net::format_peer_id(r.id)},
                            {"name", r.name},
                            {"compute_s", r.compute_s},
                            {"inbound_bytes_per_s", in},
                            {"rtt_s", rtt}};
  const std::string text = j.dump();
  return {text.begin(), text.end()};
}

PeerReport decode_report(std::span<const uint8_t> bytes, net::PeerId sender) {
  const std::string where = "pipeline: the measurements of peer " + net::short_peer_id(sender);
  PeerReport r;
  try {
    const auto j = nlohmann::json::parse(bytes.begin(), bytes.end());
    if (j.at("id").get<std::string>() != net::format_peer_id(sender))
      throw NetError(where + " speak of another peer");
    r.id = sender;
    r.name = j.at("name").get<std::string>().substr(0, 128);
    r.compute_s = j.at("compute_s").get<double>();
    auto peer_key = [&](const std::string& key) {
      const auto id = net::parse_peer_id(key);
      if (!id)
        throw NetError(where + " name a link with \"" + key.substr(0, 32) +
                       "\", which is no peer id");
      return *id;
    };
    for (const auto& [key, rate] : j.at("inbound_bytes_per_s").items()) {
      const net::PeerId from = peer_key(key);
      const double v = rate.get<double>();
      if (!(v > 0) || !std::isfinite(v))
        throw NetError(where + " give the link from " + key + " a rate of " + std::to_string(v));
      r.inbound_bytes_per_s[from] = v;
    }
    if (j.contains("rtt_s"))
      for (const auto& [key, seconds] : j.at("rtt_s").items()) {
        const net::PeerId to = peer_key(key);
        const double v = seconds.get<double>();
        if (!(v >= 0) || !std::isfinite(v) || v > kMaxRttS)
          throw NetError(where + " give the link to " + key + " a round trip of " +
                         std::to_string(v) + " s");
        r.rtt_s[to] = v;
      }
  } catch (const nlohmann::json::exception& e) {
    throw NetError(where + " are malformed: " + e.what());
  }
  if (!(r.compute_s > 0) || !std::isfinite(r.compute_s))
    throw NetError(where + " give a compute time of " + std::to_string(r.compute_s) + " s");
  return r;
}

sched::CostTable swarm_costs(const sched::CostTable& reference,
                             const std::vector<PeerReport>& reports,
                             std::vector<std::string>* unmeasured) {
  sched::CostTable t = reference;
  const double reference_s = sched::total_compute_s(reference);
  const size_t n = reports.size();
  t.devices.clear();
  for (const PeerReport& r : reports)
    t.devices.push_back({.name = who(r.id, r.name), .speed = reference_s / r.compute_s});
  t.links.assign(n, std::vector<sched::LinkCost>(n));
  auto measured = [&](size_t from, size_t to) {
    const auto& in = reports[to].inbound_bytes_per_s;
    const auto it = in.find(reports[from].id);
    return it == in.end() ? 0.0 : it->second;
  };
  auto rtt = [&](size_t a, size_t b) {
    for (auto [x, y] : {std::pair{a, b}, std::pair{b, a}}) {
      const auto& pings = reports[x].rtt_s;
      if (const auto it = pings.find(reports[y].id); it != pings.end()) return it->second;
    }
    return 0.0;
  };
  for (size_t a = 0; a < n; ++a)
    for (size_t b = 0; b < n; ++b) {
      if (a == b) continue;
      double rate = measured(a, b);
      if (rate == 0) rate = measured(b, a);
      if (rate == 0) {
        rate = sched::kUnshapedBytesPerS;
        if (unmeasured != nullptr && a < b)
          unmeasured->push_back(t.devices[a].name + " - " + t.devices[b].name);
      }
      t.links[a][b] = {.bytes_per_s = rate, .latency_s = rtt(a, b) / 2};
    }
  return t;
}

void check_auto_pipeline_peer(const train::RunConfig& c) {
  const PipelineConfig& p = c.pipeline;
  if (p.stage >= 0 || p.replica >= 0 || p.replicas > 0)
    throw ConfigError(
        "pipeline.stages = \"auto\" places every peer and chooses the replicas: drop "
        "pipeline.stage, pipeline.replica and pipeline.replicas");
  if (c.net.min_peers < 2)
    throw ConfigError(
        "pipeline.stages = \"auto\" on a peer: the peers measure themselves and plan once all "
        "of them are in the swarm, so set net.min_peers to the swarm's size (at least 2; "
        "WORLD_SIZE sets it under a launcher such as torchrun), or start a local swarm with "
        "`starling train --peers N`");
  // Before the others wait for it.
  check_any_cut(c);
}

void check_any_cut(const train::RunConfig& c) {
  PipelineConfig any_cut = c.pipeline;
  any_cut.auto_stages = false;
  any_cut.num_stages = 2;
  check_pipeline_peer(any_cut, {.strategy_kind = c.strategy.kind,
                                .dtype = c.train.dtype,
                                .net_backend = c.net.backend,
                                .swapped = c.swap.enabled(),
                                .stage = 0,
                                .replica = 0,
                                .replicas = 1});
}

AutoPipeline agree_on_pipeline(net::Node& node, const train::RunConfig& config,
                               milliseconds timeout, sched::CostTable* swarm) {
  const auto peers = static_cast<size_t>(config.net.min_peers);
  std::cerr << "pipeline: waiting for " << peers
            << " peers to measure the swarm and plan the stages (pipeline.stages = \"auto\")\n";
  if (!node.wait_for_members(peers, timeout))
    throw NetError("pipeline: only " + std::to_string(node.members().size()) +
                   " of net.min_peers = " + std::to_string(peers) +
                   " peers arrived within net.join_timeout_s = " +
                   std::to_string(timeout.count() / 1000) + " s");
  std::vector<net::PeerId> ids;
  for (const net::MemberView& m : node.members()) {
    if (m.state != net::MemberState::alive) continue;
    if (m.info.role != kAutoPipelineRole)
      throw NetError("pipeline: " + who(m.info.id, m.info.name) + " announces \"" +
                     m.info.role.substr(0, 64) +
                     "\" in a swarm that plans its pipeline (pipeline.stages = \"auto\" on every "
                     "peer, or explicit stages on every peer)");
    ids.push_back(m.info.id);
  }
  if (ids.size() != peers)
    throw NetError("pipeline: " + std::to_string(ids.size()) +
                   " peers are in a swarm planned for net.min_peers = " + std::to_string(peers));
  std::sort(ids.begin(), ids.end());
  const net::PeerId planner = ids.front();
  std::vector<net::PeerId> others;
  for (net::PeerId id : ids)
    if (id != node.id()) others.push_back(id);

  // Measure this peer, and report to the planner (itself included). The links first: a profile
  // keeps the cores busy, and a probe timed meanwhile would read slower than its link.
  PeerReport mine{.id = node.id(), .name = config.net.name};
  measure_links(node, others, mine);
  const double t0 = train::now_s();
  const sched::CostTable own = sched::profile_workload(config);
  mine.compute_s = sched::total_compute_s(own);
  std::cerr << "pipeline: this peer computes a micro-batch's forward and backward in "
            << train::fmt("%.1f", mine.compute_s * 1e3) << " ms (measured in "
            << train::fmt("%.1f", train::now_s() - t0) << " s)\n";
  node.send(planner, kReportTag, encode_report(mine)).wait();

  AutoPipeline plan;
  if (node.id() == planner) {
    std::vector<PeerReport> reports;
    for (net::PeerId id : ids)
      reports.push_back(
          decode_report(receive(node, id, kReportTag, timeout, "its measurements"), id));
    const sched::CostTable reference = config.pipeline.profile.empty() ? own : model_costs(config);
    std::vector<std::string> unmeasured;
    sched::CostTable t = swarm_costs(reference, reports, &unmeasured);
    plan = plan_on_costs(config, t, "the swarm's measurements");
    const CalibrationChoice calibration = calibration_steps(config);
    plan.trial_steps = calibration.steps;
    std::cerr << "plan: calibration: " << calibration.why << "\n";
    if (swarm != nullptr) *swarm = t;
    std::string measured = "measured by the peers:\n";
    for (size_t d = 0; d < reports.size(); ++d)
      measured += "  device " + std::to_string(d) + ": " + t.devices[d].name + ", " +
                  train::fmt("%.1f", reports[d].compute_s * 1e3) + " ms per micro-batch\n";
    for (size_t a = 0; a < reports.size(); ++a)
      for (size_t b = a + 1; b < reports.size(); ++b)
        measured += "  link " + std::to_string(a) + "-" + std::to_string(b) + ": " +
                    train::fmt("%.3g", t.links[a][b].bytes_per_s * 8 / 1e6) + " Mbit/s to " +
                    std::to_string(b) + ", " +
                    train::fmt("%.3g", t.links[b][a].bytes_per_s * 8 / 1e6) + " Mbit/s back, " +
                    train::fmt("%.3g", t.links[a][b].latency_s * 1e3) + " ms each way\n";
    for (const std::string& pair : unmeasured)
      measured += "  no bandwidth measured between " + pair + ": taken as unshaped\n";
    plan.report = measured + plan.report;
    for (net::PeerId id : ids) plan.peer_ids.push_back(net::format_peer_id(id));
    const std::string text = auto_pipeline_text(plan);
    for (net::PeerId id : others) node.send(id, kPlanTag, {text.begin(), text.end()}).wait();
  } else {
    std::vector<std::string> expected;
    for (net::PeerId id : ids) expected.push_back(net::format_peer_id(id));
    plan = received_plan(receive(node, planner, kPlanTag, timeout, "the plan"), planner, expected);
  }
  set_self(plan, node.id());
  return plan;
}

AutoPipeline calibrate_among_peers(net::Node& node, const train::RunConfig& config,
                                   AutoPipeline plan, const sched::CostTable& swarm,
                                   const RunTrial& run_trial, milliseconds timeout) {
  std::vector<net::PeerId> ids;
  // The planner's own ids come from format_peer_id; the others' plan was read by
  // parse_auto_pipeline, which checks them.
  for (const std::string& id : plan.peer_ids) ids.push_back(net::parse_peer_id(id).value());
  // agree_on_pipeline's planner: the lowest id.
  const net::PeerId planner = *std::min_element(ids.begin(), ids.end());
  const bool planning = node.id() == planner;
  std::optional<PlanTrials> trials;
  if (planning) trials.emplace(config, swarm, plan, "the swarm's measurements");
  const sched::TimedSteps timed = sched::timed_steps(plan.trial_steps, round_steps(config));
  if (planning) std::cerr << trial_note(config, plan.trial_steps);
  for (int n = 1; plan.trial_steps > 0; ++n) {
    const double mine = run_trial(plan, n);
    node.send(planner, kTimingTag, encode_timing(node.id(), n, mine)).wait();
    if (planning) {
      std::vector<sched::StageTiming> timings;
      for (size_t d = 0; d < ids.size(); ++d) {
        const auto bytes =
            receive(node, ids[d], kTimingTag, timeout,
                    "what trial " + std::to_string(n) + " measured", "net.collective_timeout_s");
        const auto& range = plan.stages.at(static_cast<size_t>(plan.stage_of.at(d)));
        timings.push_back({.device = static_cast<int>(d),
                           .first = range.first,
                           .last = range.second,
                           .seconds_per_micro_batch = decode_timing(bytes, ids[d], n)});
      }
      const bool again = trials->record(timings);
      const int64_t trial_steps = plan.trial_steps;
      plan = again ? trials->next() : trials->kept(timed);
      plan.trial_steps = again ? trial_steps : 0;
      plan.peer_ids.clear();
      for (net::PeerId id : ids) plan.peer_ids.push_back(net::format_peer_id(id));
      if (again) std::cerr << "plan: the measured speeds move the stages\n" << plan.report;
      const std::string text = auto_pipeline_text(plan);
      for (net::PeerId id : ids)
        if (id != planner) node.send(id, kPlanTag, {text.begin(), text.end()}).wait();
    } else {
      const std::vector<std::string> expected = plan.peer_ids;
      plan = received_plan(
          receive(node, planner, kPlanTag, timeout, "the plan after trial " + std::to_string(n),
                  "net.collective_timeout_s"),
          planner, expected);
    }
    set_self(plan, node.id());
  }
  return plan;
}

}  // namespace starling::strategy
