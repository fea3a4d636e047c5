// A Chrome trace (chrome://tracing, Perfetto) of host operators and device kernels, through
// libtorch's Kineto profiler: what `starling bench compute --profile` writes, so that Starling's
// kernels can be compared one by one with PyTorch's (bench/compute/trace_summary.py).
#pragma once

#include <string>

namespace starling::train {

class TraceProfiler {
 public:
  // Starts recording CPU operators, plus CUDA kernels when `cuda`. Throws ConfigError when this
  // libtorch was built without Kineto.
  explicit TraceProfiler(bool cuda);
  ~TraceProfiler();
  TraceProfiler(const TraceProfiler&) = delete;
  TraceProfiler& operator=(const TraceProfiler&) = delete;

  // Stops recording and writes the trace to `path` (JSON).
  void save(const std::string& path);

 private:
  bool running_ = false;
};

}  // namespace starling::train
