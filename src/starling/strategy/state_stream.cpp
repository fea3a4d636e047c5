#include "starling/strategy/state_stream.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <stdexcept>
#include <string>

namespace starling::strategy {

StateStream::StateStream(std::vector<at::Tensor> tensors, int64_t piece_numel)
    : tensors_(std::move(tensors)), piece_(piece_numel) {
  if (piece_ < 1) throw std::invalid_argument("StateStream: a piece holds at least one element");
  for (const at::Tensor& t : tensors_) numel_ += t.numel();
  pieces_ = std::max<int64_t>(1, (numel_ + piece_ - 1) / piece_);
}

int64_t StateStream::numel_of(int64_t k) const {
  if (k < 0 || k >= pieces_)
    throw std::logic_error("StateStream: piece " + std::to_string(k) + " of " +
                           std::to_string(pieces_));
  return std::min(piece_, numel_ - k * piece_);
}

void StateStream::walk(
    int64_t n, const std::function<void(const at::Tensor&, int64_t, int64_t, int64_t)>& span) {
  at::NoGradGuard no_grad;  // a weight read or written as it is requires its gradient
  for (int64_t filled = 0; filled < n;) {
    const at::Tensor& t = tensors_[tensor_];
    const int64_t take = std::min(n - filled, t.numel() - offset_);
    if (take > 0) {
      span(t, offset_, filled, take);
      filled += take;
      offset_ += take;
    }
    if (offset_ == t.numel()) {  // the tensor is through (or empty)
      ++tensor_;
      offset_ = 0;
      open_.reset();
    }
  }
  ++next_;
}

void StateStream::read_next(at::Tensor& part, const Reader& read) {
  const int64_t n = numel_of(next_);
  if (part.numel() != n) throw std::logic_error("StateStream::read_next: wrong piece size");
  walk(n, [&](const at::Tensor& t, int64_t offset, int64_t at, int64_t take) {
    if (!open_.defined()) open_ = read(t).reshape({-1});
    part.narrow(0, at, take).copy_(open_.narrow(0, offset, take));
  });
}

bool StateStream::update_next(at::Tensor& part, const Reader& read, const Writer& write,
                              const Update& update) {
  const int64_t n = numel_of(next_);
  if (part.numel() != n) throw std::logic_error("StateStream::update_next: wrong piece size");
  struct Span {
    const at::Tensor* tensor;
    // The open copy of a tensor that crosses an edge of the piece (kept past walk(), which lets
    // go of it at the tensor's end); undefined for one wholly inside, written from `part`.
    at::Tensor values;
    int64_t offset, at, take;
  };
  std::vector<Span> spans;
  walk(n, [&](const at::Tensor& t, int64_t offset, int64_t at, int64_t take) {
    if (offset == 0 && take == t.numel()) {  // wholly inside: nothing to hold
      part.narrow(0, at, take).copy_(read(t).reshape({-1}));
      spans.push_back({&t, at::Tensor(), offset, at, take});
      return;
    }
    if (!open_.defined()) {
      at::Tensor values = read(t);
      open_ = (values.is_alias_of(t) ? values.clone() : values).reshape({-1});
    }
    part.narrow(0, at, take).copy_(open_.narrow(0, offset, take));
    spans.push_back({&t, open_, offset, at, take});
  });
  if (!update(part)) return false;
  at::NoGradGuard no_grad;
  for (const Span& s : spans) {
    const at::Tensor from = part.narrow(0, s.at, s.take);
    if (!s.values.defined()) {
      write(*s.tensor, from.view(s.tensor->sizes()));
      continue;
    }
    s.values.narrow(0, s.offset, s.take).copy_(from);
    if (s.offset + s.take == s.tensor->numel()) write(*s.tensor, s.values.view(s.tensor->sizes()));
  }
  return true;
}

void StateStream::write_next(const at::Tensor& part, const Writer& write) {
  const int64_t n = numel_of(next_);
  if (part.numel() != n) throw std::logic_error("StateStream::write_next: wrong piece size");
  walk(n, [&](const at::Tensor& t, int64_t offset, int64_t at, int64_t take) {
    const at::Tensor from = part.narrow(0, at, take);
    if (offset == 0 && take == t.numel()) {
      write(t, from.view(t.sizes()));  // whole in this piece: no assembly
      return;
    }
    if (!open_.defined()) open_ = at::empty({t.numel()}, part.options());
    open_.narrow(0, offset, take).copy_(from);
    if (offset + take == t.numel()) write(t, open_.view(t.sizes()));
  });
}

}  // namespace starling::strategy
