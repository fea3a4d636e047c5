#include "starling/train/trace_profiler.h"

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <unistd.h>

#include <filesystem>
#include <set>
#include <string>

#include "starling/common/error.h"

namespace starling::train {
namespace {

namespace prof = torch::profiler::impl;

prof::ProfilerConfig trace_config() { return prof::ProfilerConfig(prof::ProfilerState::KINETO); }

void start(const std::set<prof::ActivityType>& activities) {
  torch::autograd::profiler::prepareProfiler(trace_config(), activities);
  torch::autograd::profiler::enableProfiler(trace_config(), activities);
}

ConfigError cannot_trace(const c10::Error& e) {
  return ConfigError(std::string("--profile: this libtorch cannot write traces (built without the "
                                 "Kineto profiler?): ") +
                     e.what_without_backtrace());
}

}  // namespace

TraceProfiler::TraceProfiler(bool cuda) {
  std::set<prof::ActivityType> activities{prof::ActivityType::CPU};
  if (cuda) activities.insert(prof::ActivityType::CUDA);
  try {
    // A libtorch without Kineto records without complaint and fails only when saving: find out
    // now, before the user waits for the run.
    start(activities);
    const auto probe = std::filesystem::temp_directory_path() /
                       ("starling-trace-probe-" + std::to_string(::getpid()) + ".json");
    torch::autograd::profiler::disableProfiler()->save(probe.string());
    std::filesystem::remove(probe);
    start(activities);
  } catch (const c10::Error& e) {
    throw cannot_trace(e);
  }
  running_ = true;
}

TraceProfiler::~TraceProfiler() {
  if (running_) torch::autograd::profiler::disableProfiler();
}

void TraceProfiler::save(const std::string& path) {
  if (!running_) return;
  running_ = false;
  try {
    torch::autograd::profiler::disableProfiler()->save(path);
  } catch (const c10::Error& e) {
    throw Error("--profile " + path + ": could not write the trace: " + e.what_without_backtrace());
  }
}

}  // namespace starling::train
