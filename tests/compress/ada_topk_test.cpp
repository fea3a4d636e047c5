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

}  // namespace
