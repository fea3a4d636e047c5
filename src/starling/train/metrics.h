// What a run reports: one JSON object per line in <run>/metrics.jsonl, and a live progress line
// (rewritten in place on a terminal, one line per report otherwise).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace starling::train {

class MetricsLog {
 public:
  // Opens <run_dir>/metrics.jsonl for appending. When resuming from `resume_step`, lines of
  // steps after it (written by the interrupted run past its last checkpoint) are dropped first.
  MetricsLog(const std::filesystem::path& run_dir, int64_t resume_step);
  void write(const nlohmann::json& record);

 private:
  std::ofstream out_;
};

class ProgressLine {
 public:
  explicit ProgressLine(bool enabled);
  // Shows `text`, replacing the previous line on a terminal. Without a terminal (logs, CI) only
  // milestone updates are printed, one line each.
  void update(const std::string& text, bool milestone);
  // Prints a permanent line (e.g. an eval result) without losing the progress line.
  void note(const std::string& text);
  // The same, printed even without a progress line (quiet runs, a swarm's peer logs): for what a
  // run's record must keep, such as a swap plan.
  void log(const std::string& text);
  void finish();

 private:
  bool enabled_, tty_;
  size_t last_width_ = 0;
};

// "1h02m", "3m05s", "12s".
std::string format_duration(double seconds);

// printf-style formatting of one number, for progress lines: fmt("%.1f MB", 12.34). Any length.
std::string fmt(const char* format, double value);

// Seconds on the monotonic clock, for measuring intervals.
double now_s();

// A time point of that clock (one a thread noted, say) in now_s()'s seconds.
double seconds_of(std::chrono::steady_clock::time_point t);

}  // namespace starling::train
