#include <iostream>

#include "starling/cli/commands.h"
#include "starling/swap/swap_runner.h"
#include "starling/train/config.h"

namespace starling::cli {

void add_plan_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("plan", "plan how a run uses this machine's memory");
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
}

}  // namespace starling::cli
