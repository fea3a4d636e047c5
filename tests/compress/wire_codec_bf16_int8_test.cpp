// Wire codecs, bf16 and int8: round to nearest even against exact double arithmetic, int8's
// per-group scale, ties, odd lengths, zero and non-finite groups; on every code path this CPU has.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "starling/compress/wire_codec.h"
#include "wire_codec_test_support.h"

namespace starling::compress {
namespace {

using namespace wire_codec_test;

// --- bf16 ----------------------------------------------------------------------------------------

// Independent reference: pick the nearer of the two bf16 neighbours in exact double arithmetic,
// the even one on a tie. Past the largest bf16 the upper neighbour is 2^128 (IEEE overflow).
uint16_t bf16_reference(float f) {
  const uint32_t u = bits_of(f);
  if (std::isinf(f)) return static_cast<uint16_t>(u >> 16);
  const uint16_t lo = static_cast<uint16_t>(u >> 16);  // toward zero
  const double x = std::fabs(static_cast<double>(f));
  const double lo_value = std::fabs(static_cast<double>(float_of(uint32_t{lo} << 16)));
  const double hi_value = (lo & 0x7FFFu) == 0x7F7Fu
                              ? std::ldexp(1.0, 128)
                              : std::fabs(static_cast<double>(float_of((uint32_t{lo} + 1) << 16)));
  const double down = x - lo_value, up = hi_value - x;
  const bool round_up = up < down || (up == down && (lo & 1u) != 0);
  return static_cast<uint16_t>(round_up ? lo + 1 : lo);
}

class WireCodecBf16 : public IsaTest {};

TEST_P(WireCodecBf16, RoundsToNearestEven) {
  EXPECT_EQ(bf16_bits(1.0f), 0x3F80);
  EXPECT_EQ(bf16_bits(1.0f + 0x1p-8f), 0x3F80);      // tie, down to even
  EXPECT_EQ(bf16_bits(1.0f + 3 * 0x1p-8f), 0x3F82);  // tie, up to even
  EXPECT_EQ(bf16_bits(1.0f + 0x1p-8f + 0x1p-20f), 0x3F81);
  EXPECT_EQ(bf16_bits(-1.0f - 3 * 0x1p-8f), 0xBF82);
  EXPECT_EQ(bf16_bits(float_of(0x7F7F7FFF)), 0x7F7F);  // below the tie at the top
  EXPECT_EQ(bf16_bits(float_of(0x7F7F8000)), 0x7F80);  // tie past the largest bf16: inf
  EXPECT_EQ(bf16_bits(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(bf16_bits(-std::numeric_limits<float>::max()), 0xFF80);
  EXPECT_EQ(bf16_bits(std::numeric_limits<float>::infinity()), 0x7F80);
  EXPECT_EQ(bf16_bits(float_of(0x00008000)), 0x0000);  // subnormal tie, to even
  EXPECT_EQ(bf16_bits(float_of(0x00018000)), 0x0002);
  EXPECT_EQ(bf16_bits(float_of(0x007FFFFF)), 0x0080);  // largest subnormal rounds up to normal
  EXPECT_EQ(bf16_bits(-0.0f), 0x8000);

  const std::vector<float> inputs = mixed_floats(200000, 9);
  const std::vector<std::byte> encoded = enc(WirePrecision::bf16, inputs);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (std::isnan(inputs[i])) continue;
    ASSERT_EQ(u16_at(encoded, i), bf16_reference(inputs[i])) << std::hex << bits_of(inputs[i]);
  }
}

TEST_P(WireCodecBf16, NanStaysNan) {
  // Rounding these as numbers would carry into the exponent and give inf (or flip the sign).
  for (uint32_t u :
       {0x7F800001u, 0x7F80FFFFu, 0x7FFFFFFFu, 0x7FC00000u, 0xFF800001u, 0xFFFFFFFFu}) {
    const uint16_t b = bf16_bits(float_of(u));
    EXPECT_EQ(b & 0x7FC0u, 0x7FC0u) << std::hex << u;  // a quiet NaN
    EXPECT_EQ(b & 0x8000u, (u >> 16) & 0x8000u) << std::hex << u;
    EXPECT_TRUE(
        std::isnan(dec(WirePrecision::bf16, enc(WirePrecision::bf16, {float_of(u)}), 1)[0]));
  }
  EXPECT_EQ(bf16_bits(float_of(0x7F800001)), 0x7FC0);
  EXPECT_EQ(bf16_bits(float_of(0xFFA5FFFF)), 0xFFE5);  // payload kept where it fits
}

TEST_P(WireCodecBf16, DecodeIsExact) {
  const std::vector<float> decoded = dec(WirePrecision::bf16, all_16_bit_patterns(), 65536);
  for (uint32_t b = 0; b < 65536; ++b) ASSERT_EQ(bits_of(decoded[b]), b << 16);
}

// --- int8 ----------------------------------------------------------------------------------------

float group_scale(const std::vector<std::byte>& encoded, size_t group) {
  float s;
  std::memcpy(&s, encoded.data() + group * kInt8GroupBytes, 4);
  return s;
}

int8_t group_value(const std::vector<std::byte>& encoded, size_t group, size_t i) {
  return static_cast<int8_t>(encoded[group * kInt8GroupBytes + 4 + i]);
}

class WireCodecInt8 : public IsaTest {
 protected:
  // Checks every group of an encoding of finite `src` against an exact reference.
  void check(const std::vector<float>& src) const {
    const std::vector<std::byte> encoded = enc(WirePrecision::int8, src);
    const std::vector<float> decoded = dec(WirePrecision::int8, encoded, src.size());
    for (size_t g = 0; g * kInt8Group < src.size(); ++g) {
      const size_t begin = g * kInt8Group, end = std::min(src.size(), begin + kInt8Group);
      float absmax = 0.0f;
      for (size_t i = begin; i < end; ++i) absmax = std::max(absmax, std::fabs(src[i]));
      const float scale = group_scale(encoded, g);
      if (absmax < kInt8MinAbsMax) {
        ASSERT_EQ(bits_of(scale), 0u);
        for (size_t i = begin; i < end; ++i) ASSERT_EQ(bits_of(decoded[i]), 0u);
        continue;
      }
      ASSERT_EQ(scale, absmax / 127.0f) << "group " << g;
      for (size_t i = begin; i < end; ++i) {
        const int8_t q = group_value(encoded, g, i - begin);
        // std::nearbyint rounds half to even in the default rounding mode.
        ASSERT_EQ(q, static_cast<int8_t>(std::nearbyint(src[i] / scale))) << i;
        ASSERT_GE(q, -127);
        ASSERT_EQ(decoded[i], static_cast<float>(q) * scale);
        // scale / 2, plus the two fp32 roundings (division, product) in relative terms.
        const double error = std::fabs(static_cast<double>(src[i]) - decoded[i]);
        ASSERT_LE(error, 0.5 * scale * (1 + 0x1p-16) + 127.0 * scale * 0x1p-24) << i;
      }
    }
  }
};

TEST_P(WireCodecInt8, QuantizesWithinHalfAScale) {
  check(finite_floats(4 * kInt8Group, 21, 1e-3f));
  check(finite_floats(kInt8Group + 1, 22, 1e6f));
  std::vector<float> spread = finite_floats(8 * kInt8Group, 23, 1.0f);
  for (size_t i = 0; i < spread.size(); ++i) {
    spread[i] *= std::ldexp(1.0f, static_cast<int>(i % 64) - 32);
  }
  check(spread);
  // Every element at the absmax: all +-127.
  std::vector<float> flat(kInt8Group, 0.3f);
  for (size_t i = 0; i < flat.size(); i += 2) flat[i] = -0.3f;
  check(flat);
  const std::vector<std::byte> encoded = enc(WirePrecision::int8, flat);
  EXPECT_EQ(group_value(encoded, 0, 0), -127);
  EXPECT_EQ(group_value(encoded, 0, 1), 127);
}

TEST_P(WireCodecInt8, TiesRoundToEven) {
  // absmax 127 gives scale 1 exactly, so x / scale = x.
  const std::vector<float> src = {127.0f, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 126.5f, 3.49f};
  const std::vector<std::byte> encoded = enc(WirePrecision::int8, src);
  ASSERT_EQ(encoded.size(), 4 + src.size());
  EXPECT_EQ(group_scale(encoded, 0), 1.0f);
  const int8_t want[] = {127, 0, 2, 2, 0, -2, -2, 126, 3};
  for (size_t i = 0; i < src.size(); ++i) EXPECT_EQ(group_value(encoded, 0, i), want[i]) << i;
  check(src);
}

TEST_P(WireCodecInt8, OddLengths) {
  for (size_t n : {1, 2, 255, 256, 257, 511, 513, 1000}) {
    SCOPED_TRACE(n);
    check(finite_floats(n, static_cast<uint32_t>(n), 0.02f));
  }
  const std::vector<std::byte> one = enc(WirePrecision::int8, {-3.0f});
  EXPECT_EQ(group_scale(one, 0), 3.0f / 127.0f);
  EXPECT_EQ(group_value(one, 0, 0), -127);
  EXPECT_EQ(dec(WirePrecision::int8, one, 1)[0], -127 * (3.0f / 127.0f));
}

TEST_P(WireCodecInt8, ZeroAndNegligibleGroupsDecodeToZero) {
  std::vector<float> src(3 * kInt8Group, 0.0f);
  src[kInt8Group + 5] = -0.0f;
  for (size_t i = 2 * kInt8Group; i < src.size(); ++i) src[i] = 1e-35f;  // below 2^-102
  src[2 * kInt8Group + 1] = float_of(0x00000001);                        // float subnormal
  const std::vector<std::byte> encoded = enc(WirePrecision::int8, src);
  for (size_t g = 0; g < 3; ++g) EXPECT_EQ(bits_of(group_scale(encoded, g)), 0u);
  for (float v : dec(WirePrecision::int8, encoded, src.size())) ASSERT_EQ(bits_of(v), 0u);
  // At the cut-off the group is quantized normally.
  check({kInt8MinAbsMax, kInt8MinAbsMax / 3, -kInt8MinAbsMax / 2});
  EXPECT_GT(group_scale(enc(WirePrecision::int8, {kInt8MinAbsMax}), 0), 0.0f);
}

TEST_P(WireCodecInt8, NonFiniteGroupsDecodeToNan) {
  for (float bad :
       {std::numeric_limits<float>::quiet_NaN(), -std::numeric_limits<float>::quiet_NaN(),
        float_of(0x7F800001), std::numeric_limits<float>::infinity(),
        -std::numeric_limits<float>::infinity()}) {
    std::vector<float> src = finite_floats(3 * kInt8Group + 10, 31, 1.0f);
    src[kInt8Group + 77] = bad;     // poisons group 1
    src[3 * kInt8Group + 9] = bad;  // and the short last group
    const std::vector<std::byte> encoded = enc(WirePrecision::int8, src);
    const std::vector<float> decoded = dec(WirePrecision::int8, encoded, src.size());
    for (size_t i = 0; i < src.size(); ++i) {
      const size_t g = i / kInt8Group;
      ASSERT_EQ(std::isnan(decoded[i]), g == 1 || g == 3) << i;
    }
    std::vector<float> acc(src.size(), 1.0f);
    detail::decode_add(isa(), WirePrecision::int8, encoded.data(), src.size(), acc.data());
    EXPECT_TRUE(std::isnan(acc[kInt8Group]));
    EXPECT_FALSE(std::isnan(acc[0]));
    // The healthy groups are quantized as usual.
    check(std::vector<float>(src.begin(), src.begin() + kInt8Group));
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, WireCodecBf16, testing::ValuesIn(available_isas()), isa_name);
INSTANTIATE_TEST_SUITE_P(Paths, WireCodecInt8, testing::ValuesIn(available_isas()), isa_name);
}  // namespace
}  // namespace starling::compress
