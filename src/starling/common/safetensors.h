// The safetensors format: an 8-byte little-endian header length, a JSON header mapping each
// tensor name to {dtype, shape, data_offsets} (plus an optional "__metadata__" map of strings),
// then the raw little-endian tensor bytes. Used for checkpoints, weight import and the exchange
// with the python oracle.
#pragma once

#include <ATen/core/Tensor.h>

#include <filesystem>
#include <functional>
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

// How write_safetensors reads a tensor's values just before writing them: the identity by
// default. A caller whose tensors keep their bytes elsewhere (a swapping runner's tier) returns a
// readable tensor of the same shape and dtype, so only one is held at a time.
using TensorReader = std::function<at::Tensor(const at::Tensor&)>;

// Writes tensors (moved to CPU, made contiguous, one at a time) in the given order and fsyncs
// the file. Supported dtypes: F64, F32, F16, BF16, I64, I32, I16, I8, U8, BOOL.
void write_safetensors(const std::filesystem::path& path,
                       const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const std::map<std::string, std::string>& metadata = {},
                       const TensorReader& read = {});

// kCopy reads every tensor into memory of its own. kMap maps the file privately instead: each
// tensor's bytes stay in the page cache until they are read (and a write to one is copied on
// write, never reaching the file), so reading a checkpoint larger than RAM commits no memory.
// A mapped file must not be truncated or rewritten in place while its tensors live (checkpoints
// never are: they are written under a new name and only ever deleted).
enum class SafetensorsRead { kCopy, kMap };

// Reads and validates a whole file. CheckpointError naming the file (and the tensor, where one is
// at fault) for: missing/short file, a directory or other non-regular file, header length beyond
// the file, malformed JSON, unknown dtype, shape and offsets that disagree, offsets outside the
// data or overlapping.
SafetensorsFile read_safetensors(const std::filesystem::path& path,
                                 SafetensorsRead mode = SafetensorsRead::kCopy);

}  // namespace starling
