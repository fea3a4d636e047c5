// Runs a function between the ATen operators this thread dispatches, at most once per interval,
// while armed. The swapper's deferred update (swapper.h) otherwise advances only when the
// executor moves to another node: a forward node of gpt2-124m lasts 40-80 ms on a CPU, and a
// staging set needs two such boundaries per chunk (one to compute and write it, one to load the
// next), which paced the update's transfers at a few hundred MB/s however fast the tier was.
// Between operators the stream keeps the tier busy within a node as well.
//
// The function runs inside the dispatch of the operator about to start (a record-function
// callback of this thread), with record functions off, so what it dispatches does not call it
// again. It is never run inside a parallel region. What it throws is kept, the pump disarms, and
// rethrow() throws it on the caller's terms. An OpPump must be destroyed on the thread that made
// it. A thread has one pump at a time: one made while another is installed stays inert.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <limits>
#include <thread>

namespace starling::swap {

class OpPump {
 public:
  // Installs the pump on this thread, disarmed (inert if the thread has one already).
  OpPump(std::function<void()> fn, double interval_s);
  ~OpPump();
  OpPump(const OpPump&) = delete;
  OpPump& operator=(const OpPump&) = delete;

  // Armed, `fn` may run before any operator this thread dispatches; disarmed, never. A call from
  // another thread than the maker's is ignored.
  void arm(bool on);
  // Throws what `fn` threw inside an operator, once.
  void rethrow();

  int64_t runs() const { return runs_; }

 private:
  static void on_operator();

  std::function<void()> fn_;
  double interval_s_;
  std::thread::id thread_;
  uint64_t handle_ = 0;
  bool armed_ = false, running_ = false;
  // Never ran: the first operator runs it. (Not 0: train::now_s() counts from the machine's
  // boot, so on a machine up for less than the interval the first run would wait for it.)
  double last_s_ = -std::numeric_limits<double>::infinity();
  int64_t runs_ = 0;
  std::exception_ptr error_;
};

}  // namespace starling::swap
