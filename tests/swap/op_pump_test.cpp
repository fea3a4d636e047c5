// The operator pump: armed, it runs between the operators this thread dispatches, and never
// otherwise; what it dispatches itself does not call it again; a failure inside an operator
// comes back through rethrow(); a thread's second pump stays inert.
#include "starling/swap/op_pump.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <stdexcept>
#include <thread>

namespace {

using starling::swap::OpPump;

void dispatch_some_operators() {
  at::Tensor a = at::ones({8});
  for (int i = 0; i < 10; ++i) a = a + 1;
}

TEST(OpPump, RunsBetweenOperatorsOnlyWhileArmed) {
  int calls = 0;
  OpPump pump([&] { ++calls; }, 0.0);
  dispatch_some_operators();
  EXPECT_EQ(calls, 0) << "a disarmed pump ran";
  pump.arm(true);
  dispatch_some_operators();
  EXPECT_GE(calls, 10);
  EXPECT_EQ(pump.runs(), calls);
  pump.arm(false);
  const int armed_calls = calls;
  dispatch_some_operators();
  EXPECT_EQ(calls, armed_calls);
}

TEST(OpPump, WhatItDispatchesDoesNotCallItAgain) {
  int depth = 0, deepest = 0, calls = 0;
  OpPump pump(
      [&] {
        ++calls;
        deepest = std::max(deepest, ++depth);
        at::Tensor b = at::zeros({4}) * 2;  // operators inside the pump
        --depth;
      },
      0.0);
  pump.arm(true);
  dispatch_some_operators();
  pump.arm(false);
  EXPECT_GE(calls, 10);
  EXPECT_EQ(deepest, 1);
}

TEST(OpPump, WaitsTheIntervalBetweenRuns) {
  int calls = 0;
  OpPump pump([&] { ++calls; }, 3600.0);
  pump.arm(true);
  dispatch_some_operators();
  pump.arm(false);
  EXPECT_EQ(calls, 1);
}

TEST(OpPump, OtherThreadsOperatorsDoNotRunIt) {
  int calls = 0;
  OpPump pump([&] { ++calls; }, 0.0);
  pump.arm(true);
  std::thread other(dispatch_some_operators);
  other.join();
  pump.arm(false);
  EXPECT_EQ(calls, 0);
}

TEST(OpPump, AFailureInsideAnOperatorIsRethrownAndDisarms) {
  int calls = 0;
  OpPump pump(
      [&] {
        ++calls;
        throw std::runtime_error("tier read failed");
      },
      0.0);
  pump.arm(true);
  EXPECT_NO_THROW(dispatch_some_operators());  // the operator itself is not failed
  EXPECT_EQ(calls, 1) << "the pump kept running after a failure";
  pump.arm(true);  // stays disarmed until the failure is collected
  dispatch_some_operators();
  EXPECT_EQ(calls, 1);
  try {
    pump.rethrow();
    FAIL() << "rethrow() did not throw";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "tier read failed");
  }
  EXPECT_NO_THROW(pump.rethrow());  // once
  pump.arm(true);
  dispatch_some_operators();
  EXPECT_GT(calls, 1);
}

TEST(OpPump, ASecondPumpOnAThreadStaysInert) {
  int first = 0, second = 0;
  OpPump pump([&] { ++first; }, 0.0);
  {
    OpPump later([&] { ++second; }, 0.0);
    later.arm(true);
    dispatch_some_operators();
    EXPECT_EQ(second, 0);
  }
  // The inert one's end leaves the first installed.
  pump.arm(true);
  dispatch_some_operators();
  pump.arm(false);
  EXPECT_GE(first, 10);
  EXPECT_EQ(second, 0);
}

}  // namespace
