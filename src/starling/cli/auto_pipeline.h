// pipeline.stages = "auto" for a local swarm (`starling train --peers N`): the launcher knows every
// peer's CPU share and every link (the lab), so it plans the pipeline itself before any peer
// starts. It reads the cost table of pipeline.profile (or profiles the model on this machine),
// lays the lab over it (sched/lab_spec.h), and lets OP-Fence choose the stage count, the cut and
// each peer's place (sched/op_fence.h: plan_replicas). The peers then run explicit stages, as if
// they had been configured by hand.
#pragma once

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "starling/sched/lab_spec.h"

namespace starling::train {
struct RunConfig;
}

namespace starling::cli {

struct AutoPipeline {
  std::vector<std::pair<int64_t, int64_t>> stages;  // node ranges, shared by every replica
  int replicas = 1;
  std::vector<int> stage_of, replica_of;  // per peer
  double predicted_step_s = 0;
  std::string report;  // the plan as `starling plan pipeline` prints it

  // The --set overrides that place peer `i` (stages, stage, replica, replicas).
  std::vector<std::string> overrides(int i) const;
};

// ConfigError when the profile cannot be read or its nodes are not the model's, or no pipeline
// fits the peers (sched::plan_replicas says why).
AutoPipeline plan_auto_pipeline(const train::RunConfig& config, const sched::LabSpec& lab);

// The plan a run began with, kept in its out_dir so --resume places every peer as before (a new
// profile could cut elsewhere, and the checkpoints hold the old stages). Atomic write; the read
// is a ConfigError naming the file when it is damaged (a missing field, a place out of range or
// held twice).
void write_auto_pipeline(const std::filesystem::path& file, const AutoPipeline& a);
AutoPipeline read_auto_pipeline(const std::filesystem::path& file);

}  // namespace starling::cli
