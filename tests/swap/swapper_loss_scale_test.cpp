// fp16's loss scaling on a swapped replica (StepRunner::unscale_next_step, gradients_finite): the
// swapper unscales each gradient where it first takes its norm, a gradient at a time, and must
// give the same bits as the local runner, which unscales them all at once after the passes. The
// losses here are scaled by hand in fp32 (autocast to fp16 needs a GPU, or a libtorch of 2.1 or
// later on a CPU); the scaling arithmetic is the same. A step whose scale overflows the
// gradients is found non-finite on both and skipped.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <limits>
#include <memory>
#include <random>
#include <vector>

#include "../data/test_util.h"
#include "lazy_write_tier.h"
#include "starling/data/loader.h"
#include "starling/data/shard.h"
#include "starling/graph/executor.h"
#include "starling/model/build.h"
#include "starling/model/config.h"
#include "starling/swap/profile.h"
#include "starling/swap/swap_plan.h"
#include "starling/swap/swapper.h"
#include "starling/swap/tier.h"
#include "starling/train/adamw.h"
#include "starling/train/step_runner.h"

namespace {

using namespace starling;
using namespace starling::swap;

constexpr int64_t kBatch = 2;
// An open-ended step's micro-batches (atom's): a whole one, then a smaller last one, each loss
// weighted by its sequences.
constexpr int64_t kOpenEnded[] = {kBatch, 1};
constexpr double kLr = 1e-3, kClip = 1.0;

model::ModelConfig scaled_model() {
  auto c = model::preset("gpt2-tiny");
  c.n_layer = 2;
  c.seq_len = 16;
  return c;
}

data::LoaderOptions loader_options(const model::ModelConfig& c) {
  data::LoaderOptions o;
  o.seq_len = c.seq_len;
  o.batch = kBatch;
  o.seed = 5;
  return o;
}

// A replica driven through the swapper as the swapped step runner drives it.
struct SwappedReplica {
  // `tier_name`: what the plan takes the tier for ("disk" or "host", not updated in place).
  SwappedReplica(const model::ModelConfig& c, const std::filesystem::path& shard,
                 const std::string& tier_name, std::unique_ptr<Tier> tier)
      : dag(model::build_model(c, 7)),
        adamw(dag->params(), {.defer_zero_state = true}),
        executor(*dag, {}),
        loader({shard}, loader_options(c)) {
    SwapProblem problem = profile_nodes(*dag, {}, kBatch, c.seq_len);
    problem.read_bps = problem.write_bps = 1e9;
    problem.tier = tier_name;
    problem.in_place = false;
    int64_t state = 0;
    for (const int64_t b : problem.param_bytes) state += 4 * b;
    problem.budget = state * 2 / 3;  // the staging area takes most of what one group leaves
    swapper = std::make_unique<Swapper>(*dag, adamw, plan_swap(problem), std::move(tier));
    executor.add_observer(swapper.get());
  }
  ~SwappedReplica() { executor.remove_observer(swapper.get()); }

  // micro_batches = 0: an open-ended step (atom's) of a whole micro-batch and a smaller one.
  void passes(int64_t micro_batches, double loss_scale) {
    swapper->begin_step(micro_batches);
    const int64_t n = micro_batches > 0 ? micro_batches : 2;
    for (int64_t m = 0; m < n; ++m) {
      swapper->begin_micro_batch(m);
      const int64_t rows = micro_batches > 0 ? kBatch : kOpenEnded[m];
      executor.forward_backward(train::to_device(loader.next(rows), c10::kCPU),
                                micro_batches > 0 ? loss_scale / static_cast<double>(n)
                                                  : loss_scale * static_cast<double>(rows));
      swapper->end_pass();
    }
  }

  std::unique_ptr<graph::OpDag> dag;
  train::AdamW adamw;
  graph::Executor executor;
  data::TokenLoader loader;
  std::unique_ptr<Swapper> swapper;
};

// The same replica through the local runner.
struct LocalReplica {
  LocalReplica(const model::ModelConfig& c, const std::filesystem::path& shard)
      : dag(model::build_model(c, 7)),
        adamw(dag->params(), {}),
        executor(*dag, {}),
        loader({shard}, loader_options(c)),
        runner(executor, dag->params(), adamw, loader, c10::kCPU) {}

  void passes(int64_t micro_batches, double loss_scale) {
    if (micro_batches > 0) {
      runner.run(micro_batches, loss_scale);
      return;
    }
    runner.begin_accumulation();
    for (const int64_t rows : kOpenEnded) runner.accumulate(loss_scale, rows);
  }

  std::unique_ptr<graph::OpDag> dag;
  train::AdamW adamw;
  graph::Executor executor;
  data::TokenLoader loader;
  train::LocalStepRunner runner;
};

// Every weight and both AdamW moments of the two replicas, bit for bit.
void expect_same_state(LocalReplica& a, SwappedReplica& b, const std::string& when) {
  b.swapper->finish_update();
  at::NoGradGuard no_grad;
  const auto& pa = a.dag->params().params();
  const auto& pb = b.dag->params().params();
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_TRUE(at::equal(pa[i].value, b.swapper->read_state(pb[i].value)))
        << when << ": weight " << pa[i].name;
    EXPECT_TRUE(at::equal(a.adamw.exp_avg(i), b.swapper->read_state(b.adamw.exp_avg(i))))
        << when << ": first moment of " << pa[i].name;
    EXPECT_TRUE(at::equal(a.adamw.exp_avg_sq(i), b.swapper->read_state(b.adamw.exp_avg_sq(i))))
        << when << ": second moment of " << pa[i].name;
  }
}

// A random token shard in `dir` for `c`.
std::filesystem::path token_shard(const model::ModelConfig& c, const std::filesystem::path& dir) {
  std::vector<uint16_t> tokens(4096);
  std::mt19937 gen(11);
  for (auto& t : tokens) t = static_cast<uint16_t>(gen() % static_cast<uint32_t>(c.vocab_size));
  const auto shard = dir / "train_000.bin";
  data::write_shard(shard, tokens);
  return shard;
}

// Steps of fixed and open-ended micro-batches, with and without an exchange, one of them
// overflowing, through both replicas: the same checks, norms and final state.
void expect_same_steps(const model::ModelConfig& c, const std::filesystem::path& shard,
                       SwappedReplica& b) {
  LocalReplica a(c, shard);
  int64_t evicted = 0;
  for (const auto& p : b.dag->params().params()) evicted += p.value.storage().nbytes() == 0;
  ASSERT_GT(evicted, 2) << "the plan evicted too few weights to test";

  struct Step {
    int64_t micro_batches;  // 0: open-ended
    double loss_scale;
    // visit_gradients (an exchange, as a strategy's) after the passes; with `check_first`, the
    // trainer's check of this peer's own gradients comes before it.
    bool exchange, check_first = true;
  };
  // fp32's largest number as the scale of one micro-batch overflows the gradients (the seed
  // itself must be a float). Unchecked steps leave the unscaling to update() (or the exchange).
  // The state is compared at the end only: comparing it between steps would complete each
  // deferred update early.
  const double overflow = std::numeric_limits<float>::max();
  const std::vector<Step> steps = {
      {2, 65536, false},      {1, 1024, true},       {1, overflow, false}, {0, 4096, true, false},
      {0, 2048, false},       {2, 32768, false},     {0, 8192, false},     {1, 16384, false},
      {2, 256, false, false}, {0, 512, false, false}};
  int64_t updates = 0;
  for (size_t k = 0; k < steps.size(); ++k) {
    const Step& s = steps[k];
    const std::string when = "step " + std::to_string(k + 1);
    a.runner.unscale_next_step(1.0 / s.loss_scale);
    b.swapper->unscale_next_step(1.0 / s.loss_scale);
    a.passes(s.micro_batches, s.loss_scale);
    b.passes(s.micro_batches, s.loss_scale);
    bool finite_a = true, finite_b = true;
    if (s.check_first) {
      finite_a = a.runner.gradients_finite();
      finite_b = b.swapper->gradients_finite();
    }
    if (s.exchange) {
      // An exchange that halves every gradient, then the check on what it left.
      const auto halve = [](graph::ParamStore& params) {
        return [&params](std::span<const int> piece) {
          at::NoGradGuard no_grad;
          for (const int p : piece) params.params()[p].value.mutable_grad().mul_(0.5);
        };
      };
      a.runner.visit_gradients(halve(a.dag->params()));
      b.swapper->visit_gradients(halve(b.dag->params()));
      finite_a = finite_a && a.runner.gradients_finite();
      finite_b = finite_b && b.swapper->gradients_finite();
    }
    EXPECT_EQ(finite_a, s.loss_scale != overflow) << when;
    EXPECT_EQ(finite_b, finite_a) << when;
    const at::Tensor norm_a = a.runner.update(kLr, kClip, !finite_a);
    const at::Tensor norm_b = b.swapper->update(kLr, kClip, !finite_b);
    if (finite_a) {
      ++updates;
      EXPECT_TRUE(at::equal(norm_a, norm_b))
          << when << ": norms " << norm_a.item<double>() << " and " << norm_b.item<double>();
      // Unscaled: the norm of gradients of an average loss, not of one multiplied by thousands.
      EXPECT_LT(norm_a.item<double>(), 100.0) << when;
    }
  }
  expect_same_state(a, b, "at the end");
  EXPECT_EQ(a.adamw.steps(), updates);
  EXPECT_EQ(b.adamw.steps(), updates);
  EXPECT_EQ(updates, static_cast<int64_t>(steps.size()) - 1);
}

TEST(SwapperLossScale, UnscaledGradientsGiveTheLocalRunnersBits) {
  data::testing::TempDir dir;
  const auto c = scaled_model();
  const auto shard = token_shard(c, dir.path());
  std::filesystem::create_directories(dir / "tier");
  SwappedReplica b(c, shard, "disk", make_tier("disk", dir / "tier"));
  expect_same_steps(c, shard, b);
}

// The same where the update's writes complete only when waited for: each step's deferred update
// is still in flight when the next step's passes begin, and its gradients are unscaled then.
TEST(SwapperLossScale, UnscaledGradientsGiveTheLocalRunnersBitsWithUpdatesInFlight) {
  data::testing::TempDir dir;
  const auto c = scaled_model();
  const auto shard = token_shard(c, dir.path());
  SwappedReplica b(c, shard, "host", std::make_unique<starling::swap::testing::LazyWriteTier>());
  expect_same_steps(c, shard, b);
}

}  // namespace
