// pipeline.stages = "auto": OP-Fence (sched/op_fence.h: plan_replicas) chooses the stage count, the
// cut and each peer's place from a cost table whose devices are the swarm's peers. Two planners
// fill that table:
// - the local launcher (`starling train --peers N`), which knows every peer's CPU share and every
//   link (the lab): it profiles the model (or reads pipeline.profile), lays the lab over it
//   (sched/lab_spec.h) and plans before any peer starts (plan_auto_pipeline);
// - peers started one by one (`starling peer`), which measure their own speed and links and
//   agree on one plan among themselves (pipeline_auto_peer.h), through plan_on_costs.
// Either way the peers then run explicit stages, as if they had been configured by hand.
#pragma once

#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "starling/sched/calibration.h"
#include "starling/sched/cost_table.h"
#include "starling/sched/lab_spec.h"
#include "starling/sched/op_fence.h"
#include "starling/sched/run_against_plan.h"

namespace starling::train {
struct RunConfig;
}

namespace starling::strategy {

struct AutoPipeline {
  std::vector<std::pair<int64_t, int64_t>> stages;  // node ranges, shared by every replica
  int replicas = 1;
  std::vector<int> stage_of, replica_of;  // per peer (a device of the cost table)
  double predicted_step_s = 0;
  std::string report;  // the plan as `starling plan pipeline` prints it
  // A plan the peers agreed on themselves: their ids (net::format_peer_id) in device order, and
  // which of them the peer that keeps this copy is (-1: a launcher's plan, by peer number).
  std::vector<std::string> peer_ids;
  int self = -1;
  // Among peers that plan themselves: train this plan for this many steps as a trial of
  // pipeline.calibrate_steps and report what it measured, then take the next plan (0: the plan
  // to run).
  int64_t trial_steps = 0;
  // Per peer (device order): the compute per micro-batch of its stage at the speed the plan gave
  // it, what the run is measured against when it ends (run_against_auto_pipeline). Saved, so a
  // resumed run and each peer that planned with the others can set its run against it.
  std::vector<double> planned_compute_s;
  // OP-Fence's plan behind it, for pricing the same places on other speeds
  // (reprice_auto_pipeline). Not saved: empty in a plan read back.
  sched::ReplicatedPlan priced;

  // The --set overrides that place peer `i` (stages, stage, replica, replicas).
  std::vector<std::string> overrides(int i) const;
};

// The cost table of the model: pipeline.profile's, checked against the model's nodes, or this
// machine's profile of it (sched::profile_workload), with the config's micro-batches. ConfigError
// when the profile cannot be read or its nodes are not the model's.
sched::CostTable model_costs(const train::RunConfig& config);

// OP-Fence over `t`, whose devices and links are already the swarm's: the cut bytes are priced at
// what pipeline.compression sends, and the replicas average by strategy.kind. ConfigError naming
// `where` when the table is inconsistent or no pipeline fits the devices.
AutoPipeline plan_on_costs(const train::RunConfig& config, sched::CostTable t,
                           const std::string& where);

// The launcher's cost table: model_costs with `lab`'s peers and links laid over it.
sched::CostTable lab_costs(const train::RunConfig& config, const sched::LabSpec& lab);
// The launcher's plan: OP-Fence over lab_costs (where the table came from names its errors).
AutoPipeline plan_auto_pipeline(const train::RunConfig& config, const sched::CostTable& costs);

// `planned` (a plan of plan_on_costs, same config) priced on `t`: the same stages and places at
// t's speeds (say, those a trial of it measured), its report and predicted step with them.
AutoPipeline reprice_auto_pipeline(const train::RunConfig& config, sched::CostTable t,
                                   const AutoPipeline& planned);

// The compute per micro-batch of the stage one peer ran, from its metrics.jsonl (`file`), over
// the `timed` steps: what trial_timings reads for each peer, and what a peer of a swarm that plans
// itself reports of its own trial. ConfigError naming the file as trial_timings does.
double trial_seconds_per_micro_batch(const std::filesystem::path& file, int64_t micro_batches,
                                     const sched::TimedSteps& timed);

// pipeline.calibrate_steps: what each peer of a trial run of `plan` measured, from
// `<root>/peer-<i>/metrics.jsonl` (the compute per micro-batch of its stage over the `timed`
// steps; sched/calibration.h). ConfigError naming the file when a peer's records are missing,
// damaged or lack a timed step.
std::vector<sched::StageTiming> trial_timings(const AutoPipeline& plan,
                                              const std::filesystem::path& root,
                                              int64_t micro_batches,
                                              const sched::TimedSteps& timed);

// One peer's step records in a run of an AutoPipeline: the device the plan placed it as, the
// number it is reported by (a launcher's peer-<n>), and its metrics.jsonl.
struct PeerRecords {
  int device = 0, peer = 0;
  std::filesystem::path metrics;
};
// The records of a local launcher's peers, <root>/peer-<i>/metrics.jsonl, for its own plan (peer
// i is device i).
std::vector<PeerRecords> launcher_peer_records(const std::filesystem::path& root, int peers);

// How the run of `plan` went against it for the peers in `records` (sched/run_against_plan.h;
// every peer of the plan, or one that reports its own part), over the whole rounds after the first
// of train.steps as a trial times them (with co2, all but the last step, which waits for the
// averaging in flight). nullopt where the plan has no planned_compute_s (a plan saved before it
// had) or the records cannot say (a peer without them, too few steps).
std::optional<sched::RunAgainstPlan> run_against_auto_pipeline(
    const AutoPipeline& plan, const std::vector<PeerRecords>& records,
    const train::RunConfig& config);

// The steps of strategy.kind that end in an averaging of the replicas (rounds of
// strategy.local_steps for localsgd, diloco and co2; 1 otherwise).
int64_t round_steps(const train::RunConfig& config);

// How long the trials of a plan run (pipeline.calibrate_steps), for a run of
// `config` with stages = "auto": `steps` per trial (0 = no trial), and a line saying why. An
// explicit value stands; -1 chooses two rounds (2 x round_steps; 3 steps without rounds), the
// least that times a round as the run has them (sched::timed_steps), when train.steps is at least
// kAutoCalibrationRuns times that (its two trials at most then cost a tenth of the run), and
// no trial for a shorter run. Peers that plan themselves ask the planner's config.
constexpr int64_t kAutoCalibrationRuns = 20;
struct CalibrationChoice {
  int64_t steps = 0;
  std::string why;
};
CalibrationChoice calibration_steps(const train::RunConfig& config);

// The plan a run began with, kept in its out_dir so --resume places every peer as before (a new
// profile could cut elsewhere, and the checkpoints hold the old stages). Atomic write; the read
// is a ConfigError naming the file when it is damaged (a missing field, a place out of range or
// held twice, peer ids that do not match the places or are no peer ids, planned_compute_s of
// another count or a negative time).
void write_auto_pipeline(const std::filesystem::path& file, const AutoPipeline& a);
AutoPipeline read_auto_pipeline(const std::filesystem::path& file);
// The same JSON as a string (what peers send one another), and back: ConfigError naming `where`
// as read_auto_pipeline does.
std::string auto_pipeline_text(const AutoPipeline& a);
AutoPipeline parse_auto_pipeline(const std::string& text, const std::string& where);

}  // namespace starling::strategy
