// Threads of the network layer start with SIGINT and SIGTERM blocked, so those signals reach the
// training thread (whose handler stops the run cleanly) and never interrupt a blocking ZeroMQ or
// socket call on a network thread: cppzmq reports an interrupted call as an exception, and one
// escaping a thread's function ends the process.
#pragma once

#include <signal.h>

#include <thread>
#include <utility>

namespace starling::net {

template <typename F>
std::thread quiet_thread(F&& body) {
  sigset_t stop, previous;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop, &previous);  // the new thread inherits this mask
  std::thread t(std::forward<F>(body));
  pthread_sigmask(SIG_SETMASK, &previous, nullptr);
  return t;
}

}  // namespace starling::net
