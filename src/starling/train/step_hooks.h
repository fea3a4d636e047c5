// The seam between the training loop (train/trainer.cpp) and a strategy (strategy/): the loop
// owns the model, optimizer, data, evaluation and checkpoints; hooks decide when replicas
// exchange what. Nothing in train/ knows which strategy is plugged in.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "starling/common/safetensors.h"
#include "starling/graph/param_store.h"
#include "starling/train/adamw.h"
#include "starling/train/config.h"
#include "starling/train/strategy_report.h"

namespace starling::train {

class StepRunner;

// The replica a hook works on: its model, optimizer and where it stands. The loop and the hooks
// share this one object; a strategy that adopts the swarm's state sets `step` here.
struct Replica {
  const RunConfig& config;
  graph::ParamStore& params;
  AdamW& optimizer;
  int64_t step = 0;     // optimizer steps completed (the schedule's position)
  uint64_t tokens = 0;  // training tokens this replica consumed
  // How the steps run, from the first step on (null in StepHooks::start, before it exists): an
  // exchange reaches the gradients through it, and a state transfer gathers the state through it
  // first, since a swapping runner keeps both outside memory.
  StepRunner* runner = nullptr;
};

class StepHooks {
 public:
  virtual ~StepHooks() = default;

  // After the replica is built and, when resuming, restored with its checkpoint's tensors and
  // `state` (see checkpoint_state), before the first step. A strategy agrees on the starting
  // state with its peers here; a peer joining a running swarm adopts the swarm's parameters and
  // step.
  virtual void start(Replica& replica, const nlohmann::json& state,
                     const SafetensorsFile* tensors) = 0;

  // What run_step produced: the step's mean loss (0-dim, on the model's device) and the training
  // tokens this replica consumed for it.
  struct StepWork {
    at::Tensor loss;
    uint64_t tokens = 0;
  };

  // Runs the step's forward and backward passes through `runner`, leaving its gradients in the
  // parameters' .grad(). The default runs train.grad_accum micro-batches (every peer the same
  // share); a strategy whose peers accumulate at their own pace (atom) runs micro-batches until
  // the swarm holds enough samples, and may hold its round's agreement here, after them (which
  // can adopt the swarm's state, replica.step included), so that the step's work includes any
  // micro-batches the agreement shows are still missing.
  virtual StepWork run_step(StepRunner& runner, Replica& replica, double loss_scale);

  // The step's gradients are accumulated in the parameters' .grad(), not yet clipped. Returns
  // whether the optimizer applies them: false skips this step's update (ddp and atom when the
  // exchange gave no average). A skipped step still counts in replica.step and the schedule, but
  // not in AdamW's own count (its bias correction), as a skipped fp16 step does not.
  virtual bool gradients_ready(Replica& replica) = 0;

  // The optimizer step just made replica.step. `last` is true for the run's final step. Returns
  // true at a round boundary, where the parameters are the swarm's shared model: only there are
  // evaluation and checkpoints taken.
  virtual bool step_done(Replica& replica, bool last) = 0;

  // Extra checkpoint content at a boundary: JSON for meta.json and tensors whose names start with
  // "strategy.". May wait for communication still in flight so nothing is lost on a restart.
  virtual nlohmann::json checkpoint_state(
      std::vector<std::pair<std::string, at::Tensor>>& tensors) = 0;

  // Counters for progress, metrics and the launcher.
  virtual StrategyReport report() const = 0;

  // Whether start() ended the run: the peer joined in the swarm's last round, took part in it
  // and in what ends it, and has no step left. The trainer then evaluates and checkpoints that
  // last step, as the others do after theirs.
  virtual bool ended_in_start() const { return false; }

  // Training ended (or stopped): finish or abandon communication in flight, leave the swarm.
  virtual void finish(Replica& replica) = 0;
};

}  // namespace starling::train
