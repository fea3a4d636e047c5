#include "starling/compress/int4_codec.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "starling/compress/wire_codec.h"

namespace starling::compress {

size_t int4_encoded_bytes(size_t count) {
  const size_t full = count / kInt4Group, rest = count % kInt4Group;
  return full * kInt4GroupBytes + (rest == 0 ? 0 : sizeof(float) + (rest + 1) / 2);
}

void encode_int4(const float* src, size_t count, std::byte* dst) {
  for (size_t g = 0; g < count; g += kInt4Group) {
    const size_t n = std::min(kInt4Group, count - g);
    const float* x = src + g;
    float absmax = 0;
    bool finite = true;
    for (size_t i = 0; i < n; ++i) {
      finite = finite && std::isfinite(x[i]);
      absmax = std::max(absmax, std::fabs(x[i]));
    }
    float scale = 0;
    if (!finite)
      scale = std::numeric_limits<float>::quiet_NaN();
    else if (absmax >= kInt8MinAbsMax)
      scale = absmax / 7.0f;
    std::memcpy(dst, &scale, sizeof scale);
    std::byte* codes = dst + sizeof scale;
    std::memset(codes, 0, (n + 1) / 2);
    for (size_t i = 0; i < n; ++i) {
      int q = 0;
      if (finite && scale > 0) {
        const float r = std::nearbyint(x[i] / scale);
        q = static_cast<int>(std::clamp(r, -7.0f, 7.0f));
      }
      const auto code = static_cast<uint8_t>(q + 8);
      codes[i / 2] |= static_cast<std::byte>(i % 2 == 0 ? code : code << 4);
    }
    dst = codes + (n + 1) / 2;
  }
}

void decode_int4(const std::byte* src, size_t count, float* dst) {
  for (size_t g = 0; g < count; g += kInt4Group) {
    const size_t n = std::min(kInt4Group, count - g);
    float scale;
    std::memcpy(&scale, src, sizeof scale);
    const auto* codes = reinterpret_cast<const uint8_t*>(src + sizeof scale);
    for (size_t i = 0; i < n; ++i) {
      const int code = i % 2 == 0 ? codes[i / 2] & 0x0f : codes[i / 2] >> 4;
      dst[g + i] = static_cast<float>(code - 8) * scale;
    }
    src += sizeof scale + (n + 1) / 2;
  }
}

}  // namespace starling::compress
