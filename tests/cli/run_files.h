// Reading what a run wrote, for end-to-end tests that compare runs byte for byte.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace starling::testing {

inline std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The length of a safetensors file's JSON header (its first 8 bytes, little-endian), 0 for a
// file too short to hold one.
inline uint64_t safetensors_header_length(const std::string& file) {
  if (file.size() < 8) return 0;
  uint64_t header = 0;
  for (int i = 0; i < 8; ++i)
    header |= static_cast<uint64_t>(static_cast<unsigned char>(file[i])) << (8 * i);
  return header;
}

// Byte offset in a safetensors file where the "rng.cpu" tensor's data begins (0 if absent).
// libtorch's CPU generator state serialises a struct with uninitialised padding, so two
// optimizer.safetensors files are compared only up to there.
inline size_t rng_data_start(const std::string& file) {
  const uint64_t header = safetensors_header_length(file);
  if (header == 0) return 0;
  const std::string key = "\"rng.cpu\":{\"dtype\":\"U8\",\"shape\":[";
  const size_t at = file.find(key);
  if (at == std::string::npos || at > 8 + header) return 0;
  const size_t offsets = file.find("\"data_offsets\":[", at);
  return 8 + header + std::stoull(file.substr(offsets + 16));
}

}  // namespace starling::testing
