// Whether a run of floats is all finite: the check that rejects a poisoned update, on the ring's
// every chunk (net/) and on a peer's own update before it leaves (strategy/). Header-only and
// torch-free, so both sides share it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace starling {

// Whether all of data[0, n) are finite.
inline bool all_finite(const float* data, size_t n) {
  // Infinities and NaNs have every exponent bit set: an integer test per element, OR-ed without
  // branches, which the compiler vectorizes (a float sum would be kept in order, unvectorized).
  uint32_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, data + i, sizeof bits);
    bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return bad == 0;
}

}  // namespace starling
