// A float vector that strategies compute on where the model lives and send from host memory.
//
// On a CPU the two are one tensor and every call below is free. On a GPU the device copy is where
// the outer-loop math runs (no host pass over the parameters), the host copy is pinned so that
// copies are true DMA, and both directions run on a side stream: a download waits only for the
// work already queued on the compute stream, and an upload holds back only the compute-stream work
// queued after use_upload(). Neither blocks the host except wait_download(), so a strategy can
// start a download at a round boundary, keep training, and hand the host copy to the network once
// download_done() says it is there.
//
// A backend that works on device memory itself (NCCL) needs no host copy: made with
// through_host = false, host() is device() and every copy is skipped, as on a CPU.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <cstdint>
#include <optional>

namespace starling::strategy {

class Staging {
 public:
  // Zeroed vectors of `numel` float32 elements on `device` and, when `through_host` and the
  // device is not the CPU, on the host.
  Staging(c10::Device device, int64_t numel, bool through_host = true);
  ~Staging();
  Staging(const Staging&) = delete;
  Staging& operator=(const Staging&) = delete;

  at::Tensor& device() { return device_; }
  at::Tensor& host() { return host_; }
  int64_t numel() const { return device_.numel(); }
  // False on a CPU or without a host copy: host() and device() are the same tensor.
  bool separate() const { return side_.has_value(); }

  // host[begin, begin+n) <- device[...] (n = -1: to the end), after the work queued so far on
  // the current stream.
  void download(int64_t begin = 0, int64_t n = -1);
  // Whether the last download has landed; never blocks.
  bool download_done() const;
  // Blocks the host until the last download has landed.
  void wait_download();
  // device[...] <- host[...], after the last download and any earlier upload.
  void upload(int64_t begin = 0, int64_t n = -1);
  // Makes the current stream wait (on the device, not the host) for the last upload; call it
  // before queuing work that reads device().
  void use_upload();

 private:
  void copy_on_side(bool to_host, int64_t begin, int64_t n);

  at::Tensor device_, host_;
  std::optional<c10::Stream> side_;  // set when the device is not the CPU
  std::optional<c10::Event> downloaded_, uploaded_;
};

// A device scalar the host reads without waiting: set() queues a copy to pinned memory, value()
// returns the newest value that has landed (one a step or two old on a GPU, exact on a CPU).
// For figures shown in progress lines, which must not stall the compute stream.
class LazyScalar {
 public:
  void set(const at::Tensor& scalar);
  double value();

 private:
  at::Tensor host_;
  std::optional<c10::Event> copied_;
  double value_ = 0;
};

}  // namespace starling::strategy
