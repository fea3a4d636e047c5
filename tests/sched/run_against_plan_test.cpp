// A run against its plan: the step and each peer's compute per micro-batch over the timed steps,
// between records every few steps, the last invocation's records only, and no answer where the
// records cannot say.
#include "starling/sched/run_against_plan.h"

#include <gtest/gtest.h>

namespace starling::sched {
namespace {

// Records every `every` steps up to `steps`: each step computes `compute` s and takes `wall` s.
std::vector<StepRecord> steady(int64_t steps, int64_t every, double compute, double wall) {
  std::vector<StepRecord> r;
  for (int64_t s = every; s <= steps; s += every)
    r.push_back({s, compute * static_cast<double>(s), wall * static_cast<double>(s)});
  return r;
}

TEST(RunAgainstPlan, TimesEveryPeerBetweenTheRecordsNearestTheTimedSteps) {
  // 40 steps in rounds of 4, records every 5 steps: the whole rounds after the first are steps
  // 5-40, and the nearest records are steps 5 and 40 (steps 6-40 timed).
  const TimedSteps timed = timed_steps(40, 4);
  ASSERT_EQ(timed.first, 5);
  std::vector<std::vector<StepRecord>> records = {steady(40, 5, 4.0, 6.0), steady(40, 5, 2.0, 6.5)};
  // Peer 0's first round computed slower; the timed steps leave it out.
  records[0][0].compute_s = 30;
  for (size_t r = 1; r < records[0].size(); ++r) records[0][r].compute_s += 10;
  const auto run = run_against_plan(records, {{0, 0.4}, {1, 0.25}}, 8, 5.2, timed);
  ASSERT_TRUE(run.has_value());
  EXPECT_EQ(run->from, 5);
  EXPECT_EQ(run->to, 40);
  EXPECT_DOUBLE_EQ(run->measured_step_s, 6.5);  // the slower peer's
  ASSERT_EQ(run->peers.size(), 2u);
  EXPECT_DOUBLE_EQ(run->peers[0].measured_s, 0.5);  // 4 s a step over 8 micro-batches
  EXPECT_DOUBLE_EQ(run->peers[0].ratio(), 1.25);
  EXPECT_DOUBLE_EQ(run->peers[1].measured_s, 0.25);
  EXPECT_EQ(run->peers[1].stage, 1);
  const std::string text = run->describe();
  EXPECT_NE(text.find("a step took 6.50 s against the 5.20 s predicted (predicted / measured "
                      "0.80) over steps 6-40"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("  peer 0, stage 0: computed 500.0 ms per micro-batch against 400.0 ms "
                      "planned (x1.25)\n"),
            std::string::npos)
      << text;
  // A peer that reports its own part says it in one line.
  const auto own = run_against_plan({records[1]}, {{1, 0.25}}, 8, 5.2, timed);
  ASSERT_TRUE(own.has_value());
  EXPECT_EQ(own->describe_own(),
            "a step took 6.50 s against the 5.20 s predicted (predicted / measured 0.80) over "
            "steps 6-40; stage 1 computed 250.0 ms per micro-batch against the 250.0 ms planned "
            "(x1.00)\n");
}

TEST(RunAgainstPlan, ReadsOnlyTheLastInvocationsRecords) {
  // Steps 1-10, then a --resume from step 6 to 20 whose counts start again from 0: the first
  // invocation's 10 s steps do not count.
  std::vector<StepRecord> r;
  for (int64_t s = 1; s <= 10; ++s) r.push_back({s, 10.0 * static_cast<double>(s), 11.0 * s});
  for (int64_t s = 7; s <= 20; ++s)
    r.push_back({s, 2.0 * static_cast<double>(s - 6), 3.0 * static_cast<double>(s - 6)});
  const auto run = run_against_plan({r}, {{0, 1.0}}, 2, 3.0, timed_steps(20, 1));
  ASSERT_TRUE(run.has_value());
  EXPECT_EQ(run->from, 7);
  EXPECT_EQ(run->to, 20);
  EXPECT_DOUBLE_EQ(run->peers[0].measured_s, 1.0);
  EXPECT_DOUBLE_EQ(run->measured_step_s, 3.0);
}

TEST(RunAgainstPlan, TellsInvocationsApartByWhereTheyBegan) {
  // Steps 1-2 took 0.1 s each; a --resume from step 2 spent 5 s on its first step (a loaded
  // machine, a peer slow to start). No count went back, so only run_from tells the records of
  // step 3 from those before it.
  const std::vector<StepRecord> r = {
      {1, 0.1, 0.1, 0}, {2, 0.2, 0.2, 0}, {3, 5.0, 5.0, 2}, {4, 5.5, 6.0, 2}};
  const auto run = run_against_plan({r, r}, {{0, 1.0}, {1, 1.0}}, 1, 1.0, timed_steps(4, 1));
  ASSERT_TRUE(run.has_value());
  EXPECT_EQ(run->from, 3);
  EXPECT_EQ(run->to, 4);
  EXPECT_DOUBLE_EQ(run->peers[0].measured_s, 0.5);
  EXPECT_DOUBLE_EQ(run->measured_step_s, 1.0);
}

TEST(RunAgainstPlan, SaysNothingWhereTheRecordsCannot) {
  const TimedSteps timed = timed_steps(20, 1);
  // One record only, or none in the timed steps.
  EXPECT_FALSE(run_against_plan({{{20, 5, 5}}}, {{0, 1}}, 1, 1, timed).has_value());
  EXPECT_FALSE(run_against_plan({{}}, {{0, 1}}, 1, 1, timed).has_value());
  // Peers whose records span different steps, or a plan without a time.
  EXPECT_FALSE(
      run_against_plan({steady(20, 5, 1, 1), steady(20, 4, 1, 1)}, {{0, 1}, {1, 1}}, 1, 1, timed)
          .has_value());
  EXPECT_FALSE(run_against_plan({steady(20, 5, 1, 1)}, {{0, 0}}, 1, 1, timed).has_value());
  // A record per peer, a planned time per peer.
  EXPECT_FALSE(run_against_plan({steady(20, 5, 1, 1)}, {}, 1, 1, timed).has_value());
  // A run too short to time anything.
  EXPECT_FALSE(
      run_against_plan({steady(1, 1, 1, 1)}, {{0, 1}}, 1, 1, timed_steps(1, 1)).has_value());
}

}  // namespace
}  // namespace starling::sched
