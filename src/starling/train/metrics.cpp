#include "starling/train/metrics.h"

#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <sstream>
#include <vector>

namespace starling::train {

MetricsLog::MetricsLog(const std::filesystem::path& run_dir, int64_t resume_step) {
  const auto path = run_dir / "metrics.jsonl";
  if (resume_step >= 0 && std::filesystem::exists(path)) {
    std::vector<std::string> kept;
    std::ifstream in(path);
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && j.contains("step") && j["step"].is_number() &&
          j["step"].get<int64_t>() > resume_step)
        continue;
      if (!line.empty()) kept.push_back(line);
    }
    std::ofstream rewrite(path, std::ios::trunc);
    for (const auto& l : kept) rewrite << l << "\n";
  } else if (resume_step < 0) {
    std::ofstream(path, std::ios::trunc);
  }
  out_.open(path, std::ios::app);
}

void MetricsLog::write(const nlohmann::json& record) {
  out_ << record.dump() << "\n";
  out_.flush();
}

ProgressLine::ProgressLine(bool enabled) : enabled_(enabled), tty_(::isatty(STDERR_FILENO)) {}

void ProgressLine::update(const std::string& text, bool milestone) {
  if (!enabled_) return;
  if (tty_) {
    std::string padded = text;
    if (padded.size() < last_width_) padded.append(last_width_ - padded.size(), ' ');
    std::cerr << "\r" << padded << std::flush;
    last_width_ = text.size();
  } else if (milestone) {
    std::cerr << text << "\n" << std::flush;
  }
}

void ProgressLine::note(const std::string& text) {
  if (!enabled_) return;
  if (tty_ && last_width_ > 0) {
    std::cerr << "\r" << std::string(last_width_, ' ') << "\r";
    last_width_ = 0;
  }
  std::cerr << text << "\n" << std::flush;
}

void ProgressLine::log(const std::string& text) {
  if (enabled_) {
    note(text);
  } else {
    std::cerr << text << "\n" << std::flush;
  }
}

void ProgressLine::finish() {
  if (enabled_ && tty_ && last_width_ > 0) std::cerr << "\n" << std::flush;
  last_width_ = 0;
}

std::string format_duration(double seconds) {
  if (seconds < 0 || seconds != seconds) return "?";
  const long s = static_cast<long>(seconds + 0.5);
  char buf[32];
  if (s >= 3600)
    std::snprintf(buf, sizeof buf, "%ldh%02ldm", s / 3600, (s % 3600) / 60);
  else if (s >= 60)
    std::snprintf(buf, sizeof buf, "%ldm%02lds", s / 60, s % 60);
  else
    std::snprintf(buf, sizeof buf, "%lds", s);
  return buf;
}

std::string fmt(const char* format, double value) {
  char buf[64];
  const int n = std::snprintf(buf, sizeof buf, format, value);
  if (n < 0) return std::string();
  if (static_cast<size_t>(n) < sizeof buf) return std::string(buf, static_cast<size_t>(n));
  // A longer line (a sentence around the number): formatted again at its full length.
  std::string out(static_cast<size_t>(n), '\0');
  std::snprintf(out.data(), out.size() + 1, format, value);
  return out;
}

double now_s() { return seconds_of(std::chrono::steady_clock::now()); }

double seconds_of(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

}  // namespace starling::train
