#include <unistd.h>

#include <cctype>
#include <csignal>
#include <filesystem>
#include <iostream>
#include <optional>
#include <regex>

#include "starling/cli/commands.h"
#include "starling/cli/cpu_quota.h"
#include "starling/cli/local_swarm.h"
#include "starling/cli/peer_sets.h"
#include "starling/common/error.h"
#include "starling/sched/cost_table.h"
#include "starling/swap/swap_runner.h"
#include "starling/train/trainer.h"

namespace starling::cli {

void add_train_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "train a model from a TOML config (docs/config.md)");
  struct Args {
    std::string config, out, link_rate, peer_cpus, lab;
    std::vector<std::string> sets, peer_sets;
    bool resume = false, quiet = false, list_keys = false;
    int64_t stop_at = -1;
    int peers = 0;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("-c,--config", a->config, "config file (TOML)");
  cmd->add_option("--set", a->sets, "override a key, e.g. --set train.steps=100 (repeatable)");
  cmd->add_option("-o,--out", a->out,
                  "the run's output directory, for train.out_dir (a new run needs a new one)")
      ->check(CLI::Validator(
          [](std::string& text) { return text.empty() ? std::string("is empty") : ""; }, "DIR"));
  cmd->add_flag("--resume", a->resume, "continue from the newest checkpoint in train.out_dir");
  cmd->add_option("--stop-at", a->stop_at,
                  "stop with a checkpoint after this step, or at the end of the round it falls "
                  "in (localsgd, diloco, co2); the schedule still spans train.steps")
      // Not int64's largest: CLI11 reads a number past it as that largest, without a word.
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 53));
  cmd->add_option("--peers", a->peers,
                  "train as a swarm of N local peer processes ([strategy] says how; "
                  "docs/strategies.md)")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--link-rate", a->link_rate,
                  "with --peers: put each peer in a network namespace behind a link of this rate, "
                  "e.g. 20mbit (needs root)");
  cmd->add_option("--peer-cpus", a->peer_cpus,
                  "with --peers: CPUs each peer may use, comma-separated or one for all, e.g. "
                  "1,1,0.5,0.5 (a cgroup CPU quota per peer: unequal peers on one machine; "
                  "needs root)");
  cmd->add_option("--peer-set", a->peer_sets,
                  "with --peers: a key for one peer only, PEER:KEY=VALUE, e.g. "
                  "1:swap.budget=\"6MB\" or 0:train.threads=2 (repeatable; train.threads, "
                  "train.device, train.device_memory, swap.*): unequal peers without root; "
                  "--resume keeps the run's own unless given, \"none\" drops them");
  cmd->add_option("--lab", a->lab,
                  "with --peers: a heterogeneous lab (TOML: a rate per pair of peers, CPUs per "
                  "peer; docs/scheduler.md#the-heterogeneous-lab) in place of --link-rate and "
                  "--peer-cpus (needs root); --peers defaults to its peer count");
  cmd->add_flag("-q,--quiet", a->quiet, "no live progress line");
  cmd->add_flag("--list-keys", a->list_keys, "list every config key with its default and exit");
  cmd->callback([a, cmd] {
    if (a->list_keys) {
      std::cout << train::describe_keys();
      return;
    }
    if (a->config.empty()) throw CLI::RequiredError("--config");
    if (!a->out.empty()) {
      for (const std::string& s : a->sets)
        if (s.rfind("train.out_dir=", 0) == 0)
          throw CLI::ValidationError("--out and --set " + s +
                                     " both give the output directory: keep one");
      a->sets.push_back("train.out_dir=" + train::toml_string(a->out, "--out"));
    }
    // Checked here, before any namespace is made: the rates scripts/netlab.sh (tc) takes.
    static const std::regex kRate(
        "[1-9][0-9]*(bit|kbit|mbit|gbit|tbit|bps|kbps|mbps|gbps)|unlimited", std::regex::icase);
    if (cmd->count("--link-rate") > 0 && !std::regex_match(a->link_rate, kRate))
      throw CLI::ValidationError("--link-rate", "\"" + a->link_rate +
                                                    "\" is not a rate: a whole number and a unit, "
                                                    "e.g. 20mbit, 500kbit, 1gbit, or unlimited");
    // tc takes its units in any case; the swarm and its planner read them in lowercase.
    for (char& c : a->link_rate) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    if (!a->link_rate.empty() && a->link_rate != "unlimited")
      sched::parse_link_rate(a->link_rate, "--link-rate");  // its maximum
    const auto config = train::load_run_config(a->config, a->sets);
    std::optional<sched::LabSpec> lab;
    if (!a->lab.empty()) {
      if (!a->link_rate.empty() || !a->peer_cpus.empty())
        throw CLI::ValidationError("--lab",
                                   "gives the links and CPUs: drop --link-rate and "
                                   "--peer-cpus");
      lab = sched::read_lab_spec(a->lab);
      if (a->peers == 0) a->peers = lab->peers;
    }
    if (!a->link_rate.empty() && a->peers == 0)
      throw CLI::ValidationError("--link-rate", "needs --peers N");
    if (!a->peer_cpus.empty() && a->peers == 0)
      throw CLI::ValidationError("--peer-cpus", "needs --peers N");
    if (!a->peer_sets.empty() && a->peers == 0)
      throw CLI::ValidationError("--peer-set", "needs --peers N");
    if (a->peers > 0) {
      LocalSwarmOptions o;
      o.peers = a->peers;
      o.lab = lab;
      o.link_rate = a->link_rate;
      if (!a->peer_cpus.empty()) o.peer_cpus = parse_peer_cpus(a->peer_cpus, a->peers);
      o.starling = std::filesystem::read_symlink("/proc/self/exe").string();
      o.config_file = a->config;
      o.overrides = a->sets;
      // A resumed swarm's peers go on as they began unless told otherwise ("none": as the
      // swarm's config says).
      std::vector<std::string> peer_sets = a->peer_sets;
      const std::string saved =
          (std::filesystem::path(config.train.out_dir) / kPeerSetsFile).string();
      bool from_saved = false;
      if (peer_sets == std::vector<std::string>{"none"}) {
        peer_sets.clear();
      } else if (a->resume && peer_sets.empty()) {
        peer_sets = saved_peer_sets(config.train.out_dir);
        from_saved = !peer_sets.empty();
        if (from_saved)
          std::cerr << "swarm: the peers' --peer-set as the run began, from " << saved
                    << " (--peer-set replaces them; --peer-set none drops them)\n";
      }
      try {
        o.peer_overrides = parse_peer_sets(peer_sets, a->peers);
      } catch (const ConfigError& e) {
        if (!from_saved) throw;
        throw ConfigError(saved + ", the run's own --peer-set: " + e.what() +
                          " (--peer-set replaces them; --peer-set none drops them)");
      }
      o.peer_set_args = peer_sets;
      // Each peer's config, checked here as the peer will load it: a bad value stops the
      // launcher before any peer starts, naming the peer (a peer's own failure would read as
      // the others' timeout).
      for (size_t i = 0; i < o.peer_overrides.size(); ++i) {
        const std::string peer = std::to_string(i);
        train::RunConfig own = config;
        if (!o.peer_overrides[i].empty()) {
          std::vector<std::string> sets = a->sets;
          sets.insert(sets.end(), o.peer_overrides[i].begin(), o.peer_overrides[i].end());
          try {
            own = train::load_run_config(a->config, sets);
          } catch (const Error& e) {
            throw ConfigError("--peer-set for peer " + peer + ": " + e.what());
          }
        }
        try {
          train::check_device_memory(own);
        } catch (const Error& e) {
          throw ConfigError("peer " + peer + ": " + e.what());
        }
      }
      o.resume = a->resume;
      o.progress = !a->quiet;
      o.stop_at = a->stop_at;
      const auto r = [&] {
        try {
          return run_local_swarm(config, o);
        } catch (const SecondSignal& s) {
          std::signal(s.signal, SIG_DFL);
          std::raise(s.signal);
          throw;  // a signal whose default is not to end the process: not SIGINT or SIGTERM
        }
      }();
      const auto failed = [&] {
        return starling::Error(
            std::to_string(r.failed_peers) + " of " + std::to_string(a->peers) + " peers failed" +
            (r.stopped_peers > 0
                 ? " (the launcher stopped the other " + std::to_string(r.stopped_peers) + ")"
                 : "") +
            "; see " + config.train.out_dir + "/peer-<i>.log");
      };
      if (r.signalled && r.failed_peers == 0 && r.step == 0) {
        std::cout << "swarm stopped by the signal before its first step: nothing was trained\n";
        return;
      }
      // A swarm that trained nothing has no summary: "trained 0 steps" and a checkpoints path
      // with none in it would come before the reason.
      if (r.failed_peers > 0 && (r.failed_peers + r.stopped_peers >= a->peers || r.step == 0))
        throw failed();
      std::cout << "swarm of " << a->peers << " trained " << r.step << " steps";
      if (r.val_loss >= 0) std::cout << ": val loss " << r.val_loss;
      std::cout << ", " << static_cast<long>(r.tokens_per_s) << " tokens/s in total\n";
      std::cout << "checkpoints: " << config.train.out_dir << "/peer-<i>/checkpoints\n";
      if (!r.sample.empty()) std::cout << "sample:\n" << r.sample << "\n";
      if (r.failed_peers > 0) throw failed();
      return;
    }
    if (config.pipeline.enabled())
      std::cerr << "note: [pipeline] cuts the model across peers (--peers "
                << (config.pipeline.auto_stages ? std::string("N")
                                                : std::to_string(config.pipeline.count()))
                << ", or `starling peer`); training it whole\n";
    if (config.strategy.kind != "none")
      std::cerr << "note: strategy.kind = \"" << config.strategy.kind
                << "\" needs peers (--peers N, or `starling peer`); training one replica\n";
    train::TrainOptions options{.resume = a->resume,
                                .progress = !a->quiet,
                                .stop_at = a->stop_at,
                                .tidy_failed_start = true};
    if (config.swap.enabled()) options.step_runner = swap::swapped_step_runner(true);
    const auto result = train::train(config, options);
    std::cout << "trained " << result.step << " steps: loss " << result.train_loss;
    if (result.val_loss >= 0) std::cout << ", val loss " << result.val_loss;
    std::cout << ", " << static_cast<long>(result.tokens_per_s) << " tokens/s\n";
    if (!result.checkpoint.empty())
      std::cout << "checkpoint: " << result.checkpoint.string() << "\n";
    if (!result.sample.empty()) std::cout << "sample:\n" << result.sample << "\n";
  });
}

}  // namespace starling::cli
