// A pipeline's stages that read the same parameter (GPT-2's tied embedding and head) each hold a
// copy of it. Their gradients are summed across the stages every step, so the copies step alike;
// but a strategy with rounds (localsgd, diloco, co2) averages each copy in its own stage's group,
// and with three or more replicas those groups may add the replicas in different orders: the
// copies would drift apart in their last bits, round after round. These hooks wrap the strategy
// and, after every round boundary, have the stage's runner align the copies
// (PipelineStepRunner::align_shared_copies), so they end each round equal, bit for bit.
#pragma once

#include <cstdint>
#include <memory>

#include "starling/train/step_hooks.h"

namespace starling::strategy {

// The CRC-32C of a copy's bytes, which the stages holding it compare to see whether it drifted.
// Equal copies give equal checksums; copies apart in a few last bits (the drift: some elements
// one unit up, others one down) always differ, which a plain sum of the bits would miss whenever
// the ups and downs cancel. A copy on a GPU is read through the host.
uint32_t copy_checksum(const at::Tensor& value);

class PipelineStepRunner;

class AlignSharedCopies final : public train::StepHooks {
 public:
  explicit AlignSharedCopies(std::unique_ptr<train::StepHooks> strategy)
      : strategy_(std::move(strategy)) {}

  // The stage's runner, once the trainer has made it (it outlives the steps).
  void set_runner(PipelineStepRunner* runner) { runner_ = runner; }

  // A replica whose stages joined in the last round took that round inside start(): its copies
  // are aligned there, as after any round (every stage of the replica joined in it together).
  void start(train::Replica& replica, const nlohmann::json& state,
             const SafetensorsFile* tensors) override;
  StepWork run_step(train::StepRunner& runner, train::Replica& replica,
                    double loss_scale) override {
    return strategy_->run_step(runner, replica, loss_scale);
  }
  bool gradients_ready(train::Replica& replica) override {
    return strategy_->gradients_ready(replica);
  }
  bool step_done(train::Replica& replica, bool last) override;
  nlohmann::json checkpoint_state(
      std::vector<std::pair<std::string, at::Tensor>>& tensors) override {
    return strategy_->checkpoint_state(tensors);
  }
  train::StrategyReport report() const override { return strategy_->report(); }
  bool ended_in_start() const override { return strategy_->ended_in_start(); }
  void finish(train::Replica& replica) override { strategy_->finish(replica); }

 private:
  std::unique_ptr<train::StepHooks> strategy_;
  PipelineStepRunner* runner_ = nullptr;
};

}  // namespace starling::strategy
