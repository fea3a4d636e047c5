#include "starling/cli/local_swarm.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "starling/cli/cpu_quota.h"
#include "starling/cli/peer_sets.h"
#include "starling/common/cgroup_cpu_limit.h"
#include "starling/common/cpu_runtime.h"
#include "starling/common/dir_lock.h"
#include "starling/common/error.h"
#include "starling/common/process.h"
#include "starling/common/signal_clock.h"
#include "starling/net/keys.h"
#include "starling/net/netlab.h"
#include "starling/sched/cost_table.h"
#include "starling/strategy/auto_pipeline.h"
#include "starling/strategy/pipeline_auto_peer.h"
#include "starling/strategy/plan_trials.h"
#include "starling/strategy/strategy_config.h"
#include "starling/train/checkpoint_dir.h"
#include "starling/train/config.h"
#include "starling/train/events.h"
#include "starling/train/metrics.h"

namespace starling::cli {
namespace fs = std::filesystem;
namespace {

using train::fmt;

std::atomic<int> g_signal{0};
std::atomic<int> g_signal_count{0};  // 1 once told to stop; 2 once told again (signal_clock.h)
std::atomic<int64_t> g_first_signal_ns{0};
extern "C" void on_swarm_signal(int sig) {
  g_signal.store(sig);
  const int64_t now = signal_clock_ns();
  int64_t first = 0;
  if (g_first_signal_ns.compare_exchange_strong(first, now))
    g_signal_count.store(1);
  else if (now - first >= kSecondSignalGapNs)
    g_signal_count.store(2);
}

// Keys of a local swarm: made once per run directory, so a resumed swarm keeps its identities.
std::vector<fs::path> ensure_keys(const fs::path& dir, int peers) {
  fs::create_directories(dir);
  std::vector<fs::path> files;
  for (int i = 0; i < peers; ++i) {
    const fs::path key = dir / ("peer-" + std::to_string(i) + ".key");
    if (!fs::exists(key))
      net::save_keypair(net::generate_keypair(), key, "peer-" + std::to_string(i));
    files.push_back(key);
  }
  std::ofstream allow(dir / "allowlist");
  for (int i = 0; i < peers; ++i)
    allow << net::load_keypair(files[i]).public_key << " peer-" << i << "\n";
  return files;
}

struct PeerView {
  int64_t step = 0, steps = 0;
  double loss = 0, tokens_per_s = 0, bytes_sent = 0, net_wait_s = 0, elapsed_s = 0;
  uint64_t tokens = 0;
  int swarm = 0;
  bool running = true;
  bool stopped = false;  // killed by the launcher (another peer failed before the first step)
  std::optional<int> exit_code;
};

// The last non-empty line of a peer's log: its error, when it failed.
std::string last_line(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line))
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  return last;
}

// The lab a swarm runs on, as the scheduler sees it: --lab, or every link at --link-rate and
// each peer's --peer-cpus.
sched::LabSpec effective_lab(const LocalSwarmOptions& o) {
  if (o.lab) return *o.lab;
  sched::LabSpec lab;
  lab.peers = o.peers;
  lab.source = "--link-rate";
  const double bits = o.link_rate.empty() || o.link_rate == "unlimited"
                          ? 0
                          : sched::parse_link_rate(o.link_rate, "--link-rate") * 8;
  lab.bits_per_s.assign(o.peers, std::vector<double>(o.peers, bits));
  for (int i = 0; i < o.peers; ++i) lab.bits_per_s[i][i] = 0;
  // A star: each peer's one shaped upload carries everything it sends.
  if (bits > 0) lab.egress_bits_per_s.assign(o.peers, bits);
  lab.cpus = o.peer_cpus;
  return lab;
}

// Each peer's steady passes last at least this long: hundreds of a CPU quota's 10 ms periods (or
// of the scheduler's slices between peers sharing a core), however small the model (a pass of a
// tiny one fits in one period's allowance), and several passes of a large one. Four gpt2-mini
// profiles at 0.45 CPU at once, ten times each way, averaged 2.57-3.52 s per micro-batch over
// 3 s (a pass takes about 2.7 s there) and 2.60-2.97 s over 10 s (docs/scheduler.md).
constexpr double kPlaceProfileSeconds = 10;

// pipeline.lab_speeds = "profiled": each peer's speed where it will compute. Every peer profiles
// the model at once in its place (`starling plan profile` on the run's config, so with the peers'
// threads; in its CPU quota, if it has one), as the peers will compute beside each other; a peer's
// speed is the reference's time (the nodes of `costs`: pipeline.profile or the launcher's profile,
// taken alone, a device of speed 1) over the time its own profile measured. A quota's share alone
// misses what CFS throttling in short periods and the shared cores cost: on a 2-core machine a
// peer at 0.25 CPU computed a whole step 1.16-1.31x slower than a quarter of its speed alone; and
// peers without quotas whose threads outnumber the cores are each slower than the reference too.
// `prefixes` holds each peer's command prefix (its quota's, or empty) and `places` how each is
// named in the lines returned, which say what each profile measured.
std::string profile_in_place(sched::CostTable& costs, const train::RunConfig& config,
                             const std::vector<std::vector<std::string>>& prefixes,
                             const std::vector<std::string>& places, const std::string& starling,
                             const fs::path& dir) {
  fs::remove_all(dir);
  fs::create_directories(dir);
  // The model and the training settings are what a profile measures; the pipeline's own keys
  // would only be checked again.
  train::RunConfig profiled = config;
  profiled.pipeline = strategy::PipelineConfig{};
  const fs::path cfg = dir / "config.toml";
  std::ofstream(cfg) << train::to_toml(profiled);
  std::vector<Process> procs;
  auto table_of = [&](size_t i) { return dir / ("peer-" + std::to_string(i) + ".json"); };
  auto log_of = [&](size_t i) { return (dir / ("peer-" + std::to_string(i) + ".log")).string(); };
  for (size_t i = 0; i < prefixes.size(); ++i) {
    std::vector<std::string> argv = prefixes[i];
    argv.insert(argv.end(),
                {starling, "plan", "profile", "-c", cfg.string(), "-o", table_of(i).string(),
                 "--steady-seconds", fmt("%g", kPlaceProfileSeconds)});
    procs.emplace_back(argv, log_of(i));
  }
  const double reference_s = sched::total_compute_s(costs);
  std::string lines;
  for (size_t i = 0; i < procs.size(); ++i) {
    procs[i].read_all(std::chrono::hours(1));
    const auto code = procs[i].wait(std::chrono::minutes(1));
    if (code.value_or(-1) != 0) {
      const std::string why = last_line(log_of(i));
      throw Error("the profile of peer " + std::to_string(i) + " (" + places[i] + ") failed" +
                  (why.empty() ? std::string() : ": " + why) + "; see " + log_of(i) +
                  " (pipeline.lab_speeds = \"quotas\" plans without it)");
    }
    const double own_s = sched::total_compute_s(sched::read_cost_table(table_of(i)));
    if (!(own_s > 0)) throw Error(table_of(i).string() + ": the profile measured no time");
    const double assumed = costs.devices[i].speed;
    costs.devices[i].speed = reference_s / own_s;
    lines += "  peer " + std::to_string(i) + ", " + places[i] + ": " + fmt("%.1f", own_s * 1e3) +
             " ms per micro-batch, speed " + fmt("%.3f", costs.devices[i].speed) + " (assumed " +
             fmt("%.3f", assumed) + ")\n";
  }
  return lines;
}

// When a run of stages = "auto" ends: how it went against its plan, and, where the peers
// computed far from the speeds an uncalibrated plan assumed, how to plan from measured ones (not
// for a resumed run, which keeps its plan).
void report_against_plan(const strategy::AutoPipeline& plan,
                         const std::vector<strategy::PeerRecords>& records,
                         const train::RunConfig& config, bool hint) {
  const auto run = strategy::run_against_auto_pipeline(plan, records, config);
  if (!run) return;
  std::cerr << "plan: against the run: " << run->describe();
  double low = run->peers.front().ratio(), high = low;
  for (const auto& p : run->peers) {
    low = std::min(low, p.ratio());
    high = std::max(high, p.ratio());
  }
  // Outside what the plan's own noise explains (a calibrated plan lands within about 15%).
  if (hint && (low < 0.8 || high > 1.25)) {
    const int64_t round = strategy::round_steps(config);
    std::cerr << "plan: the peers computed in x" << fmt("%.2f", low) << "-x" << fmt("%.2f", high)
              << " the times the plan assumed; pipeline.calibrate_steps = "
              << (round > 1 ? 2 * round : 3)
              << " plans from the speeds a trial of the plan measures\n";
  }
}

// The same for a plan the peers agreed on: each keeps a copy in its directory, which says
// which device of the plan it is. Copies that are not one plan, each device held once, say
// nothing (a peer's directory left from another run).
void report_against_peers_plan(const fs::path& root, int peers, const train::RunConfig& config,
                               bool hint) {
  std::optional<strategy::AutoPipeline> plan;
  std::vector<strategy::PeerRecords> records;
  std::set<int> devices;
  for (int i = 0; i < peers; ++i) {
    const fs::path dir = root / ("peer-" + std::to_string(i));
    strategy::AutoPipeline own;
    try {
      own = strategy::read_auto_pipeline(dir / "auto_pipeline.json");
    } catch (const ConfigError&) {
      return;  // a peer that never kept a plan: nothing to set the run against
    }
    if (own.self < 0 || !devices.insert(own.self).second) return;
    if (plan && (own.stages != plan->stages || own.stage_of != plan->stage_of ||
                 own.replica_of != plan->replica_of || own.peer_ids != plan->peer_ids))
      return;
    records.push_back({.device = own.self, .peer = i, .metrics = dir / "metrics.jsonl"});
    if (!plan) plan = std::move(own);
  }
  if (plan) report_against_plan(*plan, records, config, hint);
}

// Where each peer of a resumed swarm goes on from, from the checkpoint it will resume
// (train::find_checkpoint): "resuming every peer from step 80 (runs/x/peer-<i>/checkpoints)", or
// peer by peer where they differ.
// A strategy.kind other than the checkpoints' is said too: the peers go on with their
// parameters, moments and step, and leave the old strategy's own state behind.
std::string resume_note(const fs::path& out, int peers, const std::string& kind) {
  std::vector<std::string> steps;
  std::string saved_kind;
  for (int i = 0; i < peers; ++i) {
    const fs::path peer = out / ("peer-" + std::to_string(i));
    std::string name;
    try {
      if (train::holds_checkpoint(peer)) {
        const fs::path dir = train::find_checkpoint(peer);
        name = dir.filename().string();
        std::ifstream meta(dir / "meta.json");
        const nlohmann::json j = nlohmann::json::parse(meta, nullptr, false);
        if (saved_kind.empty() && j.is_object() && j.contains("strategy") &&
            j["strategy"].is_object())
          saved_kind = j["strategy"].value("kind", std::string());
      }
    } catch (const Error&) {
      // The peer itself says what is wrong with it.
    } catch (const nlohmann::json::exception&) {
    }
    const bool named = name.rfind("step_", 0) == 0 && name.size() > 5 &&
                       name.find_first_not_of("0123456789", 5) == std::string::npos;
    steps.push_back(named ? std::to_string(std::stoll(name.substr(5))) : "");
  }
  const std::string other_kind = saved_kind.empty() || saved_kind == kind
                                     ? ""
                                     : "; " + strategy::kind_change_note(saved_kind, kind);
  if (std::all_of(steps.begin(), steps.end(), [&](const auto& s) { return s == steps[0]; }))
    return steps[0].empty() ? "--resume found no checkpoint in " + out.string() +
                                  "/peer-<i>/checkpoints: the peers start fresh"
                            : "resuming every peer from step " + steps[0] + " (" + out.string() +
                                  "/peer-<i>/checkpoints)" + other_kind;
  std::string note = "resuming";
  for (int i = 0; i < peers; ++i)
    note += (i == 0 ? " peer " : ", peer ") + std::to_string(i) +
            (steps[i].empty() ? " without a checkpoint" : " from step " + steps[i]);
  return note + other_kind;
}

}  // namespace

LocalSwarmResult run_local_swarm(const train::RunConfig& user_config, const LocalSwarmOptions& o) {
  if (o.peers < 1 || o.peers > 64) throw ConfigError("--peers must be in [1, 64]");
  if (o.lab && o.lab->peers != o.peers)
    throw ConfigError("--peers " + std::to_string(o.peers) + " but the lab " + o.lab->source +
                      " has " + std::to_string(o.lab->peers) + " peers");
  if (o.lab && (!o.link_rate.empty() || !o.peer_cpus.empty()))
    throw ConfigError("--lab gives the links and CPUs: drop --link-rate and --peer-cpus");
  if (user_config.pipeline.enabled() &&
      (user_config.pipeline.stage >= 0 || user_config.pipeline.replica >= 0))
    throw ConfigError(
        "--peers places each peer itself: drop pipeline.stage and "
        "pipeline.replica");
  bool own_settings = false;
  for (const auto& sets : o.peer_overrides) own_settings = own_settings || !sets.empty();
  if (own_settings && user_config.pipeline.enabled())
    throw ConfigError(
        "--peer-set gives peers of a swarm of whole replicas (strategy.kind) settings of their "
        "own; a pipeline's plan places its stages on peers alike: drop --peer-set, or [pipeline]");
  const fs::path out = user_config.train.out_dir;
  if (fs::exists(out) && !fs::is_directory(out))
    throw ConfigError("train.out_dir: " + out.string() + " is a file, not a directory");
  // One launcher (or single process) at a time in `out`; the peers hold their own directories.
  fs::create_directories(out);
  const DirLock out_lock(out);
  // Any peer's checkpoints make this a swarm's run: peer-0 may have written none where the
  // others did.
  bool checkpointed = false;
  for (int i = 0; fs::is_directory(out / ("peer-" + std::to_string(i))); ++i)
    checkpointed = checkpointed || train::holds_checkpoint(out / ("peer-" + std::to_string(i)));
  // Each peer would refuse on its own; saying so here spares the others a join timeout.
  if (!o.resume && checkpointed)
    throw ConfigError(out.string() +
                      " already holds a swarm's checkpoints; pass --resume to continue that run, "
                      "or set train.out_dir (--out) to a new directory");
  if (train::holds_checkpoint(out))
    throw ConfigError(out.string() +
                      " holds a single process's run (checkpoints/): the peers' runs would go "
                      "beside it; set train.out_dir (--out) to a new directory");
  if (o.resume)
    std::cerr << "swarm: " << resume_note(out, o.peers, user_config.strategy.kind) << "\n";
  // Unequal peers on one machine: each peer's process tree gets its share of the CPUs.
  std::vector<std::unique_ptr<CpuQuota>> quotas;
  const std::vector<double>& peer_cpus = o.lab ? o.lab->cpus : o.peer_cpus;
  if (!peer_cpus.empty()) {
    const std::string what = o.lab ? "--lab " + o.lab->source : std::string("--peer-cpus");
    if (static_cast<int>(peer_cpus.size()) != o.peers)
      throw ConfigError(what + " needs one CPU value per peer");
    // A quota is a ceiling, not a share the machine can grant: say when the machine cannot.
    // The peers' cgroups are made at the hierarchy's top, not under the launcher's own cgroup:
    // the limit there (a container's) binds them, the launcher's own does not.
    const double cpus =
        std::min<double>(logical_cpus(), top_cgroup_cpu_limit().value_or(logical_cpus()));
    double sum = 0;
    for (int i = 0; i < o.peers; ++i) {
      sum += peer_cpus[i];
      if (peer_cpus[i] > cpus + 1e-9)
        std::cerr << "swarm: note: peer " << i << "'s quota of " << fmt("%g", peer_cpus[i])
                  << " CPUs is more than the " << fmt("%g", cpus)
                  << " this process may use: it is no limit\n";
    }
    if (sum > cpus + 1e-9)
      std::cerr << "swarm: note: the quotas add up to " << fmt("%g", sum) << " CPUs, more than the "
                << fmt("%g", cpus) << " this process may use: the peers share cores and run "
                << "slower than their quotas\n";
    if (auto why = CpuQuota::unavailable_reason(); !why.empty())
      throw ConfigError(what + " needs CPU quotas: " + why);
    std::string shares;
    for (int i = 0; i < o.peers; ++i) {
      quotas.push_back(std::make_unique<CpuQuota>(
          "starling-" + std::to_string(::getpid()) + "-peer-" + std::to_string(i), peer_cpus[i]));
      shares += (i ? ", " : "") + fmt("%g", peer_cpus[i]);
    }
    std::cerr << "swarm: CPU quotas per peer: " << shares << "\n";
  }
  for (size_t i = 0; i < o.peer_overrides.size(); ++i) {
    if (o.peer_overrides[i].empty()) continue;
    std::string sets;
    for (const std::string& s : o.peer_overrides[i]) sets += (sets.empty() ? "" : ", ") + s;
    std::cerr << "swarm: peer " << i << " sets " << sets << "\n";
  }

  // stages = "auto": plan the cut and every peer's place now (or take the plan the run began
  // with, on --resume: its checkpoints hold those stages), then run explicit stages. The plan is
  // kept once the peers are about to start.
  train::RunConfig config = user_config;
  std::optional<strategy::AutoPipeline> planned;
  std::optional<sched::CostTable> costs;  // the launcher's, while it may still calibrate
  const fs::path saved_plan = out / "auto_pipeline.json";
  bool keep_plan = false;
  strategy::CalibrationChoice calibration;  // with keep_plan: the trials of the plan
  if (config.pipeline.auto_stages) {
    if (config.pipeline.replicas > 0)
      throw ConfigError(
          "pipeline.stages = \"auto\" chooses the replicas too: drop pipeline.replicas");
    // Before a profile that may take a while.
    strategy::check_any_cut(config);
    if (config.pipeline.planner == "peers") {
      // The peers measure themselves in the lab and agree on a plan (each keeps it in its own
      // directory for --resume); the launcher only starts them.
      std::cerr << "plan: the peers measure their speeds and links and plan the stages "
                   "(pipeline.planner = \"peers\")\n";
    } else if (o.resume && fs::exists(saved_plan)) {
      planned = strategy::read_auto_pipeline(saved_plan);
      if (static_cast<int>(planned->stage_of.size()) != o.peers)
        throw ConfigError(saved_plan.string() + " places " +
                          std::to_string(planned->stage_of.size()) + " peers, not --peers " +
                          std::to_string(o.peers));
      std::cerr << "plan: the run's own, from " << saved_plan.string() << "\n" << planned->report;
    } else if (o.resume && checkpointed) {
      throw ConfigError(out.string() +
                        " holds checkpoints of a run that did not begin with "
                        "pipeline.stages = \"auto\" (no auto_pipeline.json): resume it with "
                        "the stages it began with");
    } else {
      const sched::LabSpec lab = effective_lab(o);
      costs = strategy::lab_costs(config, lab);
      // Without quotas the peers still share the cores when their threads outnumber them, or
      // the CPUs of a container's limit where the launcher runs in one: two 1-thread peers under
      // a 1.5 CPU limit share 1.5 CPUs.
      const int cores = default_threads();
      const int threads = config.train.threads > 0 ? config.train.threads : cores;
      const double room = std::min<double>(physical_cores(), usable_cpus());
      const bool crowded = quotas.empty() && o.peers * threads > room;
      if ((!quotas.empty() || crowded) && config.pipeline.lab_speeds == "profiled") {
        const fs::path dir = out / "lab_speeds";
        std::vector<std::vector<std::string>> prefixes;
        std::vector<std::string> places;
        for (int i = 0; i < o.peers; ++i) {
          prefixes.push_back(quotas.empty() ? std::vector<std::string>{}
                                            : quotas[i]->exec_prefix());
          places.push_back(quotas.empty() ? "no quota" : fmt("%g CPU", peer_cpus[i]));
        }
        std::cerr << "plan: profiling the model in every peer's "
                  << (quotas.empty() ? "place (" + std::to_string(o.peers) + " peers x " +
                                           std::to_string(threads) + " threads on " +
                                           fmt("%g", room) + " cores)"
                                     : std::string("CPU quota"))
                  << " at once, in " << dir.string() << " (pipeline.lab_speeds = \"profiled\")\n";
        std::cerr << profile_in_place(*costs, config, prefixes, places, o.starling, dir);
      }
      planned = strategy::plan_auto_pipeline(config, *costs);
      std::cerr << "plan: OP-Fence for " << lab.describe() << "\n" << planned->report;
      calibration = strategy::calibration_steps(config);
      std::cerr << "plan: calibration: " << calibration.why << "\n";
      keep_plan = true;
    }
    if (planned) {
      config.pipeline.auto_stages = false;
      config.pipeline.stages = planned->stages;
      config.pipeline.replicas = planned->replicas;
    }
  } else if (config.pipeline.calibrate_steps > 0) {
    throw ConfigError(
        "pipeline.calibrate_steps calibrates the plan of pipeline.stages = \"auto\": set "
        "that, or pipeline.calibrate_steps = 0");
  }
  const bool pipeline = config.pipeline.enabled();
  // Planned by the peers: unknown until they have agreed (peer 0 keeps their plan).
  int64_t stages = pipeline && !config.pipeline.auto_stages ? config.pipeline.count() : 1;
  const fs::path peers_plan = out / "peer-0" / "auto_pipeline.json";
  if (config.pipeline.auto_stages && !o.resume) fs::remove(peers_plan);
  if (config.pipeline.auto_stages) {
    // Planned by the peers: how many stages is theirs to say.
  } else if (pipeline) {
    // Peer i runs stage i % stages of replica i / stages (its flat rank places it, as RANK would
    // under torchrun) unless the plan placed it; every peer would refuse a bad setting on its
    // own, after the others started waiting for it.
    strategy::PipelineConfig placed = config.pipeline;
    strategy::place_pipeline_peer(placed, 0, o.peers);
    if (placed.replicas * stages != o.peers)
      throw ConfigError("--peers " + std::to_string(o.peers) + ": a pipeline of " +
                        std::to_string(stages) + " stages takes one peer per stage, " +
                        std::to_string(placed.replicas * stages) +
                        " for pipeline.replicas = " + std::to_string(placed.replicas));
    strategy::check_pipeline_peer(config.pipeline, {.strategy_kind = config.strategy.kind,
                                                    .dtype = config.train.dtype,
                                                    .net_backend = config.net.backend,
                                                    .swapped = config.swap.enabled(),
                                                    .stage = 0,
                                                    .replica = 0,
                                                    .replicas = placed.replicas});
  } else {
    if (config.strategy.kind == "none")
      throw ConfigError("--peers needs a strategy: set strategy.kind to " +
                        strategy::swarm_strategy_list() +
                        ", or cut the model into a pipeline "
                        "with [pipeline]");
    strategy::check_peer(config.strategy, config.net.backend);
  }
  fs::create_directories(out);
  const auto keys = ensure_keys(out / "keys", o.peers);

  // A fixed c10d group: rank 0 hosts the store on a free port and says which; the others meet it.
  const bool group = config.net.backend != "starling";
  std::unique_ptr<net::NetLab> lab;
  bool shaped = false;
  if (o.lab)
    for (const auto& row : o.lab->bits_per_s)
      for (const double bits : row) shaped = shaped || bits > 0;
  if (o.lab && o.lab->has_delays()) shaped = true;
  if (shaped) {
    if (group)
      throw ConfigError("--lab runs the Starling swarm (net.backend = \"starling\"), not \"" +
                        config.net.backend + "\"");
    if (auto why = net::NetLab::unavailable_reason(); !why.empty())
      throw ConfigError("--lab " + o.lab->source + " needs network namespaces: " + why);
    std::vector<std::vector<std::string>> rates(o.peers);
    for (int a = 0; a < o.peers; ++a)
      for (int b = 0; b < o.peers; ++b) rates[a].push_back(o.lab->tc_rate(a, b));
    lab = std::make_unique<net::NetLab>(
        rates, o.lab->has_delays() ? o.lab->delay_s : std::vector<std::vector<double>>{});
    std::cerr << "swarm: " << o.peers << " namespaces, " << o.lab->describe() << " (lab "
              << lab->name() << ")\n";
  } else if (!o.link_rate.empty()) {
    if (group)
      throw ConfigError("--link-rate runs the Starling swarm (net.backend = \"starling\"), not \"" +
                        config.net.backend + "\"");
    if (auto why = net::NetLab::unavailable_reason(); !why.empty())
      throw ConfigError("--link-rate needs network namespaces: " + why);
    lab = std::make_unique<net::NetLab>(o.peers, o.link_rate);
    std::cerr << "swarm: " << o.peers << " namespaces on " << o.link_rate << " links (lab "
              << lab->name() << ")\n";
  }

  // Peer i's command line, its directory under `root`, with the `extra` --set overrides last.
  auto argv_for = [&](int i, const std::string& join, const fs::path& root,
                      const std::vector<std::string>& extra) {
    std::vector<std::string> argv;
    if (!quotas.empty()) argv = quotas[i]->exec_prefix();
    if (lab) {
      const auto prefix = lab->exec_prefix(i);
      argv.insert(argv.end(), prefix.begin(), prefix.end());
    }
    // Each peer of a swarm trains on its share of the data; in a swarm of pipelines the flat
    // rank places the peer, and every stage of a replica reads the replica's share.
    argv.insert(argv.end(), {o.starling, "peer", "--json", "-q", "--data-rank", std::to_string(i),
                             "--data-world", std::to_string(o.peers)});
    if (!o.config_file.empty()) argv.insert(argv.end(), {"--config", o.config_file});
    for (const auto& s : o.overrides) argv.insert(argv.end(), {"--set", s});
    if (static_cast<size_t>(i) < o.peer_overrides.size())
      for (const auto& s : o.peer_overrides[i]) argv.insert(argv.end(), {"--set", s});
    if (planned)
      for (const auto& s : planned->overrides(i)) argv.insert(argv.end(), {"--set", s});
    const fs::path dir = root / ("peer-" + std::to_string(i));
    std::vector<std::string> sets;
    if (group) {
      sets = {"train.out_dir=" + train::toml_string(dir.string(), "train.out_dir"),
              "net.rank=" + std::to_string(i), "net.world_size=" + std::to_string(o.peers),
              "net.store=" +
                  train::toml_string(join.empty() ? std::string("127.0.0.1:0") : join, "net.store"),
              "net.interface=\"127.0.0.1\""};
    } else {
      const std::string listen = lab ? "tcp://" + lab->ip(i) + ":0" : "tcp://127.0.0.1:0";
      sets = {
          "train.out_dir=" + train::toml_string(dir.string(), "train.out_dir"),
          "net.key=" + train::toml_string(keys[i].string(), "net.key"),
          "net.allow=" + train::toml_string((out / "keys" / "allowlist").string(), "net.allow"),
          "net.name=\"peer-" + std::to_string(i) + "\"",
          "net.listen=" + train::toml_string(listen, "net.listen"),
          std::string("net.insecure=false"), "net.min_peers=" + std::to_string(o.peers),
          // N libtorch processes starting at once on a busy machine can take a while.
          "net.join_timeout_s=" + std::to_string(std::max<int64_t>(config.net.join_timeout_s, 120)),
          "net.join=[" + (join.empty() ? "" : train::toml_string(join, "net.join")) + "]"};
      // One page for the swarm: peer 0 serves [net] dashboard, the others would want its port.
      if (i != 0) sets.push_back("net.dashboard=\"\"");
    }
    sets.insert(sets.end(), extra.begin(), extra.end());
    for (const std::string& s : sets) argv.insert(argv.end(), {"--set", s});
    if (o.resume) argv.push_back("--resume");
    if (o.stop_at >= 0) argv.insert(argv.end(), {"--stop-at", std::to_string(o.stop_at)});
    return argv;
  };

  g_signal.store(0);
  g_signal_count.store(0);
  g_first_signal_ns.store(0);
  auto old_int = std::signal(SIGINT, on_swarm_signal);
  auto old_term = std::signal(SIGTERM, on_swarm_signal);
  struct Restore {
    void (*i)(int);
    void (*t)(int);
    ~Restore() {
      std::signal(SIGINT, i);
      std::signal(SIGTERM, t);
    }
  } restore{old_int, old_term};
  // Kept for a --resume once the launcher's checks have passed: a launch refused keeps the run's.
  save_peer_sets(out, o.peer_set_args);

  // Starts the peers with their directories under `root`, shows their progress until every one
  // has exited, and writes `root`/swarm.json.
  auto run_peers = [&](const fs::path& root,
                       const std::vector<std::string>& extra) -> LocalSwarmResult {
    std::vector<Process> procs;
    std::vector<PeerView> views(o.peers);
    auto log_of = [&](int i) { return (root / ("peer-" + std::to_string(i) + ".log")).string(); };
    fs::create_directories(root);
    for (int i = 0; i < o.peers; ++i) {
      // A resumed run keeps the logs of the runs before it: peer-<i>.log.1, .2, ... in order.
      if (o.resume && fs::exists(log_of(i))) {
        int n = 0;  // one past the highest number there, whichever were removed
        for (const auto& e : fs::directory_iterator(root)) {
          const std::string name = e.path().filename().string();
          const std::string stem = fs::path(log_of(i)).filename().string() + ".";
          if (name.rfind(stem, 0) == 0 &&
              name.find_first_not_of("0123456789", stem.size()) == std::string::npos)
            n = std::max(n, std::atoi(name.c_str() + stem.size()));
        }
        fs::rename(log_of(i), log_of(i) + "." + std::to_string(n + 1));
      }
      fs::remove(log_of(i));
    }
    procs.emplace_back(argv_for(0, "", root, extra), log_of(0));
    std::string entry;
    for (int tries = 0; tries < 600 && entry.empty(); ++tries) {
      auto line = procs[0].read_line(std::chrono::milliseconds(100));
      if (line) {
        try {
          const auto j = nlohmann::json::parse(*line);
          if (j.value("event", "") == "listening") entry = j.value("endpoint", "");
        } catch (const nlohmann::json::exception&) {
        }
      } else if (procs[0].finished_output() || g_signal.load() != 0) {
        break;
      }
    }
    if (entry.empty() && g_signal.load() != 0) {
      // Told to stop before the first peer listened: it is stopped, and nothing ran.
      procs[0].signal(SIGTERM);
      procs[0].wait(std::chrono::seconds(30));
      LocalSwarmResult stopped;
      stopped.stopped_peers = 1;
      stopped.signalled = true;
      return stopped;
    }
    if (entry.empty()) throw Error("peer 0 did not start; see " + log_of(0));
    for (int i = 1; i < o.peers; ++i)
      procs.emplace_back(argv_for(i, entry, root, extra), log_of(i));
    std::cerr << "swarm: " << o.peers << " peers ("
              << (!pipeline                     ? config.strategy.kind
                  : config.pipeline.auto_stages ? std::string("pipelines the peers plan")
                  : o.peers == stages ? "pipeline of " + std::to_string(stages) + " stages, " +
                                            config.pipeline.schedule
                                      : std::to_string(o.peers / stages) + " pipelines of " +
                                            std::to_string(stages) + " stages, " +
                                            config.pipeline.schedule + ", " + config.strategy.kind)
              << "), logs in " << (root / "peer-<i>.log").string() << ", entry point " << entry
              << "\n";

    train::ProgressLine progress(o.progress);
    LocalSwarmResult result;
    int forwarded = 0;
    nlohmann::json done_events = nlohmann::json::array();
    int64_t last_milestone = -1;
    bool stopped_early = false;
    int64_t last_eval_step = -1;
    while (true) {
      if (config.pipeline.auto_stages && !planned && fs::exists(peers_plan)) {
        planned = strategy::read_auto_pipeline(peers_plan);
        stages = static_cast<int64_t>(planned->stages.size());
        // The peers keep their plan once their trials (if any) are over: the run's own steps
        // count from here.
        result.step = 0;
        last_milestone = -1;
        for (PeerView& v : views) v.step = 0;
      }
      // The first signal stops the peers at their next round, with checkpoints (a Ctrl-C at a
      // terminal reaches them too: they take either as the same request); a second one, the
      // user's who will not wait, kills them and quits. Their checkpoints are whole either way.
      if (const int count = g_signal_count.load(); count > 0 && forwarded == 0) {
        for (auto& p : procs) p.signal(SIGTERM);
        forwarded = count;
        progress.note(
            "swarm: stopping every peer (they checkpoint at their next round; a second Ctrl-C "
            "quits at once, without those checkpoints)");
      }
      if (g_signal_count.load() > 1) {
        progress.note(
            "swarm: a second signal: killing the peers and quitting; each peer's last "
            "checkpoint is whole");
        for (auto& p : procs) p.signal(SIGKILL);
        for (auto& p : procs) p.wait(std::chrono::seconds(10));
        // Unwound to train_command, which dies of the signal: the CPU quotas' cgroups and the
        // network lab's namespaces are removed on the way.
        throw SecondSignal{g_signal.load()};
      }
      std::vector<pollfd> fds;
      for (auto& p : procs) fds.push_back({p.stdout_fd(), POLLIN, 0});
      ::poll(fds.data(), fds.size(), 200);
      bool any_running = false;
      for (int i = 0; i < o.peers; ++i) {
        PeerView& v = views[i];
        while (auto line = procs[i].read_line(std::chrono::milliseconds(1))) {
          nlohmann::json j;
          try {
            j = nlohmann::json::parse(*line);
          } catch (const nlohmann::json::exception&) {
            continue;
          }
          const std::string event = j.value("event", "");
          if (event == "step") {
            v.step = j.value("step", int64_t{0});
            v.steps = j.value("steps", int64_t{0});
            v.loss = j.value("loss", 0.0);
            v.tokens = j.value("tokens", uint64_t{0});
            v.tokens_per_s = j.value("tokens_per_s", 0.0);
            v.elapsed_s = j.value("elapsed_s", 0.0);
            if (j.contains("net") && j["net"].is_object()) {
              const auto net = j["net"].get<train::StrategyReport>();
              v.bytes_sent = net.bytes_sent;
              v.net_wait_s = net.net_wait_s;
              v.swarm = net.peers;
            }
          } else if (event == "eval") {
            // Every peer evaluates the same shared model: show each evaluation once.
            result.val_loss = j.value("val_loss", -1.0);
            const int64_t at = j.value("step", int64_t{0});
            if (at > last_eval_step)
              progress.note("step " + std::to_string(at) + " | val loss " +
                            fmt("%.4f", result.val_loss));
            last_eval_step = std::max(last_eval_step, at);
          } else if (event == "dashboard") {
            progress.note("swarm: dashboard at " + j.value("url", std::string()));
          } else if (event == "done") {
            if (i == 0) result.sample = j.value("sample", "");
            // The peer's last step: step events come every train.log_every steps only. (A peer
            // that reported no step trained none: a swarm resumed at its last step.)
            if (v.step > 0) v.step = std::max(v.step, j.value("step", int64_t{0}));
            j["peer"] = i;
            done_events.push_back(j);
          }
        }
        if (v.running && procs[i].finished_output()) {
          v.exit_code = procs[i].wait(std::chrono::seconds(30));
          v.running = false;
          if (v.stopped && v.exit_code == 128 + SIGKILL) {
            ++result.stopped_peers;
            progress.log("swarm: peer " + std::to_string(i) +
                         " stopped (another peer failed before the first step); see " + log_of(i));
          } else if (v.exit_code.value_or(-1) != 0 && forwarded > 0 && v.step == 0) {
            // Stopped by the signal the launcher passed on before it trained a step: killed by
            // it while starting, or failing as the others it waited for went. Not a failure.
            ++result.stopped_peers;
          } else if (v.exit_code.value_or(-1) != 0) {
            ++result.failed_peers;
            // Killed by a signal (the OOM killer's SIGKILL, say), a peer wrote no error: its
            // log's last line would be whatever it wrote before.
            const int code = v.exit_code.value_or(-1);
            const std::string why = code > 128 ? "killed by signal " + std::to_string(code - 128) +
                                                     " (" + ::strsignal(code - 128) + ")"
                                               : last_line(log_of(i));
            // Printed in a quiet run too: the summary's "N peers failed" needs its reason.
            progress.log("swarm: peer " + std::to_string(i) + " exited with code " +
                         std::to_string(v.exit_code.value_or(-1)) +
                         (why.empty() ? "" : ": " + why) + "; see " + log_of(i));
          }
        }
        any_running = any_running || v.running;
      }
      // A peer that fails before anyone trained refused something the others will too, or leaves
      // a place they would wait for until net.join_timeout_s: stop them now. Nothing is lost (no
      // step ran; a resumed run's checkpoints stay as they were).
      const bool nobody_trained =
          std::all_of(views.begin(), views.end(), [](const PeerView& v) { return v.step == 0; });
      if (nobody_trained && result.failed_peers > 0 && any_running && !stopped_early) {
        stopped_early = true;
        progress.note("swarm: a peer failed before the first step; stopping the others");
        for (int i = 0; i < o.peers; ++i) {
          // One that has already exited (its own error, the OOM killer's SIGKILL), though its
          // output is not yet read to the end, is reaped as what it is, not as stopped.
          if (!views[i].running || procs[i].wait(std::chrono::milliseconds(0))) continue;
          views[i].stopped = true;
          procs[i].signal(SIGKILL);
        }
      }
      // The combined line: the slowest running peer's step, the swarm's throughput and traffic.
      int64_t step = -1, steps = 0;
      double lo = 1e30, hi = -1e30, tps = 0, sent = 0, wait = 0, elapsed = 0;
      int live = 0;
      for (const auto& v : views) {
        // A failed peer's last step would hold the line back while the others train on.
        if (v.step == 0 || v.exit_code.value_or(0) != 0) continue;
        step = step < 0 ? v.step : std::min(step, v.step);
        steps = std::max(steps, v.steps);
        lo = std::min(lo, v.loss);
        hi = std::max(hi, v.loss);
        // Every stage of a pipeline reports the pipeline's tokens: count them once.
        tps += v.running ? v.tokens_per_s / static_cast<double>(stages) : 0;
        sent += v.bytes_sent;
        wait = std::max(wait, v.net_wait_s);
        elapsed = std::max(elapsed, v.elapsed_s);
        live += v.running ? 1 : 0;
      }
      // Peers that plan themselves may first train trials of plans the launcher does not see:
      // their steps are a trial's, and their stage count (which the tokens are shared by) unknown.
      const bool trial = config.pipeline.auto_stages && !planned;
      if (step > 0) {
        result.step = std::max(result.step, step);
        const bool milestone =
            !trial && step / config.train.log_every > last_milestone / config.train.log_every;
        if (milestone) last_milestone = step;
        progress.update(std::string(trial ? "the peers' trial: step " : "step ") +
                            std::to_string(step) + "/" + std::to_string(steps) + " | loss " +
                            fmt("%.4f", lo) + (hi - lo > 5e-5 ? ".." + fmt("%.4f", hi) : "") +
                            (trial ? std::string() : " | " + fmt("%.0f", tps) + " tok/s") + " | " +
                            std::to_string(live) + "/" + std::to_string(o.peers) +
                            " peers | sent " + fmt("%.1f MB", sent / 1e6) + " | net wait " +
                            fmt("%.0f%%", elapsed > 0 ? 100 * wait / elapsed : 0) + " | " +
                            train::format_duration(elapsed),
                        milestone);
      }
      if (!any_running) break;
    }
    progress.finish();
    double total_tokens = 0, longest = 0;
    for (const auto& v : views) {
      total_tokens += static_cast<double>(v.tokens) / static_cast<double>(stages);
      longest = std::max(longest, v.elapsed_s);
    }
    // The swarm's rate is the sum of its peers' own rates over their steps (each pipeline counted
    // once), as every peer reports it when done: the run's wall time would count evaluations,
    // checkpoints and the wait for the slowest peer's start as if no one trained meanwhile. Without
    // every peer's report (one failed), the tokens over the longest run.
    double rates = 0;
    for (const auto& d : done_events) rates += d.value("tokens_per_s", 0.0);
    // ddp and atom average every step: a swarm whose every peer ends without one applied (every
    // exchange refused, as between peers that cut their gradients differently) trained nothing,
    // though every step ran. Each peer's log says why, a step at a time; the summary says so once.
    // Counted over this invocation's steps (net.applied_steps), so a resumed run that applies
    // none says so too; a peer that trained no step here (resumed at its last) says nothing.
    const bool every_step_a_round =
        !pipeline && (config.strategy.kind == "ddp" || config.strategy.kind == "atom");
    const bool none_applied =
        !done_events.empty() &&
        std::all_of(done_events.begin(), done_events.end(), [&](const nlohmann::json& d) {
          const int peer = d.value("peer", -1);
          const bool trained = peer >= 0 && peer < static_cast<int>(views.size()) &&
                               views[static_cast<size_t>(peer)].step > 0;
          return trained && d.contains("net") &&
                 d["net"].value("applied_steps", d["net"].value("round", 0.0)) == 0;
        });
    if (every_step_a_round && none_applied)
      progress.log(
          "swarm: no peer applied an average of the swarm's gradients: every exchange "
          "failed and every update was skipped, so the model is as it began; see " +
          log_of(0));
    result.tokens_per_s = static_cast<int>(done_events.size()) == o.peers && rates > 0
                              ? rates / static_cast<double>(stages)
                          : longest > 0 ? total_tokens / longest
                                        : 0;
    // The run's summary for scripts (bench/strategies, the demo's plot).
    std::ofstream(root / "swarm.json")
        << nlohmann::json{{"peers", o.peers},
                          {"strategy", !pipeline ? config.strategy.kind
                                       : config.strategy.kind == "none"
                                           ? "pipeline"
                                           : "pipeline+" + config.strategy.kind},
                          {"link_rate", o.lab ? o.lab->describe() : o.link_rate},
                          {"stages", stages},
                          {"predicted_step_s", planned ? planned->predicted_step_s : 0.0},
                          {"tokens", total_tokens},
                          {"elapsed_s", longest},
                          {"tokens_per_s", result.tokens_per_s},
                          {"failed_peers", result.failed_peers},
                          {"stopped_peers", result.stopped_peers},
                          {"done", done_events}}
               .dump(2)
        << "\n";
    result.signalled = g_signal_count.load() > 0;
    return result;
  };

  if (keep_plan && calibration.steps > 0) {
    // A trial of the plan on the swarm itself: what each peer's stage costs it there, beside
    // the others, replaces the speed the plan assumed (a CPU quota's share, a profile taken
    // alone), and OP-Fence plans again from those speeds. A peer's speed also depends on which
    // nodes it computes and beside whom, so a plan that moved nodes is tried once more. The run
    // keeps one of the plans tried, priced at what its own stages measured: the one predicting
    // the shortest step that way (a plan OP-Fence moved to but nobody tried has no such price).
    const int64_t trial_steps = calibration.steps;
    const int64_t round = strategy::round_steps(config);
    const sched::TimedSteps timed = sched::timed_steps(trial_steps, round);
    std::cerr << strategy::trial_note(config, trial_steps);
    strategy::PlanTrials trials(
        user_config, *costs, *planned,
        config.pipeline.profile.empty() ? "the profile" : config.pipeline.profile);
    fs::remove_all(out / "calibration");
    for (bool again = true; again;) {
      const fs::path trial = out / "calibration" / ("trial-" + std::to_string(trials.trials() + 1));
      std::cerr << "plan: calibrating: " << trial_steps << " steps of this plan in "
                << trial.string() << " (pipeline.calibrate_steps)\n";
      const LocalSwarmResult result = run_peers(
          trial, {"train.steps=" + std::to_string(trial_steps), "train.log_every=1",
                  "train.eval_every=0", "train.checkpoint_every=0", "train.sample_at_end=false"});
      if (g_signal.load() != 0) return result;
      if (result.failed_peers > 0)
        throw Error("the calibration run failed (" + std::to_string(result.failed_peers) +
                    " peer(s)); see " + (trial / "peer-<i>.log").string());
      again = trials.record(
          strategy::trial_timings(trials.next(), trial, config.train.grad_accum, timed));
      // Their checkpoints are of no use: the run starts over from step 0.
      for (int i = 0; i < o.peers; ++i)
        fs::remove_all(trial / ("peer-" + std::to_string(i)) / "checkpoints");
      if (again) {
        planned = trials.next();
        std::cerr << "plan: the measured speeds move the stages\n" << planned->report;
      }
    }
    planned = trials.kept(timed);
    std::cerr << "plan: OP-Fence for the measured speeds\n" << planned->report;
    config.pipeline.stages = planned->stages;
    config.pipeline.replicas = planned->replicas;
    stages = config.pipeline.count();
  }
  if (keep_plan) strategy::write_auto_pipeline(saved_plan, *planned);
  const LocalSwarmResult result = run_peers(out, {});
  if (result.failed_peers == 0 && g_signal.load() == 0 && user_config.pipeline.auto_stages) {
    if (user_config.pipeline.planner == "peers")
      report_against_peers_plan(
          out, o.peers, user_config,
          !checkpointed && strategy::calibration_steps(user_config).steps == 0);
    else if (planned)
      report_against_plan(*planned, strategy::launcher_peer_records(out, o.peers), user_config,
                          keep_plan && calibration.steps == 0);
  }
  return result;
}

}  // namespace starling::cli
