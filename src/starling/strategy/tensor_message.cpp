#include "starling/strategy/tensor_message.h"

#include <ATen/ATen.h>

#include <cstring>

#include "starling/common/error.h"

namespace starling::strategy {
namespace {

constexpr char kMagic[4] = {'S', 'P', 'T', '1'};
constexpr size_t kFixed = 4 + 4 + 8 + 4 + 4;  // magic, kind/dtype/ndim/pad, step, mb, node
constexpr int kMaxDims = 8;

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

std::vector<uint8_t> encode_tensor(const TensorLabel& label, const at::Tensor& t) {
  const at::Tensor host = t.detach().to(at::kCPU).contiguous();
  const auto dims = host.sizes();
  if (dims.size() > static_cast<size_t>(kMaxDims))
    throw std::invalid_argument("a pipeline link carries tensors of at most 8 dimensions");
  const size_t header = kFixed + 8 * dims.size();
  const size_t payload = static_cast<size_t>(host.numel()) * host.element_size();
  std::vector<uint8_t> out(header + payload);
  std::memcpy(out.data(), kMagic, 4);
  out[4] = static_cast<uint8_t>(label.kind);
  out[5] = dtype_code(host.scalar_type());
  out[6] = static_cast<uint8_t>(dims.size());
  out[7] = 0;
  put(out, 8, label.step);
  put(out, 16, label.micro_batch);
  put(out, 20, label.node);
  for (size_t i = 0; i < dims.size(); ++i) put(out, kFixed + 8 * i, dims[i]);
  if (payload > 0) std::memcpy(out.data() + header, host.data_ptr(), payload);
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
  const size_t payload = static_cast<size_t>(numel) * c10::elementSize(dtype);
  if (in.size() != header + payload)
    throw bad("holds " + std::to_string(in.size() - header) + " bytes of elements, expected " +
              std::to_string(payload));
  at::Tensor out = at::empty(shape, at::TensorOptions().dtype(dtype));
  if (payload > 0) std::memcpy(out.data_ptr(), in.data() + header, payload);
  return out;
}

}  // namespace starling::strategy
