#include <cmath>
#include <cstdio>
#include <iostream>
#include <sstream>
#include <stdexcept>

#include "starling/cli/commands.h"
#include "starling/cli/number_list.h"
#include "starling/common/error.h"
#include "starling/compress/ada_topk.h"
#include "starling/sched/lab_spec.h"
#include "starling/sched/op_fence.h"
#include "starling/sched/plan_report.h"
#include "starling/sched/workload.h"
#include "starling/swap/swap_runner.h"
#include "starling/train/config.h"

namespace starling::cli {

namespace {

using sched::describe_plan;

// Devices of the given speeds, every link at `rate` but the ones named A-B=RATE.
void set_devices(sched::CostTable& t, const std::string& speed_list, const std::string& rate_text,
                 const std::vector<std::string>& links) {
  const std::vector<double> speeds =
      parse_positive_numbers(speed_list, "--speeds", "a speed > 0 (e.g. 0.5 or 2)");
  t.devices.clear();
  for (size_t d = 0; d < speeds.size(); ++d)
    t.devices.push_back({.name = "device " + std::to_string(d), .speed = speeds[d]});
  const double rate = sched::parse_link_rate(rate_text, "--link-rate");
  t.links.assign(speeds.size(), std::vector<sched::LinkCost>(speeds.size(), {rate, 0}));
  for (const std::string& l : links) {
    int a = -1, b = -1;
    char rest[64] = {};
    if (std::sscanf(l.c_str(), "%d-%d=%63s", &a, &b, rest) != 3 || a < 0 || b < 0 ||
        a >= static_cast<int>(speeds.size()) || b >= static_cast<int>(speeds.size()) || a == b)
      throw ConfigError("--link " + l +
                        ": expected A-B=RATE, A and B two different devices from 0 to " +
                        std::to_string(speeds.size() - 1) + " (--speeds lists " +
                        std::to_string(speeds.size()) + "), e.g. 0-1=10mbit");
    const double r = sched::parse_link_rate(rest, "--link " + l);
    t.links[static_cast<size_t>(a)][static_cast<size_t>(b)] = {r, 0};
    t.links[static_cast<size_t>(b)][static_cast<size_t>(a)] = {r, 0};
  }
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "plan", "plan how a run uses this machine's memory, or how a pipeline cuts the model");
  cmd->require_subcommand(1);
  auto* swap = cmd->add_subcommand(
      "swap",
      "profile a config's model and the swap tier, then print the layer groups, bytes per tier, "
      "predicted step time and share of I/O hidden for a memory budget; a config with a swarm "
      "strategy is planned as each of its peers runs (docs/swap.md)");
  struct Args {
    std::string config, budget;
    std::vector<std::string> sets;
  };
  auto a = std::make_shared<Args>();
  swap->add_option("-c,--config", a->config, "config file (TOML)")->required();
  swap->add_option("--budget", a->budget,
                   "training state kept in compute memory, e.g. 2GB (default: swap.budget)");
  swap->add_option("--set", a->sets, "override a key, e.g. --set swap.tier=host (repeatable)");
  swap->callback([a] {
    const auto config = train::load_run_config(a->config, a->sets);
    const std::string budget = a->budget.empty() ? config.swap.budget : a->budget;
    if (budget.empty())
      throw CLI::ValidationError("--budget",
                                 "give a budget (e.g. --budget 2GB) or set swap.budget");
    // Checked before the profile, which takes minutes on a large model.
    if (!a->budget.empty() && swap::parse_bytes(a->budget, "--budget") <= 0)
      throw CLI::ValidationError("--budget", "must be more than 0 bytes");
    std::cout << swap::plan_swap_for(config, budget);
  });

  auto* profile = cmd->add_subcommand(
      "profile",
      "measure a config's model on this machine (each node's forward and backward time, the "
      "bytes each cut sends) into a cost table for `plan pipeline` (docs/scheduler.md)");
  struct ProfileArgs {
    std::string config, out;
    std::vector<std::string> sets;
    double steady_seconds = 0;
  };
  auto pa = std::make_shared<ProfileArgs>();
  profile->add_option("-c,--config", pa->config, "config file (TOML)")->required();
  profile->add_option("-o,--out", pa->out, "cost table to write (JSON)")->required();
  profile->add_option("--set", pa->sets, "override a key (repeatable)");
  profile
      ->add_option("--steady-seconds", pa->steady_seconds,
                   "repeat the steady passes for this long and take each node's mean (under a "
                   "CPU quota); 0 = the faster of two passes")
      ->check(CLI::Range(0.0, 600.0))
      ->capture_default_str();
  profile->callback([pa] {
    const auto config = train::load_run_config(pa->config, pa->sets);
    const sched::CostTable t = sched::profile_workload(config, pa->steady_seconds);
    sched::write_cost_table(pa->out, t);
    const double total = sched::total_compute_s(t);
    std::cout << "profiled " << t.nodes.size() << " nodes: " << sched::format_seconds(total)
              << " per micro-batch of " << config.train.batch_size << " x " << config.model.seq_len
              << " tokens, forward and backward; wrote " << pa->out << "\n";
  });

  auto* pipeline = cmd->add_subcommand(
      "pipeline",
      "cut a profiled model into pipeline stages for devices of given speeds and links "
      "(OP-Fence: groups by bandwidth, exact cut; docs/scheduler.md)");
  struct PipelineArgs {
    std::string profile, speeds = "1,1", rate = "1gbit", lab, egress;
    std::vector<std::string> links;
    int64_t micro_batches = 0;
    std::string schedule;
    int64_t extra_warmup = -1;
    double sync_every = 1;
    bool overlapped = false;
    std::string compression = "none";
  };
  auto pp = std::make_shared<PipelineArgs>();
  pipeline->add_option("--profile", pp->profile, "cost table from `plan profile`")->required();
  pipeline
      ->add_option("--speeds", pp->speeds,
                   "one device per comma-separated speed against the profiled machine")
      ->capture_default_str();
  pipeline->add_option("--link-rate", pp->rate, "every link's rate, e.g. 100mbit")
      ->capture_default_str();
  pipeline->add_option("--link", pp->links,
                       "one link's rate, A-B=RATE with device numbers, e.g. 1-2=10mbit "
                       "(repeatable)");
  pipeline->add_option("--egress", pp->egress,
                       "every device sends through one upload of this rate, and receives "
                       "through one download of it, e.g. 10mbit (a star, as `train --link-rate` "
                       "builds): a middle stage's activations and gradients share them");
  pipeline->add_option("--lab", pp->lab,
                       "the devices and links of a lab file (as `train --peers N --lab` builds "
                       "it) in place of --speeds, --link-rate and --link");
  pipeline
      ->add_option("--sync-every", pp->sync_every,
                   "for pipeline replicas: steps between two averagings of a stage with its "
                   "counterparts (1 = ddp, tau = strategy.local_steps otherwise)")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  pipeline
      ->add_option("--compression", pp->compression,
                   "price each cut at what pipeline.compression sends of it (int8: about a "
                   "quarter; adatopk: as int8, the most it compresses before it drops entries)")
      ->capture_default_str()
      ->check(CLI::IsMember({"none", "int8", "int4", "topk", "adatopk"}));
  pipeline->add_flag("--overlapped", pp->overlapped,
                     "for pipeline replicas: the averaging overlaps the next steps (co2)");
  pipeline
      ->add_option("--micro-batches", pp->micro_batches,
                   "micro-batches per step (default: the profiled config's train.grad_accum)")
      // train.grad_accum's maximum: the simulation's time grows with it.
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 20));
  pipeline
      ->add_option("--schedule", pp->schedule,
                   "the micro-batches' order the step is simulated with (default: the profiled "
                   "config's pipeline.schedule)")
      ->check(CLI::IsMember({"1f1b", "gpipe"}));
  pipeline
      ->add_option("--extra-warmup", pp->extra_warmup,
                   "1f1b: forwards each stage runs ahead beyond its warm-up (default: the "
                   "profiled config's pipeline.extra_warmup)")
      ->check(CLI::NonNegativeNumber);
  pipeline->callback([pp, pipeline] {
    sched::CostTable t = sched::read_cost_table(pp->profile);
    if (pp->micro_batches > 0) t.micro_batches = pp->micro_batches;
    if (!pp->schedule.empty()) t.one_f_one_b = pp->schedule == "1f1b";
    if (pp->extra_warmup >= 0) t.extra_warmup = pp->extra_warmup;
    t.scale_cuts(compress::planned_wire_fraction(pp->compression, "int8", 0.1));
    if (!pp->lab.empty()) {
      if (pipeline->count("--speeds") + pipeline->count("--link-rate") + pipeline->count("--link"))
        throw CLI::ValidationError("--lab",
                                   "gives the devices and links: drop --speeds, "
                                   "--link-rate and --link");
      const auto lab = sched::read_lab_spec(pp->lab);
      sched::apply_lab(t, lab);
      std::cout << "lab " << pp->lab << ": " << lab.describe() << "\n";
    } else {
      set_devices(t, pp->speeds, pp->rate, pp->links);
    }
    if (!pp->egress.empty())
      for (auto& d : t.devices)
        d.egress_bytes_per_s = d.ingress_bytes_per_s =
            sched::parse_link_rate(pp->egress, "--egress");
    t.validate(pp->profile);
    const auto groups = sched::cluster_devices(t);
    const auto chain = sched::device_chain(t, groups);
    std::cout << groups.size() << " group" << (groups.size() == 1 ? "" : "s")
              << " of devices by bandwidth; chain";
    for (const int d : chain) std::cout << " " << d;
    std::cout << "\nOP-Fence:\n" << describe_plan(t, sched::op_fence(t));
    if (static_cast<int>(chain.size()) <= static_cast<int>(t.nodes.size())) {
      const auto even = sched::uniform_pipeline(t, chain);
      std::cout << "even split by node count over the whole chain (for comparison):\n"
                << describe_plan(t, even);
    }
    if (t.devices.size() >= 2) {
      try {
        const auto every = sched::plan_replicas(
            t, true, {.every_steps = pp->sync_every, .overlapped = pp->overlapped});
        std::cout << "every device at work (as pipeline.stages = \"auto\" places a local "
                     "swarm):\n"
                  << describe_plan(t, every);
      } catch (const std::invalid_argument& e) {
        std::cout << "every device at work: " << e.what() << "\n";
      }
    }
  });
}

}  // namespace starling::cli
