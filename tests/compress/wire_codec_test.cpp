// Wire codecs: exact formats, fp16's round to nearest even against numpy, NaN/inf handling, and
// agreement between the portable and the AVX2/F16C code paths (bf16 and int8 against exact
// references: wire_codec_bf16_int8_test.cpp).
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
#include "wire_codec_test_support.h"

namespace starling::compress {
namespace {

using namespace wire_codec_test;

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

INSTANTIATE_TEST_SUITE_P(Paths, WireCodecPaths, testing::ValuesIn(available_isas()), isa_name);
INSTANTIATE_TEST_SUITE_P(Paths, WireCodecFp16, testing::ValuesIn(available_isas()), isa_name);

}  // namespace
}  // namespace starling::compress
