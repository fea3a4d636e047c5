#include "starling/strategy/tensor_message.h"

#include <ATen/ATen.h>

#include <cstring>

#include "starling/common/error.h"
#include "starling/compress/int4_codec.h"
#include "starling/compress/wire_codec.h"

namespace starling::strategy {
namespace {

constexpr char kMagic[4] = {'S', 'P', 'T', '1'};
constexpr size_t kFixed = 4 + 4 + 8 + 4 + 4;  // magic, kind/dtype/ndim/pad, step, mb, node
constexpr int kMaxDims = 8;
constexpr uint8_t kSparse = 1;  // flags: the elements are top-k entries
constexpr uint8_t kInt8 = 2;    // flags: the elements are quantized to int8
constexpr uint8_t kInt4 = 3;    // flags: the elements are quantized to int4

uint8_t dtype_code(c10::ScalarType t) {
  switch (t) {
    case c10::ScalarType::Float:
      return 1;
    case c10::ScalarType::BFloat16:
      return 2;
    case c10::ScalarType::Half:
      return 3;
    default:
      throw std::invalid_argument(std::string("a pipeline link carries fp32, bf16 or fp16, not ") +
                                  c10::toString(t));
  }
}

bool dtype_of(uint8_t code, c10::ScalarType* out) {
  switch (code) {
    case 1:
      *out = c10::ScalarType::Float;
      return true;
    case 2:
      *out = c10::ScalarType::BFloat16;
      return true;
    case 3:
      *out = c10::ScalarType::Half;
      return true;
    default:
      return false;
  }
}

template <typename T>
void put(std::vector<uint8_t>& out, size_t at, T v) {
  std::memcpy(out.data() + at, &v, sizeof v);
}

template <typename T>
T get(std::span<const uint8_t> in, size_t at) {
  T v;
  std::memcpy(&v, in.data() + at, sizeof v);
  return v;
}

std::string shape_text(std::span<const int64_t> shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

const char* tensor_kind_name(TensorKind kind) {
  switch (kind) {
    case TensorKind::activation:
      return "activation";
    case TensorKind::gradient:
      return "gradient";
    case TensorKind::loss:
      return "loss";
  }
  return "unknown";
}

namespace {

// The header of a message whose elements take `payload` bytes after it.
std::vector<uint8_t> with_header(const TensorLabel& label, c10::ScalarType dtype,
                                 at::IntArrayRef dims, uint8_t flags, size_t payload) {
  if (dims.size() > static_cast<size_t>(kMaxDims))
    throw std::invalid_argument("a pipeline link carries tensors of at most 8 dimensions");
  std::vector<uint8_t> out(kFixed + 8 * dims.size() + payload);
  std::memcpy(out.data(), kMagic, 4);
  out[4] = static_cast<uint8_t>(label.kind);
  out[5] = dtype_code(dtype);
  out[6] = static_cast<uint8_t>(dims.size());
  out[7] = flags;
  put(out, 8, label.step);
  put(out, 16, label.micro_batch);
  put(out, 20, label.node);
  for (size_t i = 0; i < dims.size(); ++i) put(out, kFixed + 8 * i, dims[i]);
  return out;
}

}  // namespace

std::vector<uint8_t> encode_tensor(const TensorLabel& label, const at::Tensor& t) {
  const at::Tensor host = t.detach().to(at::kCPU).contiguous();
  const size_t payload = static_cast<size_t>(host.numel()) * host.element_size();
  std::vector<uint8_t> out = with_header(label, host.scalar_type(), host.sizes(), 0, payload);
  if (payload > 0) std::memcpy(out.data() + out.size() - payload, host.data_ptr(), payload);
  return out;
}

size_t encoded_tensor_bytes(const at::Tensor& t) {
  return kFixed + 8 * static_cast<size_t>(t.dim()) +
         static_cast<size_t>(t.numel()) * t.element_size();
}

std::vector<uint8_t> encode_int8_tensor(const TensorLabel& label, const at::Tensor& t) {
  const at::Tensor host = t.detach().to(at::kCPU, at::kFloat).contiguous();
  const auto count = static_cast<size_t>(host.numel());
  const size_t payload = compress::encoded_bytes(compress::WirePrecision::int8, count);
  std::vector<uint8_t> out = with_header(label, at::kFloat, host.sizes(), kInt8, payload);
  compress::encode(compress::WirePrecision::int8, host.data_ptr<float>(), count,
                   reinterpret_cast<std::byte*>(out.data() + out.size() - payload));
  return out;
}

std::vector<uint8_t> encode_int4_tensor(const TensorLabel& label, const at::Tensor& t) {
  const at::Tensor host = t.detach().to(at::kCPU, at::kFloat).contiguous();
  const auto count = static_cast<size_t>(host.numel());
  const size_t payload = compress::int4_encoded_bytes(count);
  std::vector<uint8_t> out = with_header(label, at::kFloat, host.sizes(), kInt4, payload);
  compress::encode_int4(host.data_ptr<float>(), count,
                        reinterpret_cast<std::byte*>(out.data() + out.size() - payload));
  return out;
}

std::vector<uint8_t> encode_sparse_tensor(const TensorLabel& label, at::IntArrayRef shape,
                                          const compress::TopK& kept) {
  const at::Tensor indices = kept.indices.to(at::kCPU, at::kInt).contiguous();
  const at::Tensor values = kept.values.to(at::kCPU).contiguous();
  const auto count = static_cast<uint64_t>(indices.numel());
  if (values.numel() != indices.numel())
    throw std::invalid_argument("encode_sparse_tensor: as many values as indices");
  const size_t index_bytes = 4 * count;
  const size_t value_bytes = count * values.element_size();
  std::vector<uint8_t> out =
      with_header(label, values.scalar_type(), shape, kSparse, 8 + index_bytes + value_bytes);
  const size_t at = out.size() - (8 + index_bytes + value_bytes);
  put(out, at, count);
  if (count > 0) {
    std::memcpy(out.data() + at + 8, indices.data_ptr(), index_bytes);
    std::memcpy(out.data() + at + 8 + index_bytes, values.data_ptr(), value_bytes);
  }
  return out;
}

at::Tensor decode_tensor(std::span<const uint8_t> in, const TensorExpectation& expect,
                         const std::string& sender) {
  const TensorLabel& want = expect.label;
  const std::string what = std::string(tensor_kind_name(want.kind)) + " of node " +
                           std::to_string(want.node) + " (step " + std::to_string(want.step) +
                           ", micro-batch " + std::to_string(want.micro_batch) + ") from " + sender;
  const auto bad = [&](const std::string& why) {
    return NetError("pipeline: the " + what + " " + why);
  };
  if (in.size() < kFixed || std::memcmp(in.data(), kMagic, 4) != 0)
    throw bad("is not a pipeline tensor message (" + std::to_string(in.size()) + " bytes)");
  const auto kind = static_cast<TensorKind>(in[4]);
  c10::ScalarType dtype;
  if (!dtype_of(in[5], &dtype)) throw bad("has an unknown dtype code " + std::to_string(in[5]));
  const int ndim = in[6];
  if (ndim > kMaxDims) throw bad("claims " + std::to_string(ndim) + " dimensions");
  const size_t header = kFixed + 8 * static_cast<size_t>(ndim);
  if (in.size() < header) throw bad("is truncated inside its header");
  const TensorLabel got{kind, get<int64_t>(in, 8), get<int32_t>(in, 16), get<int32_t>(in, 20)};
  if (got.kind != want.kind || got.step != want.step || got.micro_batch != want.micro_batch ||
      got.node != want.node)
    throw bad(std::string("arrived as the ") + tensor_kind_name(got.kind) + " of node " +
              std::to_string(got.node) + " (step " + std::to_string(got.step) + ", micro-batch " +
              std::to_string(got.micro_batch) + "): the stages are out of step");
  std::vector<int64_t> shape(static_cast<size_t>(ndim));
  for (int i = 0; i < ndim; ++i)
    shape[static_cast<size_t>(i)] = get<int64_t>(in, kFixed + 8 * static_cast<size_t>(i));
  if (shape != expect.shape)
    throw bad("has shape " + shape_text(shape) + ", expected " + shape_text(expect.shape));
  bool dtype_ok = false;
  for (const auto d : expect.dtypes) dtype_ok = dtype_ok || d == dtype;
  if (!dtype_ok)
    throw bad(std::string("has dtype ") + c10::toString(dtype) +
              ", which this stage does not accept");
  int64_t numel = 1;
  for (const int64_t d : shape) numel *= d;
  const size_t element = c10::elementSize(dtype);
  if (in[7] == kSparse) {
    if (in.size() < header + 8) throw bad("is truncated before its count of kept entries");
    const auto count = get<uint64_t>(in, header);
    if (count > static_cast<uint64_t>(numel))
      throw bad("claims " + std::to_string(count) + " kept entries of " + std::to_string(numel));
    const size_t expected = header + 8 + count * (4 + element);
    if (in.size() != expected)
      throw bad("holds " + std::to_string(in.size()) + " bytes for " + std::to_string(count) +
                " kept entries, expected " + std::to_string(expected));
    compress::TopK kept;
    kept.indices = at::empty({static_cast<int64_t>(count)}, at::kInt);
    kept.values = at::empty({static_cast<int64_t>(count)}, at::TensorOptions().dtype(dtype));
    if (count > 0) {
      std::memcpy(kept.indices.data_ptr(), in.data() + header + 8, 4 * count);
      std::memcpy(kept.values.data_ptr(), in.data() + header + 8 + 4 * count, element * count);
    }
    // Ascending and inside the tensor: densify() writes exactly where the sender read.
    const int32_t* idx = kept.indices.data_ptr<int32_t>();
    for (uint64_t i = 0; i < count; ++i)
      if (idx[i] < 0 || idx[i] >= numel || (i > 0 && idx[i] <= idx[i - 1]))
        throw bad("has kept entry " + std::to_string(i) + " at index " + std::to_string(idx[i]) +
                  ", not ascending inside its " + std::to_string(numel) + " entries");
    return compress::densify(kept, shape, dtype);
  }
  if (in[7] == kInt8 || in[7] == kInt4) {
    const bool int8 = in[7] == kInt8;
    const std::string name = int8 ? "int8" : "int4";
    if (dtype != c10::ScalarType::Float) throw bad("is " + name + "-coded but not fp32");
    const auto count = static_cast<size_t>(numel);
    const size_t payload = int8 ? compress::encoded_bytes(compress::WirePrecision::int8, count)
                                : compress::int4_encoded_bytes(count);
    if (in.size() != header + payload)
      throw bad("holds " + std::to_string(in.size() - header) + " bytes of " + name +
                " groups, expected " + std::to_string(payload));
    at::Tensor out = at::empty(shape, at::kFloat);
    const auto* payload_bytes = reinterpret_cast<const std::byte*>(in.data() + header);
    if (int8)
      compress::decode(compress::WirePrecision::int8, payload_bytes, count, out.data_ptr<float>());
    else
      compress::decode_int4(payload_bytes, count, out.data_ptr<float>());
    return out;
  }
  if (in[7] != 0) throw bad("has unknown flags " + std::to_string(in[7]));
  const size_t payload = static_cast<size_t>(numel) * element;
  if (in.size() != header + payload)
    throw bad("holds " + std::to_string(in.size() - header) + " bytes of elements, expected " +
              std::to_string(payload));
  at::Tensor out = at::empty(shape, at::TensorOptions().dtype(dtype));
  if (payload > 0) std::memcpy(out.data_ptr(), in.data() + header, payload);
  return out;
}

}  // namespace starling::strategy
