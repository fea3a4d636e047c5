#include "starling/common/error.h"
#include "starling/net/collective.h"

namespace starling::net {

std::string to_string(CollectiveKind kind) {
  switch (kind) {
    case CollectiveKind::all_reduce:
      return "all_reduce";
    case CollectiveKind::reduce_scatter:
      return "reduce_scatter";
    case CollectiveKind::all_gather:
      return "all_gather";
    case CollectiveKind::broadcast:
      return "broadcast";
  }
  return "collective";
}

Shard shard_of(size_t count, int size, int position) {
  const auto n = static_cast<unsigned __int128>(count);
  return {static_cast<size_t>(n * position / size), static_cast<size_t>(n * (position + 1) / size)};
}

void Work::State::finish(CollectiveResult r, std::string err) {
  {
    std::lock_guard lock(mutex);
    result = std::move(r);
    error = std::move(err);
    done = true;
  }
  done_cv.notify_all();
}

bool Work::test() const {
  if (!state_) return true;
  std::lock_guard lock(state_->mutex);
  return state_->done;
}

bool Work::wait_for(std::chrono::milliseconds timeout) const {
  if (!state_) return true;
  std::unique_lock lock(state_->mutex);
  return state_->done_cv.wait_for(lock, timeout, [&] { return state_->done; });
}

CollectiveResult Work::wait() const {
  if (!state_) throw NetError("wait() on an empty collective handle");
  std::unique_lock lock(state_->mutex);
  state_->done_cv.wait(lock, [&] { return state_->done; });
  if (!state_->error.empty()) throw NetError(state_->error);
  return state_->result;
}

}  // namespace starling::net
