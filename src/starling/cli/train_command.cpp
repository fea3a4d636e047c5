#include <iostream>

#include "starling/cli/commands.h"
#include "starling/train/trainer.h"

namespace starling::cli {

void add_train_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "train a model from a TOML config (docs/config.md)");
  struct Args {
    std::string config;
    std::vector<std::string> sets;
    bool resume = false, quiet = false, list_keys = false;
    int64_t stop_at = -1;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("-c,--config", a->config, "config file (TOML)");
  cmd->add_option("--set", a->sets, "override a key, e.g. --set train.steps=100 (repeatable)");
  cmd->add_flag("--resume", a->resume, "continue from the newest checkpoint in train.out_dir");
  cmd->add_option("--stop-at", a->stop_at,
                  "stop with a checkpoint after this step (the schedule still spans train.steps)");
  cmd->add_flag("-q,--quiet", a->quiet, "no live progress line");
  cmd->add_flag("--list-keys", a->list_keys, "list every config key with its default and exit");
  cmd->callback([a] {
    if (a->list_keys) {
      std::cout << train::describe_keys();
      return;
    }
    if (a->config.empty()) throw CLI::RequiredError("--config");
    const auto config = train::load_run_config(a->config, a->sets);
    const auto result =
        train::train(config, {.resume = a->resume, .progress = !a->quiet, .stop_at = a->stop_at});
    std::cout << "trained " << result.step << " steps: loss " << result.train_loss;
    if (result.val_loss >= 0) std::cout << ", val loss " << result.val_loss;
    std::cout << ", " << static_cast<long>(result.tokens_per_s) << " tokens/s\n";
    if (!result.checkpoint.empty())
      std::cout << "checkpoint: " << result.checkpoint.string() << "\n";
    if (!result.sample.empty()) std::cout << "sample:\n" << result.sample << "\n";
  });
}

}  // namespace starling::cli
