// A run against its plan: what the peers of a run of pipeline.stages = "auto" measured, next to
// what OP-Fence predicted for them, so that whoever ran it sees whether the plan held and where
// it did not (when the run ends the launcher prints it for all its peers, and a peer of a plan the
// peers agreed on its own part; pipeline.calibrate_steps plans from measured speeds where the
// assumed ones were wrong). Torch-free.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "starling/sched/calibration.h"

namespace starling::sched {

// One step record of a peer (a metrics.jsonl line, every train.log_every steps): the step, the
// stage's compute so far (net.compute_s) and the invocation's elapsed seconds, both counted from
// the invocation's start.
struct StepRecord {
  int64_t step = 0;
  double compute_s = 0, elapsed_s = 0;
  // The step the invocation that wrote it began at (its run_from: 0 for a fresh start, the
  // resumed checkpoint's step); -1 in records written before the key was.
  int64_t run_from = -1;
};

// What the plan gave one peer: its stage and that stage's compute per micro-batch at the peer's
// planned speed.
struct PlannedPeer {
  int stage = 0;
  double seconds_per_micro_batch = 0;
};

struct PeerAgainstPlan {
  int peer = 0, stage = 0;
  double planned_s = 0, measured_s = 0;  // compute per micro-batch
  double ratio() const { return measured_s / planned_s; }
};

struct RunAgainstPlan {
  int64_t from = 0, to = 0;  // the records the run is timed between: steps from + 1 .. to
  double predicted_step_s = 0;
  double measured_step_s = 0;  // the slowest peer's, wall time between the records
  std::vector<PeerAgainstPlan> peers;
  // "a step took 6.98 s against the 6.54 s predicted (predicted / measured 0.94) over steps
  // 6-80", then a line per peer.
  std::string describe() const;
  // The same in one line, for a run timed from one peer's own records (a peer that reports its
  // part): "a step took ... over steps 6-80; stage 1 computed 0.40 s per micro-batch against
  // the 0.32 s planned (x1.25)".
  std::string describe_own() const;

 private:
  std::string describe_step() const;
};

// The run over the steps `timed` (timed_steps of the run's steps and rounds) as far as the records
// reach: for every peer, between its first record at or after step timed.first - 1 and its last
// at or before timed.last (records every train.log_every steps cannot meet the rounds exactly),
// and only records of the last invocation (a --resume starts its counts again). nullopt when a
// peer has no two such records, the peers' records do not span the same steps, or a planned
// time is not positive. A step's wall time includes the evaluations and checkpoints taken in it.
std::optional<RunAgainstPlan> run_against_plan(const std::vector<std::vector<StepRecord>>& records,
                                               const std::vector<PlannedPeer>& planned,
                                               int64_t micro_batches, double predicted_step_s,
                                               const TimedSteps& timed);

}  // namespace starling::sched
