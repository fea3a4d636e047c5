// The safetensors format: an 8-byte little-endian header length, a JSON header mapping each
// tensor name to {dtype, shape, data_offsets} (plus an optional "__metadata__" map of strings),
// then the raw little-endian tensor bytes. Used for checkpoints, weight import and the exchange
// with the python oracle.
#pragma once

#include <ATen/core/Tensor.h>

#include <filesystem>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace starling {

struct SafetensorsFile {
  // Tensors in the order of their data offsets (CPU, contiguous).
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  std::map<std::string, std::string> metadata;

  // The tensor of that name; CheckpointError naming `file` and the tensor if absent.
  const at::Tensor& at(const std::string& name) const;
  bool contains(const std::string& name) const;
  std::filesystem::path file;
};

// Writes tensors (moved to CPU, made contiguous) in the given order and fsyncs the file.
// Supported dtypes: F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL.
void write_safetensors(const std::filesystem::path& path,
                       const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

// Reads and validates a whole file. CheckpointError naming the file (and the tensor, where one is
// at fault) for: missing/short file, header length beyond the file, malformed JSON, unknown
// dtype, shape and offsets that disagree, offsets outside the data or overlapping.
SafetensorsFile read_safetensors(const std::filesystem::path& path);

}  // namespace starling
