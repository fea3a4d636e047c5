// The pipeline's int4 codec (compress/int4_codec.h): sizes, the error bound, the special groups,
// the byte layout, and that encoding is a function of the input alone.
#include "starling/compress/int4_codec.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace starling::compress {
namespace {

std::vector<float> round_trip(const std::vector<float>& x) {
  std::vector<std::byte> bytes(int4_encoded_bytes(x.size()));
  encode_int4(x.data(), x.size(), bytes.data());
  std::vector<float> y(x.size(), -1.f);
  decode_int4(bytes.data(), x.size(), y.data());
  return y;
}

TEST(Int4Codec, SizesAreAScalePerGroupAndHalfAByteAnEntry) {
  EXPECT_EQ(int4_encoded_bytes(0), 0u);
  EXPECT_EQ(int4_encoded_bytes(1), 5u);
  EXPECT_EQ(int4_encoded_bytes(64), 36u);
  EXPECT_EQ(int4_encoded_bytes(65), 36u + 5u);
  EXPECT_EQ(int4_encoded_bytes(64 * 1000 + 3), 36u * 1000 + 4 + 2);
}

TEST(Int4Codec, EveryEntryIsWithinHalfAStepOfItsGroupsScale) {
  std::mt19937 rng(3);
  std::normal_distribution<float> n(0.f, 2.f);
  std::vector<float> x(64 * 5 + 17);
  for (auto& v : x) v = n(rng);
  x[70] = 40.f;  // one large entry coarsens only its own group
  const auto y = round_trip(x);
  for (size_t g = 0; g < x.size(); g += kInt4Group) {
    float absmax = 0;
    for (size_t i = g; i < std::min(x.size(), g + kInt4Group); ++i)
      absmax = std::max(absmax, std::fabs(x[i]));
    const float scale = absmax / 7.0f;
    for (size_t i = g; i < std::min(x.size(), g + kInt4Group); ++i)
      EXPECT_LE(std::fabs(x[i] - y[i]), scale / 2 * (1 + 1e-6f)) << "entry " << i;
  }
  // The group's largest entry comes back exactly (7 steps of absmax / 7, up to rounding).
  EXPECT_NEAR(y[70], 40.f, 40.f * 1e-6f);
}

TEST(Int4Codec, SpecialGroupsDecodeToNanOrZero) {
  std::vector<float> x(3 * kInt4Group, 1.f);
  x[5] = std::numeric_limits<float>::quiet_NaN();
  x[kInt4Group + 7] = std::numeric_limits<float>::infinity();
  for (size_t i = 2 * kInt4Group; i < x.size(); ++i) x[i] = 1e-35f;  // below the cut-off
  const auto y = round_trip(x);
  for (size_t i = 0; i < 2 * kInt4Group; ++i) EXPECT_TRUE(std::isnan(y[i])) << i;
  for (size_t i = 2 * kInt4Group; i < x.size(); ++i) {
    EXPECT_EQ(y[i], 0.f) << i;
    EXPECT_FALSE(std::signbit(y[i])) << i;
  }
}

TEST(Int4Codec, TheLayoutIsAScaleThenLowAndHighHalves) {
  const std::vector<float> x = {7.f, -7.f, 1.f};  // scale 1: codes 15, 1, 9
  std::vector<std::byte> bytes(int4_encoded_bytes(x.size()));
  encode_int4(x.data(), x.size(), bytes.data());
  ASSERT_EQ(bytes.size(), 6u);
  float scale;
  std::memcpy(&scale, bytes.data(), sizeof scale);
  EXPECT_EQ(scale, 1.f);
  EXPECT_EQ(std::to_integer<int>(bytes[4]), 15 | 1 << 4);
  EXPECT_EQ(std::to_integer<int>(bytes[5]), 9);  // the odd group's unused high half is 0
  EXPECT_EQ(round_trip(x), x);
}

TEST(Int4Codec, TiesRoundToEvenAndEncodingIsRepeatable) {
  // Scale 1 (absmax 7): 2.5 and -0.5 are ties, to 2 and -0.
  const std::vector<float> x = {7.f, 2.5f, -0.5f, 3.5f};
  const auto y = round_trip(x);
  EXPECT_EQ(y[1], 2.f);
  EXPECT_EQ(y[2], 0.f);
  EXPECT_EQ(y[3], 4.f);
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> big(10000);
  for (auto& v : big) v = u(rng);
  std::vector<std::byte> a(int4_encoded_bytes(big.size())), b(a.size());
  encode_int4(big.data(), big.size(), a.data());
  encode_int4(big.data(), big.size(), b.data());
  EXPECT_EQ(a, b);
}

}  // namespace
}  // namespace starling::compress
