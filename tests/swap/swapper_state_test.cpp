// A swapped replica's state read and written between steps (Swapper::read_state, write_state):
// a write to an evicted tensor's room goes on after the call returns, and whatever next reads
// that room must wait for it. The tier here completes a write only when it is waited for, so a
// read that did not wait would find the old bytes every time.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <vector>

#include "lazy_write_tier.h"
#include "starling/graph/executor.h"
#include "starling/model/build.h"
#include "starling/model/config.h"
#include "starling/swap/profile.h"
#include "starling/swap/swap_plan.h"
#include "starling/swap/swapper.h"
#include "starling/swap/tier.h"
#include "starling/train/adamw.h"

namespace {

using namespace starling;
using namespace starling::swap;

using starling::swap::testing::LazyWriteTier;

model::ModelConfig two_layers() {
  auto c = model::preset("gpt2-tiny");
  c.n_layer = 2;
  c.seq_len = 16;
  return c;
}

// A plan for `dag` under two thirds of its training state (the optimizer's staging area takes
// most of what a layer group leaves at less), updating moments in place where `in_place`.
SwapPlan plan_for(graph::OpDag& dag, int64_t seq_len, bool in_place) {
  SwapProblem problem = profile_nodes(dag, {}, 2, seq_len);
  problem.read_bps = problem.write_bps = 1e9;
  problem.in_place = in_place;
  problem.tier = "host";
  int64_t state = 0;
  for (const int64_t b : problem.param_bytes) state += 4 * b;
  problem.budget = state * 2 / 3;
  return plan_swap(problem);
}

TEST(SwapperState, AReadOfAnEvictedTensorWaitsForItsWriteStillInFlight) {
  const auto c = two_layers();
  auto dag = model::build_model(c, 7);
  train::AdamW adamw(dag->params(), {.defer_zero_state = true});
  auto tier = std::make_unique<LazyWriteTier>();
  LazyWriteTier* lazy = tier.get();
  Swapper swapper(*dag, adamw, plan_for(*dag, c.seq_len, false), std::move(tier));

  // The weights the budget left out (their storage is empty).
  std::vector<at::Tensor> evicted;
  for (const auto& p : dag->params().params())
    if (p.value.storage().nbytes() == 0) evicted.push_back(p.value);
  ASSERT_GE(evicted.size(), 3u) << "the plan evicted too few weights to test";

  at::NoGradGuard no_grad;
  std::vector<at::Tensor> values;
  for (size_t i = 0; i < evicted.size(); ++i) {
    values.push_back(at::full(evicted[i].sizes(), 1.0f + static_cast<float>(i)));
    swapper.write_state(evicted[i], values.back());
    EXPECT_EQ(evicted[i].storage().nbytes(), 0u) << "a written evicted weight stays out";
  }
  EXPECT_GT(lazy->queued(), 0u) << "no write was left in flight: nothing to wait for";
  // Read back in the other order: each read must first wait for its own room's write.
  for (size_t i = evicted.size(); i-- > 0;)
    EXPECT_TRUE(at::equal(swapper.read_state(evicted[i]), values[i])) << "weight " << i;

  // A second write to a room replaces the first, and the weights the next step loads are the
  // written ones.
  for (size_t i = 0; i < evicted.size(); ++i) {
    values[i] = at::full(evicted[i].sizes(), -2.0f - static_cast<float>(i));
    swapper.write_state(evicted[i], values[i]);
  }
  swapper.gather_weights();
  for (size_t i = 0; i < evicted.size(); ++i)
    EXPECT_TRUE(at::equal(evicted[i], values[i])) << "weight " << i << " after gather_weights";
}

// A peer that adopts the swarm's state between its passes and its update (ddp, atom) writes
// moments whose rooms the update then changes where they lie (host RAM below a CPU): the update
// must start from the written values, not from what the room held before the write landed.
TEST(SwapperState, TheUpdateWaitsForWritesStillInFlightWhereItWorksInPlace) {
  const auto c = two_layers();
  auto dag = model::build_model(c, 7);
  train::AdamW adamw(dag->params(), {.defer_zero_state = true});
  Swapper swapper(*dag, adamw, plan_for(*dag, c.seq_len, true),
                  std::make_unique<LazyWriteTier>(/*in_place=*/true));
  graph::Executor executor(*dag, {});
  executor.add_observer(&swapper);
  auto tokens = at::randint(c.vocab_size, {2, c.seq_len + 1},
                            at::make_generator<at::CPUGeneratorImpl>(3), at::kLong);
  swapper.begin_step(1);
  swapper.begin_micro_batch(0);
  executor.forward_backward(
      {tokens.narrow(1, 0, c.seq_len).contiguous(), tokens.narrow(1, 1, c.seq_len).contiguous()},
      1.0);
  swapper.end_pass();

  std::vector<size_t> out;  // parameters whose first moment lies in the tier
  for (size_t i = 0; i < dag->params().params().size(); ++i)
    if (adamw.exp_avg(i).storage().nbytes() == 0) out.push_back(i);
  ASSERT_FALSE(out.empty()) << "the plan kept every moment in memory";
  at::NoGradGuard no_grad;
  for (const size_t i : out)
    swapper.write_state(adamw.exp_avg(i), at::full(adamw.exp_avg(i).sizes(), 100.0f));
  swapper.update(1e-3, 0.0);
  swapper.finish_update();
  executor.remove_observer(&swapper);
  // m = beta1 * 100 + (1 - beta1) * g: about 90 (a stale start would give 0.1 g, and the late
  // write 100 after it).
  const double beta1 = adamw.options().beta1;
  for (const size_t i : out) {
    const at::Tensor m = swapper.read_state(adamw.exp_avg(i));
    EXPECT_LT((m - beta1 * 100.0).abs().max().item<double>(), 1.0) << "parameter " << i;
  }
}

}  // namespace
