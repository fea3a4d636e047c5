// What the training loop tells the world after each step and evaluation: the live progress line,
// records in metrics.jsonl, and --json events (events.h). It keeps the throughput window (tokens/s,
// TFLOP/s and MFU over the steps since the last milestone) and the run's compute time.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

#include "starling/train/config.h"
#include "starling/train/metrics.h"
#include "starling/train/strategy_report.h"

namespace starling::train {

struct StepOutcome {
  int64_t step = 0;  // the step just completed
  double loss = 0;   // its loss, as last read from the device
  double lr = 0;
  double grad_norm = 0;              // read only at milestones
  std::optional<double> loss_scale;  // fp16 runs
  uint64_t tokens = 0;               // training tokens consumed so far
  uint64_t step_tokens = 0;          // of those, by this step (atom: varies from step to step)
  double seconds = 0;                // wall time of the step, communication included
  // The update was skipped (an fp16 overflow, a ddp or atom step without the swarm's average):
  // its record says so, with grad_norm null: it would be the norm of gradients no update used
  // (an overflow's, or partly summed ones).
  bool skipped = false;
};

class StepReporter {
 public:
  // `last` is the step this run stops at; `resume_step` >= 0 when resuming (metrics.jsonl drops
  // lines written after it).
  StepReporter(const RunConfig& config, ProgressLine& progress, bool json_events,
               double peak_gflops, int64_t last, int64_t resume_step,
               std::function<void(const nlohmann::json&)> on_record = {});

  // Counts the step's time; at a milestone (every train.log_every steps, and the last) writes the
  // metrics record and the step event, and closes the throughput window.
  void step(const StepOutcome& s, bool milestone, const std::optional<StrategyReport>& net);
  void eval(int64_t step, double val_loss, uint64_t tokens);

  // Tokens per second over the whole run's steps (evaluations and checkpoints excluded).
  double run_tokens_per_s() const;
  double elapsed_s() const;

 private:
  const RunConfig& config_;
  ProgressLine& progress_;
  MetricsLog metrics_;
  bool json_events_;
  std::function<void(const nlohmann::json&)> on_record_;
  double peak_gflops_, flops_per_token_;
  int64_t last_;
  int64_t run_from_;  // the step this invocation began at, in every step record
  double start_s_;
  double compute_s_ = 0, window_s_ = 0;
  int64_t window_tokens_ = 0, run_tokens_ = 0, run_steps_ = 0;
};

}  // namespace starling::train
