// Wire codecs: exact formats, round to nearest even against independent references (numpy for
// fp16, exact double arithmetic for bf16 and int8), NaN/inf handling, odd lengths, and
// agreement between the portable and the AVX2/F16C code paths.
#include "starling/compress/wire_codec.h"

#include <gtest/gtest.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "starling/common/error.h"

namespace starling::compress {
namespace wire_codec_detail {
// Names the code path in gtest messages (found by argument-dependent lookup).
void PrintTo(Isa isa, std::ostream* os) { *os << to_string(isa); }
}  // namespace wire_codec_detail

namespace {

namespace detail = wire_codec_detail;
using detail::Isa;

constexpr WirePrecision kAllPrecisions[] = {WirePrecision::fp32, WirePrecision::fp16,
                                            WirePrecision::bf16, WirePrecision::int8};

uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }
float float_of(uint32_t u) { return std::bit_cast<float>(u); }

// The code paths this CPU has; every reference test runs on each of them.
std::vector<Isa> available_isas() {
  std::vector<Isa> isas;
  for (Isa isa : {Isa::kPortable, Isa::kAvx2F16c}) {
    if (detail::isa_available(isa)) isas.push_back(isa);
  }
  return isas;
}

std::vector<std::byte> encode_vec(Isa isa, WirePrecision p, const std::vector<float>& src) {
  std::vector<std::byte> out(encoded_bytes(p, src.size()));
  detail::encode(isa, p, src.data(), src.size(), out.data());
  return out;
}

std::vector<float> decode_vec(Isa isa, WirePrecision p, const std::vector<std::byte>& src,
                              size_t count) {
  std::vector<float> out(count);
  detail::decode(isa, p, src.data(), count, out.data());
  return out;
}

uint16_t u16_at(const std::vector<std::byte>& buf, size_t i) {
  uint16_t v;
  std::memcpy(&v, buf.data() + 2 * i, 2);
  return v;
}

std::vector<std::byte> all_16_bit_patterns() {
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

std::string isa_name(const testing::TestParamInfo<Isa>& info) {
  return info.param == Isa::kPortable ? "Portable" : "Avx2F16c";
}

// Floats of every kind: random bit patterns (NaNs, infs, subnormals included) and values in the
// ranges the codecs care about.
std::vector<float> mixed_floats(size_t n, uint32_t seed) {
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
std::vector<float> finite_floats(size_t n, uint32_t seed, float sigma) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> out(n);
  for (float& v : out) v = normal(rng);
  return out;
}

// --- names and misuse ----------------------------------------------------------------------------

TEST(WirePrecision, NamesRoundTrip) {
  for (WirePrecision p : kAllPrecisions) {
    EXPECT_EQ(parse_wire_precision(to_string(p)), p);
    EXPECT_EQ(wire_precision_from_byte(static_cast<uint8_t>(p)), p);
  }
  EXPECT_EQ(to_string(WirePrecision::fp16), "fp16");
  EXPECT_EQ(parse_wire_precision("FP16"), std::nullopt);
  EXPECT_EQ(parse_wire_precision(""), std::nullopt);
  EXPECT_EQ(parse_wire_precision("int4"), std::nullopt);
  EXPECT_EQ(wire_precision_from_byte(4), std::nullopt);
  EXPECT_EQ(wire_precision_from_byte(255), std::nullopt);
}

TEST(WirePrecision, InvalidValueIsAProgrammingError) {
  const auto bogus = static_cast<WirePrecision>(9);
  float x = 1.0f;
  std::byte buf[16];
  EXPECT_THROW(encoded_bytes(bogus, 1), Error);
  EXPECT_THROW(encode(bogus, &x, 1, buf), Error);
  EXPECT_THROW(decode(bogus, buf, 1, &x), Error);
  EXPECT_THROW(decode_add(bogus, buf, 1, &x), Error);
  EXPECT_THROW(encoded_bytes(WirePrecision::fp32, SIZE_MAX / 2), Error);
}

// --- sizes, layout, public entry points ----------------------------------------------------------

TEST(WireCodec, EncodedBytesIsExactlyWhatEncodeWrites) {
  EXPECT_EQ(encoded_bytes(WirePrecision::fp32, 10), 40u);
  EXPECT_EQ(encoded_bytes(WirePrecision::fp16, 10), 20u);
  EXPECT_EQ(encoded_bytes(WirePrecision::bf16, 10), 20u);
  EXPECT_EQ(encoded_bytes(WirePrecision::int8, 0), 0u);
  EXPECT_EQ(encoded_bytes(WirePrecision::int8, 1), 5u);
  EXPECT_EQ(encoded_bytes(WirePrecision::int8, 256), 260u);
  EXPECT_EQ(encoded_bytes(WirePrecision::int8, 257), 265u);
  EXPECT_EQ(encoded_bytes(WirePrecision::int8, 1000), 1000u + 4 * 4);

  constexpr std::byte kCanary{0xA5};
  for (WirePrecision p : kAllPrecisions) {
    for (size_t n : {0, 1, 7, 8, 63, 64, 65, 255, 256, 257, 1000}) {
      SCOPED_TRACE(std::string(to_string(p)) + " n=" + std::to_string(n));
      const std::vector<float> src = mixed_floats(n, 7);
      const size_t size = encoded_bytes(p, n);
      std::vector<std::byte> buf(size + 64, kCanary);
      encode(p, src.data(), n, buf.data());
      for (size_t i = size; i < buf.size(); ++i) ASSERT_EQ(buf[i], kCanary) << "byte " << i;
      std::vector<float> out(n + 16, 42.0f);
      decode(p, buf.data(), n, out.data());
      for (size_t i = n; i < out.size(); ++i) ASSERT_EQ(out[i], 42.0f);
      decode_add(p, buf.data(), n, out.data());
      for (size_t i = n; i < out.size(); ++i) ASSERT_EQ(out[i], 42.0f);
    }
  }
}

TEST(WireCodec, PublicFunctionsUseTheBestPath) {
  const std::vector<float> src = mixed_floats(1000, 8);
  for (WirePrecision p : kAllPrecisions) {
    std::vector<std::byte> a(encoded_bytes(p, src.size()));
    encode(p, src.data(), src.size(), a.data());
    EXPECT_EQ(a, encode_vec(detail::best_isa(), p, src)) << to_string(p);
  }
}

TEST(WireCodec, ZeroCountAcceptsNullPointers) {
  for (WirePrecision p : kAllPrecisions) {
    encode(p, nullptr, 0, nullptr);
    decode(p, nullptr, 0, nullptr);
    decode_add(p, nullptr, 0, nullptr);
  }
}

TEST(WireCodec, Fp32IsBitExact) {
  const std::vector<float> src = mixed_floats(1001, 3);
  std::vector<std::byte> enc(encoded_bytes(WirePrecision::fp32, src.size()));
  encode(WirePrecision::fp32, src.data(), src.size(), enc.data());
  ASSERT_EQ(std::memcmp(enc.data(), src.data(), enc.size()), 0);
  std::vector<float> dec(src.size());
  decode(WirePrecision::fp32, enc.data(), src.size(), dec.data());
  ASSERT_EQ(std::memcmp(dec.data(), src.data(), enc.size()), 0);
}

class WireCodecPaths : public IsaTest {};

// Chunks are independent: encoding a buffer piecewise (int8 at group boundaries) gives the same
// bytes as encoding it whole, and unaligned buffers give the same bytes as aligned ones.
TEST_P(WireCodecPaths, ChunksAndAlignmentDoNotMatter) {
  const std::vector<float> src = mixed_floats(3 * kInt8Group + 17, 11);
  for (WirePrecision p : kAllPrecisions) {
    SCOPED_TRACE(std::string(to_string(p)));
    const std::vector<std::byte> whole = enc(p, src);
    const size_t split = 2 * kInt8Group;
    std::vector<std::byte> pieces(whole.size());
    detail::encode(isa(), p, src.data(), split, pieces.data());
    detail::encode(isa(), p, src.data() + split, src.size() - split,
                   pieces.data() + encoded_bytes(p, split));
    EXPECT_EQ(pieces, whole);

    std::vector<std::byte> shifted(whole.size() + 1);
    detail::encode(isa(), p, src.data(), src.size(), shifted.data() + 1);
    EXPECT_EQ(std::memcmp(shifted.data() + 1, whole.data(), whole.size()), 0);
    std::vector<float> a(src.size()), b(src.size() + 1);
    detail::decode(isa(), p, whole.data(), src.size(), a.data());
    detail::decode(isa(), p, shifted.data() + 1, src.size(), b.data() + 1);  // both misaligned
    EXPECT_EQ(std::memcmp(a.data(), b.data() + 1, a.size() * sizeof(float)), 0);
  }
}

TEST_P(WireCodecPaths, DecodeAddIsDecodeThenAdd) {
  for (WirePrecision p : kAllPrecisions) {
    SCOPED_TRACE(std::string(to_string(p)));
    const size_t n = 5 * kInt8Group + 77;
    const std::vector<float> src =
        p == WirePrecision::int8 ? finite_floats(n, 41, 1.3f) : mixed_floats(n, 41);
    const std::vector<float> acc0 = finite_floats(n, 42, 2.0f);
    const std::vector<std::byte> encoded = enc(p, src);
    const std::vector<float> decoded = dec(p, encoded, n);
    std::vector<float> acc = acc0;
    detail::decode_add(isa(), p, encoded.data(), n, acc.data());
    for (size_t i = 0; i < n; ++i) {
      const float want = acc0[i] + decoded[i];
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(acc[i])) << i;
      } else {
        ASSERT_EQ(bits_of(acc[i]), bits_of(want)) << i;
      }
    }
  }
}

TEST(WireCodec, FastPathMatchesPortablePath) {
  if (!detail::isa_available(Isa::kAvx2F16c)) GTEST_SKIP() << "no AVX2/F16C on this CPU";
  EXPECT_EQ(detail::best_isa(), Isa::kAvx2F16c);
  std::vector<float> src = mixed_floats(64 * kInt8Group + 13, 51);
  // Specials everywhere the vector loops and the tails might treat them differently.
  const float specials[] = {0.0f,
                            -0.0f,
                            65504.0f,
                            65520.0f,
                            0x1p-25f,
                            3 * 0x1p-25f,
                            std::numeric_limits<float>::infinity(),
                            float_of(0x7F800001),
                            float_of(0xFFC01234),
                            float_of(0x00000001),
                            1.0f + 0x1p-11f};
  for (size_t i = 0; i < src.size(); i += 97) src[i] = specials[(i / 97) % std::size(specials)];
  std::vector<float> finite = finite_floats(src.size(), 52, 0.1f);
  finite[3 * kInt8Group] = std::numeric_limits<float>::quiet_NaN();
  for (WirePrecision p : kAllPrecisions) {
    const std::vector<float>& in = p == WirePrecision::int8 ? finite : src;
    for (size_t n : {in.size(), size_t{7}, size_t{8}, size_t{9}, size_t{kInt8Group - 1}}) {
      SCOPED_TRACE(std::string(to_string(p)) + " n=" + std::to_string(n));
      std::vector<std::byte> a(encoded_bytes(p, n)), b(encoded_bytes(p, n));
      detail::encode(Isa::kPortable, p, in.data(), n, a.data());
      detail::encode(Isa::kAvx2F16c, p, in.data(), n, b.data());
      ASSERT_EQ(a, b);
      std::vector<float> da(n), db(n), aa = finite, ab = finite;
      detail::decode(Isa::kPortable, p, a.data(), n, da.data());
      detail::decode(Isa::kAvx2F16c, p, a.data(), n, db.data());
      ASSERT_EQ(std::memcmp(da.data(), db.data(), n * sizeof(float)), 0);
      detail::decode_add(Isa::kPortable, p, a.data(), n, aa.data());
      detail::decode_add(Isa::kAvx2F16c, p, a.data(), n, ab.data());
      ASSERT_EQ(std::memcmp(aa.data(), ab.data(), n * sizeof(float)), 0);
    }
  }
  // Every half through both decoders, every half's float through both encoders.
  const std::vector<std::byte> halves = all_16_bit_patterns();
  const std::vector<float> pa = decode_vec(Isa::kPortable, WirePrecision::fp16, halves, 65536);
  const std::vector<float> pb = decode_vec(Isa::kAvx2F16c, WirePrecision::fp16, halves, 65536);
  ASSERT_EQ(std::memcmp(pa.data(), pb.data(), pa.size() * sizeof(float)), 0);
  EXPECT_EQ(encode_vec(Isa::kPortable, WirePrecision::fp16, pa),
            encode_vec(Isa::kAvx2F16c, WirePrecision::fp16, pa));
}

#if defined(__x86_64__) || defined(__i386__)
// A thread that flushes denormals (FTZ/DAZ, as some BLAS and torch setups do) must still put the
// same bytes on the wire and decode them to the same floats.
TEST_P(WireCodecPaths, FlushToZeroModeDoesNotChangeResults) {
  std::vector<float> src = mixed_floats(4 * kInt8Group + 3, 61);
  for (size_t i = 0; i < src.size(); i += 5) src[i] = float_of(0x00000001u + 977 * i);
  // int8 groups around the 2^-102 cut-off (their scales would be subnormal) and ordinary ones.
  std::vector<float> quantizable = finite_floats(src.size(), 62, 1.0f);
  const float group_sigma[] = {1e-30f, 1e-36f, 1e-40f, 1e-3f, 1.0f};
  for (size_t i = 0; i < src.size(); ++i) quantizable[i] *= group_sigma[i / kInt8Group];
  for (size_t i = 0; i < src.size(); i += 7) quantizable[i] = float_of(0x80000001u + 977 * i);
  for (WirePrecision p : kAllPrecisions) {
    SCOPED_TRACE(std::string(to_string(p)));
    for (const std::vector<float>* in : {&src, &quantizable}) {
      const std::vector<std::byte> plain = enc(p, *in);
      const std::vector<float> plain_decoded = dec(p, plain, in->size());
      const unsigned csr = _mm_getcsr();
      _mm_setcsr(csr | 0x8040u);  // FTZ | DAZ
      const std::vector<std::byte> flushed = enc(p, *in);
      const std::vector<float> flushed_decoded = dec(p, plain, in->size());
      _mm_setcsr(csr);
      EXPECT_EQ(flushed, plain);
      EXPECT_EQ(std::memcmp(flushed_decoded.data(), plain_decoded.data(), in->size() * 4), 0);
    }
  }
}
#endif

// --- fp16 ----------------------------------------------------------------------------------------

class WireCodecFp16 : public IsaTest {};

TEST_P(WireCodecFp16, EveryHalfRoundTrips) {
  const std::vector<float> floats = dec(WirePrecision::fp16, all_16_bit_patterns(), 65536);
  const std::vector<std::byte> again = enc(WirePrecision::fp16, floats);
  for (uint32_t h = 0; h < 65536; ++h) {
    const bool is_nan = (h & 0x7C00u) == 0x7C00u && (h & 0x03FFu) != 0;
    const uint16_t back = u16_at(again, h);
    if (is_nan) {
      ASSERT_TRUE(std::isnan(floats[h])) << std::hex << h;
      ASSERT_EQ(back, h | 0x0200u) << std::hex << h;  // sign and payload kept, made quiet
    } else {
      ASSERT_EQ(back, h) << std::hex << h;
    }
  }
  // Exact values, subnormals included.
  EXPECT_EQ(floats[0x0001], 0x1p-24f);
  EXPECT_EQ(floats[0x03FF], 1023 * 0x1p-24f);
  EXPECT_EQ(floats[0x0400], 0x1p-14f);
  EXPECT_EQ(floats[0x3C00], 1.0f);
  EXPECT_EQ(floats[0x7BFF], 65504.0f);
  EXPECT_EQ(floats[0x7C00], std::numeric_limits<float>::infinity());
  EXPECT_EQ(bits_of(floats[0x8000]), 0x80000000u);
  EXPECT_EQ(floats[0x8001], -0x1p-24f);
  EXPECT_EQ(floats[0xC000], -2.0f);
}

TEST_P(WireCodecFp16, RoundsToNearestEvenAtBoundaries) {
  EXPECT_EQ(fp16_bits(1.0f), 0x3C00);
  EXPECT_EQ(fp16_bits(1.0f + 0x1p-11f), 0x3C00);      // tie, down to even
  EXPECT_EQ(fp16_bits(1.0f + 3 * 0x1p-11f), 0x3C02);  // tie, up to even
  EXPECT_EQ(fp16_bits(std::nextafter(1.0f + 0x1p-11f, 2.0f)), 0x3C01);
  EXPECT_EQ(fp16_bits(65504.0f), 0x7BFF);                        // largest finite
  EXPECT_EQ(fp16_bits(std::nextafter(65520.0f, 0.0f)), 0x7BFF);  // just below the tie
  EXPECT_EQ(fp16_bits(65520.0f), 0x7C00);                        // tie: to even, which is inf
  EXPECT_EQ(fp16_bits(-1e10f), 0xFC00);                          // overflow
  EXPECT_EQ(fp16_bits(std::numeric_limits<float>::max()), 0x7C00);
  EXPECT_EQ(fp16_bits(-std::numeric_limits<float>::infinity()), 0xFC00);
  EXPECT_EQ(fp16_bits(0x1p-24f), 0x0001);  // smallest subnormal
  EXPECT_EQ(fp16_bits(0x1p-25f), 0x0000);  // tie with 0: even
  EXPECT_EQ(fp16_bits(std::nextafter(0x1p-25f, 1.0f)), 0x0001);
  EXPECT_EQ(fp16_bits(3 * 0x1p-25f), 0x0002);        // tie: 1 or 2, even is 2
  EXPECT_EQ(fp16_bits(1023 * 0x1p-24f), 0x03FF);     // largest subnormal
  EXPECT_EQ(fp16_bits(1023.5f * 0x1p-24f), 0x0400);  // tie into the normals
  EXPECT_EQ(fp16_bits(0x1p-14f), 0x0400);            // smallest normal
  EXPECT_EQ(fp16_bits(-0.0f), 0x8000);
  EXPECT_EQ(fp16_bits(-3 * 0x1p-25f), 0x8002);
  EXPECT_EQ(fp16_bits(float_of(0x00000001)), 0x0000);  // float subnormals flush by rounding
  EXPECT_EQ(fp16_bits(float_of(0x80000001)), 0x8000);
}

TEST_P(WireCodecFp16, NanStaysNan) {
  EXPECT_EQ(fp16_bits(std::numeric_limits<float>::quiet_NaN()), 0x7E00);
  EXPECT_EQ(fp16_bits(-std::numeric_limits<float>::quiet_NaN()), 0xFE00);
  EXPECT_EQ(fp16_bits(float_of(0x7F800001)), 0x7E00);  // signalling, payload below fp16's bits
  EXPECT_EQ(fp16_bits(float_of(0xFF802000)), 0xFE01);  // payload kept where it fits
  EXPECT_EQ(fp16_bits(float_of(0x7FFFFFFF)), 0x7FFF);
  EXPECT_EQ(bits_of(fp16_value(0x7C01)), 0x7FC02000u);  // made quiet
  EXPECT_EQ(bits_of(fp16_value(0xFE00)), 0xFFC00000u);
}

// numpy's float32 -> float16 conversion (round to nearest even, IEEE overflow), or nothing.
std::optional<std::vector<uint16_t>> numpy_fp16(const std::vector<float>& inputs) {
  const std::string base = testing::TempDir() + "/wire_codec_fp16_" + std::to_string(getpid());
  const std::string in_path = base + "_in.bin", out_path = base + "_out.bin";
  {
    std::ofstream out(in_path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(inputs.data()),
              static_cast<std::streamsize>(inputs.size() * sizeof(float)));
  }
  const std::string command =
      "/usr/bin/python3 -c 'import sys, numpy as np\n"
      "a = np.fromfile(sys.argv[1], dtype=\"<f4\")\n"
      "with np.errstate(all=\"ignore\"): a.astype(\"<f2\").tofile(sys.argv[2])' " +
      in_path + " " + out_path + " 2>/dev/null";
  const int status = std::system(command.c_str());
  std::remove(in_path.c_str());
  std::ifstream in(out_path, std::ios::binary);
  std::vector<char> raw((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::remove(out_path.c_str());
  if (status != 0 || raw.size() != inputs.size() * 2) return std::nullopt;
  std::vector<uint16_t> out(inputs.size());
  std::memcpy(out.data(), raw.data(), raw.size());
  return out;
}

// Inputs: every tie point between adjacent halves and its two float neighbours, plus random
// bits and values. Computed once: the reference does not depend on the code path.
const std::vector<float>& numpy_inputs() {
  static const std::vector<float> inputs = [] {
    const std::vector<float> halves =
        decode_vec(Isa::kPortable, WirePrecision::fp16, all_16_bit_patterns(), 65536);
    std::vector<float> out;
    for (uint32_t h = 0; h < 0x7C00; ++h) {
      const double lo = halves[h];
      const double hi = h + 1 == 0x7C00 ? 65536.0 : halves[h + 1];
      const float mid = static_cast<float>((lo + hi) / 2);  // exact: 12 significant bits
      for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e30f)}) {
        out.push_back(f);
        out.push_back(-f);
      }
    }
    std::mt19937 rng(5);
    for (int i = 0; i < 100000; ++i) out.push_back(float_of(static_cast<uint32_t>(rng())));
    for (float f : mixed_floats(100000, 6)) out.push_back(f);
    return out;
  }();
  return inputs;
}

TEST_P(WireCodecFp16, MatchesNumpy) {
  static const std::optional<std::vector<uint16_t>> numpy = numpy_fp16(numpy_inputs());
  if (!numpy) GTEST_SKIP() << "python3 with numpy is not available";
  const std::vector<float>& inputs = numpy_inputs();
  const std::vector<std::byte> ours = enc(WirePrecision::fp16, inputs);
  size_t failures = 0;
  for (size_t i = 0; i < inputs.size() && failures < 10; ++i) {
    const uint16_t want = (*numpy)[i], got = u16_at(ours, i);
    const bool want_nan = (want & 0x7C00u) == 0x7C00u && (want & 0x03FFu) != 0;
    const bool got_nan = (got & 0x7C00u) == 0x7C00u && (got & 0x03FFu) != 0;
    const bool ok = want_nan ? got_nan && (got & 0x8000u) == (want & 0x8000u) : got == want;
    if (!ok) {
      ++failures;
      ADD_FAILURE() << std::hex << "float 0x" << bits_of(inputs[i]) << ": got 0x" << got
                    << ", numpy 0x" << want;
    }
  }
}

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

INSTANTIATE_TEST_SUITE_P(Paths, WireCodecPaths, testing::ValuesIn(available_isas()), isa_name);
INSTANTIATE_TEST_SUITE_P(Paths, WireCodecFp16, testing::ValuesIn(available_isas()), isa_name);
INSTANTIATE_TEST_SUITE_P(Paths, WireCodecBf16, testing::ValuesIn(available_isas()), isa_name);
INSTANTIATE_TEST_SUITE_P(Paths, WireCodecInt8, testing::ValuesIn(available_isas()), isa_name);

}  // namespace
}  // namespace starling::compress
