// What the swap planner needs to know, measured on this machine: each node's forward and
// backward time on one micro-batch, each parameter's bytes, the optimizer's time, and the tier's
// read and write bandwidth.
#pragma once

#include <c10/core/Device.h>

#include <filesystem>
#include <functional>
#include <string>

#include "starling/swap/swap_plan.h"

namespace starling::graph {
class OpDag;
struct ExecutorOptions;
}  // namespace starling::graph

namespace starling::swap {

// Runs one forward and backward of a (batch x seq_len) micro-batch of token 0 through `dag`,
// timing every node, then drops the gradients it made. The weights must be resident on `device`
// (on a GPU each node is timed to the end of its kernels). The global random generator is not
// touched, so a run that profiles stays bit-identical to one that does not.
SwapProblem profile_nodes(graph::OpDag& dag, const graph::ExecutorOptions& options, int64_t batch,
                          int64_t seq_len, c10::Device device = c10::Device(c10::kCPU));

// How much longer a unit of computation like a training step's (a matrix product and an AdamW
// update, on the training's threads, about 50 ms) takes while `beside` runs again and again on
// another thread: the median of five timings beside it over the median of five alone, less one
// (0.2: 20% longer), at least 0. Touches no random generator. CPU only.
double probe_slowdown(const std::function<void()>& beside);

// Reads and writes `bytes` through a fresh tier of `kind` in `dir` below `device`'s memory;
// fills read_bps, write_bps and what the tier is (duplex, copies_take_compute, in_place). With
// `slowdown` on a CPU whose copies do not take the computing cores, also io_slowdown: a
// unit of computation like a step's (a matrix product, an AdamW update, on the training's
// threads) timed alone and while the tier reads and writes without pause (probe_slowdown).
void measure_tier(SwapProblem& problem, const std::string& kind, const std::filesystem::path& dir,
                  int64_t bytes, c10::Device device = c10::Device(c10::kCPU),
                  bool slowdown = false);

}  // namespace starling::swap
