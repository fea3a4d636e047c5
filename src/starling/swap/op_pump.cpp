#include "starling/swap/op_pump.h"

#include <ATen/Parallel.h>
#include <ATen/record_function.h>

#include "starling/train/metrics.h"

namespace starling::swap {
namespace {

thread_local OpPump* t_pump = nullptr;  // the pump installed on this thread, if any

}  // namespace

OpPump::OpPump(std::function<void()> fn, double interval_s)
    : fn_(std::move(fn)), interval_s_(interval_s), thread_(std::this_thread::get_id()) {
  if (t_pump != nullptr) return;  // the thread's first pump keeps it; this one stays inert
  t_pump = this;
  handle_ = at::addThreadLocalCallback(
      at::RecordFunctionCallback([](const at::RecordFunction&)
                                     -> std::unique_ptr<at::ObserverContext> {
        on_operator();
        return nullptr;
      }).scopes({at::RecordScope::FUNCTION}));
}

OpPump::~OpPump() {
  // Documented: destroyed by its maker's thread. An inert pump installed nothing.
  if (std::this_thread::get_id() != thread_ || t_pump != this) return;
  at::removeCallback(handle_);
  t_pump = nullptr;
}

void OpPump::arm(bool on) {
  if (std::this_thread::get_id() == thread_) armed_ = on && !error_;
}

void OpPump::rethrow() {
  if (!error_) return;
  std::exception_ptr e = std::move(error_);
  error_ = nullptr;
  std::rethrow_exception(e);
}

void OpPump::on_operator() {
  OpPump* p = t_pump;
  if (p == nullptr || !p->armed_ || p->running_ || at::in_parallel_region()) return;
  const double t = train::now_s();
  if (t - p->last_s_ < p->interval_s_) return;
  p->running_ = true;
  {
    at::DisableRecordFunctionGuard off;  // what fn dispatches does not come back here
    try {
      p->fn_();
    } catch (...) {
      p->error_ = std::current_exception();
      p->armed_ = false;
    }
  }
  p->running_ = false;
  p->last_s_ = train::now_s();
  ++p->runs_;
}

}  // namespace starling::swap
