// CRC-32C (Castagnoli) of message payloads. Uses the SSE4.2 crc32 instruction when the CPU has it
// (three interleaved streams: over 10 GB/s, so checksumming a tensor costs little beside sending
// it) and a table otherwise; both give the same value.
#pragma once

#include <cstddef>
#include <cstdint>

namespace starling::net {

uint32_t crc32c(const void* data, size_t size, uint32_t seed = 0);

}  // namespace starling::net
