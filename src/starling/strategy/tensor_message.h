// A tensor as it crosses a pipeline link: a small header (what it is, for which step, micro-batch
// and producer node, its dtype and shape) and the raw elements. Only this format crosses the
// link, no framework state, so the stages on either side may run different builds or devices.
//
// Layout (little-endian, as every machine Starling builds for): "SPT1", kind u8, dtype u8, ndim
// u8, a zero byte, step i64, micro-batch i32, node i32, ndim dims i64, then numel elements.
// decode() checks every field against what the receiver expects, so a malformed, truncated or
// mismatched message is a NetError naming the sender and the field, never a crash.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

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
