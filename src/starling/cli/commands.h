// Subcommands of the `starling` binary; each file registers one and owns its options.
#pragma once

#include <CLI/CLI.hpp>

namespace starling::cli {

void add_data_command(CLI::App& app);
void add_train_command(CLI::App& app);
void add_sample_command(CLI::App& app);
void add_export_command(CLI::App& app);
void add_eval_command(CLI::App& app);
void add_model_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_net_commands(CLI::App& app);  // keygen, status
void add_peer_command(CLI::App& app);
void add_plan_command(CLI::App& app);  // plan swap

}  // namespace starling::cli
