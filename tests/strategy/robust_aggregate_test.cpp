#include "starling/strategy/robust_aggregate.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <limits>
#include <string>
#include <vector>

#include "starling/common/error.h"
#include "starling/strategy/fault_injection.h"

namespace starling::strategy {
namespace {

// Rows of `n` values and a contribution flag.
at::Tensor rows_of(const std::vector<std::vector<float>>& values, std::vector<float> flags = {}) {
  const int64_t p = static_cast<int64_t>(values.size()), n = static_cast<int64_t>(values[0].size());
  at::Tensor rows = at::zeros({p, n + 1}, at::kFloat);
  for (int64_t i = 0; i < p; ++i) {
    for (int64_t j = 0; j < n; ++j) rows[i][j] = values[i][j];
    rows[i][n] = flags.empty() ? 1.f : flags[i];
  }
  return rows;
}

TEST(TrimmedMean, DropsTheExtremesOfEveryElement) {
  // Five peers; the last sends a sign-flipped update a hundred times too large.
  const at::Tensor rows = rows_of({{1, 10}, {2, 20}, {3, 30}, {4, 40}, {-300, -3000}});
  at::Tensor out = at::empty({2}, at::kFloat);
  const TrimmedMeanOutcome o = trimmed_mean(rows, 1, out);
  EXPECT_EQ(o.used, 5);
  EXPECT_EQ(o.trimmed, 1);
  EXPECT_TRUE(o.non_finite.empty());
  // Sorted per element: (-300, 1, 2, 3, 4) -> mean of 1, 2, 3; (-3000, 10, 20, 30, 40) -> 20.
  EXPECT_FLOAT_EQ(out[0].item<float>(), 2.f);
  EXPECT_FLOAT_EQ(out[1].item<float>(), 20.f);
  // Without trimming the poisoned row dominates.
  trimmed_mean(rows, 0, out);
  EXPECT_FLOAT_EQ(out[0].item<float>(), -58.f);
}

TEST(TrimmedMean, RejectsNonFiniteRowsAndSkipsNonContributors) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const at::Tensor rows = rows_of({{1, 1}, {nan, 2}, {3, 3}, {100, 100}, {5, 5}}, {1, 1, 1, 0, 1});
  at::Tensor out = at::empty({2}, at::kFloat);
  const TrimmedMeanOutcome o = trimmed_mean(rows, 1, out);
  ASSERT_EQ(o.non_finite, std::vector<int>{1});
  EXPECT_EQ(o.used, 3);  // rows 0, 2, 4: the flagged-out row 3 is not averaged
  EXPECT_EQ(o.trimmed, 1);
  EXPECT_FLOAT_EQ(out[0].item<float>(), 3.f);
  EXPECT_FLOAT_EQ(out[1].item<float>(), 3.f);
}

TEST(TrimmedMean, KeepsAtLeastOneValueAndHandlesNoRows) {
  at::Tensor out = at::empty({1}, at::kFloat);
  TrimmedMeanOutcome o = trimmed_mean(rows_of({{1}, {5}}), 3, out);
  EXPECT_EQ(o.trimmed, 0);  // two rows: (2 - 1) / 2 = 0 dropped
  EXPECT_FLOAT_EQ(out[0].item<float>(), 3.f);
  o = trimmed_mean(rows_of({{1}, {5}}, {0, 0}), 1, out);
  EXPECT_EQ(o.used, 0);
  EXPECT_FLOAT_EQ(out[0].item<float>(), 0.f);
}

TEST(TrimmedMean, IsTheSameBitsAsAPlainMeanWithoutTrimming) {
  at::manual_seed(3);
  const at::Tensor values = at::randn({4, 3000}, at::kFloat);
  at::Tensor rows = at::cat({values, at::ones({4, 1}, at::kFloat)}, 1).contiguous();
  at::Tensor out = at::empty({3000}, at::kFloat);
  trimmed_mean(rows, 0, out);
  at::Tensor expect = values[0].clone();
  for (int i = 1; i < 4; ++i) expect.add_(values[i]);
  expect.div_(4.0);
  EXPECT_TRUE(at::equal(out, expect));
}

TEST(UpdatePoison, ParsesItsForms) {
  EXPECT_TRUE(UpdatePoison::parse("nan").nan);
  EXPECT_FALSE(UpdatePoison::parse("nan").own);
  EXPECT_TRUE(UpdatePoison::parse("nan:own").nan && UpdatePoison::parse("nan:own").own);
  EXPECT_EQ(UpdatePoison::parse("nan:own").describe(), "NaN from its own computation");
  EXPECT_DOUBLE_EQ(UpdatePoison::parse("scale:-10").scale, -10.0);
  EXPECT_EQ(UpdatePoison::parse("scale:-10").describe(), "scaled by -10");
  for (const char* bad : {"scale:", "scale:x", "scale:inf", "2", "NaN ", "nan:"}) {
    try {
      UpdatePoison::parse(bad);
      FAIL() << bad;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("STARLING_FAULT_POISON"), std::string::npos);
    }
  }
  at::Tensor t = at::ones({3}, at::kFloat);
  UpdatePoison::parse("scale:-2").apply(t);
  EXPECT_TRUE(at::equal(t, at::full({3}, -2.f, at::kFloat)));
}

// The whole-number faults read from the environment: unset or empty is none; anything but a
// whole number in range is refused, naming the variable.
TEST(FaultsFromTheEnvironment, WholeNumbersOrAConfigError) {
  const struct {
    const char* name;
    std::optional<long long> (*read)();
  } faults[] = {{"STARLING_FAULT_REFUSE_STATE", refuse_state_from_env},
                {"STARLING_FAULT_SLOW_TRANSFER", slow_transfer_from_env},
                {"STARLING_FAULT_DIE_IN_EXCHANGE", die_in_exchange_from_env},
                {"STARLING_FAULT_ABORT_AGREEMENT", abort_agreement_from_env}};
  for (const auto& f : faults) {
    SCOPED_TRACE(f.name);
    ::unsetenv(f.name);
    EXPECT_FALSE(f.read());
    ::setenv(f.name, "", 1);
    EXPECT_FALSE(f.read());
    ::setenv(f.name, "3", 1);
    EXPECT_EQ(f.read(), 3);
    for (const char* bad : {"0", "-1", "+2", " 2", "2x", "x", "99999999999999999999"}) {
      ::setenv(f.name, bad, 1);
      try {
        f.read();
        ADD_FAILURE() << bad;
      } catch (const ConfigError& e) {
        EXPECT_NE(std::string(e.what()).find(f.name), std::string::npos) << e.what();
      }
    }
    ::unsetenv(f.name);
  }
}

// STARLING_FAULT_STOP_AT_START is a switch: 1, or unset or empty for none.
TEST(FaultsFromTheEnvironment, AStopAtTheStartIsOneOrNothing) {
  const char* name = "STARLING_FAULT_STOP_AT_START";
  ::unsetenv(name);
  EXPECT_FALSE(stop_at_start_from_env());
  ::setenv(name, "", 1);
  EXPECT_FALSE(stop_at_start_from_env());
  ::setenv(name, "1", 1);
  EXPECT_TRUE(stop_at_start_from_env());
  for (const char* bad : {"0", "2", "yes", "true"}) {
    ::setenv(name, bad, 1);
    try {
      stop_at_start_from_env();
      ADD_FAILURE() << bad;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
  ::unsetenv(name);
}

TEST(FaultsFromTheEnvironment, APieceLossIsARoundAndAPiece) {
  const char* name = "STARLING_FAULT_LOSE_PIECE";
  ::unsetenv("STARLING_FAULT_DIE_IN_EXCHANGE");
  ::unsetenv(name);
  EXPECT_FALSE(lose_piece_from_env());
  ::setenv(name, "", 1);
  EXPECT_FALSE(lose_piece_from_env());
  EXPECT_EQ(RoundFaults("outer step").announcement(), "");
  ::setenv(name, "3:2", 1);
  const auto loss = lose_piece_from_env();
  ASSERT_TRUE(loss);
  EXPECT_EQ(loss->round, 3);
  EXPECT_EQ(loss->piece, 2);
  // Only the second piece (index 1) of the third round counts as failed, and it says so.
  RoundFaults faults("outer step");
  EXPECT_NE(faults.announcement().find("piece 2 of its outer step 3"), std::string::npos)
      << faults.announcement();
  std::vector<std::string> lines;
  const auto log = [&](const std::string& line) { lines.push_back(line); };
  for (int round = 1; round <= 4; ++round) {
    faults.begin();
    for (int64_t k = 0; k < 4; ++k)
      EXPECT_EQ(faults.loses_piece(k, log), round == 3 && k == 1) << round << " " << k;
  }
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("counting piece 2 of outer step 3 as failed"), std::string::npos)
      << lines[0];
  for (const char* bad : {"3", "3:", ":2", "0:1", "1:0", "-1:2", "1:+2", "1: 2", "a:b", "1:2:3"}) {
    ::setenv(name, bad, 1);
    try {
      lose_piece_from_env();
      ADD_FAILURE() << bad;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
  ::unsetenv(name);
}

TEST(FaultsFromTheEnvironment, ADeathWhileAccumulatingIsAStepAndItsMicroBatches) {
  const char* name = "STARLING_FAULT_DIE_ACCUMULATING";
  ::unsetenv(name);
  EXPECT_FALSE(die_accumulating_from_env());
  ::setenv(name, "", 1);
  EXPECT_FALSE(die_accumulating_from_env());
  ::setenv(name, "4:3", 1);
  const auto death = die_accumulating_from_env();
  ASSERT_TRUE(death);
  EXPECT_EQ(death->step, 4);
  EXPECT_EQ(death->micro_batches, 3);
  for (const char* bad : {"4", "4:", ":3", "0:1", "1:0", "1:+2", "a:b", "1:2:3"}) {
    ::setenv(name, bad, 1);
    try {
      die_accumulating_from_env();
      ADD_FAILURE() << bad;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("micro-batches"), std::string::npos) << e.what();
    }
  }
  ::unsetenv(name);
}

}  // namespace
}  // namespace starling::strategy
