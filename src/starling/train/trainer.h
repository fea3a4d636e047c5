// The training loop: the session (session.h) builds the replica, a step runner (step_runner.h)
// produces each step's gradients, the strategy's hooks (step_hooks.h) exchange what it decides,
// then clipping and the AdamW step on the warmup+cosine schedule; evaluation and checkpoints at
// round boundaries, progress and metrics through step_reporter.h.
// Torch-free header so the CLI does not pull in libtorch.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "starling/train/config.h"
#include "starling/train/strategy_report.h"

namespace starling::train {

class StepHooks;
class StepRunner;
class ProgressLine;
struct Session;

struct TrainOptions {
  bool resume = false;   // continue from <out_dir>/checkpoints/latest
  bool progress = true;  // live progress line on stderr
  // Stop (with a checkpoint) after this step, or at the end of the strategy's round it falls in;
  // the schedule still spans train.steps, so a later --resume continues the same run.
  int64_t stop_at = -1;
  StepHooks* hooks = nullptr;  // a strategy (strategy/); nullptr trains one replica alone
  int data_rank = 0;           // this replica's share of the training data: rank of world
  int data_world = 1;
  // One JSON object per step and event on stdout, for a launcher; such a run also leaves a forced
  // stop to that launcher: any number of SIGINT/SIGTERM ask it to stop at the next boundary.
  bool json_events = false;
  // A start that fails (before config.toml is written) removes the run directory, and the parents
  // it made, where they hold nothing but the lock (Session::remove_unstarted_run_dir). For a lone
  // `train`: a swarm's peer-<i> directories stay, since a gap in them hides the later peers'
  // runs from what looks for them in order (checkpoint_model, the launcher's resume check).
  bool tidy_failed_start = false;
  // Makes the runner that produces each step's gradients and applies the optimizer (e.g. the
  // swapping runner of swap/swap_runner.h); empty runs every step locally (LocalStepRunner).
  std::function<std::unique_ptr<StepRunner>(Session&, ProgressLine&)> step_runner;
  // The first and last node this peer runs when it trains only part of the model (a pipeline
  // stage), given the model's node count: the session then holds only the parameters those nodes
  // read (model::build_model_part), and its optimizer state and checkpoints cover only them.
  // Empty = the whole model.
  std::function<std::pair<int, int>(int nodes)> model_part;
  // Told every record metrics.jsonl gets (a step milestone's, an evaluation's), as it is written,
  // and {"checkpoint_step": N} after each checkpoint: a swarm peer tells the others how it trains
  // (net::Node::set_progress).
  std::function<void(const nlohmann::json& record)> on_record;
};

struct TrainResult {
  int64_t step = 0;          // optimizer steps completed
  double train_loss = 0;     // loss of the last step
  double val_loss = -1;      // last validation loss, -1 if none
  double tokens_per_s = 0;   // over the whole run (excluding eval and checkpoints)
  bool interrupted = false;  // stopped by SIGINT/SIGTERM or stop_at before train.steps
  std::filesystem::path checkpoint;
  std::string sample;                 // the end-of-training sample, if any
  std::optional<StrategyReport> net;  // a strategy's final counters; none when training alone
};

// Runs training. Throws ConfigError/DataError/CheckpointError with a clear message on bad input.
// Without `resume`, refuses to start in an out_dir that already holds a checkpoint (so a run is
// never overwritten by mistake). SIGINT/SIGTERM finish the current step (with a strategy: the
// current round), checkpoint, and return.
TrainResult train(const RunConfig& config, const TrainOptions& options);

}  // namespace starling::train
