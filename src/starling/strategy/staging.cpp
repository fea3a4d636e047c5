#include "starling/strategy/staging.h"

#include <ATen/ATen.h>
#include <c10/core/StreamGuard.h>
#include <c10/core/impl/VirtualGuardImpl.h>

namespace starling::strategy {
namespace {

// The current stream of `device` (the compute stream the trainer queues on).
c10::Stream current_stream(c10::Device device) {
  return c10::impl::VirtualGuardImpl(device.type()).getStream(device);
}

}  // namespace

Staging::Staging(c10::Device device, int64_t numel, bool through_host) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  device_ = at::zeros({numel}, f32.device(device));
  if (device.is_cpu() || !through_host) {
    host_ = device_;
    return;
  }
  host_ = at::zeros({numel}, f32.pinned_memory(true));
  side_ = c10::impl::VirtualGuardImpl(device.type()).getStreamFromGlobalPool(device);
  downloaded_.emplace(device.type());
  uploaded_.emplace(device.type());
}

Staging::~Staging() {
  // Copies in flight read or write these buffers: let them land before the memory goes back.
  if (side_) side_->synchronize();
}

void Staging::copy_on_side(bool to_host, int64_t begin, int64_t n) {
  if (n < 0) n = device_.numel() - begin;
  // After the compute-stream work queued so far: it may still write (download) or read (upload)
  // the device vector.
  c10::Event queued(device_.device().type());
  queued.record(current_stream(device_.device()));
  queued.block(*side_);
  c10::StreamGuard on_side(*side_);
  at::Tensor d = device_.narrow(0, begin, n), h = host_.narrow(0, begin, n);
  (to_host ? h : d).copy_(to_host ? d : h, /*non_blocking=*/true);
  (to_host ? downloaded_ : uploaded_)->record(*side_);
}

void Staging::download(int64_t begin, int64_t n) {
  if (side_) copy_on_side(/*to_host=*/true, begin, n);
}

bool Staging::download_done() const { return !side_ || downloaded_->query(); }

void Staging::wait_download() {
  if (side_) side_->synchronize();
}

void Staging::upload(int64_t begin, int64_t n) {
  if (side_) copy_on_side(/*to_host=*/false, begin, n);
}

void Staging::use_upload() {
  if (side_) uploaded_->block(current_stream(device_.device()));
}

void LazyScalar::set(const at::Tensor& scalar) {
  if (scalar.device().is_cpu()) {
    value_ = scalar.item<double>();
    copied_.reset();
    return;
  }
  if (!host_.defined())
    host_ = at::zeros({}, at::TensorOptions().dtype(at::kFloat).pinned_memory(true));
  if (copied_ && copied_->query()) value_ = host_.item<double>();  // keep the landed one
  c10::Stream stream = current_stream(scalar.device());
  host_.copy_(scalar.detach().reshape({}), /*non_blocking=*/true);
  copied_.emplace(scalar.device().type());
  copied_->record(stream);
}

double LazyScalar::value() {
  if (copied_ && copied_->query()) {
    value_ = host_.item<double>();
    copied_.reset();
  }
  return value_;
}

}  // namespace starling::strategy
