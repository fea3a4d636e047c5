// The [pipeline] table: the model's OP-DAG cut into contiguous stages that run on different peers,
// activations flowing forward and their gradients back over the swarm (docs/pipeline.md). The
// strategy layer owns these settings and their keys; train/config.h places the table in a run's
// config. Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "starling/config/keys_fwd.h"

namespace starling::strategy {

struct PipelineConfig {
  // Node ranges [first, last] of each stage, in order, covering every node of the model once
  // (`starling model show` numbers them). Empty: `num_stages` stages of about equal node count.
  std::vector<std::pair<int64_t, int64_t>> stages;
  int64_t num_stages = 0;  // with `stages` empty; 0 or 1 = no pipeline
  // stages = "auto": OP-Fence (sched/op_fence.h) cuts the model and places the peers over
  // `profile` (a cost table; "" = the model is profiled first). The local launcher plans for its
  // lab and hands every peer explicit stages (auto_pipeline.h); peers started one by one measure
  // their speeds and links and agree on a plan among themselves (pipeline_auto_peer.h).
  bool auto_stages = false;
  std::string profile;
  // Who plans "auto" for a local swarm (`starling train --peers N`): "launcher" (from the lab's
  // rates and CPU shares, before any peer starts) or "peers" (the peers measure themselves and
  // agree, as peers started one by one always do).
  std::string planner = "launcher";
  // With the launcher's plan: train it for this many steps first (in <out_dir>/calibration), set
  // each peer's speed to what its stage measured (sched/calibration.h) and plan again, with a
  // second trial when that moved the stages; the run then starts from step 0 with a plan tried.
  // 0 = plan from the assumed speeds alone; else 2 or more (the first step is left out). -1 (the
  // default) = two rounds when the run is long enough to pay for the trials
  // (strategy::calibration_steps).
  int64_t calibrate_steps = -1;
  // With the launcher's plan and CPU quotas (a lab's cpus, --peer-cpus): where each peer's speed
  // comes from before any trial. "profiled" = every peer's quota profiles the model at once, as
  // the peers will compute beside each other (a quota throttled in short periods buys less than
  // its share); "quotas" = the quota's share of the profiled threads (sched::apply_lab).
  std::string lab_speeds = "profiled";
  std::string schedule = "1f1b";  // micro-batch order: "1f1b" or "gpipe"
  // 1F1B: forwards each stage but the last runs ahead beyond 1F1B's stages - 1 - stage before
  // its first backward. On slow links more micro-batches in flight overlap the forward and
  // backward directions, at the memory of as many more held activations.
  int64_t extra_warmup = 0;
  int64_t stage = -1;  // the stage this peer runs; -1 = from the rank (rank % stages)
  // Pipeline replicas of the same cut, each stage averaged with its counterparts in the others by
  // strategy.kind (ddp, localsgd, diloco or co2): the swarm has stages x replicas peers. 0 = from
  // the world size (WORLD_SIZE, --data-world) divided by the stage count, else 1.
  int64_t replicas = 0;
  int64_t replica = -1;  // the replica this peer belongs to; -1 = from the rank (rank / stages)
  // With replicas: how long the other stages of a pipeline that lost a stage peer wait for a
  // replacement (a peer started with the dead one's key) before they give up; 0 = they stop at
  // once. The replacement and the waiting stages take the state of their counterparts in a whole
  // replica, which admits them all at the same step.
  int64_t replacement_wait_s = 0;
  // What crosses the links between stages in training (evaluation always sends whole tensors):
  // "none" (whole tensors), "int8" (every activation and activation gradient quantized in groups
  // of 256 with one fp32 scale: a quarter of the bytes, no entry dropped), "int4" (the same in 4
  // bits, groups of 64: a seventh of the bytes), "topk" (the topk_ratio of entries of largest
  // magnitude of every activation gradient, and of activations with compress_activations =
  // "topk") or "adatopk" (per stage, as little as lets its tensors cross its slowest outgoing
  // link within the slowest stage's compute time: whole tensors where they already do, then int8
  // activations, int8 gradients, int4 gradients, int4 activations, and only where even int4
  // would take more than adatopk_topk_beyond times that time, the top entries of the gradients,
  // never fewer than adatopk_min_ratio). See compress/.
  std::string compression = "none";
  double topk_ratio = 0.1;
  double adatopk_min_ratio = 0.01;
  double adatopk_topk_beyond = 2.0;
  // With "topk" or "adatopk", how activations cross: "int8" (every entry, quantized in groups of
  // 256 with one fp32 scale each: a quarter of the bytes, no entry dropped), "topk" (sparsified
  // like the gradients, as FusionLLM does) or "none" (whole); "adatopk" may take "int8" down to
  // int4 where int8 does not fit. "int8" and "int4" compression ignore it.
  std::string compress_activations = "int8";
  // Error feedback on compressed activation gradients: what an edge did not send is added to its
  // next gradient.
  bool error_feedback = true;

  bool enabled() const { return auto_stages || !stages.empty() || num_stages > 1; }
  int64_t count() const {
    return stages.empty() ? num_stages : static_cast<int64_t>(stages.size());
  }
};

// Appends the [pipeline] keys, bound to `c`'s fields.
void add_config_keys(PipelineConfig& c, config::Keys& keys);
// Checks what spans keys (stages ordered and contiguous from node 0, stage within the count);
// ConfigError prefixed with `source`. How the stages fit a model is checked when it is built.
void check(const PipelineConfig& c, const std::string& source);

// The node ranges of the stages for a model of `nodes` nodes: the configured ones (ConfigError
// unless they cover exactly nodes 0 .. nodes-1), or an even split by node count.
std::vector<std::pair<int, int>> stage_ranges(const PipelineConfig& c, int nodes);

// What a pipeline peer refuses about the rest of its config (ConfigError naming the keys):
// checked by `starling peer` and by the local launcher before any peer starts.
struct PipelinePeerSettings {
  std::string strategy_kind, dtype, net_backend;
  bool swapped = false;
  int64_t stage = -1, replica = 0, replicas = 1;  // after the rank was applied
};
void check_pipeline_peer(const PipelineConfig& c, const PipelinePeerSettings& s);

// This peer's place in the swarm of pipelines from its flat rank among `world` peers (RANK and
// WORLD_SIZE, or --data-rank and --data-world): fills pipeline.stage (rank % stages),
// pipeline.replica (rank / stages) and pipeline.replicas (world / stages) where they are unset.
// ConfigError when a world of several peers is not a multiple of the stage count.
// ConfigError with stages = "auto" (the plan places the peers).
void place_pipeline_peer(PipelineConfig& c, int64_t rank, int64_t world);

// ConfigError when stages = "auto" reaches what needs explicit stages (a plan must place it).
void refuse_auto_stages(const PipelineConfig& c);

}  // namespace starling::strategy
