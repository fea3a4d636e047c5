// Wire precisions: how collectives put float32 tensors on the network. A collective encodes each
// message chunk on its own (no state between chunks, no alignment assumptions), sends the bytes,
// and the receiver decodes them or adds them into an fp32 accumulator.
//
// Formats (all little-endian; `count` floats in, `encoded_bytes(p, count)` bytes out):
//   fp32  the floats' own bytes, bit for bit (NaN payloads included).
//   fp16  IEEE binary16, 2 bytes each. Round to nearest, ties to even; magnitudes that round past
//         65504 become +-inf and subnormal halves are produced (no flush to zero), exactly as
//         IEEE conversion does. NaN stays NaN with its sign: the result is a quiet NaN carrying the
//         top 9 payload bits (what x86 F16C's vcvtps2ph writes). Decoding is exact; NaN halves
//         decode to quiet NaNs (as vcvtph2ps does).
//   bf16  the top 16 bits of the float, 2 bytes each. Round to nearest, ties to even; values past
//         the largest bf16 round to +-inf. A NaN stays a NaN with its sign (it is made quiet and
//         is never rounded into inf). Decoding is exact (the bits shifted back).
//   int8  symmetric quantization in groups of kInt8Group = 256 consecutive elements (the last
//         group may be shorter). Each group is a 4-byte fp32 scale followed by one int8 per
//         element, groups back to back, so group g starts at byte g * kInt8GroupBytes:
//           [scale 0][q 0..255] [scale 1][q 256..511] ... [scale k][q 256k..count-1]
//         The scale is absmax / 127 (fp32 division); q = x / scale (fp32 division) rounded to
//         nearest, ties to even, always within [-127, 127]; decoding is q * scale in fp32. So
//         |x - decoded| <= scale / 2, up to the fp32 rounding of that division and product.
//         Special groups:
//           - a group holding a NaN or +-inf has a NaN scale and all q = 0, so the whole group
//             decodes to NaN: a blow-up on one peer is visible, never silently clipped;
//           - a group whose absmax is below kInt8MinAbsMax (2^-102; all-zero groups included)
//             has scale 0 and decodes to +0. Such values carry no training signal, and the
//             cut-off keeps every scale a normal float (see Determinism).
//
// Determinism: the same input gives byte-identical output on every machine and on every code path
// (the portable one and the x86 AVX2/F16C one are bit-identical; tests check it), whatever the
// build flags (no fused multiply-add, no fast-math) and whatever the calling thread's
// flush-to-zero / denormals-are-zero setting (encode and decode never produce or consume a float
// subnormal in a way that mode could change). It needs the default IEEE rounding mode (round to
// nearest even), which Starling never changes. decode_add(p) is exactly decode(p) followed by an
// elementwise fp32 add; that add, like any, follows the thread's FTZ setting.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace starling::compress {

// The numeric value is what goes into message headers; never renumber.
enum class WirePrecision : uint8_t { fp32 = 0, fp16 = 1, bf16 = 2, int8 = 3 };

inline constexpr size_t kInt8Group = 256;
inline constexpr size_t kInt8GroupBytes = sizeof(float) + kInt8Group;
// Groups whose largest magnitude is below this (2^-102) encode as zero.
inline constexpr float kInt8MinAbsMax = 0x1p-102f;

// "fp32", "fp16", "bf16", "int8".
std::string_view to_string(WirePrecision p);
// The inverse of to_string (exact, lower case); nullopt for anything else.
std::optional<WirePrecision> parse_wire_precision(std::string_view name);
// The precision a header byte names; nullopt for an unknown value (validate untrusted headers).
std::optional<WirePrecision> wire_precision_from_byte(uint8_t byte);

// The exact size of encode()'s output for `count` floats.
size_t encoded_bytes(WirePrecision p, size_t count);

// Encodes src[0, count) into dst[0, encoded_bytes(p, count)). Buffers must not overlap; no
// alignment is required. count may be 0 (pointers may then be null). Like encoded_bytes (which
// also rejects a count whose size overflows size_t), these throw starling::Error only for misuse:
// a WirePrecision value outside the enum (use wire_precision_from_byte on untrusted bytes).
void encode(WirePrecision p, const float* src, size_t count, std::byte* dst);
// dst[i] = decoded value i, reading src[0, encoded_bytes(p, count)). Any bytes decode (to the same
// floats everywhere); nothing in them is validated, so check message lengths before calling.
void decode(WirePrecision p, const std::byte* src, size_t count, float* dst);
// acc[i] += decoded value i, in fp32 (equal to decode() followed by acc[i] + decoded[i]).
void decode_add(WirePrecision p, const std::byte* src, size_t count, float* acc);

// The individual code paths, for tests and benchmarks; the functions above pick the best one the
// CPU supports.
namespace wire_codec_detail {

enum class Isa : uint8_t {
  kPortable,  // baseline x86-64 (SSE2) or any other CPU; loops the compiler vectorizes
  kAvx2F16c,  // x86 with AVX2 and F16C (hardware fp16 conversion, 256-bit loops)
};

bool isa_available(Isa isa);
Isa best_isa();
std::string_view to_string(Isa isa);

// Throws starling::Error if `isa` is not available on this CPU.
void encode(Isa isa, WirePrecision p, const float* src, size_t count, std::byte* dst);
void decode(Isa isa, WirePrecision p, const std::byte* src, size_t count, float* dst);
void decode_add(Isa isa, WirePrecision p, const std::byte* src, size_t count, float* acc);

}  // namespace wire_codec_detail

}  // namespace starling::compress
