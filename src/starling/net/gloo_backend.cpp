// ProcessGroupGloo.hpp declares nothing unless the including code says Gloo is built in; Debian's
// libtorch is (its libtorch_cpu exports ProcessGroupGloo and links libgloo).
#ifndef USE_C10D_GLOO
#define USE_C10D_GLOO 1
#endif

#include "starling/net/gloo_backend.h"

#include <torch/torch.h>

#include <algorithm>
#include <mutex>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <vector>

#include "starling/common/error.h"

namespace starling::net {
namespace {

using Clock = std::chrono::steady_clock;

// c10::Error's what() carries a C++ backtrace; users need the message.
std::string message_of(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e))
    return c10_error->what_without_backtrace();
  return e.what();
}

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

 private:
  GlooOptions options_;
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> group_;
  // Gloo matches operations across ranks by launch order; one launch at a time keeps this
  // rank's order well defined.
  std::mutex launch_mutex_;
  uint64_t next_op_id_ = 1;
};

GlooBackend::Impl::Impl(GlooOptions options) : options_(std::move(options)) {
  if (options_.world_size < 1 || options_.rank < 0 || options_.rank >= options_.world_size)
    throw ConfigError("gloo: rank " + std::to_string(options_.rank) + " is not in 0.." +
                      std::to_string(options_.world_size - 1));
  const auto colon = options_.store.rfind(':');
  const std::string port_text = colon == std::string::npos ? "" : options_.store.substr(colon + 1);
  if (colon == 0 || port_text.empty() || port_text.size() > 5 ||
      port_text.find_first_not_of("0123456789") != std::string::npos ||
      std::stoul(port_text) > 65535)
    throw ConfigError("gloo: store address '" + options_.store + "' is not HOST:PORT");
  const std::string host = options_.store.substr(0, colon);
  const auto port = static_cast<uint16_t>(std::stoul(port_text));
  if (options_.rank != 0 && port == 0)
    throw ConfigError("gloo: rank " + std::to_string(options_.rank) +
                      " needs the store's real port, not 0");
  if (options_.interface.empty()) throw ConfigError("gloo: no local interface address given");

  try {
    c10d::TCPStoreOptions store_options;
    store_options.port = port;
    store_options.isServer = options_.rank == 0;
    store_options.numWorkers = static_cast<size_t>(options_.world_size);
    // The process group's own rendezvous waits for every rank; waiting here too would block
    // rank 0 before it can report the port it picked.
    store_options.waitWorkers = false;
    store_options.timeout = options_.timeout;
    auto store = c10::make_intrusive<c10d::TCPStore>(host, store_options);
    if (options_.rank == 0 && options_.on_store_listening)
      options_.on_store_listening(store->getPort());
    store_ = store;

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
  if (options.precision != WirePrecision::fp32)
    throw NetError(what + ": wire precision " +
                   std::string(compress::to_string(options.precision)) +
                   " is not available (Gloo only sends fp32)");
  const int world = options_.world_size, rank = options_.rank;
  if (kind == CollectiveKind::broadcast && options.root >= static_cast<PeerId>(world))
    throw NetError(what + ": root " + std::to_string(options.root) +
                   " is not a rank (the group has " + std::to_string(world) + ")");

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

Work GlooBackend::launch(CollectiveKind kind, std::span<float> data,
                         const CollectiveOptions& options) {
  return impl_->launch(kind, data, options);
}

}  // namespace starling::net
