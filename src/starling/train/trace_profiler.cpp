#include "starling/train/trace_profiler.h"

#include <c10/util/Exception.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <set>

#include "starling/common/error.h"

namespace starling::train {
namespace {

namespace prof = torch::profiler::impl;

prof::ProfilerConfig trace_config() { return prof::ProfilerConfig(prof::ProfilerState::KINETO); }

}  // namespace

TraceProfiler::TraceProfiler(bool cuda) {
  std::set<prof::ActivityType> activities{prof::ActivityType::CPU};
  if (cuda) activities.insert(prof::ActivityType::CUDA);
  try {
    torch::autograd::profiler::prepareProfiler(trace_config(), activities);
    torch::autograd::profiler::enableProfiler(trace_config(), activities);
  } catch (const c10::Error& e) {
    throw ConfigError(std::string("--profile: this libtorch cannot record traces (built without "
                                  "the Kineto profiler?): ") +
                      e.what_without_backtrace());
  }
  running_ = true;
}

TraceProfiler::~TraceProfiler() {
  if (running_) torch::autograd::profiler::disableProfiler();
}

void TraceProfiler::save(const std::string& path) {
  if (!running_) return;
  running_ = false;
  auto result = torch::autograd::profiler::disableProfiler();
  result->save(path);
}

}  // namespace starling::train
