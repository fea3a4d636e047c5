// Wire codecs. Every kernel is written once as an always-inline body of plain integer and IEEE
// float operations and instantiated twice: for the baseline target (SSE2 on x86-64) and, on x86,
// for AVX2 (+F16C for the fp16 conversions). Elementwise IEEE operations and an integer max give
// the same bits whatever the vector width, so both instantiations agree bit for bit.
//
// The loops run over fixed-size blocks with a separate tail so that GCC vectorizes them even at
// -O2 (whose "very cheap" cost model refuses loops that would need a runtime trip-count epilogue).
#include "starling/compress/wire_codec.h"

#include <bit>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>

#include "starling/common/error.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define STARLING_WIRE_CODEC_X86 1
#endif

// decode_add(int8) computes acc + q * scale; contracting that into a fused multiply-add (which
// GCC does by default in GNU mode whenever the target has FMA, e.g. under -march=native) would
// round once instead of twice and break "decode_add == decode, then add" as well as agreement
// between builds. Contraction is the only thing that could make a build differ, so turn it off.
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#define STARLING_ALWAYS_INLINE inline __attribute__((always_inline))

namespace starling::compress {
namespace {

static_assert(std::endian::native == std::endian::little,
              "wire buffers are little-endian; a big-endian host needs byte swaps here");
static_assert(std::numeric_limits<float>::is_iec559);

using wire_codec_detail::Isa;

// Iterations per block of the vectorized main loops (a compile-time trip count).
constexpr size_t kBlock = 64;

constexpr uint32_t kInt8NanScaleBits = 0x7FC00000u;  // positive quiet NaN
constexpr uint32_t kInt8MinAbsMaxBits = std::bit_cast<uint32_t>(kInt8MinAbsMax);
static_assert(kInt8MinAbsMaxBits == (127u - 102u) << 23);

// --- unaligned little-endian loads and stores ---------------------------------------------------

STARLING_ALWAYS_INLINE uint16_t load_u16(const std::byte* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
STARLING_ALWAYS_INLINE void store_u16(std::byte* p, uint16_t v) { std::memcpy(p, &v, sizeof v); }
STARLING_ALWAYS_INLINE float load_f32(const std::byte* p) {
  float v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
STARLING_ALWAYS_INLINE void store_f32(std::byte* p, float v) { std::memcpy(p, &v, sizeof v); }

// --- scalar conversions (written branch-free so the loops around them vectorize) ---------------

// c ? a : b as mask arithmetic. A plain ?: lets GCC sink the float addition of the unused arm
// into a branch, and then -ftrapping-math (the default) forbids if-converting it back, so the
// loop would not vectorize.
STARLING_ALWAYS_INLINE uint32_t select_bits(bool c, uint32_t a, uint32_t b) {
  const uint32_t mask = 0u - static_cast<uint32_t>(c);
  return (a & mask) | (b & ~mask);
}

// float -> binary16, round to nearest even. After F. Giesen's float_to_half_fast3_rtne.
STARLING_ALWAYS_INLINE uint16_t fp16_from_float(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const uint32_t abs = bits & 0x7FFFFFFFu;
  // Normal halves (|f| >= 2^-14): rebias the exponent (-112 << 23, modulo 2^32) and round the
  // 13 dropped bits to nearest even by adding 0xFFF plus the lowest kept bit; a carry out of
  // the mantissa bumps the exponent, which also takes [65520, 65536) to inf (0x7C00).
  const uint32_t normal = (abs + 0xC8000FFFu + ((abs >> 13) & 1u)) >> 13;
  // Subnormal halves (|f| < 2^-14): adding 0.5 puts the unit of 2^-24 (the smallest subnormal)
  // at the last mantissa bit of the sum, so the FPU's own round-to-nearest-even does the
  // rounding; the sum's low bits are the result. Inputs below 2^-25 (float subnormals included)
  // give 0 whether or not the FPU flushes them.
  const uint32_t subnormal =
      std::bit_cast<uint32_t>(std::bit_cast<float>(abs) + 0.5f) - 0x3F000000u;
  // Signed compares: abs < 2^31, and SSE2 has no unsigned 32-bit compare.
  const int32_t sabs = static_cast<int32_t>(abs);
  // Inf stays inf; NaN becomes a quiet NaN keeping its top payload bits (as vcvtps2ph does).
  const uint32_t special = sabs > 0x7F800000 ? (0x7E00u | ((abs >> 13) & 0x3FFu)) : 0x7C00u;
  uint32_t result = select_bits(sabs < 0x38800000, subnormal, normal);
  result = select_bits(sabs >= 0x47800000, special, result);
  return static_cast<uint16_t>(result | sign);
}

// binary16 -> float (exact). After F. Giesen's half_to_float.
STARLING_ALWAYS_INLINE float float_from_fp16(uint16_t h) {
  const uint32_t shifted = (static_cast<uint32_t>(h) & 0x7FFFu) << 13;  // exponent and mantissa
  const uint32_t exponent = shifted & 0x0F800000u;
  const uint32_t normal = shifted + 0x38000000u;  // rebias 15 -> 127
  // Inf/NaN: exponent all ones. NaNs come out quiet (bit 22 set), as vcvtph2ps writes them.
  const uint32_t special = (normal + 0x38000000u) | (shifted > 0x0F800000u ? 0x00400000u : 0u);
  // Zero/subnormal: build 2^-14 * (1 + m/1024) and subtract 2^-14, which is exact and normal.
  const uint32_t subnormal =
      std::bit_cast<uint32_t>(std::bit_cast<float>(normal + 0x00800000u) - 0x1p-14f);
  const uint32_t sign = (static_cast<uint32_t>(h) & 0x8000u) << 16;
  uint32_t result = select_bits(exponent == 0, subnormal, normal);
  result = select_bits(exponent == 0x0F800000u, special, result);
  return std::bit_cast<float>(result | sign);
}

// float -> bfloat16, round to nearest even. A NaN is made quiet instead of rounded: rounding
// would turn a NaN whose payload sits only in the dropped bits into inf, and could carry a
// full payload into the sign bit.
STARLING_ALWAYS_INLINE uint16_t bf16_from_float(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint32_t rounded = (bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16;
  const uint32_t quiet_nan = (bits >> 16) | 0x0040u;
  const bool is_nan = static_cast<int32_t>(bits & 0x7FFFFFFFu) > 0x7F800000;
  return static_cast<uint16_t>(is_nan ? quiet_nan : rounded);
}

STARLING_ALWAYS_INLINE float float_from_bf16(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

// --- fp32 ----------------------------------------------------------------------------------------

void encode_fp32(const float* src, size_t n, std::byte* dst) {
  if (n != 0) std::memcpy(dst, src, n * sizeof(float));
}

void decode_fp32(const std::byte* src, size_t n, float* dst) {
  if (n != 0) std::memcpy(dst, src, n * sizeof(float));
}

STARLING_ALWAYS_INLINE void decode_add_fp32_body(const std::byte* __restrict src, size_t n,
                                                 float* __restrict acc) {
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    for (size_t j = 0; j < kBlock; ++j) acc[i + j] += load_f32(src + 4 * (i + j));
  }
  for (; i < n; ++i) acc[i] += load_f32(src + 4 * i);
}

// --- fp16 / bf16 bodies --------------------------------------------------------------------------

// One body per direction; Convert is fp16_from_float / bf16_from_float and the inverses.
template <uint16_t (*Convert)(float)>
STARLING_ALWAYS_INLINE void encode_16_body(const float* __restrict src, size_t n,
                                           std::byte* __restrict dst) {
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    for (size_t j = 0; j < kBlock; ++j) store_u16(dst + 2 * (i + j), Convert(src[i + j]));
  }
  for (; i < n; ++i) store_u16(dst + 2 * i, Convert(src[i]));
}

template <float (*Convert)(uint16_t)>
STARLING_ALWAYS_INLINE void decode_16_body(const std::byte* __restrict src, size_t n,
                                           float* __restrict dst) {
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    for (size_t j = 0; j < kBlock; ++j) dst[i + j] = Convert(load_u16(src + 2 * (i + j)));
  }
  for (; i < n; ++i) dst[i] = Convert(load_u16(src + 2 * i));
}

template <float (*Convert)(uint16_t)>
STARLING_ALWAYS_INLINE void decode_add_16_body(const std::byte* __restrict src, size_t n,
                                               float* __restrict acc) {
  size_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    for (size_t j = 0; j < kBlock; ++j) acc[i + j] += Convert(load_u16(src + 2 * (i + j)));
  }
  for (; i < n; ++i) acc[i] += Convert(load_u16(src + 2 * i));
}

// --- int8 bodies ---------------------------------------------------------------------------------

// One group of n <= kInt8Group elements. kFull makes n the compile-time constant kInt8Group so
// the loops vectorize at -O2; the short last group takes the generic instantiation.
template <bool kFull>
STARLING_ALWAYS_INLINE void encode_int8_group(const float* __restrict src, size_t n,
                                              std::byte* __restrict dst) {
  if constexpr (kFull) n = kInt8Group;
  // absmax on the bit patterns: for non-negative floats integer order is numeric order, inf and
  // NaN sort above every finite value, and an integer max does not depend on evaluation order.
  // Full groups keep kMaxLanes running maxima: independent chains the vectorizer maps onto
  // several registers (one chain of SSE2's emulated max is latency-bound).
  constexpr size_t kMaxLanes = 16;
  int32_t max_bits = 0;
  if constexpr (kFull) {
    int32_t lanes[kMaxLanes] = {};
    for (size_t i = 0; i < kInt8Group; i += kMaxLanes) {
      for (size_t k = 0; k < kMaxLanes; ++k) {
        const int32_t a = static_cast<int32_t>(std::bit_cast<uint32_t>(src[i + k]) & 0x7FFFFFFFu);
        lanes[k] = a > lanes[k] ? a : lanes[k];
      }
    }
    for (size_t k = 0; k < kMaxLanes; ++k) max_bits = lanes[k] > max_bits ? lanes[k] : max_bits;
  } else {
    for (size_t i = 0; i < n; ++i) {
      const int32_t a = static_cast<int32_t>(std::bit_cast<uint32_t>(src[i]) & 0x7FFFFFFFu);
      max_bits = a > max_bits ? a : max_bits;
    }
  }
  std::byte* values = dst + sizeof(float);
  if (max_bits >= 0x7F800000 || max_bits < static_cast<int32_t>(kInt8MinAbsMaxBits)) {
    const uint32_t scale_bits = max_bits >= 0x7F800000 ? kInt8NanScaleBits : 0u;
    std::memcpy(dst, &scale_bits, sizeof scale_bits);
    std::memset(values, 0, n);
    return;
  }
  const float scale = std::bit_cast<float>(max_bits) / 127.0f;
  store_f32(dst, scale);
  // Adding 1.5 * 2^23 rounds x / scale to an integer with the FPU's round-to-nearest-even and
  // leaves that integer in the low mantissa bits (two's complement relative to the constant's
  // bits). No clamp is needed: scale is absmax / 127 rounded, at most 2^-24 relatively below it,
  // so |x / scale| <= 127 * (1 + 2^-23) and rounds to at most 127.
  constexpr float kRoundMagic = 0x1.8p23f;
  constexpr int32_t kRoundMagicBits = static_cast<int32_t>(std::bit_cast<uint32_t>(kRoundMagic));
  for (size_t i = 0; i < n; ++i) {
    const float r = src[i] / scale + kRoundMagic;
    const int32_t q = static_cast<int32_t>(std::bit_cast<uint32_t>(r)) - kRoundMagicBits;
    values[i] = static_cast<std::byte>(static_cast<int8_t>(q));
  }
}

STARLING_ALWAYS_INLINE void encode_int8_body(const float* __restrict src, size_t n,
                                             std::byte* __restrict dst) {
  const size_t full = n / kInt8Group;
  for (size_t g = 0; g < full; ++g) {
    encode_int8_group<true>(src + g * kInt8Group, kInt8Group, dst + g * kInt8GroupBytes);
  }
  if (const size_t rest = n % kInt8Group; rest != 0) {
    encode_int8_group<false>(src + full * kInt8Group, rest, dst + full * kInt8GroupBytes);
  }
}

template <bool kFull, bool kAdd>
STARLING_ALWAYS_INLINE void decode_int8_group(const std::byte* __restrict src, size_t n,
                                              float* __restrict dst) {
  if constexpr (kFull) n = kInt8Group;
  const float scale = load_f32(src);
  const std::byte* values = src + sizeof(float);
  for (size_t i = 0; i < n; ++i) {
    const float decoded = static_cast<float>(static_cast<int8_t>(values[i])) * scale;
    if constexpr (kAdd) {
      dst[i] += decoded;
    } else {
      dst[i] = decoded;
    }
  }
}

template <bool kAdd>
STARLING_ALWAYS_INLINE void decode_int8_body(const std::byte* __restrict src, size_t n,
                                             float* __restrict dst) {
  const size_t full = n / kInt8Group;
  for (size_t g = 0; g < full; ++g) {
    decode_int8_group<true, kAdd>(src + g * kInt8GroupBytes, kInt8Group, dst + g * kInt8Group);
  }
  if (const size_t rest = n % kInt8Group; rest != 0) {
    decode_int8_group<false, kAdd>(src + full * kInt8GroupBytes, rest, dst + full * kInt8Group);
  }
}

// --- instantiations ------------------------------------------------------------------------------

using EncodeFn = void (*)(const float*, size_t, std::byte*);
using DecodeFn = void (*)(const std::byte*, size_t, float*);

// Indexed by WirePrecision.
struct Kernels {
  EncodeFn encode[4];
  DecodeFn decode[4];
  DecodeFn decode_add[4];
};

// Defines the kernels that are plain bodies, for the target ATTR names (none: the baseline).
#define STARLING_DEFINE_KERNELS(SUFFIX, ATTR)                                      \
  ATTR void decode_add_fp32_##SUFFIX(const std::byte* src, size_t n, float* acc) { \
    decode_add_fp32_body(src, n, acc);                                             \
  }                                                                                \
  ATTR void encode_bf16_##SUFFIX(const float* src, size_t n, std::byte* dst) {     \
    encode_16_body<bf16_from_float>(src, n, dst);                                  \
  }                                                                                \
  ATTR void decode_bf16_##SUFFIX(const std::byte* src, size_t n, float* dst) {     \
    decode_16_body<float_from_bf16>(src, n, dst);                                  \
  }                                                                                \
  ATTR void decode_add_bf16_##SUFFIX(const std::byte* src, size_t n, float* acc) { \
    decode_add_16_body<float_from_bf16>(src, n, acc);                              \
  }                                                                                \
  ATTR void encode_int8_##SUFFIX(const float* src, size_t n, std::byte* dst) {     \
    encode_int8_body(src, n, dst);                                                 \
  }                                                                                \
  ATTR void decode_int8_##SUFFIX(const std::byte* src, size_t n, float* dst) {     \
    decode_int8_body<false>(src, n, dst);                                          \
  }                                                                                \
  ATTR void decode_add_int8_##SUFFIX(const std::byte* src, size_t n, float* acc) { \
    decode_int8_body<true>(src, n, acc);                                           \
  }

STARLING_DEFINE_KERNELS(portable, )

void encode_fp16_portable(const float* src, size_t n, std::byte* dst) {
  encode_16_body<fp16_from_float>(src, n, dst);
}
void decode_fp16_portable(const std::byte* src, size_t n, float* dst) {
  decode_16_body<float_from_fp16>(src, n, dst);
}
void decode_add_fp16_portable(const std::byte* src, size_t n, float* acc) {
  decode_add_16_body<float_from_fp16>(src, n, acc);
}

constexpr Kernels kPortableKernels = {
    {encode_fp32, encode_fp16_portable, encode_bf16_portable, encode_int8_portable},
    {decode_fp32, decode_fp16_portable, decode_bf16_portable, decode_int8_portable},
    {decode_add_fp32_portable, decode_add_fp16_portable, decode_add_bf16_portable,
     decode_add_int8_portable},
};

#if defined(STARLING_WIRE_CODEC_X86)
// No "fma" here: without it the compiler cannot fuse, whatever the pragma above does.
#define STARLING_AVX2 __attribute__((target("avx2,f16c")))

STARLING_DEFINE_KERNELS(avx2, STARLING_AVX2)

// vcvtps2ph with an immediate rounding mode (round to nearest even, whatever MXCSR says) and
// vcvtph2ps: the hardware conversions, bit-identical to fp16_from_float / float_from_fp16.
STARLING_AVX2 void encode_fp16_avx2(const float* src, size_t n, std::byte* dst) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i), h);
  }
  for (; i < n; ++i) store_u16(dst + 2 * i, fp16_from_float(src[i]));
}

STARLING_AVX2 void decode_fp16_avx2(const std::byte* src, size_t n, float* dst) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(h));
  }
  for (; i < n; ++i) dst[i] = float_from_fp16(load_u16(src + 2 * i));
}

STARLING_AVX2 void decode_add_fp16_avx2(const std::byte* src, size_t n, float* acc) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 2 * i));
    _mm256_storeu_ps(acc + i, _mm256_add_ps(_mm256_loadu_ps(acc + i), _mm256_cvtph_ps(h)));
  }
  for (; i < n; ++i) acc[i] += float_from_fp16(load_u16(src + 2 * i));
}

constexpr Kernels kAvx2Kernels = {
    {encode_fp32, encode_fp16_avx2, encode_bf16_avx2, encode_int8_avx2},
    {decode_fp32, decode_fp16_avx2, decode_bf16_avx2, decode_int8_avx2},
    {decode_add_fp32_avx2, decode_add_fp16_avx2, decode_add_bf16_avx2, decode_add_int8_avx2},
};
#endif

#undef STARLING_DEFINE_KERNELS

bool cpu_has_avx2_f16c() {
#if defined(STARLING_WIRE_CODEC_X86)
  // F16C from CPUID directly: not every compiler's __builtin_cpu_supports knows it. The AVX2 check
  // also covers the OS saving the ymm registers.
  static const bool has = [] {
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
    return f16c && __builtin_cpu_supports("avx2");
  }();
  return has;
#else
  return false;
#endif
}

const Kernels& kernels_for(Isa isa) {
  if (!wire_codec_detail::isa_available(isa)) {
    throw Error("wire codec: code path " + std::string(wire_codec_detail::to_string(isa)) +
                " is not available on this CPU");
  }
#if defined(STARLING_WIRE_CODEC_X86)
  if (isa == Isa::kAvx2F16c) return kAvx2Kernels;
#endif
  return kPortableKernels;
}

size_t index_of(WirePrecision p) {
  const auto index = static_cast<size_t>(p);
  if (index > static_cast<size_t>(WirePrecision::int8)) {
    throw Error("wire codec: invalid WirePrecision value " + std::to_string(index));
  }
  return index;
}

const Kernels& best_kernels() {
  static const Kernels& best = kernels_for(wire_codec_detail::best_isa());
  return best;
}

}  // namespace

std::string_view to_string(WirePrecision p) {
  switch (p) {
    case WirePrecision::fp32:
      return "fp32";
    case WirePrecision::fp16:
      return "fp16";
    case WirePrecision::bf16:
      return "bf16";
    case WirePrecision::int8:
      return "int8";
  }
  return "invalid";
}

std::optional<WirePrecision> parse_wire_precision(std::string_view name) {
  for (WirePrecision p :
       {WirePrecision::fp32, WirePrecision::fp16, WirePrecision::bf16, WirePrecision::int8}) {
    if (name == to_string(p)) return p;
  }
  return std::nullopt;
}

std::optional<WirePrecision> wire_precision_from_byte(uint8_t byte) {
  if (byte > static_cast<uint8_t>(WirePrecision::int8)) return std::nullopt;
  return static_cast<WirePrecision>(byte);
}

size_t encoded_bytes(WirePrecision p, size_t count) {
  // Larger counts cannot describe memory that exists; reject them before the products wrap.
  if (count > SIZE_MAX / sizeof(float)) {
    throw Error("wire codec: element count " + std::to_string(count) + " is too large");
  }
  switch (p) {
    case WirePrecision::fp32:
      return count * sizeof(float);
    case WirePrecision::fp16:
    case WirePrecision::bf16:
      return count * sizeof(uint16_t);
    case WirePrecision::int8:
      return count + (count + kInt8Group - 1) / kInt8Group * sizeof(float);
  }
  index_of(p);  // throws
  return 0;
}

void encode(WirePrecision p, const float* src, size_t count, std::byte* dst) {
  best_kernels().encode[index_of(p)](src, count, dst);
}

void decode(WirePrecision p, const std::byte* src, size_t count, float* dst) {
  best_kernels().decode[index_of(p)](src, count, dst);
}

void decode_add(WirePrecision p, const std::byte* src, size_t count, float* acc) {
  best_kernels().decode_add[index_of(p)](src, count, acc);
}

namespace wire_codec_detail {

bool isa_available(Isa isa) {
  switch (isa) {
    case Isa::kPortable:
      return true;
    case Isa::kAvx2F16c:
      return cpu_has_avx2_f16c();
  }
  return false;
}

Isa best_isa() { return cpu_has_avx2_f16c() ? Isa::kAvx2F16c : Isa::kPortable; }

std::string_view to_string(Isa isa) {
  switch (isa) {
    case Isa::kPortable:
      return "portable";
    case Isa::kAvx2F16c:
      return "avx2-f16c";
  }
  return "invalid";
}

void encode(Isa isa, WirePrecision p, const float* src, size_t count, std::byte* dst) {
  kernels_for(isa).encode[index_of(p)](src, count, dst);
}

void decode(Isa isa, WirePrecision p, const std::byte* src, size_t count, float* dst) {
  kernels_for(isa).decode[index_of(p)](src, count, dst);
}

void decode_add(Isa isa, WirePrecision p, const std::byte* src, size_t count, float* acc) {
  kernels_for(isa).decode_add[index_of(p)](src, count, acc);
}

}  // namespace wire_codec_detail

}  // namespace starling::compress
