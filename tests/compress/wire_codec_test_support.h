// What the wire codec tests share: the code paths this CPU has, a fixture that runs a test on
// each, encode/decode helpers and float generators.
#pragma once

#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "starling/compress/wire_codec.h"

namespace starling::compress {
namespace wire_codec_detail {
// Names the code path in gtest messages (found by argument-dependent lookup).
inline void PrintTo(Isa isa, std::ostream* os) { *os << to_string(isa); }
}  // namespace wire_codec_detail

namespace wire_codec_test {

namespace detail = wire_codec_detail;
using detail::Isa;

inline constexpr WirePrecision kAllPrecisions[] = {WirePrecision::fp32, WirePrecision::fp16,
                                                   WirePrecision::bf16, WirePrecision::int8};

inline uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }
inline float float_of(uint32_t u) { return std::bit_cast<float>(u); }

// The code paths this CPU has; every reference test runs on each of them.
inline std::vector<Isa> available_isas() {
  std::vector<Isa> isas;
  for (Isa isa : {Isa::kPortable, Isa::kAvx2F16c}) {
    if (detail::isa_available(isa)) isas.push_back(isa);
  }
  return isas;
}

inline std::vector<std::byte> encode_vec(Isa isa, WirePrecision p, const std::vector<float>& src) {
  std::vector<std::byte> out(encoded_bytes(p, src.size()));
  detail::encode(isa, p, src.data(), src.size(), out.data());
  return out;
}

inline std::vector<float> decode_vec(Isa isa, WirePrecision p, const std::vector<std::byte>& src,
                                     size_t count) {
  std::vector<float> out(count);
  detail::decode(isa, p, src.data(), count, out.data());
  return out;
}

inline uint16_t u16_at(const std::vector<std::byte>& buf, size_t i) {
  uint16_t v;
  std::memcpy(&v, buf.data() + 2 * i, 2);
  return v;
}

inline std::vector<std::byte> all_16_bit_patterns() {
  std::vector<std::byte> out(2 * 65536);
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint16_t v = static_cast<uint16_t>(h);
    std::memcpy(out.data() + 2 * h, &v, 2);
  }
  return out;
}

// Runs a test once per available code path (GetParam()).
class IsaTest : public testing::TestWithParam<Isa> {
 protected:
  Isa isa() const { return GetParam(); }
  std::vector<std::byte> enc(WirePrecision p, const std::vector<float>& src) const {
    return encode_vec(isa(), p, src);
  }
  std::vector<float> dec(WirePrecision p, const std::vector<std::byte>& src, size_t n) const {
    return decode_vec(isa(), p, src, n);
  }
  uint16_t fp16_bits(float f) const { return u16_at(enc(WirePrecision::fp16, {f}), 0); }
  uint16_t bf16_bits(float f) const { return u16_at(enc(WirePrecision::bf16, {f}), 0); }
  float fp16_value(uint16_t h) const {
    std::vector<std::byte> b(2);
    std::memcpy(b.data(), &h, 2);
    return dec(WirePrecision::fp16, b, 1)[0];
  }
};

inline std::string isa_name(const testing::TestParamInfo<Isa>& info) {
  return info.param == Isa::kPortable ? "Portable" : "Avx2F16c";
}

// Floats of every kind: random bit patterns (NaNs, infs, subnormals included) and values in the
// ranges the codecs care about.
inline std::vector<float> mixed_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    switch (i % 4) {
      case 0:
        out[i] = float_of(static_cast<uint32_t>(rng()));
        break;
      case 1:
        out[i] = normal(rng) * 1e-3f;
        break;
      case 2:
        out[i] = normal(rng) * 3e4f;  // around the fp16 overflow threshold
        break;
      default:
        out[i] = normal(rng) * 1e-6f;  // fp16 subnormals
        break;
    }
  }
  return out;
}

// Plain floats (no NaN/inf), so int8 groups are quantized rather than poisoned.
inline std::vector<float> finite_floats(size_t n, uint32_t seed, float sigma) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> out(n);
  for (float& v : out) v = normal(rng);
  return out;
}

}  // namespace wire_codec_test
}  // namespace starling::compress
