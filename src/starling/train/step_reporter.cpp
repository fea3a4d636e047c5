#include "starling/train/step_reporter.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>

#include "starling/train/events.h"

namespace starling::train {
namespace {

// " | 4 peers | sent 12.3 MB | net wait 4.0s" from a strategy's report, "" without one.
std::string net_summary(const std::optional<StrategyReport>& net) {
  if (!net) return "";
  return " | " + std::to_string(net->peers) + " peers | sent " +
         fmt("%.1f MB", net->bytes_sent / 1e6) + " | net wait " + fmt("%.1fs", net->net_wait_s);
}

}  // namespace

StepReporter::StepReporter(const RunConfig& config, ProgressLine& progress, bool json_events,
                           double peak_gflops, int64_t last, int64_t resume_step,
                           std::function<void(const nlohmann::json&)> on_record)
    : config_(config),
      progress_(progress),
      metrics_(config.train.out_dir, resume_step),
      json_events_(json_events),
      on_record_(std::move(on_record)),
      peak_gflops_(peak_gflops),
      flops_per_token_(config.model.train_flops_per_token()),
      last_(last),
      run_from_(std::max<int64_t>(resume_step, 0)),
      start_s_(now_s()) {}

double StepReporter::elapsed_s() const { return now_s() - start_s_; }

double StepReporter::run_tokens_per_s() const {
  return compute_s_ > 0 ? static_cast<double>(run_tokens_) / compute_s_ : 0;
}

void StepReporter::step(const StepOutcome& s, bool milestone,
                        const std::optional<StrategyReport>& net) {
  compute_s_ += s.seconds;
  window_s_ += s.seconds;
  window_tokens_ += s.step_tokens;
  run_tokens_ += s.step_tokens;
  ++run_steps_;
  const double tps = static_cast<double>(window_tokens_) / window_s_;
  const double tflops = tps * flops_per_token_ / 1e12;
  const double mfu = tflops * 1e3 / peak_gflops_;
  const double eta =
      (compute_s_ / static_cast<double>(run_steps_)) * static_cast<double>(last_ - s.step);
  const int64_t steps = config_.train.steps;
  if (milestone && json_events_)
    std::cout << events::step({.step = s.step,
                               .steps = steps,
                               .loss = s.loss,
                               .lr = s.lr,
                               .tokens = s.tokens,
                               .tokens_per_s = tps,
                               .elapsed_s = elapsed_s()},
                              net)
                     .dump()
              << std::endl;
  progress_.update(
      "step " + std::to_string(s.step) + "/" + std::to_string(steps) + " | loss " +
          fmt("%.4f", s.loss) + " | lr " + fmt("%.2e", s.lr) + " | " + fmt("%.0f", tps) +
          " tok/s | " +
          // A small model on a CPU runs at a few GFLOP/s: 0.0 TFLOP/s says nothing.
          (tflops < 1 ? fmt("%.1f", tflops * 1e3) + " GFLOP/s" : fmt("%.1f", tflops) + " TFLOP/s") +
          " | MFU " + fmt("%.1f%%", 100 * mfu) + " | " + format_duration(elapsed_s()) +
          " elapsed, eta " + format_duration(eta) + net_summary(net),
      milestone);
  if (!milestone) return;
  nlohmann::json record = {
      {"step", s.step},           {"loss", s.loss},     {"lr", s.lr},
      {"grad_norm", s.grad_norm}, {"tokens", s.tokens}, {"tokens_per_s", tps},
      {"tflops", tflops},         {"mfu", mfu},         {"elapsed_s", elapsed_s()},
      {"run_from", run_from_}};
  if (s.skipped) {
    record["grad_norm"] = nullptr;
    record["skipped"] = true;
  }
  if (s.loss_scale) record["loss_scale"] = *s.loss_scale;
  if (net) record["net"] = *net;
  metrics_.write(record);
  if (on_record_) on_record_(record);
  window_s_ = 0;
  window_tokens_ = 0;
}

void StepReporter::eval(int64_t step, double val_loss, uint64_t tokens) {
  const nlohmann::json record = {
      {"step", step}, {"val_loss", val_loss}, {"tokens", tokens}, {"elapsed_s", elapsed_s()}};
  metrics_.write(record);
  if (on_record_) on_record_(record);
  if (json_events_)
    std::cout << events::eval(step, val_loss, tokens, elapsed_s()).dump() << std::endl;
  progress_.note("step " + std::to_string(step) + " | val loss " + fmt("%.4f", val_loss));
}

}  // namespace starling::train
