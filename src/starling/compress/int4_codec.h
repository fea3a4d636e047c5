// int4: the pipeline's coarsest quantization of a float32 tensor, for activations and their
// gradients on links too slow for int8 (ada_topk.h's tiers). Every entry is kept, at an eighth of
// its bytes plus a scale per group, so it drops nothing the way top-k does.
//
// Format (little-endian): groups of kInt4Group = 64 consecutive elements (the last may be
// shorter), each a 4-byte fp32 scale followed by ceil(n / 2) bytes of 4-bit codes, element 2i in
// the low half of byte i and 2i + 1 in the high half, groups back to back (group g starts at byte
// g * kInt4GroupBytes). The scale is absmax / 7 (fp32 division); the code is q + 8 where q = x /
// scale (fp32 division) rounded to nearest, ties to even, within [-7, 7]; decoding is (code - 8)
// * scale in fp32. So |x - decoded| <= scale / 2, up to fp32 rounding. As int8's groups
// (wire_codec.h): a group holding a NaN or an infinity has a NaN scale and decodes to NaN; a group
// whose absmax is below kInt8MinAbsMax has scale 0 and decodes to +0. An odd group's unused high
// half is 0. Deterministic: plain fp32 arithmetic in the default rounding mode, no FMA contraction
// of the scale's division or the decoding's product. Torch-free.
#pragma once

#include <cstddef>

namespace starling::compress {

inline constexpr size_t kInt4Group = 64;
inline constexpr size_t kInt4GroupBytes = sizeof(float) + kInt4Group / 2;

// The exact size of encode_int4's output for `count` floats.
size_t int4_encoded_bytes(size_t count);

// Encodes src[0, count) into dst[0, int4_encoded_bytes(count)); buffers must not overlap.
void encode_int4(const float* src, size_t count, std::byte* dst);
// dst[i] = decoded value i. Any bytes decode; check message lengths before calling.
void decode_int4(const std::byte* src, size_t count, float* dst);

}  // namespace starling::compress
