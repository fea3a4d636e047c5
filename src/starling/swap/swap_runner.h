// Swapped training as the training loop sees it: a step runner (train/step_runner.h) that
// profiles the model, plans the layer groups under [swap] budget, and runs every step through a
// Swapper. Torch-free, so the command line can ask for it without pulling in libtorch.
#pragma once

#include <functional>
#include <memory>
#include <string>

namespace starling::train {
struct RunConfig;
struct Session;
class StepRunner;
class ProgressLine;
}  // namespace starling::train

namespace starling::swap {

using StepRunnerFactory =
    std::function<std::unique_ptr<train::StepRunner>(train::Session&, train::ProgressLine&)>;

// The factory train::TrainOptions::step_runner takes for a config with a [swap] budget. The
// runner it makes throws ConfigError for what swapping does not support yet (fp16 loss scaling,
// the disk tier below a GPU). With peers, ddp and atom exchange its gradients a node at a time
// (StepRunner::visit_gradients), localsgd averages its weights a piece at a time
// (StepRunner::read_state, write_state); strategies that keep whole-model vectors refuse a [swap]
// budget.
// `one_replica`: a single trainer, which announces each step's update (StepRunner::expect_update)
// so that it may start inside the backward; a peer's exchange comes in between.
StepRunnerFactory swapped_step_runner(bool one_replica);

// `starling plan swap`: builds the config's model, profiles it and the tier, and returns the
// plan for `budget` (a size such as "2GB") as text: for one replica where strategy.kind is
// "none", else as each peer runs it (swapped_step_runner(false)). ConfigError for an infeasible
// budget, naming the smallest feasible one.
std::string plan_swap_for(const train::RunConfig& config, const std::string& budget);

}  // namespace starling::swap
