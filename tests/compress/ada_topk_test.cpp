// AdaTopK's choice of how much of a stage's tensors to send.
#include "starling/compress/ada_topk.h"

#include <gtest/gtest.h>

namespace {

using starling::compress::adaptive_keep_ratio;
using starling::compress::LinkBudget;

TEST(AdaTopK, CompressesOnlyWhatDoesNotFitAndOnlyAsMuchAsNeeded) {
  // 1M fp32 entries (4 MB) per micro-batch, 0.1 s of compute on the slowest stage.
  LinkBudget b{.seconds = 0.1, .mbit_per_s = 1000, .elements = 1e6};
  // 1 Gbit carries 12.5 MB in 0.1 s: whole tensors.
  EXPECT_EQ(adaptive_keep_ratio(b, 0.01), 1.0);
  // 10 Mbit carries 125 kB: 15625 entries of 8 bytes.
  b.mbit_per_s = 10;
  EXPECT_NEAR(adaptive_keep_ratio(b, 0.001), 0.015625, 1e-12);
  // Never below the floor.
  EXPECT_EQ(adaptive_keep_ratio(b, 0.05), 0.05);
  // Half the compute time, half the entries.
  b.seconds = 0.05;
  EXPECT_NEAR(adaptive_keep_ratio(b, 0.001), 0.0078125, 1e-12);
  // Just too slow for whole tensors: the kept entries still cost fewer bytes than whole ones.
  b = {.seconds = 0.1, .mbit_per_s = 300, .elements = 1e6};
  const double r = adaptive_keep_ratio(b, 0.01);
  EXPECT_LT(r * 8, 4.0);
  // Nothing measured yet: send whole tensors.
  EXPECT_EQ(adaptive_keep_ratio({.seconds = 0, .mbit_per_s = 10, .elements = 1e6}, 0.01), 1.0);
  EXPECT_EQ(adaptive_keep_ratio({.seconds = 0.1, .mbit_per_s = -1, .elements = 1e6}, 0.01), 1.0);
}

TEST(AdaTopK, QuantizesBeforeItDropsEntries) {
  using starling::compress::adaptive_compression;
  // 1M activation and 1M gradient entries per micro-batch (8 MB whole), 0.1 s of compute.
  const double n = 1e6;
  // 1 Gbit (12.5 MB in 0.1 s): whole.
  auto c = adaptive_compression(0.1, 1000, n, n, true, 0.01);
  EXPECT_FALSE(c.int8_activations);
  EXPECT_FALSE(c.int8_gradients);
  EXPECT_EQ(c.keep_ratio, 1.0);
  // 500 Mbit (6.25 MB): int8 activations (~1 MB) and whole gradients (4 MB) fit.
  c = adaptive_compression(0.1, 500, n, n, true, 0.01);
  EXPECT_TRUE(c.int8_activations);
  EXPECT_FALSE(c.int8_gradients);
  EXPECT_EQ(c.keep_ratio, 1.0);
  // 200 Mbit (2.5 MB): both int8 (~2 MB), nothing dropped.
  c = adaptive_compression(0.1, 200, n, n, true, 0.01);
  EXPECT_TRUE(c.int8_activations);
  EXPECT_TRUE(c.int8_gradients);
  EXPECT_EQ(c.keep_ratio, 1.0);
  // 150 Mbit (1.875 MB): int8 activations (~1 MB) and int4 gradients (~0.56 MB).
  c = adaptive_compression(0.1, 150, n, n, true, 0.001);
  EXPECT_TRUE(c.int8_activations);
  EXPECT_FALSE(c.int8_gradients);
  EXPECT_TRUE(c.int4_gradients);
  EXPECT_EQ(c.keep_ratio, 1.0);
  // 100 Mbit (1.25 MB): int4 both ways (~1.13 MB), still nothing dropped.
  c = adaptive_compression(0.1, 100, n, n, true, 0.001);
  EXPECT_FALSE(c.int8_activations);
  EXPECT_TRUE(c.int4_activations);
  EXPECT_TRUE(c.int4_gradients);
  EXPECT_EQ(c.keep_ratio, 1.0);
  // 60 Mbit (0.75 MB): int4 activations and the top ~2.4% of the gradients.
  c = adaptive_compression(0.1, 60, n, n, true, 0.001);
  EXPECT_TRUE(c.int4_activations);
  EXPECT_FALSE(c.int4_gradients);
  EXPECT_GT(c.keep_ratio, 0.02);
  EXPECT_LT(c.keep_ratio, 0.03);
  // Without int8 activations, whole activations (4 MB) leave no room: the floor.
  c = adaptive_compression(0.1, 200, n, n, false, 0.01);
  EXPECT_FALSE(c.int8_activations);
  EXPECT_FALSE(c.int4_activations);
  EXPECT_EQ(c.keep_ratio, 0.01);
  // Allowed to be twice as slow as the stage, int4 both ways (1.13 MB) is kept at 60 Mbit; at
  // 25 Mbit (0.31 MB, 0.63 MB allowed) top-k after all.
  c = adaptive_compression(0.1, 60, n, n, true, 0.001, 2.0);
  EXPECT_TRUE(c.int4_activations);
  EXPECT_TRUE(c.int4_gradients);
  EXPECT_EQ(c.keep_ratio, 1.0);
  c = adaptive_compression(0.1, 25, n, n, true, 0.001, 2.0);
  EXPECT_FALSE(c.int4_gradients);
  EXPECT_LT(c.keep_ratio, 1.0);
  // A floor above int4's cost (8 x 0.1 bytes per entry > ~0.56): int4 gradients, not top-k.
  c = adaptive_compression(0.1, 60, n, n, true, 0.1);
  EXPECT_TRUE(c.int4_gradients);
  EXPECT_EQ(c.keep_ratio, 1.0);
  // Nothing measured: whole.
  c = adaptive_compression(0, 10, n, n, true, 0.01);
  EXPECT_FALSE(c.int8_activations);
  EXPECT_EQ(c.keep_ratio, 1.0);
}

TEST(AdaTopK, PlannedWireFractionFollowsTheSetting) {
  using starling::compress::planned_wire_fraction;
  EXPECT_EQ(planned_wire_fraction("none", "int8", 0.1), 1.0);
  const double int8 = planned_wire_fraction("int8", "none", 0.1);
  EXPECT_NEAR(int8, 0.2539, 1e-3);
  const double int4 = planned_wire_fraction("int4", "none", 0.1);
  EXPECT_NEAR(int4, 0.1406, 1e-3);
  EXPECT_NEAR(planned_wire_fraction("adatopk", "int8", 0.1), int4, 1e-12);
  EXPECT_EQ(planned_wire_fraction("adatopk", "none", 0.1), 1.0);
  // topk 0.1: gradients 20% of the bytes, int8 activations about 25%: the heavier direction.
  EXPECT_NEAR(planned_wire_fraction("topk", "int8", 0.1), int8, 1e-12);
  EXPECT_NEAR(planned_wire_fraction("topk", "topk", 0.1), 0.2, 1e-12);
  EXPECT_EQ(planned_wire_fraction("topk", "none", 0.1), 1.0);
  EXPECT_THROW(planned_wire_fraction("zip", "int8", 0.1), std::invalid_argument);
}

}  // namespace
