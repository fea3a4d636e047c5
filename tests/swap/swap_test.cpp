// The swap layer's parts on their own: sizes in configs, the planner's choices and errors on a
// synthetic model, and both tiers' transfers (the disk tier's bytes must bypass the page cache).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "starling/common/error.h"
#include "starling/swap/disk_tier.h"
#include "starling/swap/pinned_tier.h"
#include "starling/swap/profile.h"
#include "starling/swap/swap_config.h"
#include "starling/swap/swap_plan.h"
#include "starling/swap/tier.h"

namespace {

namespace fs = std::filesystem;
using namespace starling::swap;

TEST(SwapConfig, ParsesSizesWithUnits) {
  EXPECT_EQ(parse_bytes("2GB", "k"), 2000000000);
  EXPECT_EQ(parse_bytes("1.5 GiB", "k"), 1610612736);
  EXPECT_EQ(parse_bytes("512mb", "k"), 512000000);
  EXPECT_EQ(parse_bytes("4096B", "k"), 4096);
  EXPECT_EQ(parse_bytes("3KiB", "k"), 3072);
  // A unit is required: "6" is likelier a missing GB than 6 bytes.
  for (const char* bad : {"", "GB", "2 GBs", "1.2.3MB", "-5MB", "lots", "4096", "6"}) {
    try {
      parse_bytes(bad, "swap.budget");
      ADD_FAILURE() << "accepted \"" << bad << "\"";
    } catch (const starling::ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("swap.budget"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(format_bytes(1536e6), "1.54 GB");
  EXPECT_EQ(format_bytes(999), "999 B");
}

// An embedding (a large tied parameter), `layers` equal layers, a head reading the embedding,
// and a loss: the shape of a GPT-2.
SwapProblem model_problem(int layers, int64_t layer_bytes, int64_t embed_bytes) {
  SwapProblem p;
  p.param_bytes.push_back(embed_bytes);
  p.nodes.push_back({"embedding", 0.01, 0.02, {0}});
  for (int i = 0; i < layers; ++i) {
    p.param_bytes.push_back(layer_bytes);
    p.nodes.push_back({"layers." + std::to_string(i), 0.1, 0.2, {i + 1}});
  }
  p.nodes.push_back({"head", 0.05, 0.1, {0}});
  p.nodes.push_back({"loss", 0.001, 0.001, {}});
  p.read_bps = 1e9;
  p.write_bps = 5e8;
  p.optimizer_s = 0.05;
  return p;
}

// Weights, gradients and both AdamW moments of every parameter.
int64_t training_state(const SwapProblem& p) {
  int64_t state = 0;
  for (int64_t b : p.param_bytes) state += 4 * b;
  return state;
}

TEST(SwapPlan, TheWholeStateFittingMovesNothing) {
  SwapProblem p = model_problem(4, 4 << 20, 8 << 20);
  p.budget = int64_t{1} << 30;
  const SwapPlan plan = plan_swap(p);
  EXPECT_TRUE(plan.everything_resident);
  EXPECT_EQ(plan.read_bytes, 0);
  EXPECT_DOUBLE_EQ(plan.predicted_s, plan.compute_s);
  EXPECT_DOUBLE_EQ(plan.hidden_share(), 1.0);
  // A budget past the state is no share of it.
  EXPECT_NE(describe_plan(plan, p).find("of training state (all of it)"), std::string::npos)
      << describe_plan(plan, p);
}

TEST(SwapPlan, ATooSmallBudgetNamesTheSmallestFeasibleOne) {
  SwapProblem p = model_problem(4, 4 << 20, 8 << 20);
  p.budget = 10 << 20;
  try {
    plan_swap(p);
    FAIL() << "planned an infeasible budget";
  } catch (const starling::ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("smallest feasible budget is"), std::string::npos) << msg;
    // The head's group holds the 8 MiB embedding and its gradient, plus 24 staging chunks of
    // 2 MiB.
    EXPECT_NE(msg.find("67.1 MB"), std::string::npos) << msg;
  }
  p.budget = 64 << 20;
  EXPECT_NO_THROW(plan_swap(p));
}

TEST(SwapPlan, PlansStayUnderTheBudgetAndPinWhatFits) {
  SwapProblem p = model_problem(12, 4 << 20, 8 << 20);
  const int64_t state = training_state(p);
  for (double share : {0.9, 0.6, 0.45, 0.35}) {
    p.budget = static_cast<int64_t>(share * static_cast<double>(state));
    const SwapPlan plan = plan_swap(p);
    EXPECT_FALSE(plan.everything_resident);
    EXPECT_LE(plan.peak_bytes, p.budget) << share;
    // With room for every weight and gradient (half the state) plus the staging area, only the
    // moments move.
    size_t pinned = 0;
    for (const auto& g : plan.groups) pinned += g.pinned;
    if (share == 0.9) {
      EXPECT_EQ(pinned, plan.groups.size());
    }
    if (share == 0.35) {
      EXPECT_LT(pinned, plan.groups.size());
    }
    EXPECT_GE(plan.predicted_s, plan.compute_s - 1e-12);
    EXPECT_GE(plan.hidden_share(), 0.0);
    EXPECT_LE(plan.hidden_share(), 1.0);
    // Groups cover the nodes contiguously.
    int next = 0;
    for (const auto& g : plan.groups) {
      EXPECT_EQ(g.first, next);
      next = g.last + 1;
    }
    EXPECT_EQ(next, static_cast<int>(p.nodes.size()));
  }
}

// Layer loads hide behind compute, and so does the optimizer's own I/O (the moments streamed
// through the tier), which the next step's forward overlaps.
TEST(SwapPlan, ComputeBoundModelsHideTheirLayerLoads) {
  SwapProblem p = model_problem(12, 4 << 20, 4 << 20);
  for (auto& n : p.nodes) n.forward_s *= 10, n.backward_s *= 10;  // slow compute, fast tier
  const int64_t state = training_state(p);
  p.budget = state * 3 / 10;
  const SwapPlan plan = plan_swap(p);
  EXPECT_LT(plan.predicted_s, plan.compute_s + 0.9 * plan.io_s) << describe_plan(plan, p);
  EXPECT_LT(plan.predicted_s, plan.compute_s * 1.05) << describe_plan(plan, p);
}

// The deferred update: only the first group's parameters wait for their update before the next
// forward starts; the rest of the optimizer's transfers run behind the forward's compute.
TEST(SwapPlan, TheOptimizersTransfersHideBehindTheNextForward) {
  SwapProblem p = model_problem(12, 4 << 20, 4 << 20);
  const int64_t state = training_state(p);
  p.budget = state * 3 / 10;
  const SwapPlan plan = plan_swap(p);
  ASSERT_FALSE(plan.everything_resident);
  // At least both moments go in and out of the tier every step; run after the passes, that alone
  // would add optimizer_io to the step.
  const double optimizer_io = state / 2.0 / p.read_bps + state / 2.0 / p.write_bps;
  EXPECT_GT(optimizer_io, 0.1);
  EXPECT_LT(plan.predicted_s, plan.compute_s + 0.5 * optimizer_io) << describe_plan(plan, p);
  // The first group's share is exposed: a slower tier makes the step slower.
  SwapProblem slow = p;
  slow.read_bps /= 8;
  slow.write_bps /= 8;
  EXPECT_GT(plan_swap(slow).predicted_s, plan.predicted_s) << describe_plan(plan_swap(slow), slow);
}

// A computation slowed by the tier's transfers (SwapProblem::io_slowdown) lengthens the predicted
// step by the slowdown times the transfers it overlaps: nothing when nothing moves, and when the
// tier's copies are counted as computation already.
TEST(SwapPlan, ASlowdownWhileTheTierMovesLengthensThePredictedStep) {
  SwapProblem p = model_problem(12, 4 << 20, 4 << 20);
  for (auto& n : p.nodes) n.forward_s *= 10, n.backward_s *= 10;  // the transfers hide
  p.budget = training_state(p) * 3 / 10;
  const SwapPlan plain = plan_swap(p);
  EXPECT_EQ(plain.slowed_s, 0.0);
  SwapProblem slowed = p;
  slowed.io_slowdown = 0.5;
  const SwapPlan plan = plan_swap(slowed);
  // Hidden transfers overlap the computation for nearly all their time.
  EXPECT_GT(plan.slowed_s, 0.5 * 0.8 * plan.io_s) << describe_plan(plan, slowed);
  EXPECT_LE(plan.slowed_s, 0.5 * plan.io_s + 1e-9) << describe_plan(plan, slowed);
  // The slowdown can only lengthen the best step, and the best plan without it stays the best.
  EXPECT_GE(plan.predicted_s - plan.slowed_s, plain.predicted_s - 1e-9);
  EXPECT_GT(plan.predicted_s, plain.predicted_s);
  EXPECT_NE(describe_plan(plan, slowed).find("50% slower while the tier moves data"),
            std::string::npos)
      << describe_plan(plan, slowed);
  SwapProblem copies = slowed;
  copies.copies_take_compute = true;
  EXPECT_EQ(plan_swap(copies).slowed_s, 0.0);
  slowed.budget = int64_t{1} << 30;
  EXPECT_DOUBLE_EQ(plan_swap(slowed).predicted_s, plan_swap(slowed).compute_s);
}

// With clipping, "auto" may start the update inside the backward as a guess; where it finds
// that guessing does not pay, the plan says the update could start there, and that it will not.
TEST(SwapPlan, ADeclinedGuessIsSaidToBeOnlyPossible) {
  SwapProblem p = model_problem(12, 4 << 20, 4 << 20);
  p.budget = training_state(p) * 3 / 10;
  p.update_in_backward = true;
  p.speculation = Speculation::kAfterUnclipped;
  p.guess_break_even = 1;  // never pays
  const std::string declined = describe_plan(plan_swap(p), p);
  EXPECT_NE(declined.find("the update could start inside the backward"), std::string::npos)
      << declined;
  EXPECT_NE(declined.find("\"auto\" guesses nothing"), std::string::npos) << declined;
  p.guess_break_even = 0;  // always pays
  const std::string taken = describe_plan(plan_swap(p), p);
  EXPECT_NE(taken.find("the update starts inside the backward"), std::string::npos) << taken;
  EXPECT_EQ(taken.find("guesses nothing"), std::string::npos) << taken;
}

// A token table whose lookup's rows go first (swapper.h): its update no longer stands between
// the backward and the next forward but is spread over the later layers' forwards, where the tier
// has time to spare, so a step is predicted shorter than with the table updated whole first.
TEST(SwapPlan, ATableWhoseRowsGoFirstSpreadsItsUpdate) {
  SwapProblem p = model_problem(12, 16 << 20, 96 << 20);
  p.nodes[0].rows = {0};  // the embedding reads its table by row; the head reads it whole
  p.read_bps = 4e9;
  p.write_bps = 2e9;
  p.budget = training_state(p) * 3 / 10;
  SwapProblem whole = p;
  whole.rows_first = false;
  const SwapPlan spread = plan_swap(p), first = plan_swap(whole);
  ASSERT_FALSE(spread.everything_resident);
  // The table's moments in and out, which the whole update waits for before the first layer.
  const double table_io = 2.0 * (96 << 20) / p.read_bps + 2.0 * (96 << 20) / p.write_bps;
  EXPECT_LT(spread.predicted_s, first.predicted_s - 0.5 * table_io)
      << describe_plan(spread, p) << describe_plan(first, whole);
}

// Layer groups may be finer than the largest node: with a table as large as GPT-2's (its head a
// group of its own), small groups of layers leave the room to pin the head, whose weight and
// gradient then never move, where groups at least the head's size could pin nothing.
TEST(SwapPlan, GroupsMayBeFinerThanTheLargestNode) {
  SwapProblem p = model_problem(12, 16 << 20, 96 << 20);
  const int64_t state = training_state(p);
  p.budget = state * 3 / 10;
  const SwapPlan plan = plan_swap(p);
  int64_t head = 0, largest_other = 0;
  bool head_pinned = false;
  for (const auto& g : plan.groups) {
    if (g.first <= 13 && 13 <= g.last) {  // the head's group
      head = g.bytes;
      head_pinned = g.pinned;
    } else if (g.first > 0) {  // neither the head's nor the embedding's (the same table)
      largest_other = std::max(largest_other, g.bytes);
    }
  }
  EXPECT_LT(largest_other, head) << describe_plan(plan, p);
  EXPECT_TRUE(head_pinned) << describe_plan(plan, p);
  // The table is in the embedding's group and the head's: the plan says it counts it twice.
  EXPECT_NE(describe_plan(plan, p).find("201 MB of weights+grads are read by more than one group"),
            std::string::npos)
      << describe_plan(plan, p);
  // Fixed coarse groups (every 4 nodes) leave no room to pin the head, and move more.
  SwapProblem coarse = p;
  coarse.group_nodes = 4;
  const SwapPlan fixed = plan_swap(coarse);
  EXPECT_LT(plan.read_bytes, fixed.read_bytes) << describe_plan(fixed, coarse);
}

// Half the training state in a tier slow enough to bound the step, fixed groups of two nodes
// and depth 1: plans that differ only in how the tier moves bytes.
SwapProblem tier_bound_problem() {
  SwapProblem p = model_problem(12, 4 << 20, 4 << 20);
  p.read_bps = p.write_bps = 1e8;
  p.budget = training_state(p) / 2;
  p.group_nodes = 2;
  p.depth = 1;
  return p;
}

// A duplex tier (a GPU's copy engines, one each way) moves loads and stores at once: the same
// plan's transfers take the longer direction's time, not the sum, and the step is shorter when
// the tier bounds it.
TEST(SwapPlan, ADuplexTierOverlapsReadsWithWrites) {
  SwapProblem p = tier_bound_problem();
  const SwapPlan simplex = plan_swap(p);
  p.duplex = true;
  const SwapPlan duplex = plan_swap(p);
  ASSERT_EQ(duplex.read_bytes, simplex.read_bytes);
  ASSERT_EQ(duplex.write_bytes, simplex.write_bytes);
  EXPECT_DOUBLE_EQ(simplex.io_s, (simplex.read_bytes + simplex.write_bytes) / 1e8);
  EXPECT_DOUBLE_EQ(duplex.io_s, std::max(duplex.read_bytes, duplex.write_bytes) / 1e8);
  EXPECT_LT(duplex.predicted_s, 0.9 * simplex.predicted_s) << describe_plan(duplex, p);
  EXPECT_GE(duplex.predicted_s, duplex.io_s) << describe_plan(duplex, p);
  EXPECT_NE(describe_plan(duplex, p).find("at once"), std::string::npos);
}

// A tier the compute device addresses (host RAM below a CPU) is updated in place: the
// optimizer's operands (both moments, the moving gradients) never cross it, so the plan moves
// fewer bytes (by at least half the moments' bytes each way, whatever it pins) and is faster.
TEST(SwapPlan, ATierUpdatedInPlaceMovesNoOptimizerState) {
  SwapProblem p = tier_bound_problem();
  p.moment_groups = 0;
  const SwapPlan copied = plan_swap(p);
  p.in_place = true;
  const SwapPlan in_place = plan_swap(p);
  const int64_t moments = training_state(p) / 2;
  EXPECT_LE(in_place.read_bytes, copied.read_bytes - moments / 2) << describe_plan(in_place, p);
  EXPECT_LE(in_place.write_bytes, copied.write_bytes - moments / 2) << describe_plan(in_place, p);
  EXPECT_LT(in_place.predicted_s, copied.predicted_s) << describe_plan(in_place, p);
  // Nothing is staged, so the budget keeps no room for it.
  EXPECT_GT(copied.staging_bytes, 0);
  EXPECT_EQ(in_place.staging_bytes, 0);
  EXPECT_NE(describe_plan(in_place, p).find("no staging"), std::string::npos);
}

// Host RAM below a CPU whose threads fill its cores: the copies take the cores from the
// computation, so a plan's step is its compute plus every copy, nothing hidden, and the planner
// moves fewer bytes for it than where the copies overlap.
TEST(SwapPlan, CopiesMadeByTheComputesCoresAddToItsTime) {
  SwapProblem p = model_problem(12, 4 << 20, 4 << 20);
  for (auto& n : p.nodes) n.forward_s *= 10, n.backward_s *= 10;  // loads would hide
  p.read_bps = p.write_bps = 1e9;
  p.tier = "host";
  p.in_place = true;
  p.budget = training_state(p) * 4 / 10;
  const SwapPlan overlapped = plan_swap(p);
  ASSERT_GT(overlapped.io_s, 0) << describe_plan(overlapped, p);
  EXPECT_GT(overlapped.hidden_share(), 0.5) << describe_plan(overlapped, p);  // but the first load
  p.copies_take_compute = true;
  const SwapPlan serial = plan_swap(p);
  ASSERT_GT(serial.io_s, 0) << describe_plan(serial, p);
  EXPECT_NEAR(serial.predicted_s, serial.compute_s + serial.io_s, 1e-9) << describe_plan(serial, p);
  EXPECT_NEAR(serial.hidden_share(), 0, 1e-9);
  EXPECT_LE(serial.read_bytes + serial.write_bytes, overlapped.read_bytes + overlapped.write_bytes)
      << describe_plan(serial, p) << describe_plan(overlapped, p);
  EXPECT_NE(describe_plan(serial, p).find("copied by the cores that compute"), std::string::npos);
  // The same grouping's step, copies overlapped, is the shorter one.
  SwapProblem fixed = p;
  fixed.group_nodes = 2;
  fixed.depth = 1;
  const SwapPlan fixed_serial = plan_swap(fixed);
  fixed.copies_take_compute = false;
  const SwapPlan fixed_overlapped = plan_swap(fixed);
  ASSERT_EQ(fixed_serial.read_bytes, fixed_overlapped.read_bytes);
  EXPECT_GT(fixed_serial.predicted_s, fixed_overlapped.predicted_s + 0.5 * fixed_serial.io_s)
      << describe_plan(fixed_serial, fixed) << describe_plan(fixed_overlapped, fixed);
}

// Without clipping, the update of every group but the first starts inside the backward, whose
// longer passes leave the tier idle time, instead of inside the next forward: a step whose
// forward is tier-bound, though the whole step has room for its transfers, is shorter.
TEST(SwapPlan, UpdatesStartedInsideTheBackwardShortenATierBoundForward) {
  SwapProblem p = tier_bound_problem();
  p.read_bps = p.write_bps = 2e8;
  const SwapPlan after = plan_swap(p);
  ASSERT_LT(after.io_s, after.compute_s) << describe_plan(after, p);
  p.update_in_backward = true;
  const SwapPlan inside = plan_swap(p);
  EXPECT_LT(inside.predicted_s, 0.95 * after.predicted_s)
      << describe_plan(after, p) << describe_plan(inside, p);
  EXPECT_GE(inside.predicted_s, inside.io_s) << describe_plan(inside, p);
  EXPECT_NE(describe_plan(inside, p).find("inside the backward (no clipping)"), std::string::npos);
  // With clipping the same schedule is a guess (swapper.h); the plan says when it is made.
  p.speculation = Speculation::kAfterUnclipped;
  const SwapPlan guess = plan_swap(p);
  EXPECT_EQ(guess.speculation, Speculation::kAfterUnclipped);
  EXPECT_DOUBLE_EQ(guess.predicted_s, inside.predicted_s);
  EXPECT_NE(
      describe_plan(guess, p).find("after a step that was not clipped, where the tier has room"),
      std::string::npos)
      << describe_plan(guess, p);
  // A step not guessed runs as planned without the guess, no faster than that plan; one whose
  // guess is redone pays that and the guess's wasted transfers besides.
  EXPECT_GE(guess.unguessed_s, 0.999 * after.predicted_s) << describe_plan(after, p);
  EXPECT_GT(guess.unguessed_s, guess.predicted_s);
  EXPECT_GT(guess.redone_s, guess.unguessed_s);
  char line[160];
  std::snprintf(line, sizeof line,
                "predicted %.3f s a step when the guess is kept, %.3f s when it is redone, %.3f s "
                "without a guess",
                guess.predicted_s, guess.redone_s, guess.unguessed_s);
  EXPECT_NE(describe_plan(guess, p).find(line), std::string::npos) << describe_plan(guess, p);
  // Guessing pays when the kept share q has q * (unguessed - kept) > (1 - q) * (redone -
  // unguessed); "auto" says from which share it guesses.
  EXPECT_NEAR(guess.break_even,
              (guess.redone_s - guess.unguessed_s) / (guess.redone_s - guess.predicted_s), 1e-12);
  ASSERT_GT(guess.break_even, 0);
  ASSERT_LT(guess.break_even, 1);
  std::snprintf(line, sizeof line, "while more than %.0f%% of the recent steps after one",
                100 * guess.break_even);
  EXPECT_NE(describe_plan(guess, p).find(line), std::string::npos) << describe_plan(guess, p);
  // Without a guess there is nothing else to predict.
  EXPECT_EQ(inside.redone_s, 0);
  EXPECT_EQ(describe_plan(inside, p).find("when it is redone"), std::string::npos);
}

// Where the tier keeps up with the compute, the update is hidden with or without a guess: a kept
// guess saves nothing, a redone one costs, and "auto" guesses nothing unless told otherwise.
TEST(SwapPlan, AutoGuessesNothingWhereAKeptGuessSavesLittle) {
  SwapProblem p = tier_bound_problem();
  p.read_bps = p.write_bps = 1e12;
  p.update_in_backward = true;
  p.speculation = Speculation::kAfterUnclipped;
  const SwapPlan plan = plan_swap(p);
  ASSERT_GT(plan.redone_s, 0) << describe_plan(plan, p);
  EXPECT_LT(plan.unguessed_s - plan.predicted_s, kMinGuessGain * plan.unguessed_s)
      << describe_plan(plan, p);
  EXPECT_GE(plan.break_even, 1);
  EXPECT_NE(describe_plan(plan, p).find("\"auto\" guesses nothing: a kept guess saves under 2%"),
            std::string::npos)
      << describe_plan(plan, p);
  // swap.guess_break_even overrides the planner's share.
  p.guess_break_even = 0.25;
  const SwapPlan told = plan_swap(p);
  EXPECT_EQ(told.break_even, 0.25);
  EXPECT_NE(describe_plan(told, p).find("more than 25% of the recent steps after one were not "
                                        "clipped either (swap.guess_break_even)"),
            std::string::npos)
      << describe_plan(told, p);
}

// "auto" counts, over the latest steps after an unclipped one, how many were unclipped too.
TEST(GuessRecord, GuessesWhileEnoughOfTheLatestStepsWouldHaveKeptTheGuess) {
  GuessRecord r;
  EXPECT_DOUBLE_EQ(r.keep_rate(), 0.5);  // nothing counted yet
  EXPECT_TRUE(r.worth_guessing(0.3));
  EXPECT_FALSE(r.worth_guessing(0.6));
  for (int i = 0; i < 3; ++i) r.add(false);
  EXPECT_DOUBLE_EQ(r.keep_rate(), 1.0 / 5);
  EXPECT_FALSE(r.worth_guessing(0.3));
  for (int i = 0; i < GuessRecord::kWindow; ++i) r.add(true);
  // The old misses have left the window.
  EXPECT_EQ(r.counted(), GuessRecord::kWindow);
  EXPECT_EQ(r.kept(), GuessRecord::kWindow);
  EXPECT_DOUBLE_EQ(r.keep_rate(), (GuessRecord::kWindow + 1.0) / (GuessRecord::kWindow + 2.0));
  EXPECT_TRUE(r.worth_guessing(0.9));
  EXPECT_FALSE(r.worth_guessing(1.0));  // a share of 1 or more: never
  r.add(false);
  EXPECT_EQ(r.kept(), GuessRecord::kWindow - 1);
}

// Without staging, the smallest budget is the largest group's weights and gradients alone.
TEST(SwapPlan, ATierUpdatedInPlaceNeedsNoRoomForStaging) {
  SwapProblem p = model_problem(4, 4 << 20, 8 << 20);
  p.in_place = true;
  p.budget = 16 << 20;  // the embedding and its gradient: 67.1 MB with staging
  EXPECT_NO_THROW(plan_swap(p));
  p.budget = 15 << 20;
  try {
    plan_swap(p);
    FAIL() << "planned an infeasible budget";
  } catch (const starling::ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("smallest feasible budget is 16.8 MB"), std::string::npos) << msg;
    EXPECT_EQ(msg.find("staging"), std::string::npos) << msg;
  }
}

TEST(SwapPlan, OverridesAreFollowed) {
  SwapProblem p = model_problem(8, 4 << 20, 4 << 20);
  const int64_t state = training_state(p);
  p.budget = state / 2;
  p.group_nodes = 2;
  p.depth = 1;
  const SwapPlan plan = plan_swap(p);
  EXPECT_EQ(plan.depth, 1);
  ASSERT_EQ(plan.groups.size(), 6u);  // 11 nodes in twos
  for (size_t i = 0; i + 1 < plan.groups.size(); ++i)
    EXPECT_EQ(plan.groups[i].last - plan.groups[i].first, 1);
}

// The first group's update waits at the step's start with nothing to hide behind, and every
// moment crosses the tier in the forward: where the budget holds the embedding's moments, the
// planner keeps them, and the step is shorter than with every moment in the tier.
TEST(SwapPlan, TheFirstGroupsMomentsStayWhereTheyPay) {
  SwapProblem p = model_problem(12, 4 << 20, 16 << 20);
  p.budget = training_state(p) * 6 / 10;
  const SwapPlan plan = plan_swap(p);
  ASSERT_FALSE(plan.everything_resident);
  ASSERT_FALSE(plan.groups.empty());
  EXPECT_TRUE(plan.groups[0].moments) << describe_plan(plan, p);
  EXPECT_LE(plan.peak_bytes, p.budget) << describe_plan(plan, p);
  // Kept moments are never the later groups' alone: they run from the first group on.
  bool gap = false;
  for (const auto& g : plan.groups) {
    if (!g.moments) gap = true;
    EXPECT_FALSE(gap && g.moments) << describe_plan(plan, p);
  }
  EXPECT_NE(describe_plan(plan, p).find("in compute memory, the rest in the tier"),
            std::string::npos)
      << describe_plan(plan, p);

  SwapProblem tier_only = p;
  tier_only.moment_groups = 0;
  const SwapPlan without = plan_swap(tier_only);
  for (const auto& g : without.groups) EXPECT_FALSE(g.moments);
  // Faster, although it may move more bytes in all (fewer weights and gradients pinned): what
  // it saves is the transfers nothing overlaps.
  EXPECT_LT(plan.predicted_s, without.predicted_s) << describe_plan(without, tier_only);
}

// swap.moment_groups fixes how many groups keep their moments, and the smallest feasible budget
// then holds them.
TEST(SwapPlan, FixedMomentGroupsAreFollowedAndBudgeted) {
  SwapProblem p = model_problem(4, 4 << 20, 8 << 20);
  p.moment_groups = 1;
  p.budget = 70 << 20;  // enough without the moments (67.1 MB), not with them
  try {
    plan_swap(p);
    FAIL() << "planned an infeasible budget";
  } catch (const starling::ConfigError& e) {
    const std::string msg = e.what();
    // The embedding's two moments (16 MiB) on top of the 64 MiB of the test above.
    EXPECT_NE(msg.find("smallest feasible budget is 83.9 MB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("swap.moment_groups = 1"), std::string::npos) << msg;
  }
  p.budget = 84 << 20;
  const SwapPlan least = plan_swap(p);
  EXPECT_TRUE(least.groups[0].moments) << describe_plan(least, p);
  EXPECT_LE(least.peak_bytes, p.budget);

  SwapProblem deeper = model_problem(12, 4 << 20, 8 << 20);
  deeper.budget = training_state(deeper) * 6 / 10;
  deeper.moment_groups = 2;
  const SwapPlan two = plan_swap(deeper);
  ASSERT_GE(two.groups.size(), 3u);
  for (size_t i = 0; i < two.groups.size(); ++i)
    EXPECT_EQ(two.groups[i].moments, i < 2) << describe_plan(two, deeper);
  EXPECT_LE(two.peak_bytes, deeper.budget);
}

// ---- tiers ----

void round_trip(Tier& tier) {
  constexpr size_t kBytes = (size_t{3} << 20) + 1000;  // not a multiple of the alignment
  std::mt19937 rng(5);
  std::vector<uint64_t> keys;
  std::vector<char*> bufs;
  for (int i = 0; i < 3; ++i) {
    keys.push_back(tier.reserve(kBytes));
    char* b = static_cast<char*>(std::aligned_alloc(kSwapAlign, align_up(kBytes)));
    for (size_t k = 0; k < kBytes; ++k) b[k] = static_cast<char>(rng());
    bufs.push_back(b);
  }
  std::vector<Ticket> t;
  for (int i = 0; i < 3; ++i) t.push_back(tier.write(keys[i], 0, bufs[i], kBytes));
  for (Ticket x : t) tier.wait(x);
  char* back = static_cast<char*>(std::aligned_alloc(kSwapAlign, align_up(kBytes)));
  for (int i = 2; i >= 0; --i) {
    std::memset(back, 0, align_up(kBytes));
    tier.wait(tier.read(keys[i], 0, back, kBytes));
    EXPECT_EQ(std::memcmp(back, bufs[i], kBytes), 0) << "tensor " << i;
  }
  // A slice at an aligned offset, written and read back alone.
  std::memset(back, 7, kSwapAlign);
  tier.wait(tier.write(keys[1], 2 * kSwapAlign, back, kSwapAlign));
  std::memset(back, 0, align_up(kBytes));
  tier.wait(tier.read(keys[1], 0, back, kBytes));
  EXPECT_EQ(std::memcmp(back, bufs[1], 2 * kSwapAlign), 0);
  EXPECT_EQ(back[2 * kSwapAlign], 7);
  EXPECT_EQ(std::memcmp(back + 3 * kSwapAlign, bufs[1] + 3 * kSwapAlign, kBytes - 3 * kSwapAlign),
            0);
  EXPECT_TRUE(tier.done(t.back()));
  // A room never written reads as zeros (fresh AdamW moments start out there unwritten).
  const uint64_t fresh = tier.reserve(kBytes);
  std::memset(back, 0x5a, align_up(kBytes));
  tier.wait(tier.read(fresh, 0, back, kBytes));
  EXPECT_TRUE(std::all_of(back, back + kBytes, [](char c) { return c == 0; }));
  std::free(back);
  for (char* b : bufs) std::free(b);
}

TEST(SwapTier, HostRoundTrip) { round_trip(*make_tier("host", "")); }

// The host tier's waiter copies what is queued up to its own request rather than blocking on the
// idle-priority worker, and copies finishing out of order still complete every ticket. The worker
// may hold one copy for as long as the machine keeps it off a core (it runs at idle priority), so
// a wait promises only its own request: the reads below come after waits for every write.
TEST(SwapTier, HostWaitersCopyWhatIsQueued) {
  auto tier = make_tier("host", "");
  constexpr int kCopies = 200;
  constexpr size_t kBytes = 64 << 10;
  std::vector<uint64_t> keys;
  std::vector<char*> bufs;
  for (int i = 0; i < kCopies; ++i) {
    keys.push_back(tier->reserve(kBytes));
    bufs.push_back(static_cast<char*>(std::aligned_alloc(kSwapAlign, kBytes)));
    std::memset(bufs.back(), i % 251, kBytes);
  }
  std::vector<Ticket> t;
  for (int i = 0; i < kCopies; ++i) t.push_back(tier->write(keys[i], 0, bufs[i], kBytes));
  tier->wait(t[kCopies / 2]);
  EXPECT_TRUE(tier->done(t[kCopies / 2]));
  // Everything queued before it was copied by the waiter, but for the one the worker may hold.
  int pending = 0;
  for (int i = 0; i < kCopies / 2; ++i) pending += tier->done(t[i]) ? 0 : 1;
  EXPECT_LE(pending, 1);
  for (Ticket x : t) tier->wait(x);
  for (Ticket x : t) EXPECT_TRUE(tier->done(x));
  char* back = static_cast<char*>(std::aligned_alloc(kSwapAlign, kBytes));
  for (int i = 0; i < kCopies; ++i) {
    tier->wait(tier->read(keys[i], 0, back, kBytes));
    EXPECT_EQ(std::memcmp(back, bufs[i], kBytes), 0) << "copy " << i;
  }
  std::free(back);
  for (char* b : bufs) std::free(b);
}

// A GPU's tier: bytes made by kernels still queued on the compute stream go out as they will be
// once those kernels ran, come back equal, and a fresh room reads as zeros.
TEST(SwapTier, PinnedRoundTripOnTheGpu) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no GPU: this libtorch has no CUDA support or sees no GPU";
  const c10::Device gpu("cuda");
  auto tier = make_tier("host", "", gpu);
  EXPECT_NE(tier->describe().find("pinned"), std::string::npos) << tier->describe();
  const auto u8 = at::TensorOptions().dtype(at::kByte).device(gpu);
  constexpr int64_t n = (int64_t{3} << 20) + 100;  // not a multiple of anything
  std::vector<uint64_t> keys;
  std::vector<at::Tensor> made;
  std::vector<Ticket> t;
  for (int i = 0; i < 3; ++i) {
    keys.push_back(tier->reserve(n));
    // Queued behind a matrix product, so the copy must wait for the compute stream.
    at::Tensor busy = at::rand({2048, 2048}, at::TensorOptions().device(gpu));
    at::Tensor x = (at::mm(busy, busy).sum() * 0 + i + 1).to(at::kByte).expand({n}).contiguous();
    made.push_back(x);
    t.push_back(tier->write(keys.back(), 0, x.data_ptr(), n));
  }
  for (Ticket x : t) tier->wait(x);
  for (int i = 2; i >= 0; --i) {
    at::Tensor back = at::zeros({n}, u8);
    tier->wait(tier->read(keys[i], 0, back.data_ptr(), n));
    EXPECT_TRUE(at::equal(back, made[i])) << "tensor " << i;
  }
  // A slice at an odd offset.
  at::Tensor seven = at::full({1000}, 7, u8);
  tier->wait(tier->write(keys[1], 12345, seven.data_ptr(), 1000));
  at::Tensor back = at::zeros({n}, u8);
  tier->wait(tier->read(keys[1], 0, back.data_ptr(), n));
  EXPECT_EQ(back.narrow(0, 12345, 1000).eq(7).all().item<bool>(), true);
  EXPECT_EQ(back.narrow(0, 0, 12345).eq(2).all().item<bool>(), true);
  EXPECT_TRUE(tier->done(t.back()));
  const uint64_t fresh = tier->reserve(n);
  at::Tensor z = at::full({n}, 0x5a, u8);
  tier->wait(tier->read(fresh, 0, z.data_ptr(), n));
  EXPECT_EQ(z.eq(0).all().item<bool>(), true);
  // A disk below a GPU's memory is not built: a clear error.
  EXPECT_THROW(make_tier("disk", fs::temp_directory_path(), gpu), starling::ConfigError);
}

// Ordered on the device, not by the host: a load queued after order_copies_after(write) reads
// what the write stored, and kernels queued after order_after(load) see the loaded bytes, though
// the host never waited for either copy (a matrix product keeps the write queued behind it).
TEST(SwapTier, PinnedCopiesAreOrderedOnTheGpu) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no GPU: this libtorch has no CUDA support or sees no GPU";
  const c10::Device gpu("cuda");
  auto tier = make_tier("host", "", gpu);
  ASSERT_TRUE(tier->orders_on_device());
  const auto u8 = at::TensorOptions().dtype(at::kByte).device(gpu);
  constexpr int64_t n = int64_t{16} << 20;
  const uint64_t key = tier->reserve(n);
  for (int round = 1; round <= 4; ++round) {
    at::Tensor busy = at::rand({4096, 4096}, at::TensorOptions().device(gpu));
    at::Tensor x = (at::mm(busy, busy).sum() * 0 + round).to(at::kByte).expand({n}).contiguous();
    tier->order_copies_after(tier->write(key, 0, x.data_ptr(), n));
    at::Tensor back = at::zeros({n}, u8);
    tier->order_after(tier->read(key, 0, back.data_ptr(), n));
    EXPECT_EQ(back.eq(round).all().item<bool>(), true) << "round " << round;
  }
  // On the CPU's tiers both orderings are waits.
  EXPECT_FALSE(make_tier("host", "")->orders_on_device());
}

// The probe behind swap.io_slowdown: threads that take the computation's cores slow it by a
// large share; a thread that sleeps does not.
TEST(SwapProfile, TheSlowdownProbeSeesCoresTakenAndNotASleepingThread) {
  using namespace std::chrono_literals;
  // The computation on every CPU, as training runs by default (train.threads = 0): with a CPU to
  // spare, the scheduler would give the spinners that one.
  const unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
  const int threads = at::get_num_threads();
  at::set_num_threads(static_cast<int>(cpus));
  const auto spin = [cpus] {
    // A spinning thread on every CPU, for 5 ms each time.
    std::vector<std::thread> spinners;
    for (unsigned i = 0; i < cpus; ++i)
      spinners.emplace_back([] {
        const auto until = std::chrono::steady_clock::now() + 5ms;
        while (std::chrono::steady_clock::now() < until) {
        }
      });
    for (auto& t : spinners) t.join();
  };
  // A sleeper's wake-ups still preempt the computation's threads now and then (up to 0.5 here
  // beside another busy test); the spinners take half of every core (0.5-8.7 here, the parallel
  // regions waiting for their slowest thread). A virtual machine's noise can blur one pair of
  // probes, so up to three pairs are taken until one shows the difference.
  double idle = 0, taken = 0;
  const auto apart = [&] { return idle < 1.0 && taken > 0.8 && taken > 2 * idle + 0.5; };
  for (int attempt = 0; attempt < 3 && (attempt == 0 || !apart()); ++attempt) {
    idle = probe_slowdown([] { std::this_thread::sleep_for(5ms); });
    taken = probe_slowdown(spin);
    std::cout << "slowdown beside a sleeping thread " << idle << ", beside spinning ones " << taken
              << std::endl;
  }
  at::set_num_threads(threads);
  EXPECT_GE(idle, 0.0);
  EXPECT_TRUE(apart()) << "idle " << idle << ", taken " << taken << ", " << cpus << " threads";
  // A failure beside the computation (a tier's I/O error) reaches the caller.
  EXPECT_THROW(probe_slowdown([] { throw starling::Error("disk gone"); }), starling::Error);
}

TEST(SwapTier, DiskRoundTrip) {
  const fs::path dir = fs::temp_directory_path() / "starling_tier_test";
  auto tier = make_tier("disk", dir);
  EXPECT_NE(tier->describe().find("O_DIRECT"), std::string::npos);
  round_trip(*tier);
  tier.reset();
  // The file was unlinked while open: nothing is left behind.
  EXPECT_TRUE(fs::is_empty(dir));
  fs::remove_all(dir);
}

// One transfer of more chunks than the ring holds: queuing its last chunks reaps its first ones.
TEST(SwapTier, DiskTransferLargerThanTheRing) {
  constexpr size_t kBytes = size_t{520} << 20;  // 65 chunks of 8 MB; the ring holds 64
  const fs::path dir = fs::temp_directory_path() / "starling_tier_ring_test";
  auto tier = make_tier("disk", dir);
  const uint64_t key = tier->reserve(kBytes);
  auto* buf = static_cast<uint32_t*>(std::aligned_alloc(kSwapAlign, kBytes));
  for (size_t i = 0; i < kBytes / 4; ++i) buf[i] = static_cast<uint32_t>(i);
  tier->wait(tier->write(key, 0, buf, kBytes));
  std::memset(buf, 0, kBytes);
  tier->wait(tier->read(key, 0, buf, kBytes));
  size_t wrong = 0;
  for (size_t i = 0; i < kBytes / 4; ++i) wrong += buf[i] != static_cast<uint32_t>(i);
  EXPECT_EQ(wrong, 0u);
  std::free(buf);
  tier.reset();
  fs::remove_all(dir);
}

// A signal handled while the training thread waits for the disk (SIGINT asks a run to stop at the
// next step) does not fail the transfer: the wait goes on.
TEST(SwapTier, DiskWaitsThroughSignals) {
  struct sigaction quiet = {}, before = {};
  quiet.sa_handler = [](int) {};
  sigemptyset(&quiet.sa_mask);
  quiet.sa_flags = 0;  // no SA_RESTART: a blocked wait returns EINTR
  ASSERT_EQ(sigaction(SIGUSR1, &quiet, &before), 0);
  constexpr size_t kBytes = size_t{256} << 20;
  const fs::path dir = fs::temp_directory_path() / "starling_tier_signal_test";
  auto tier = make_tier("disk", dir);
  const uint64_t key = tier->reserve(kBytes);
  auto* buf = static_cast<uint32_t*>(std::aligned_alloc(kSwapAlign, kBytes));
  for (size_t i = 0; i < kBytes / 4; ++i) buf[i] = static_cast<uint32_t>(i * 7);
  const pthread_t waiter = pthread_self();
  std::atomic<bool> done{false};
  std::atomic<int> sent{0};
  std::thread signaller([&] {
    while (!done) {
      pthread_kill(waiter, SIGUSR1);
      ++sent;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  for (int round = 0; round < 4; ++round) try {
      tier->wait(tier->write(key, 0, buf, kBytes));
      std::memset(buf, 0, kBytes);
      tier->wait(tier->read(key, 0, buf, kBytes));
    } catch (const std::exception& e) {
      ADD_FAILURE() << "round " << round << ": " << e.what();
      break;  // the ring's requests are astray: go no further
    }
  done = true;
  signaller.join();
  sigaction(SIGUSR1, &before, nullptr);
  size_t wrong = 0;
  for (size_t i = 0; i < kBytes / 4; ++i) wrong += buf[i] != static_cast<uint32_t>(i * 7);
  EXPECT_EQ(wrong, 0u);
  EXPECT_GT(sent.load(), 10);
  std::free(buf);
  tier.reset();
  fs::remove_all(dir);
}

// The free space is told before anything is written, for a directory not made yet too.
TEST(SwapTier, DiskRoomIsCheckedBeforeAnythingIsWritten) {
  const fs::path dir = fs::temp_directory_path() / "starling_tier_room_check" / "not_yet";
  EXPECT_GT(disk_free_bytes(dir), 0);  // its nearest existing parent's filesystem
  EXPECT_NO_THROW(check_disk_room(dir, 1 << 20, "a test's state"));
  try {
    check_disk_room(dir, int64_t{1} << 60, "a test's state");
    FAIL() << "an exabyte fitted";
  } catch (const starling::Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(dir.string()), std::string::npos) << msg;
    EXPECT_NE(msg.find("room there for a test's state ("), std::string::npos) << msg;
  }
  EXPECT_FALSE(fs::exists(dir));
}

// A full disk stops a run where room is reserved, not at a write in mid-step: the file's blocks
// are allocated then. A file size limit (RLIMIT_FSIZE, in a child process) stands in for a full
// disk.
TEST(SwapTier, DiskWithoutRoomRefusesTheReservation) {
  const fs::path dir = fs::temp_directory_path() / "starling_tier_room_test";
  auto reserve_past_the_limit = [&] {
    std::signal(SIGXFSZ, SIG_IGN);  // the limit's signal; the call then fails with EFBIG
    const rlimit limit{64 << 20, 64 << 20};
    setrlimit(RLIMIT_FSIZE, &limit);
    try {
      auto tier = make_tier("disk", dir);
      tier->reserve(32 << 20);  // fits
      tier->reserve(64 << 20);  // past the limit
    } catch (const starling::Error& e) {
      std::fputs(e.what(), stderr);
      std::_Exit(3);
    }
    std::_Exit(0);
  };
  EXPECT_EXIT(reserve_past_the_limit(), ::testing::ExitedWithCode(3),
              "swap.dir .*starling_tier_room_test: no room for the swap file");
  fs::remove_all(dir);
}

TEST(SwapTier, DiskRefusesAFilesystemWithoutODirect) {
  std::ifstream mounts("/proc/mounts");
  bool shm_tmpfs = false;
  for (std::string dev, dir, type; mounts >> dev >> dir >> type;) {
    shm_tmpfs = shm_tmpfs || (dir == "/dev/shm" && type == "tmpfs");
    mounts.ignore(1 << 12, '\n');
  }
  if (!shm_tmpfs) GTEST_SKIP() << "no tmpfs at /dev/shm to try";
  try {
    // Newer kernels give tmpfs O_DIRECT; then the tier works there, and says it is in RAM.
    const auto tier = make_tier("disk", "/dev/shm");
    EXPECT_NE(tier->describe().find("tmpfs: in RAM"), std::string::npos) << tier->describe();
  } catch (const starling::Error& e) {
    EXPECT_NE(std::string(e.what()).find("O_DIRECT"), std::string::npos) << e.what();
  }
}

int64_t page_cache_kb() {
  std::ifstream in("/proc/meminfo");
  for (std::string key; in >> key;) {
    int64_t kb = 0;
    in >> kb;
    in.ignore(64, '\n');
    if (key == "Cached:") return kb;
  }
  return -1;
}

TEST(SwapTier, DiskBytesStayOutOfThePageCache) {
  constexpr size_t kBytes = size_t{256} << 20;
  const fs::path dir = fs::temp_directory_path() / "starling_tier_cache_test";
  auto tier = make_tier("disk", dir);
  const uint64_t key = tier->reserve(kBytes);
  char* buf = static_cast<char*>(std::aligned_alloc(kSwapAlign, kBytes));
  std::memset(buf, 3, kBytes);
  const int64_t before = page_cache_kb();
  tier->wait(tier->write(key, 0, buf, kBytes));
  tier->wait(tier->read(key, 0, buf, kBytes));
  const int64_t grown_kb = page_cache_kb() - before;
  std::free(buf);
  tier.reset();
  fs::remove_all(dir);
  // Buffered I/O would add all 256 MB; allow for what other processes cache meanwhile.
  EXPECT_LT(grown_kb, 64 << 10) << "the page cache grew by " << grown_kb << " KB";
}

}  // namespace
