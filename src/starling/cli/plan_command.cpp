#include <cstdio>
#include <iostream>
#include <sstream>

#include "starling/cli/commands.h"
#include "starling/cli/number_list.h"
#include "starling/common/error.h"
#include "starling/sched/op_fence.h"
#include "starling/sched/workload.h"
#include "starling/swap/swap_runner.h"
#include "starling/train/config.h"

namespace starling::cli {

namespace {

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, s < 1 ? "%.1f ms" : "%.2f s", s < 1 ? s * 1e3 : s);
  return buf;
}

std::string describe(const sched::CostTable& t, const sched::PipelinePlan& p) {
  std::ostringstream out;
  out << "  stage  device      nodes                                      compute/mb   link "
         "on/mb\n";
  for (size_t s = 0; s < p.stages.size(); ++s) {
    const auto& st = p.stages[s];
    const auto& d = t.devices[static_cast<size_t>(st.device)];
    char line[200];
    const std::string nodes = std::to_string(st.first) + "-" + std::to_string(st.last) + " (" +
                              t.nodes[static_cast<size_t>(st.first)].name + " .. " +
                              t.nodes[static_cast<size_t>(st.last)].name + ")";
    std::snprintf(
        line, sizeof line, "  %-5zu  %-10s  %-41s  %10s   %10s\n", s,
        (std::to_string(st.device) + " (x" + std::to_string(d.speed).substr(0, 4) + ")").c_str(),
        nodes.c_str(), seconds(st.compute_s).c_str(),
        s + 1 < p.stages.size() ? seconds(st.link_s).c_str() : "-");
    out << line;
  }
  out << "  slowest part " << seconds(p.bottleneck_s) << " per micro-batch; predicted step "
      << seconds(p.step_s) << " for " << t.micro_batches << " micro-batches\n";
  return out.str();
}

}  // namespace

void add_plan_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "plan", "plan how a run uses this machine's memory, or how a pipeline cuts the model");
  cmd->require_subcommand(1);
  auto* swap = cmd->add_subcommand(
      "swap",
      "profile a config's model and the swap tier, then print the layer groups, bytes per tier, "
      "predicted step time and share of I/O hidden for a memory budget (docs/swap.md)");
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
    std::cout << swap::plan_swap_for(config, budget);
  });

  auto* profile = cmd->add_subcommand(
      "profile",
      "measure a config's model on this machine (each node's forward and backward time, the "
      "bytes each cut sends) into a cost table for `plan pipeline` (docs/scheduler.md)");
  struct ProfileArgs {
    std::string config, out;
    std::vector<std::string> sets;
  };
  auto pa = std::make_shared<ProfileArgs>();
  profile->add_option("-c,--config", pa->config, "config file (TOML)")->required();
  profile->add_option("-o,--out", pa->out, "cost table to write (JSON)")->required();
  profile->add_option("--set", pa->sets, "override a key (repeatable)");
  profile->callback([pa] {
    const auto config = train::load_run_config(pa->config, pa->sets);
    const sched::CostTable t = sched::profile_workload(config);
    sched::write_cost_table(pa->out, t);
    double total = 0;
    for (const auto& n : t.nodes) total += n.compute_s;
    std::cout << "profiled " << t.nodes.size() << " nodes: " << seconds(total)
              << " per micro-batch of " << config.train.batch_size << " x " << config.model.seq_len
              << " tokens, forward and backward; wrote " << pa->out << "\n";
  });

  auto* pipeline = cmd->add_subcommand(
      "pipeline",
      "cut a profiled model into pipeline stages for devices of given speeds and links "
      "(OP-Fence: groups by bandwidth, exact cut; docs/scheduler.md)");
  struct PipelineArgs {
    std::string profile, speeds = "1,1", rate = "1gbit";
    std::vector<std::string> links;
    int64_t micro_batches = 0;
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
  pipeline
      ->add_option("--micro-batches", pp->micro_batches,
                   "micro-batches per step (default: the profiled config's train.grad_accum)")
      ->check(CLI::PositiveNumber);
  pipeline->callback([pp] {
    sched::CostTable t = sched::read_cost_table(pp->profile);
    if (pp->micro_batches > 0) t.micro_batches = pp->micro_batches;
    const std::vector<double> speeds =
        parse_positive_numbers(pp->speeds, "--speeds", "a speed > 0 (e.g. 0.5 or 2)");
    t.devices.clear();
    for (size_t d = 0; d < speeds.size(); ++d)
      t.devices.push_back({.name = "device " + std::to_string(d), .speed = speeds[d]});
    const double rate = sched::parse_link_rate(pp->rate, "--link-rate");
    t.links.assign(speeds.size(), std::vector<sched::LinkCost>(speeds.size(), {rate, 0}));
    for (const std::string& l : pp->links) {
      int a = -1, b = -1;
      char rest[64] = {};
      if (std::sscanf(l.c_str(), "%d-%d=%63s", &a, &b, rest) != 3 || a < 0 || b < 0 ||
          a >= static_cast<int>(speeds.size()) || b >= static_cast<int>(speeds.size()) || a == b)
        throw ConfigError("--link " + l + ": expected A-B=RATE with two different devices of " +
                          std::to_string(speeds.size()));
      const double r = sched::parse_link_rate(rest, "--link " + l);
      t.links[static_cast<size_t>(a)][static_cast<size_t>(b)] = {r, 0};
      t.links[static_cast<size_t>(b)][static_cast<size_t>(a)] = {r, 0};
    }
    t.validate(pp->profile);
    const auto groups = sched::cluster_devices(t);
    const auto chain = sched::device_chain(t, groups);
    std::cout << groups.size() << " group" << (groups.size() == 1 ? "" : "s")
              << " of devices by bandwidth; chain";
    for (const int d : chain) std::cout << " " << d;
    std::cout << "\nOP-Fence:\n" << describe(t, sched::op_fence(t));
    if (static_cast<int>(chain.size()) <= static_cast<int>(t.nodes.size())) {
      const auto even = sched::uniform_pipeline(t, chain);
      std::cout << "even split by node count over the whole chain (for comparison):\n"
                << describe(t, even);
    }
  });
}

}  // namespace starling::cli
