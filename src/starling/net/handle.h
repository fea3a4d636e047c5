// A handle to an asynchronous network operation that finishes once, with a result or an error:
// shared by the caller, who tests or waits, and the thread that completes it. Copies refer to
// the same operation. Work (a collective) and Transfer (a point-to-point message) are handles.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

#include "starling/common/error.h"

namespace starling::net {

template <typename Result>
class Handle {
 public:
  struct State {
    std::mutex mutex;
    std::condition_variable done_cv;
    bool done = false;
    std::string error;  // empty on success
    Result result{};
    // When the result came to be: for a received message, when it arrived (which may be before
    // its receive was posted).
    std::chrono::steady_clock::time_point at{};
    void finish(Result r, std::string err,
                std::chrono::steady_clock::time_point when = std::chrono::steady_clock::now()) {
      {
        std::lock_guard lock(mutex);
        result = std::move(r);
        error = std::move(err);
        at = when;
        done = true;
      }
      done_cv.notify_all();
    }
  };

  Handle() = default;
  explicit Handle(std::shared_ptr<State> state) : state_(std::move(state)) {}

  // True once the operation finished (successfully or not). Never blocks.
  bool test() const {
    if (!state_) return true;
    std::lock_guard lock(state_->mutex);
    return state_->done;
  }
  // Blocks until finished; returns the result or throws NetError with the reason.
  Result wait() const {
    if (!state_) throw NetError("wait() on an empty handle");
    std::unique_lock lock(state_->mutex);
    state_->done_cv.wait(lock, [&] { return state_->done; });
    if (!state_->error.empty()) throw NetError(state_->error);
    return state_->result;
  }
  // When it finished (see State::at); the epoch of steady_clock while it has not.
  std::chrono::steady_clock::time_point finished_at() const {
    if (!state_) return {};
    std::lock_guard lock(state_->mutex);
    return state_->at;
  }
  // Waits at most `timeout`; true if finished.
  bool wait_for(std::chrono::milliseconds timeout) const {
    if (!state_) return true;
    std::unique_lock lock(state_->mutex);
    return state_->done_cv.wait_for(lock, timeout, [&] { return state_->done; });
  }

 private:
  std::shared_ptr<State> state_;
};

}  // namespace starling::net
