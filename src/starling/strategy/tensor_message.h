// A tensor as it crosses a pipeline link: a small header (what it is, for which step, micro-batch
// and producer node, its dtype and shape) and the raw elements. Only this format crosses the
// link, no framework state, so the stages on either side may run different builds or devices.
//
// Layout (little-endian, as every machine Starling builds for): "SPT1", kind u8, dtype u8, ndim
// u8, flags u8, step i64, micro-batch i32, node i32, ndim dims i64, then the elements. Flags 0: a
// whole tensor, numel elements. Flags 1: a sparse one (top-k, compress/topk.h): the kept count
// u64, that many flat indices i32 in ascending order, then that many values. Flags 2: a whole
// fp32 tensor quantized to int8 (compress/wire_codec.h's int8: groups of 256 entries, each an
// fp32 scale and 256 int8 values). Flags 3: likewise quantized to int4 (compress/int4_codec.h:
// groups of 64, each an fp32 scale and 32 bytes of 4-bit codes). decode() checks every field
// against what the receiver expects, so a malformed, truncated or mismatched message is a NetError
// naming the sender and the field, never a crash.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "starling/compress/topk.h"

namespace starling::strategy {

enum class TensorKind : uint8_t { activation = 1, gradient = 2, loss = 3 };
const char* tensor_kind_name(TensorKind kind);

// What a message is about; a receiver knows all of it in advance.
struct TensorLabel {
  TensorKind kind = TensorKind::activation;
  int64_t step = 0;         // the optimizer step (or evaluation round) it belongs to
  int32_t micro_batch = 0;  // within that step
  int32_t node = 0;         // the node that produced the activation (its gradient: the same)
};

// The message for `t` (any device; copied to the host), fp32, bf16 or fp16.
std::vector<uint8_t> encode_tensor(const TensorLabel& label, const at::Tensor& t);

// The size of encode_tensor(label, t)'s message.
size_t encoded_tensor_bytes(const at::Tensor& t);

// The message for `t` (fp32 values) quantized to int8: about a quarter of encode_tensor's bytes,
// every entry within half a step of its group's scale (absmax / 127).
std::vector<uint8_t> encode_int8_tensor(const TensorLabel& label, const at::Tensor& t);
// The same in int4: about a seventh of encode_tensor's bytes, every entry within half a step of
// its group's scale (absmax / 7).
std::vector<uint8_t> encode_int4_tensor(const TensorLabel& label, const at::Tensor& t);

// The message for the kept entries of a tensor of `shape` (indices ascending, values fp32, bf16
// or fp16): the receiver gets the whole tensor back with zeros everywhere else.
std::vector<uint8_t> encode_sparse_tensor(const TensorLabel& label, at::IntArrayRef shape,
                                          const compress::TopK& kept);

// What the receiver accepts: exactly `label` and `shape`, and one of `dtypes`.
struct TensorExpectation {
  TensorLabel label;
  std::vector<int64_t> shape;
  std::vector<c10::ScalarType> dtypes;
};

// The tensor in `bytes` (a CPU tensor owning a copy of the elements). NetError naming `sender`
// and what differs when the message is malformed or not what `expect` describes.
at::Tensor decode_tensor(std::span<const uint8_t> bytes, const TensorExpectation& expect,
                         const std::string& sender);

}  // namespace starling::strategy
