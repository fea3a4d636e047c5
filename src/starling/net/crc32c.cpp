#include "starling/net/crc32c.h"

#include <array>
#include <cstring>

namespace starling::net {
namespace {

constexpr uint32_t kPolynomial = 0x82F63B78u;  // reflected Castagnoli

constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ kPolynomial : c >> 1;
    table[i] = c;
  }
  return table;
}

constexpr std::array<uint32_t, 256> kTable = make_table();

uint32_t crc_portable(const unsigned char* p, size_t n, uint32_t crc) {
  for (size_t i = 0; i < n; ++i) crc = kTable[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc_sse42_one_stream(const unsigned char* p, size_t n,
                                                                uint32_t crc) {
  uint64_t c = crc;
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = __builtin_ia32_crc32di(c, word);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n > 0) {
    c32 = __builtin_ia32_crc32qi(c32, *p);
    ++p;
    --n;
  }
  return c32;
}

// One crc32 instruction has a latency of 3 cycles but a throughput of 1 per cycle, so a single
// stream runs at a third of the instruction's speed. Three streams over consecutive blocks of
// kBlock bytes run at full speed; the block CRCs are then joined: the CRC register of A||B is
// the register after A, advanced over |B| zero bytes, xor the register of B alone (from 0).
// Advancing over kBlock zero bytes is linear in the register, so it is four table lookups.
constexpr size_t kBlock = 4096;

struct ZeroShift {
  uint32_t table[4][256];
  __attribute__((target("sse4.2"))) ZeroShift() {
    static const unsigned char zeros[kBlock] = {};
    uint32_t basis[32];
    for (int bit = 0; bit < 32; ++bit) basis[bit] = crc_sse42_one_stream(zeros, kBlock, 1u << bit);
    for (int k = 0; k < 4; ++k)
      for (uint32_t b = 0; b < 256; ++b) {
        uint32_t out = 0;
        for (int bit = 0; bit < 8; ++bit)
          if (b & (1u << bit)) out ^= basis[8 * k + bit];
        table[k][b] = out;
      }
  }
  uint32_t operator()(uint32_t c) const {
    return table[0][c & 0xFF] ^ table[1][(c >> 8) & 0xFF] ^ table[2][(c >> 16) & 0xFF] ^
           table[3][c >> 24];
  }
};

__attribute__((target("sse4.2"))) uint32_t crc_sse42(const unsigned char* p, size_t n,
                                                     uint32_t crc) {
  static const ZeroShift shift;
  while (n >= 3 * kBlock) {
    uint64_t a = crc, b = 0, c = 0;
    for (size_t i = 0; i < kBlock; i += 8) {
      uint64_t wa, wb, wc;
      std::memcpy(&wa, p + i, 8);
      std::memcpy(&wb, p + kBlock + i, 8);
      std::memcpy(&wc, p + 2 * kBlock + i, 8);
      a = __builtin_ia32_crc32di(a, wa);
      b = __builtin_ia32_crc32di(b, wb);
      c = __builtin_ia32_crc32di(c, wc);
    }
    crc = shift(shift(static_cast<uint32_t>(a)) ^ static_cast<uint32_t>(b)) ^
          static_cast<uint32_t>(c);
    p += 3 * kBlock;
    n -= 3 * kBlock;
  }
  return crc_sse42_one_stream(p, n, crc);
}
#endif

}  // namespace

uint32_t crc32c(const void* data, size_t size, uint32_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t crc = ~seed;
#if defined(__x86_64__)
  static const bool has_sse42 = __builtin_cpu_supports("sse4.2");
  crc = has_sse42 ? crc_sse42(p, size, crc) : crc_portable(p, size, crc);
#else
  crc = crc_portable(p, size, crc);
#endif
  return ~crc;
}

}  // namespace starling::net
