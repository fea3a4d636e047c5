#include "starling/net/nccl_backend.h"

#include "starling/common/error.h"

#ifdef STARLING_WITH_NCCL
// ProcessGroupNCCL.hpp declares nothing unless the including code says NCCL is built in.
#ifndef USE_C10D_NCCL
#define USE_C10D_NCCL 1
#endif

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "starling/net/c10d_group.h"
#include "starling/net/quiet_thread.h"

namespace starling::net {
namespace {

using Clock = std::chrono::steady_clock;

// Shuts the group down where the libtorch offers it (2.x), so its destructor neither warns nor
// waits on a watchdog; older versions clean up in the destructor alone.
template <typename Group>
auto shut_down(Group& group, int) -> decltype(group.shutdown(), void()) {
  group.shutdown();
}
template <typename Group>
void shut_down(Group&, long) {}

class NcclBackend final : public Collectives {
 public:
  explicit NcclBackend(NcclOptions options);
  ~NcclBackend() override;

  std::string backend_name() const override { return "nccl"; }
  PeerId self() const override { return static_cast<PeerId>(options_.rank); }
  bool elastic() const override { return false; }
  BufferPlace buffers() const override { return BufferPlace::device; }
  uint64_t bytes_sent() const override { return bytes_sent_; }

 protected:
  Work launch(CollectiveKind kind, std::span<float> data,
              const CollectiveOptions& options) override;

 private:
  // A launched operation the completion thread watches.
  struct Pending {
    c10::intrusive_ptr<c10d::Work> work;
    std::function<void()> after;  // device copies out of padded buffers, once NCCL is done
    std::shared_ptr<Work::State> state;
    CollectiveResult result;
    Clock::time_point launched;
    std::string what;
  };

  at::Tensor view_of(float* data, size_t count) const;
  void complete_in_order();
  void finish(Pending& p);

  NcclOptions options_;
  c10::Device device_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> group_;
  std::mutex launch_mutex_;  // NCCL matches operations across ranks by launch order
  uint64_t next_op_id_ = 1;
  std::atomic<uint64_t> bytes_sent_{0};

  // NCCL finishes operations in launch order (one stream), so one thread watches them in order.
  std::mutex queue_mutex_;
  std::condition_variable queue_cv_;
  std::deque<Pending> queue_;
  bool stopping_ = false;
  std::thread completer_;
};

NcclBackend::NcclBackend(NcclOptions options)
    : options_(std::move(options)), device_(c10::DeviceType::CUDA, 0) {
  if (options_.device_index < 0)
    throw ConfigError("nccl: CUDA device index " + std::to_string(options_.device_index) +
                      " is negative");
  const auto devices = static_cast<int>(c10::cuda::device_count());
  if (options_.device_index >= devices)
    throw ConfigError("nccl: CUDA device " + std::to_string(options_.device_index) +
                      " does not exist (" + std::to_string(devices) + " visible)");
  device_ =
      c10::Device(c10::DeviceType::CUDA, static_cast<c10::DeviceIndex>(options_.device_index));
  store_ = connect_store(options_, "nccl");
  try {
    auto group_options = c10d::ProcessGroupNCCL::Options::create();
    group_options->timeout = options_.timeout;
    group_ = c10::make_intrusive<c10d::ProcessGroupNCCL>(store_, options_.rank, options_.world_size,
                                                         group_options);
  } catch (const std::exception& e) {
    throw NetError("nccl: rank " + std::to_string(options_.rank) + " of " +
                   std::to_string(options_.world_size) + " could not form the group (store " +
                   options_.store + "): " + message_of(e));
  }
  completer_ = quiet_thread([this] { complete_in_order(); });
}

NcclBackend::~NcclBackend() {
  {
    std::lock_guard lock(queue_mutex_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  completer_.join();  // after every launched operation finished
  try {
    shut_down(*group_, 0);
  } catch (const std::exception&) {
    // Nothing to report to at exit: the operations' own errors were delivered already.
  }
}

at::Tensor NcclBackend::view_of(float* data, size_t count) const {
  return at::from_blob(data, {static_cast<int64_t>(count)},
                       at::TensorOptions().dtype(at::kFloat).device(device_));
}

Work NcclBackend::launch(CollectiveKind kind, std::span<float> data,
                         const CollectiveOptions& options) {
  const std::string what = "nccl " + to_string(kind);
  const int world = options_.world_size, rank = options_.rank;
  check_launch(what, kind, options, world);

  Pending p;
  p.state = std::make_shared<Work::State>();
  p.launched = Clock::now();
  p.what = what;
  const size_t count = data.size();
  const Shard own = shard_of(count, world, rank);
  for (int r = 0; r < world; ++r) p.result.ring.push_back(static_cast<PeerId>(r));
  p.result.position = rank;
  p.result.shard = own;
  const c10d::ReduceOp op =
      options.op == ReduceOp::mean ? c10d::ReduceOp::AVG : c10d::ReduceOp::SUM;

  std::lock_guard lock(launch_mutex_);
  p.result.op_id = next_op_id_++;
  if (count == 0) {  // every rank passes the same count, so every rank skips it alike
    p.state->finish(p.result, "");
    return Work(p.state);
  }
  bytes_sent_ += ring_bytes(kind, count, world);

  // Pieces of equal length, as NCCL's reduce-scatter and all-gather need.
  size_t longest = 0;
  bool even = true;
  for (int r = 0; r < world; ++r) {
    const Shard s = shard_of(count, world, r);
    if (r > 0 && s.end - s.begin != longest) even = false;
    longest = std::max(longest, s.end - s.begin);
  }
  const auto piece = static_cast<int64_t>(longest);
  at::Tensor all = view_of(data.data(), count);
  try {
    switch (kind) {
      case CollectiveKind::all_reduce: {
        std::vector<at::Tensor> tensors{all};
        c10d::AllreduceOptions o;
        o.reduceOp = op;
        p.work = group_->allreduce(tensors, o);
        break;
      }
      case CollectiveKind::reduce_scatter: {
        c10d::ReduceScatterOptions o;
        o.reduceOp = op;
        if (even) {
          at::Tensor out = all.narrow(0, static_cast<int64_t>(own.begin), piece);
          p.work = group_->_reduce_scatter_base(out, all, o);  // in place: NCCL allows it
          break;
        }
        // Lay each shard into its own equal slot (queued before the launch, so NCCL sees it).
        at::Tensor padded = at::zeros({piece * world}, all.options());
        for (int r = 0; r < world; ++r) {
          const Shard s = shard_of(count, world, r);
          padded.narrow(0, r * piece, static_cast<int64_t>(s.end - s.begin))
              .copy_(all.narrow(0, static_cast<int64_t>(s.begin),
                                static_cast<int64_t>(s.end - s.begin)));
        }
        at::Tensor out = at::empty({piece}, all.options());
        p.work = group_->_reduce_scatter_base(out, padded, o);
        const auto n = static_cast<int64_t>(own.end - own.begin);
        p.after = [all, out, padded, own, n] {
          all.narrow(0, static_cast<int64_t>(own.begin), n).copy_(out.narrow(0, 0, n));
        };
        break;
      }
      case CollectiveKind::all_gather: {
        if (even) {
          at::Tensor in = all.narrow(0, static_cast<int64_t>(own.begin), piece);
          p.work = group_->_allgather_base(all, in);  // in place: NCCL allows it
          break;
        }
        at::Tensor in = at::zeros({piece}, all.options());
        in.narrow(0, 0, static_cast<int64_t>(own.end - own.begin))
            .copy_(all.narrow(0, static_cast<int64_t>(own.begin),
                              static_cast<int64_t>(own.end - own.begin)));
        at::Tensor out = at::empty({piece * world}, all.options());
        p.work = group_->_allgather_base(out, in);
        p.after = [all, in, out, count, world, rank, piece] {
          for (int r = 0; r < world; ++r) {
            if (r == rank) continue;
            const Shard s = shard_of(count, world, r);
            const auto n = static_cast<int64_t>(s.end - s.begin);
            all.narrow(0, static_cast<int64_t>(s.begin), n).copy_(out.narrow(0, r * piece, n));
          }
        };
        break;
      }
      case CollectiveKind::broadcast: {
        std::vector<at::Tensor> tensors{all};
        c10d::BroadcastOptions o;
        o.rootRank = static_cast<int64_t>(options.root);
        p.work = group_->broadcast(tensors, o);
        break;
      }
    }
  } catch (const std::exception& e) {
    throw NetError(what + " of " + std::to_string(count) + " floats: " + message_of(e));
  }
  Work handle(p.state);
  {
    std::lock_guard queue_lock(queue_mutex_);
    queue_.push_back(std::move(p));
  }
  queue_cv_.notify_all();
  return handle;
}

void NcclBackend::complete_in_order() {
  // Copies out of padded buffers run on a stream of their own, never the compute stream.
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool(false, device_.index());
  c10::cuda::CUDAStreamGuard guard(side);
  for (;;) {
    Pending p;
    {
      std::unique_lock lock(queue_mutex_);
      queue_cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      p = std::move(queue_.front());
      queue_.pop_front();
    }
    finish(p);
  }
}

void NcclBackend::finish(Pending& p) {
  std::string error;
  try {
    // Polling keeps the caller's streams free: nothing waits on the device but this thread.
    while (!p.work->isCompleted()) {
      if (Clock::now() - p.launched > options_.timeout)
        throw NetError(
            "timed out after " +
            std::to_string(
                std::chrono::duration_cast<std::chrono::seconds>(options_.timeout).count()) +
            " s");
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    p.work->wait();  // rethrows NCCL's error, if any
    if (p.after) {
      p.after();
      c10::cuda::getCurrentCUDAStream(device_.index()).synchronize();
    }
  } catch (const std::exception& e) {
    error = p.what + " failed: " + message_of(e);
  }
  p.result.seconds = std::chrono::duration<double>(Clock::now() - p.launched).count();
  p.state->finish(std::move(p.result), std::move(error));
}

}  // namespace

bool nccl_available() { return true; }

std::unique_ptr<Collectives> make_nccl_backend(NcclOptions options) {
  return std::make_unique<NcclBackend>(std::move(options));
}

}  // namespace starling::net

#else  // a libtorch without NCCL (Debian's, any CPU build)

namespace starling::net {

bool nccl_available() { return false; }

std::unique_ptr<Collectives> make_nccl_backend(NcclOptions) {
  throw ConfigError(
      "net.backend = \"nccl\" needs a CUDA libtorch with NCCL (this build's libtorch has none; "
      "see docs/gpu.md for building against one)");
}

}  // namespace starling::net

#endif
