// A clock a signal handler may read, and the gap that tells a user's second Ctrl-C from one
// keypress delivered twice (a wrapper that passes the terminal's SIGINT on to its child as a
// SIGTERM, while the child hears the SIGINT too).
#pragma once

#include <time.h>

#include <cstdint>

namespace starling {

// Nanoseconds of CLOCK_MONOTONIC: clock_gettime is async-signal-safe.
inline int64_t signal_clock_ns() noexcept {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// A stop signal this long after the first is the user's second request; sooner, the same one.
constexpr int64_t kSecondSignalGapNs = 1'000'000'000;

}  // namespace starling
