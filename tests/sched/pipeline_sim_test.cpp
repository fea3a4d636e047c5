// The pipeline step simulation (pipeline_sim.h) on plans whose step is known by hand: free links
// (GPipe and 1F1B both take (M + S - 1) stage times), a slow link whose round trip 1F1B's warm-up
// does not cover (and extra_warmup covering it), latency alone, and a star's shared upload.
#include "starling/sched/pipeline_sim.h"

#include <gtest/gtest.h>

#include <stdexcept>

#include "starling/sched/op_fence.h"

namespace starling::sched {
namespace {

// `stages` devices of speed 1 in a chain, one node per stage of forward `f` and backward `b`,
// each cut sending `cut_bytes` over links of `rate` bytes/s and `latency` s.
CostTable chain(int stages, double f, double b, int64_t micro_batches, int64_t cut_bytes,
                double rate, double latency = 0) {
  CostTable t;
  t.micro_batches = micro_batches;
  for (int i = 0; i < stages; ++i) {
    NodeCost n{.name = std::string("n").append(std::to_string(i)),
               .compute_s = f + b,
               .cut_bytes = i + 1 < stages ? cut_bytes : 0,
               .forward_s = f};
    t.nodes.push_back(n);
    t.devices.push_back({.name = std::string("d").append(std::to_string(i)), .speed = 1});
  }
  t.links.assign(static_cast<size_t>(stages),
                 std::vector<LinkCost>(static_cast<size_t>(stages), {rate, latency}));
  return t;
}

PipelinePlan one_node_per_stage(int stages) {
  PipelinePlan p;
  for (int s = 0; s < stages; ++s) p.stages.push_back({.first = s, .last = s, .device = s});
  return p;
}

TEST(PipelineSim, FreeLinksTakeMPlusSMinusOneStageTimes) {
  for (const bool one_f_one_b : {true, false}) {
    CostTable t = chain(3, 1, 2, 5, 0, 1e9);
    t.one_f_one_b = one_f_one_b;
    EXPECT_DOUBLE_EQ(simulate_step(t, one_node_per_stage(3)), (5 + 3 - 1) * 3.0)
        << (one_f_one_b ? "1f1b" : "gpipe");
  }
  // One stage: its micro-batches one after another.
  EXPECT_DOUBLE_EQ(simulate_step(chain(1, 1, 2, 4, 0, 1e9), one_node_per_stage(1)), 12);
}

TEST(PipelineSim, OneFOneBWaitsForTheRoundTripOverASlowLink) {
  // Two stages of forward 1 s and backward 2 s, 4 micro-batches, and a link that takes 10 s per
  // tensor each way. Stage 0 holds two micro-batches in flight, but one round trip (10 s over,
  // 3 s of stage 1, 10 s back) is 23 s: by hand, the step ends at 62 s (stage 0's last backward,
  // 60 s to 62 s), 6 s past the steady state's 3 + 3 + 2 x 10 + 3 x 10 = 56.
  CostTable t = chain(2, 1, 2, 4, 10, 1.0);
  const PipelinePlan plan = one_node_per_stage(2);
  EXPECT_DOUBLE_EQ(simulate_step(t, plan), 62);
  PipelinePlan priced = plan;
  price(t, priced);
  EXPECT_DOUBLE_EQ(priced.steady_step_s, 56);
  EXPECT_DOUBLE_EQ(priced.step_s, 62);
  // One forward more ahead keeps the forward link busy: the steady state, exactly.
  t.extra_warmup = 1;
  EXPECT_DOUBLE_EQ(simulate_step(t, plan), 56);
}

TEST(PipelineSim, LatencyAloneCostsARoundTripPerWarmUp) {
  // Nothing to compute or send but a 1 s latency each way, 4 micro-batches on 2 stages: 1F1B
  // keeps 2 in flight, so two round trips (4 s); GPipe sends all 4 at once (2 s), as does 1F1B
  // with every micro-batch in its warm-up.
  CostTable t = chain(2, 0, 0, 4, 1000, 1e12, 1.0);
  const PipelinePlan plan = one_node_per_stage(2);
  EXPECT_NEAR(simulate_step(t, plan), 4, 1e-6);
  t.extra_warmup = 2;
  EXPECT_NEAR(simulate_step(t, plan), 2, 1e-6);
  t.extra_warmup = 0;
  t.one_f_one_b = false;
  EXPECT_NEAR(simulate_step(t, plan), 2, 1e-6);
}

TEST(PipelineSim, AStarsUploadCarriesBothDirectionsOfAMiddleStage) {
  // Three stages of 1 s + 2 s with fast links, but each device's sends share an upload that
  // takes 2 s per tensor: the middle stage sends 2 per micro-batch, so 4 s each, 8 micro-batches.
  CostTable t = chain(3, 1, 2, 8, 1'000'000, 1e12);
  const PipelinePlan plan = one_node_per_stage(3);
  const double free = simulate_step(t, plan);
  EXPECT_NEAR(free, (8 + 3 - 1) * 3.0, 1e-3);
  for (auto& d : t.devices) d.egress_bytes_per_s = 500'000;
  const double shared = simulate_step(t, plan);
  EXPECT_GE(shared, 8 * 4.0);
  PipelinePlan priced = plan;
  price(t, priced);
  EXPECT_DOUBLE_EQ(priced.bottleneck_s, 4);
  EXPECT_GE(shared, priced.steady_step_s - 1e-9);
}

TEST(PipelineSim, AStarsDownloadTakesFromBothNeighboursInTurn) {
  // Four stages with nothing to compute and 1 s per tensor through every access link, up and
  // down. With uploads alone a middle stage's two sends per micro-batch pace the step; its
  // download also takes both neighbours' tensors, and a tensor needs its sender's upload and its
  // receiver's download free at once, so the step only grows.
  CostTable t = chain(4, 0, 0, 8, 1'000'000, 1e12);
  const PipelinePlan plan = one_node_per_stage(4);
  for (auto& d : t.devices) d.egress_bytes_per_s = 1e6;
  const double uploads = simulate_step(t, plan);
  EXPECT_GE(uploads, 8 * 2.0);
  for (auto& d : t.devices) d.ingress_bytes_per_s = 1e6;
  const double both = simulate_step(t, plan);
  EXPECT_GE(both, uploads);
  // Downloads alone pace it as uploads alone do: a middle stage receives what it sends.
  for (auto& d : t.devices) d.egress_bytes_per_s = 0;
  EXPECT_GE(simulate_step(t, plan), 8 * 2.0);
}

TEST(PipelineSim, ASlowerDeviceSetsThePace) {
  // The second of two stages at half speed: 6 s a micro-batch there, 3 s on the first.
  CostTable t = chain(2, 1, 2, 6, 0, 1e9);
  t.devices[1].speed = 0.5;
  PipelinePlan plan = one_node_per_stage(2);
  price(t, plan);
  EXPECT_DOUBLE_EQ(plan.bottleneck_s, 6);
  // The first micro-batch's forward on stage 0 (1 s), then stage 1 busy from then on: 6 x 6 s,
  // and stage 0's last backward (2 s) after it.
  EXPECT_DOUBLE_EQ(plan.step_s, 1 + 6 * 6.0 + 2);
}

TEST(PipelineSim, RefusesAPlanTheTableDoesNotHave) {
  const CostTable t = chain(2, 1, 2, 4, 0, 1e9);
  EXPECT_THROW(simulate_step(t, PipelinePlan{}), std::invalid_argument);
  PipelinePlan bad = one_node_per_stage(2);
  bad.stages[1].device = 5;
  EXPECT_THROW(simulate_step(t, bad), std::invalid_argument);
  bad = one_node_per_stage(2);
  bad.stages[1].last = 7;
  EXPECT_THROW(simulate_step(t, bad), std::invalid_argument);
}

}  // namespace
}  // namespace starling::sched
