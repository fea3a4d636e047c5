// The co2 outer update, step by step, against the formulas of DESIGN.md computed here by hand.
// A one-peer swarm (a real node on loopback) makes every average equal the peer's own delta, so
// the expected anchors follow from the deltas the test plants between boundaries. The same checks
// run with the parameters on a GPU when there is one: the outer state then lives on the device
// and the exchange goes through pinned staging on a side stream.
#include "starling/strategy/co2.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <utility>

#include "starling/net/nccl_backend.h"
#include "starling/net/node.h"
#include "starling/train/adamw.h"

namespace {

using namespace starling;

struct Harness {
  train::RunConfig config;
  graph::ParamStore params;
  std::unique_ptr<train::AdamW> optimizer;
  std::unique_ptr<net::Collectives> net;
  std::unique_ptr<strategy::Co2> co2;
  std::unique_ptr<train::Replica> replica;

  // backend "starling": a one-peer swarm; "nccl": a one-rank NCCL group (buffers on the GPU).
  Harness(const std::string& clip, double threshold, bool zero, const std::string& device = "cpu",
          const std::string& backend = "starling", int64_t local_steps = 2,
          int64_t overlap_steps = 0) {
    config.strategy.kind = "co2";
    config.strategy.local_steps = local_steps;
    config.strategy.overlap_steps = overlap_steps;
    config.strategy.outer_lr = 0.5;
    config.strategy.outer_momentum = 0.8;
    config.strategy.staleness_penalty = 2.0;
    config.strategy.clip = clip;
    config.strategy.clip_threshold = threshold;
    config.strategy.zero = zero;
    params.add("w", at::tensor({1.0f, -2.0f, 0.5f, 3.0f}).to(c10::Device(device)), true);
    params.add("b", at::tensor({0.25f, -0.75f}).to(c10::Device(device)), false);
    optimizer = std::make_unique<train::AdamW>(params, train::AdamWOptions{});
    if (backend == "nccl") {
      net::NcclOptions o;
      o.timeout = std::chrono::seconds(60);
      net = net::make_nccl_backend(o);
    } else {
      net::NodeOptions o;
      o.insecure = true;
      o.log = [](const std::string&) {};
      net = std::make_unique<net::Node>(o);
    }
    co2 = std::make_unique<strategy::Co2>(config, *net);
    replica = std::make_unique<train::Replica>(train::Replica{config, params, *optimizer});
    co2->start(*replica, nlohmann::json(), nullptr);
  }

  at::Tensor flat() {
    return at::cat({params.get("w").value.detach().flatten(), params.get("b").value.detach()})
        .cpu();
  }
  // Plays `steps` inner steps that move the parameters by -delta; returns what the last step's
  // step_done says (whether the parameters are the shared anchor).
  bool steps(const at::Tensor& delta, int64_t steps, bool last = false) {
    at::NoGradGuard g;
    const at::Tensor d = delta.to(params.get("w").value.device());
    params.get("w").value.sub_(d.narrow(0, 0, 4));
    params.get("b").value.sub_(d.narrow(0, 4, 2));
    for (int64_t i = 1; i < steps; ++i) {
      ++replica->step;
      EXPECT_FALSE(co2->step_done(*replica, false)) << "step " << replica->step;
    }
    ++replica->step;
    return co2->step_done(*replica, last);
  }
  // Plays tau inner steps that move the parameters by -delta, then the boundary.
  void round(const at::Tensor& delta, bool last = false) {
    EXPECT_TRUE(steps(delta, config.strategy.local_steps, last));
  }
};

at::Tensor clip(const at::Tensor& m, const std::string& mode, double phi) {
  if (mode == "value") return m.clamp(-phi, phi);
  if (mode == "norm") {
    const double n = m.norm().item<double>();
    return n > phi ? m * (phi / n) : m;
  }
  return m;
}

void check_against_formulas(const std::string& mode, double phi, bool zero,
                            const std::string& device = "cpu",
                            const std::string& backend = "starling", bool nesterov = false,
                            const std::string& final_step = "outer") {
  SCOPED_TRACE(mode + (zero ? " zero" : "") + (nesterov ? " Nesterov" : "") + " on " + device +
               " over " + backend + ", final step " + final_step);
  Harness h(mode, phi, zero, device, backend);
  h.config.strategy.outer_nesterov = nesterov;  // the strategy reads its config as it goes
  h.config.strategy.final_step = final_step;
  const auto& s = h.config.strategy;
  at::Tensor x = h.flat();
  at::Tensor m = at::zeros_like(x);
  const std::vector<at::Tensor> deltas = {at::tensor({0.1f, 0.2f, -0.1f, 0.3f, 0.05f, -0.02f}),
                                          at::tensor({0.3f, -0.1f, 0.2f, 0.1f, -0.04f, 0.06f}),
                                          at::tensor({-0.2f, 0.4f, 0.1f, 0.0f, 0.03f, 0.01f}),
                                          at::tensor({0.05f, 0.05f, -0.3f, 0.2f, 0.0f, -0.05f})};
  at::Tensor previous;  // Delta_{t-2}
  for (size_t t = 0; t < deltas.size(); ++t) {
    const bool last = t + 1 == deltas.size();
    h.round(deltas[t], last);
    // Round t applies Delta_{t-1} (the delta of the round before); the last also drains its own.
    const size_t first = t == 0 ? 1 : t - 1, end = last ? t + 1 : t;
    for (size_t k = first; k < end && t > 0; ++k) {
      const at::Tensor d = deltas[k];
      if (k == t && final_step == "average") {
        x = x - d;  // the drain moves the anchor to the peer's own (the peers' mean) parameters
        break;
      }
      double gap = 0;
      if (previous.defined())
        gap = (d - previous).norm().item<double>() / (previous.norm().item<double>() + 1e-8);
      const at::Tensor damped = d / (1 + s.staleness_penalty * gap);
      m = clip(m * s.outer_momentum + damped, mode, phi);
      // A round-late average takes the heavy ball's step even with outer_nesterov (co2.cpp).
      x = x - m * s.outer_lr;
      previous = d;
    }
    EXPECT_TRUE(at::allclose(h.flat(), x, 1e-5, 1e-6))
        << "round " << t << ": got " << h.flat() << " expected " << x;
  }
}

TEST(Co2Test, OuterUpdateFollowsTheFormulas) {
  check_against_formulas("none", 0, false);
  check_against_formulas("norm", 0.25, false);
  check_against_formulas("value", 0.1, false);
  // The published form keeps the heavy ball's step whatever outer_nesterov says.
  check_against_formulas("norm", 0.25, false, "cpu", "starling", true);
  check_against_formulas("norm", 0.25, false, "cpu", "starling", false, "average");
}

TEST(Co2Test, ZeroShardingGivesTheSameAnchors) {
  check_against_formulas("none", 0, true);
  check_against_formulas("norm", 0.25, true);
  check_against_formulas("norm", 0.25, true, "cpu", "starling", true);
  check_against_formulas("norm", 0.25, true, "cpu", "starling", false, "average");
}

TEST(Co2Test, OuterStateOnTheGpuFollowsTheFormulas) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no CUDA: this libtorch has no CUDA support or no GPU";
  check_against_formulas("none", 0, false, "cuda");
  check_against_formulas("norm", 0.25, false, "cuda");
  check_against_formulas("value", 0.1, false, "cuda");
  check_against_formulas("norm", 0.25, true, "cuda");
}

// The exchange straight from device memory: no host staging, NCCL on the GPU's vectors.
TEST(Co2Test, OuterStateOverNcclFollowsTheFormulas) {
  if (!net::nccl_available()) GTEST_SKIP() << "this libtorch has no NCCL";
  if (!at::hasCUDA()) GTEST_SKIP() << "no GPU";
  check_against_formulas("none", 0, false, "cuda", "nccl");
  check_against_formulas("norm", 0.25, false, "cuda", "nccl");
  check_against_formulas("norm", 0.25, true, "cuda", "nccl");
}

// overlap_steps = 2 of tau = 4: each round's delta is applied two steps into the next round, with
// no round of staleness (so no penalty), and the peer keeps the progress it made meanwhile. One
// peer: the average is its own delta. The progress of a round is u (its first two steps) + v (its
// last two), the first two steps' progress made on top of the previous anchor before it moved.
TEST(Co2Test, EarlyApplicationFollowsTheFormulas) {
  for (const auto& [nesterov, final_step] :
       {std::pair{false, "outer"}, std::pair{true, "outer"}, std::pair{true, "average"}}) {
    SCOPED_TRACE(std::string(nesterov ? "Nesterov's outer step" : "heavy ball") + ", final step " +
                 final_step);
    Harness h("norm", 0.25, false, "cpu", "starling", 4, 2);
    h.config.strategy.outer_nesterov = nesterov;  // the strategy reads its config as it goes
    h.config.strategy.final_step = final_step;
    const auto& s = h.config.strategy;
    const std::vector<at::Tensor> u = {at::tensor({0.1f, 0.2f, -0.1f, 0.3f, 0.05f, -0.02f}),
                                       at::tensor({0.3f, -0.1f, 0.2f, 0.1f, -0.04f, 0.06f}),
                                       at::tensor({-0.2f, 0.4f, 0.1f, 0.0f, 0.03f, 0.01f})};
    const std::vector<at::Tensor> v = {at::tensor({0.05f, 0.05f, -0.3f, 0.2f, 0.0f, -0.05f}),
                                       at::tensor({-0.1f, 0.1f, 0.0f, 0.2f, 0.02f, 0.0f}),
                                       at::tensor({0.2f, -0.3f, 0.1f, -0.1f, 0.01f, 0.04f})};
    at::Tensor x = h.flat(), m = at::zeros_like(x), previous;
    // No staleness penalty: an average applied inside the next round is not stale.
    auto apply = [&](const at::Tensor& d) {
      m = clip(m * s.outer_momentum + d, "norm", 0.25);
      x = nesterov ? x - (m * s.outer_momentum + d) * s.outer_lr : x - m * s.outer_lr;
    };
    at::Tensor delta = u[0];  // this round's progress from its anchor
    EXPECT_FALSE(h.steps(u[0], 2)) << "nothing is in flight in the first round";
    for (size_t t = 0; t < u.size(); ++t) {
      const bool last = t + 1 == u.size();
      delta = delta + v[t];
      EXPECT_EQ(h.steps(v[t], 2, last), last) << "a boundary launches; only the last applies";
      if (last) break;
      EXPECT_TRUE(h.steps(u[t + 1], 2)) << "round " << t << "'s average is applied here";
      apply(delta);
      EXPECT_TRUE(at::allclose(h.flat(), x, 1e-5, 1e-6))
          << "round " << t << ": got " << h.flat() << " expected the anchor " << x;
      delta = u[t + 1];  // made before the anchor moved, counted in the next round
    }
    // The drain: the last round's average at once, as an outer step or as the peers' mean.
    if (h.config.strategy.final_step == "average")
      x = x - delta;
    else
      apply(delta);
    EXPECT_TRUE(at::allclose(h.flat(), x, 1e-5, 1e-6)) << "got " << h.flat() << " expected " << x;
  }
}

TEST(Co2Test, ZeroKeepsOnlyShardsOfTheOuterState) {
  Harness plain("none", 0, false), zero("none", 0, true);
  // One peer owns every shard, so the saving shows only with more peers (see swarm_cli_test);
  // here both hold anchor, momentum, previous average and the send buffer: 4 x 6 floats, and
  // without zero its own part of the last exchange (to send again if it is not applied).
  EXPECT_EQ(plain.co2->state_bytes(), 5 * 4 * 6);
  EXPECT_EQ(zero.co2->state_bytes(), 4 * 4 * 6);
}

}  // namespace
