// ProcessGroupGloo.hpp declares nothing unless the including code says Gloo is built in; Debian's
// libtorch is (its libtorch_cpu exports ProcessGroupGloo and links libgloo).
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO 1
#endif

#include "starling/net/gloo_backend.h"

#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <vector>

#include "starling/common/error.h"
#include "starling/net/c10d_group.h"

namespace starling::net {
namespace {

using Clock = std::chrono::steady_clock;

at::Tensor view_of(float* data, size_t count) {
  return torch::from_blob(data, {static_cast<int64_t>(count)}, torch::kFloat32);
}

void divide(std::span<float> data, size_t begin, size_t end, float divisor) {
  for (size_t i = begin; i < end; ++i) data[i] /= divisor;
}

}  // namespace

class GlooBackend::Impl {
 public:
  explicit Impl(GlooOptions options);

  Work launch(CollectiveKind kind, std::span<float> data, const CollectiveOptions& options);

  int rank() const { return options_.rank; }
  int world_size() const { return options_.world_size; }
  uint64_t bytes_sent() const { return bytes_sent_; }

 private:
  GlooOptions options_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group_;
  // Gloo matches operations across ranks by launch order; one launch at a time keeps this
  // rank's order well defined.
  std::mutex launch_mutex_;
  uint64_t next_op_id_ = 1;
  std::atomic<uint64_t> bytes_sent_{0};
};

GlooBackend::Impl::Impl(GlooOptions options) : options_(std::move(options)) {
  if (options_.interface.empty()) throw ConfigError("gloo: no local interface address given");
  store_ = connect_store(options_, "gloo");
  try {
    auto group_options = c10d::ProcessGroupGloo::Options::create(options_.timeout);
    group_options->devices.push_back(
        c10d::ProcessGroupGloo::createDeviceForHostname(options_.interface));
    group_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store_, options_.rank, options_.world_size,
                                                         group_options);
  } catch (const std::exception& e) {
    throw NetError("gloo: rank " + std::to_string(options_.rank) + " of " +
                   std::to_string(options_.world_size) + " could not connect (store " +
                   options_.store + ", interface " + options_.interface + "): " + message_of(e));
  }
}

Work GlooBackend::Impl::launch(CollectiveKind kind, std::span<float> data,
                               const CollectiveOptions& options) {
  const std::string what = "gloo " + to_string(kind);
  const int world = options_.world_size, rank = options_.rank;
  check_launch(what, kind, options, world);

  auto state = std::make_shared<Work::State>();
  const auto launched = Clock::now();
  const size_t count = data.size();
  const Shard own = shard_of(count, world, rank);
  CollectiveResult result;
  for (int r = 0; r < world; ++r) result.ring.push_back(static_cast<PeerId>(r));
  result.position = rank;
  result.shard = own;
  const bool mean = options.op == ReduceOp::mean;
  const auto divisor = static_cast<float>(world);

  std::lock_guard lock(launch_mutex_);
  result.op_id = next_op_id_++;
  bytes_sent_ += ring_bytes(kind, count, world);
  if (count == 0) {  // every rank passes the same count, so every rank skips it alike
    state->finish(result, "");
    return Work(state);
  }

  // What to do on this rank once Gloo is done (runs on a Gloo worker thread).
  std::function<void()> after;
  c10::intrusive_ptr<c10d::Work> work;
  try {
    switch (kind) {
      case CollectiveKind::all_reduce:
      case CollectiveKind::reduce_scatter: {
        std::vector<at::Tensor> tensors{view_of(data.data(), count)};
        work = group_->allreduce(tensors);  // in place on the caller's buffer
        if (mean) {
          const Shard keep = kind == CollectiveKind::all_reduce ? Shard{0, count} : own;
          after = [data, keep, divisor] { divide(data, keep.begin, keep.end, divisor); };
        }
        break;
      }
      case CollectiveKind::all_gather: {
        std::vector<Shard> shards;
        size_t longest = 0;
        for (int r = 0; r < world; ++r) {
          shards.push_back(shard_of(count, world, r));
          longest = std::max(longest, shards.back().end - shards.back().begin);
        }
        const bool even = std::all_of(shards.begin(), shards.end(),
                                      [&](const Shard& s) { return s.end - s.begin == longest; });
        std::vector<at::Tensor> input;
        std::vector<std::vector<at::Tensor>> outputs(1);
        if (even) {
          // Gloo copies each gathered piece straight into these views of the caller's buffer.
          input.push_back(view_of(data.data() + own.begin, longest));
          for (const Shard& s : shards)
            outputs[0].push_back(view_of(data.data() + s.begin, longest));
        } else {
          at::Tensor padded = torch::zeros({static_cast<int64_t>(longest)}, torch::kFloat32);
          std::copy(data.begin() + own.begin, data.begin() + own.end, padded.data_ptr<float>());
          input.push_back(padded);
          for (int r = 0; r < world; ++r)
            outputs[0].push_back(torch::empty({static_cast<int64_t>(longest)}, torch::kFloat32));
          after = [data, shards, pieces = outputs[0], rank] {
            for (size_t r = 0; r < shards.size(); ++r) {
              if (static_cast<int>(r) == rank) continue;
              const float* src = pieces[r].data_ptr<float>();
              std::copy(src, src + (shards[r].end - shards[r].begin),
                        data.begin() + shards[r].begin);
            }
          };
        }
        work = group_->allgather(outputs, input);
        break;
      }
      case CollectiveKind::broadcast: {
        std::vector<at::Tensor> tensors{view_of(data.data(), count)};
        c10d::BroadcastOptions broadcast_options;
        broadcast_options.rootRank = static_cast<int64_t>(options.root);
        work = group_->broadcast(tensors, broadcast_options);
        break;
      }
    }
  } catch (const std::exception& e) {
    throw NetError(what + " of " + std::to_string(count) + " floats: " + message_of(e));
  }

  // Completion arrives through the c10d future (no thread of our own); the callback runs on the
  // Gloo worker thread that finished the operation, or right here if it already has.
  work->getFuture()->addCallback([state, result, launched, after = std::move(after),
                                  what](c10::ivalue::Future& future) mutable {
    std::string error;
    try {
      if (future.hasError()) {
        error = what + " failed: " + future.tryRetrieveErrorMessage();
      } else if (after) {
        after();
      }
    } catch (const std::exception& e) {
      error = what + " failed: " + message_of(e);
    }
    result.seconds = std::chrono::duration<double>(Clock::now() - launched).count();
    state->finish(std::move(result), std::move(error));
  });
  return Work(state);
}

// --- GlooBackend -------------------------------------------------------------------------------

GlooBackend::GlooBackend(GlooOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
GlooBackend::~GlooBackend() = default;
int GlooBackend::rank() const { return impl_->rank(); }
int GlooBackend::world_size() const { return impl_->world_size(); }
uint64_t GlooBackend::bytes_sent() const { return impl_->bytes_sent(); }

Work GlooBackend::launch(CollectiveKind kind, std::span<float> data,
                         const CollectiveOptions& options) {
  return impl_->launch(kind, data, options);
}

}  // namespace starling::net
