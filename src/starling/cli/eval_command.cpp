#include <fstream>
#include <iostream>

#include "starling/cli/commands.h"
#include "starling/common/cpu_runtime.h"
#include "starling/common/error.h"
#include "starling/train/eval_checkpoint.h"
#include "starling/train/metrics.h"

namespace starling::cli {

void add_eval_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("eval", "loss and perplexity of a checkpoint on a dataset split");
  auto ckpt = std::make_shared<std::string>();
  auto json = std::make_shared<std::string>();
  auto quiet = std::make_shared<bool>(false);
  auto threads = std::make_shared<int>(0);
  auto o = std::make_shared<train::EvalOptions>();
  cmd->add_option("--checkpoint", *ckpt, "run directory or checkpoint directory")->required();
  cmd->add_option("--data", o->data, "prepared dataset directory (default: the run's data.dir)");
  cmd->add_option("--split", o->split, "val or train")->capture_default_str();
  cmd->add_option("--batches", o->batches, "batches to evaluate; 0 = every complete batch")
      ->capture_default_str();
  cmd->add_option("--batch-size", o->batch_size, "sequences per batch; 0 = the run's")
      ->capture_default_str();
  cmd->add_option("--device", o->device, "cpu or cuda")->capture_default_str();
  cmd->add_option("--json", *json, "also write the result to this file as JSON");
  cmd->add_option("--threads", *threads,
                  "intra-op threads on the CPU; 0 = physical cores (within a CPU limit)")
      ->check(CLI::Range(0, 1024))
      ->capture_default_str();
  cmd->add_flag("-q,--quiet", *quiet, "no progress line");
  cmd->callback([ckpt, json, quiet, threads, o] {
    setup_cpu_runtime(*threads);
    o->progress = !*quiet;
    const train::EvalResult r = train::eval_checkpoint(*ckpt, *o);
    std::cout << "step " << r.step << " of " << r.checkpoint.string() << " on the " << r.split
              << " split of " << r.data.string() << ": loss " << train::fmt("%.4f", r.loss)
              << ", perplexity " << train::fmt("%.3f", r.perplexity) << " (" << r.batches
              << " batches, " << r.tokens << " tokens, " << train::fmt("%.1f s", r.seconds)
              << ")\n";
    if (!json->empty()) {
      std::ofstream out(*json);
      out << train::eval_json(r) << "\n";
      if (!out) throw Error("--json: cannot write " + *json);
    }
  });
}

}  // namespace starling::cli
