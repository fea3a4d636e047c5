// Device speeds from a trial run: the compute per micro-batch a peer's step records show, the
// speeds that follow, the errors bad timings get, and a plan that moves work off a device that
// measured slower than it was assumed to be.
#include "starling/sched/calibration.h"

#include <gtest/gtest.h>

#include "starling/common/error.h"
#include "starling/sched/op_fence.h"

namespace starling::sched {
namespace {

// n nodes of 1 s each on devices of the given speeds, every link fast.
CostTable table(int n, std::vector<double> speeds) {
  CostTable t;
  t.micro_batches = 8;
  for (int i = 0; i < n; ++i)
    t.nodes.push_back({std::string("n").append(std::to_string(i)), 1.0, 100, i + 1 < n ? 1000 : 0});
  for (size_t d = 0; d < speeds.size(); ++d)
    t.devices.push_back({std::string("d").append(std::to_string(d)), speeds[d]});
  t.links.assign(speeds.size(), std::vector<LinkCost>(speeds.size(), {1e9, 0}));
  return t;
}

TEST(Calibration, ComputePerMicroBatchIsTheMedianStepAfterTheFirst) {
  // Step 1 warms up (9 s); steps 2-4 grow by 4, 8 and 5 s: the median, 5 s, over 4 micro-batches.
  EXPECT_DOUBLE_EQ(
      compute_per_micro_batch({{1, 9}, {2, 13}, {3, 21}, {4, 26}}, 4, timed_steps(4, 1)), 1.25);
  // An even count of steps takes the middle two's mean.
  EXPECT_DOUBLE_EQ(compute_per_micro_batch({{1, 9}, {2, 11}, {3, 15}}, 2, timed_steps(3, 1)), 1.5);
  // One step says nothing beyond the warm-up; a timed step without its record is refused.
  EXPECT_LT(compute_per_micro_batch({{1, 9}}, 4, timed_steps(1, 1)), 0);
  EXPECT_LT(compute_per_micro_batch({}, 4, timed_steps(3, 1)), 0);
  EXPECT_LT(compute_per_micro_batch({{1, 9}, {3, 15}}, 2, timed_steps(3, 1)), 0);
  EXPECT_EQ(timed_steps(3, 1).describe(), "steps 2-3, their median");
}

// With rounds, whole rounds are timed, ending at the trial's last step, and their mean is taken:
// the round's first step, slower beside the averaging, counts once a round as in the run.
TEST(Calibration, WholeRoundsAreTimedByTheirMean) {
  const TimedSteps one = timed_steps(5, 4);
  EXPECT_EQ(one.first, 2);
  EXPECT_EQ(one.last, 5);
  EXPECT_EQ(one.rounds, 1);
  EXPECT_TRUE(one.mean);
  EXPECT_EQ(one.describe(), "steps 2-5 (1 whole round), their mean");
  EXPECT_FALSE(one.after_first_round);
  EXPECT_EQ(timed_steps(7, 4).first, 4);
  // With a round after the first, only such rounds: steps 5-8 compute beside the averaging
  // launched after step 4, as every later round of the run does.
  const TimedSteps second = timed_steps(8, 4);
  EXPECT_EQ(second.first, 5);
  EXPECT_EQ(second.rounds, 1);
  EXPECT_TRUE(second.after_first_round);
  EXPECT_EQ(second.describe(), "steps 5-8 (1 whole round after the first), their mean");
  EXPECT_EQ(timed_steps(10, 4).first, 7);     // the last whole round, ending at the trial's end
  const TimedSteps two = timed_steps(13, 4);  // steps 6-13: two rounds, none of them the first
  EXPECT_EQ(two.first, 6);
  EXPECT_EQ(two.rounds, 2);
  // Shorter than a round after the first step: the median, as without rounds.
  const TimedSteps short_trial = timed_steps(4, 4);
  EXPECT_EQ(short_trial.first, 2);
  EXPECT_EQ(short_trial.rounds, 0);
  EXPECT_FALSE(short_trial.mean);
  // Steps of 4, 4, 4 and 6 s (the round's first, beside the averaging): the mean, 4.5 s, where
  // the median would say 4.
  const std::vector<std::pair<int64_t, double>> c = {{1, 9}, {2, 13}, {3, 17}, {4, 21}, {5, 27}};
  EXPECT_DOUBLE_EQ(compute_per_micro_batch(c, 2, one), 2.25);
  EXPECT_DOUBLE_EQ(compute_per_micro_batch(c, 2, timed_steps(5, 1)), 2);
}

TEST(Calibration, SpeedIsTheStagesProfiledTimeOverTheMeasuredOne) {
  CostTable t = table(6, {1, 0.5, 0.5});
  // Device 1 ran nodes 2-3 (2 s profiled) in 8 s: a quarter, not the half it was assumed.
  const std::string report =
      calibrate_speeds(t, {{.device = 1, .first = 2, .last = 3, .seconds_per_micro_batch = 8},
                           {.device = 0, .first = 0, .last = 1, .seconds_per_micro_batch = 2.5}});
  EXPECT_DOUBLE_EQ(t.devices[1].speed, 0.25);
  EXPECT_DOUBLE_EQ(t.devices[0].speed, 0.8);
  EXPECT_DOUBLE_EQ(t.devices[2].speed, 0.5) << "an untimed device keeps its speed";
  EXPECT_NE(report.find("    device 1 (d1): nodes 2-3 took 8000.0 ms per micro-batch against "
                        "4000.0 ms planned: speed x0.25 (was x0.50)"),
            std::string::npos)
      << report;
}

TEST(Calibration, BadTimingsAreNamed) {
  auto error_of = [](StageTiming m) -> std::string {
    CostTable t = table(4, {1, 1});
    try {
      calibrate_speeds(t, {m});
    } catch (const ConfigError& e) {
      return e.what();
    }
    return "no error";
  };
  EXPECT_NE(error_of({.device = 2, .first = 0, .last = 1, .seconds_per_micro_batch = 1})
                .find("calibration of device 2: the table has 2 devices"),
            std::string::npos);
  EXPECT_NE(error_of({.device = 0, .first = 2, .last = 4, .seconds_per_micro_batch = 1})
                .find("nodes 2-4 are not a range of the table's 4"),
            std::string::npos);
  EXPECT_NE(error_of({.device = 0, .first = 0, .last = 1, .seconds_per_micro_batch = 0})
                .find("a measured time of 0"),
            std::string::npos);
  EXPECT_NE(error_of({.device = 0, .first = 0, .last = 1, .seconds_per_micro_batch = -1})
                .find("a measured time of -1"),
            std::string::npos);
}

TEST(Calibration, APlanFromMeasuredSpeedsMovesWorkOffTheSlowDevice) {
  // Two devices assumed equal: an even cut. Device 1 measures at a third of device 0's speed.
  CostTable t = table(8, {1, 1});
  const PipelinePlan assumed = cut_pipeline(t, {0, 1});
  ASSERT_EQ(assumed.stages[0].last, 3);
  calibrate_speeds(t, {{.device = 0, .first = 0, .last = 3, .seconds_per_micro_batch = 4},
                       {.device = 1, .first = 4, .last = 7, .seconds_per_micro_batch = 12}});
  const PipelinePlan measured = cut_pipeline(t, {0, 1});
  // 6 nodes at speed 1 against 2 at a third: 6 s either side.
  EXPECT_EQ(measured.stages[0].last, 5);
  EXPECT_NEAR(measured.bottleneck_s, 6, 1e-9);
  EXPECT_GT(assumed.bottleneck_s * 3, measured.bottleneck_s)
      << "the assumed plan's slow stage runs 12 s on the real device";
}

}  // namespace
}  // namespace starling::sched
