// Pipelines across peers: the tensor format that crosses a stage boundary and its checks, the
// layout of a cut model (what each stage sends, receives and owns), the [pipeline] settings, and
// end to end with real processes: a 2-, 3- and 4-stage pipeline (GPT-2 and LLaMA, GPipe and 1F1B,
// with accumulation) trains like one process on the same batches, loss for loss and weight for
// weight within fp32 rounding.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "../cli/run_cli.h"
#include "../cli/run_files.h"
#include "starling/common/cpu_runtime.h"
#include "starling/common/error.h"
#include "starling/common/safetensors.h"
#include "starling/model/build.h"
#include "starling/net/netlab.h"
#include "starling/strategy/pipeline_admission.h"
#include "starling/strategy/pipeline_auto_peer.h"
#include "starling/strategy/pipeline_layout.h"
#include "starling/strategy/pipeline_peer.h"
#include "starling/strategy/plan_trials.h"
#include "starling/strategy/shared_copies.h"
#include "starling/strategy/tensor_message.h"
#include "starling/train/config.h"

namespace {

namespace fs = std::filesystem;
using starling::NetError;
using starling::testing::run_cli;
using namespace starling::strategy;

TensorExpectation expect(TensorKind kind, int64_t step, int32_t mb, int32_t node,
                         std::vector<int64_t> shape) {
  return {.label = {kind, step, mb, node},
          .shape = std::move(shape),
          .dtypes = {c10::ScalarType::Float, c10::ScalarType::BFloat16}};
}

// The NetError's text, or "" when none was thrown.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const NetError& e) {
    return e.what();
  }
  return "";
}

TEST(TensorMessage, RoundTripsEveryLinkDtype) {
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    const at::Tensor t = at::randn({2, 3, 4}).to(dtype);
    const auto bytes = encode_tensor({TensorKind::activation, 7, 2, 5}, t);
    const at::Tensor back =
        decode_tensor(bytes, expect(TensorKind::activation, 7, 2, 5, {2, 3, 4}), "stage 1");
    EXPECT_EQ(back.scalar_type(), dtype);
    EXPECT_TRUE(at::equal(back, t));
  }
  const at::Tensor scalar = at::full({}, 2.5);
  const auto bytes = encode_tensor({TensorKind::loss, 1, 0, 9}, scalar);
  EXPECT_EQ(decode_tensor(bytes, expect(TensorKind::loss, 1, 0, 9, {}), "x").item<double>(), 2.5);
}

TEST(TensorMessage, AMismatchedOrMalformedMessageNamesTheSenderAndTheField) {
  const at::Tensor t = at::randn({2, 3});
  const auto good = encode_tensor({TensorKind::gradient, 3, 1, 4}, t);
  const auto want = expect(TensorKind::gradient, 3, 1, 4, {2, 3});
  ASSERT_EQ(error_of([&] { decode_tensor(good, want, "stage 2 (peer ab12)"); }), "");

  const std::string shape = error_of([&] {
    decode_tensor(good, expect(TensorKind::gradient, 3, 1, 4, {3, 2}), "P");
  });
  EXPECT_NE(shape.find("shape [2, 3], expected [3, 2]"), std::string::npos) << shape;
  EXPECT_NE(shape.find("from P"), std::string::npos) << shape;

  const std::string step = error_of([&] {
    decode_tensor(good, expect(TensorKind::gradient, 4, 1, 4, {2, 3}), "P");
  });
  EXPECT_NE(step.find("out of step"), std::string::npos) << step;

  auto truncated = good;
  truncated.resize(truncated.size() - 5);
  const std::string cut = error_of([&] { decode_tensor(truncated, want, "stage 2 (peer ab12)"); });
  EXPECT_NE(cut.find("bytes of elements"), std::string::npos) << cut;
  EXPECT_NE(cut.find("stage 2 (peer ab12)"), std::string::npos) << cut;

  auto header_cut = good;
  header_cut.resize(30);
  EXPECT_NE(error_of([&] { decode_tensor(header_cut, want, "P"); }).find("truncated"),
            std::string::npos);

  auto dtype = good;
  dtype[5] = 99;
  EXPECT_NE(error_of([&] { decode_tensor(dtype, want, "P"); }).find("unknown dtype"),
            std::string::npos);

  auto dims = good;
  dims[6] = 200;
  EXPECT_NE(error_of([&] { decode_tensor(dims, want, "P"); }).find("dimensions"),
            std::string::npos);

  const std::vector<uint8_t> junk = {1, 2, 3};
  EXPECT_NE(error_of([&] { decode_tensor(junk, want, "P"); }).find("not a pipeline tensor"),
            std::string::npos);

  const auto f16 = encode_tensor({TensorKind::gradient, 3, 1, 4}, t.to(at::kHalf));
  EXPECT_NE(error_of([&] { decode_tensor(f16, want, "P"); }).find("does not accept"),
            std::string::npos);
}

starling::train::RunConfig model_config(const std::string& preset, const std::string& extra = "") {
  return starling::train::parse_run_config("[data]\ndir = \"unused\"\n[model]\npreset = \"" +
                                               preset +
                                               "\"\nn_layer = 2\nd_model = 32\nn_head = 2\n"
                                               "seq_len = 16\n" +
                                               extra,
                                           "<test>");
}

TEST(PipelineLayout, StagesSendTheirBoundaryAndShareTiedWeights) {
  const auto c = model_config("gpt2-tiny");
  auto dag = starling::model::build_model(c.model, 1, c10::kCPU);
  const int n = dag->size();
  PipelineLayout layout(*dag, {{0, 1}, {2, n - 1}});
  ASSERT_EQ(layout.stages(), 2);
  EXPECT_EQ(layout.loss_node(), n - 1);
  // What stage 1 reads from before it is exactly what stage 0 sends it.
  ASSERT_FALSE(layout.stage(1).receives.empty());
  for (const auto& [producer, from] : layout.stage(1).receives) {
    EXPECT_EQ(from, 0);
    ASSERT_TRUE(layout.stage(0).sends.count(producer));
    EXPECT_EQ(layout.stage(0).sends.at(producer), std::vector<int>{1});
  }
  EXPECT_TRUE(layout.stage(0).receives.empty());
  EXPECT_TRUE(layout.stage(1).sends.empty());
  // GPT-2 ties the token embedding to the head: both stages read it, the first counts it.
  const auto tied = dag->tied_params();
  ASSERT_EQ(tied.size(), 1u);
  ASSERT_EQ(layout.shared().size(), 1u);
  EXPECT_EQ(layout.shared()[0].stages, (std::vector<int>{0, 1}));
  EXPECT_EQ(layout.shared()[0].name, tied[0].name);
  EXPECT_TRUE(layout.counts_in_norm(0, tied[0].name));
  EXPECT_FALSE(layout.counts_in_norm(1, tied[0].name));
  // Every parameter is owned by some stage.
  size_t owned = 0;
  for (int s = 0; s < 2; ++s) owned += layout.stage(s).params.size();
  EXPECT_EQ(owned, dag->params().params().size() + 1);  // the tied one twice

  EXPECT_THROW(PipelineLayout(*dag, {{0, 1}, {3, n - 1}}), std::invalid_argument);
  EXPECT_THROW(PipelineLayout(*dag, {{0, 1}, {2, n - 2}}), std::invalid_argument);
}

// Tied copies drift apart by single units in their last bits, some up and some down: a checksum
// that a plain sum of the bits would call equal must still tell them apart.
TEST(SharedCopies, ChecksumsTellApartCopiesWhoseDriftCancels) {
  const at::Tensor a = at::randn({64, 32}, at::TensorOptions().dtype(at::kFloat));
  at::Tensor b = a.clone();
  at::Tensor bits = b.view(at::kInt);
  bits.view({-1})[5] += 1;
  bits.view({-1})[700] -= 1;
  ASSERT_FALSE(at::equal(a, b));
  ASSERT_EQ(a.view(at::kInt).sum().item<int64_t>(), b.view(at::kInt).sum().item<int64_t>());
  EXPECT_NE(starling::strategy::copy_checksum(a), starling::strategy::copy_checksum(b));
  EXPECT_EQ(starling::strategy::copy_checksum(a), starling::strategy::copy_checksum(a.clone()));
  // A copy that is not contiguous is read by its values.
  EXPECT_EQ(starling::strategy::copy_checksum(a.t().contiguous().t()),
            starling::strategy::copy_checksum(a));
}

// A stage's place travels in its member record; what does not read back exactly is no place.
TEST(PipelinePlace, RoundTripsThroughTheMemberRoleAndRefusesAnythingElse) {
  const PipelinePlace p{.stage = 2, .stages = 4, .replica = 1, .replicas = 3};
  const auto back = parse_pipeline_role(pipeline_role(p));
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->stage, 2);
  EXPECT_EQ(back->stages, 4);
  EXPECT_EQ(back->replica, 1);
  EXPECT_EQ(back->replicas, 3);
  for (const char* bad :
       {"", "worker", "pipeline stage 4/4 replica 0/1", "pipeline stage -1/4 replica 0/1",
        "pipeline stage 1/4 replica 1/1", "pipeline stage 1/4 replica 0/1 extra",
        "pipeline stage 01/4 replica 0/1", "pipeline stage 1/0 replica 0/1"})
    EXPECT_FALSE(parse_pipeline_role(bad).has_value()) << bad;
}

// A waiting pipeline is admitted whole: only when every place is held by a live member and each
// replica is wholly active or wholly waiting.
TEST(PipelineAdmission, OnlyAWholeWaitingReplicaWithEveryPlaceHeldIsAdmitted) {
  using starling::net::MemberState;
  using starling::net::MemberView;
  const PipelineGrid grid = {{1, 2}, {3, 4}};
  const auto view = [](std::vector<std::pair<int, bool>> active_by_id,
                       MemberState dead_state = MemberState::alive) {
    std::vector<MemberView> v;
    for (const auto& [id, active] : active_by_id) {
      MemberView m;
      m.info.id = static_cast<starling::net::PeerId>(id);
      m.info.active = active;
      m.state = id == 4 ? dead_state : MemberState::alive;
      v.push_back(m);
    }
    return v;
  };
  // Everyone trains: nothing to admit.
  EXPECT_FALSE(can_admit(view({{1, true}, {2, true}, {3, true}, {4, true}}), grid));
  // Replica 1 waits whole: admit.
  EXPECT_TRUE(can_admit(view({{1, true}, {2, true}, {3, false}, {4, false}}), grid));
  // Its stage 1 is not back yet (absent, or its dead predecessor): wait.
  EXPECT_FALSE(can_admit(view({{1, true}, {2, true}, {3, false}}), grid));
  EXPECT_FALSE(
      can_admit(view({{1, true}, {2, true}, {3, false}, {4, false}}, MemberState::dead), grid));
  // Its stage 0 still runs the old pipeline (active) while stage 1 waits: wait.
  EXPECT_FALSE(can_admit(view({{1, true}, {2, true}, {3, true}, {4, false}}), grid));
}

// The planner's table from the peers' reports: speeds against the reference's total, each link as
// the receiving peer measured it, the other direction where only that one was, and a pair nobody
// measured taken as unshaped and named.
TEST(PipelineAutoPeer, ReportsBecomeTheSwarmsCostTable) {
  starling::sched::CostTable ref;
  ref.nodes = {{.name = "a", .compute_s = 0.3, .cut_bytes = 100},
               {.name = "b", .compute_s = 0.1, .cut_bytes = 0}};
  ref.devices = {{.name = "this machine", .speed = 1}};
  ref.links = {{{}}};
  const std::vector<PeerReport> reports = {
      {.id = 7,
       .name = "fast",
       .compute_s = 0.2,
       .inbound_bytes_per_s = {{9, 1e6}},
       .rtt_s = {{9, 0.050}}},
      {.id = 9,
       .name = "",
       .compute_s = 0.4,
       .inbound_bytes_per_s = {{7, 2e6}},
       .rtt_s = {{7, 0.070}, {12, 0.010}}},
      {.id = 12, .name = "far", .compute_s = 0.8, .inbound_bytes_per_s = {{7, 5e5}}}};
  std::vector<std::string> unmeasured;
  const auto t = swarm_costs(ref, reports, &unmeasured);
  ASSERT_EQ(t.devices.size(), 3u);
  EXPECT_DOUBLE_EQ(t.devices[0].speed, 2.0);
  EXPECT_DOUBLE_EQ(t.devices[1].speed, 1.0);
  EXPECT_DOUBLE_EQ(t.devices[2].speed, 0.5);
  EXPECT_EQ(t.devices[0].name, "peer 00000000 (fast)");
  EXPECT_EQ(t.nodes.size(), 2u);
  EXPECT_DOUBLE_EQ(t.links[0][1].bytes_per_s, 2e6);  // what 9 measured from 7
  EXPECT_DOUBLE_EQ(t.links[1][0].bytes_per_s, 1e6);  // what 7 measured from 9
  EXPECT_DOUBLE_EQ(t.links[0][2].bytes_per_s, 5e5);
  EXPECT_DOUBLE_EQ(t.links[2][0].bytes_per_s, 5e5);  // only the other direction was measured
  EXPECT_DOUBLE_EQ(t.links[1][2].bytes_per_s, starling::sched::kUnshapedBytesPerS);
  // Half the round trip, as the first of the pair pinged it; the other's where it did not.
  EXPECT_DOUBLE_EQ(t.links[0][1].latency_s, 0.025);
  EXPECT_DOUBLE_EQ(t.links[1][0].latency_s, 0.035);
  EXPECT_DOUBLE_EQ(t.links[2][1].latency_s, 0.005);
  EXPECT_DOUBLE_EQ(t.links[0][2].latency_s, 0);  // nobody pinged
  ASSERT_EQ(unmeasured.size(), 1u);
  EXPECT_EQ(unmeasured[0], "peer 00000000 - peer 00000000 (far)");
  EXPECT_NO_THROW(t.validate());
}

// A calibrated run prices a plan it tried at the speeds that trial measured: the same places, the
// prediction of those speeds (what OP-Fence itself predicts for them when it keeps the places),
// and a plan read back from its file, which carries no OP-Fence plan, is refused.
TEST(AutoPipeline, RepricedAtMeasuredSpeedsKeepsItsPlaces) {
  starling::sched::CostTable t;
  for (int i = 0; i < 8; ++i)
    t.nodes.push_back({.name = std::string("n").append(std::to_string(i)),
                       .compute_s = 0.1,
                       .param_bytes = 4000,
                       .cut_bytes = 1000});
  for (int d = 0; d < 4; ++d)
    t.devices.push_back({.name = std::string("d").append(std::to_string(d)), .speed = 1});
  t.links.assign(4, std::vector<starling::sched::LinkCost>(4, {.bytes_per_s = 1e9}));
  t.micro_batches = 4;
  starling::train::RunConfig config;
  config.strategy.kind = "co2";
  config.strategy.local_steps = 4;
  const AutoPipeline planned = plan_on_costs(config, t, "the table");
  ASSERT_FALSE(planned.priced.pipelines.empty());

  const AutoPipeline same = reprice_auto_pipeline(config, t, planned);
  EXPECT_EQ(same.stages, planned.stages);
  EXPECT_EQ(same.stage_of, planned.stage_of);
  EXPECT_EQ(same.replica_of, planned.replica_of);
  EXPECT_DOUBLE_EQ(same.predicted_step_s, planned.predicted_step_s);
  EXPECT_EQ(same.report, planned.report);

  // Every device at a third of the speed: the same places, and three times the compute.
  for (auto& d : t.devices) d.speed = 1.0 / 3;
  const AutoPipeline slow = reprice_auto_pipeline(config, t, planned);
  EXPECT_EQ(slow.stage_of, planned.stage_of);
  // (The links' microseconds stay as they were.)
  EXPECT_NEAR(slow.predicted_step_s, 3 * planned.predicted_step_s, 1e-4 * slow.predicted_step_s);
  const AutoPipeline fresh = plan_on_costs(config, t, "the table");
  EXPECT_EQ(fresh.stage_of, slow.stage_of);
  EXPECT_DOUBLE_EQ(fresh.predicted_step_s, slow.predicted_step_s);

  // One device slower: the plan as it was is priced at that, though OP-Fence would move nodes.
  for (auto& d : t.devices) d.speed = 1;
  t.devices[0].speed = 0.25;
  const AutoPipeline one_slow = reprice_auto_pipeline(config, t, planned);
  EXPECT_EQ(one_slow.stages, planned.stages);
  EXPECT_GT(one_slow.predicted_step_s, 2 * planned.predicted_step_s);
  EXPECT_LT(plan_on_costs(config, t, "the table").predicted_step_s, one_slow.predicted_step_s);

  const AutoPipeline read_back = parse_auto_pipeline(auto_pipeline_text(planned), "a file");
  try {
    reprice_auto_pipeline(config, t, read_back);
    ADD_FAILURE() << "a plan read back was priced";
  } catch (const starling::Error& e) {
    EXPECT_NE(std::string(e.what()).find("holds no OP-Fence plan"), std::string::npos) << e.what();
  }
}

// The trials of a plan: a device that measured half its assumed speed gets fewer nodes in the next
// plan, which is tried once more; when its trial confirms the speeds the trials end, and the run
// keeps the tried plan that predicts the shortest step at its own trial's speeds.
TEST(PlanTrials, AMovedPlanIsTriedAndTheFasterTriedOneKept) {
  starling::sched::CostTable t;
  for (int i = 0; i < 8; ++i)
    t.nodes.push_back(
        {.name = std::string("n").append(std::to_string(i)), .compute_s = 0.1, .cut_bytes = 1000});
  for (int d = 0; d < 2; ++d)
    t.devices.push_back({.name = std::string("d").append(std::to_string(d)), .speed = 1});
  t.links.assign(2, std::vector<starling::sched::LinkCost>(2, {.bytes_per_s = 1e9}));
  t.micro_batches = 4;
  starling::train::RunConfig config;
  config.strategy.kind = "none";
  const AutoPipeline first = plan_on_costs(config, t, "the table");
  ASSERT_EQ(first.stages.size(), 2u);
  // What a trial of `plan` measures when device 0 runs at half speed and device 1 at full.
  auto timings = [](const AutoPipeline& plan) {
    std::vector<starling::sched::StageTiming> out;
    for (int d = 0; d < 2; ++d) {
      const auto [a, b] = plan.stages[static_cast<size_t>(plan.stage_of[static_cast<size_t>(d)])];
      out.push_back(
          {.device = d,
           .first = a,
           .last = b,
           .seconds_per_micro_batch = 0.1 * static_cast<double>(b - a + 1) / (d == 0 ? 0.5 : 1.0)});
    }
    return out;
  };
  PlanTrials trials(config, t, first, "the table");
  EXPECT_EQ(trials.next().stages, first.stages);
  ASSERT_TRUE(trials.record(timings(trials.next())));
  const AutoPipeline second = trials.next();
  EXPECT_NE(second.stages, first.stages);
  const auto [a, b] = second.stages[static_cast<size_t>(second.stage_of[0])];
  EXPECT_LT(b - a + 1, 4) << "the slow device kept " << b - a + 1 << " of 8 nodes";
  EXPECT_FALSE(trials.record(timings(second)));
  EXPECT_EQ(trials.trials(), 2);
  const AutoPipeline kept = trials.kept(starling::sched::timed_steps(3, 1));
  EXPECT_EQ(kept.stages, second.stages);
  EXPECT_NE(kept.report.find("calibrated by 2 trial(s) timed over steps 2-3, their median"),
            std::string::npos)
      << kept.report;
  EXPECT_NE(kept.report.find("the run keeps trial 2's plan"), std::string::npos) << kept.report;
}

// pipeline.calibrate_steps = -1 (the default) tries the launcher's plan for two rounds when the
// run is long enough to pay for it, and not otherwise; a value set stands.
TEST(AutoPipeline, ALongRunIsCalibratedByDefaultAndAShortOneIsNot) {
  starling::train::RunConfig config;
  config.pipeline.auto_stages = true;
  ASSERT_EQ(config.pipeline.calibrate_steps, -1);
  config.strategy.kind = "co2";
  config.strategy.local_steps = 4;
  config.train.steps = 160;
  auto c = calibration_steps(config);
  EXPECT_EQ(c.steps, 8);
  EXPECT_NE(c.why.find("a trial of 8 steps (two co2 rounds, the second timed beside"),
            std::string::npos)
      << c.why;
  config.train.steps = 159;
  c = calibration_steps(config);
  EXPECT_EQ(c.steps, 0);
  EXPECT_NE(c.why.find("train.steps = 159 is under 20 times a trial of 8 steps"), std::string::npos)
      << c.why;
  EXPECT_NE(c.why.find("pipeline.calibrate_steps = 8 calibrates it anyway"), std::string::npos)
      << c.why;
  // Without rounds: the warm-up step and two timed ones.
  config.strategy.kind = "ddp";
  config.train.steps = 60;
  EXPECT_EQ(calibration_steps(config).steps, 3);
  config.train.steps = 59;
  EXPECT_EQ(calibration_steps(config).steps, 0);
  // A value set stands, however short the run.
  config.pipeline.calibrate_steps = 4;
  EXPECT_EQ(calibration_steps(config).steps, 4);
  config.pipeline.calibrate_steps = 0;
  config.train.steps = 1000;
  EXPECT_EQ(calibration_steps(config).steps, 0);
  // Peers that plan for themselves calibrate by the same rule.
  config.pipeline.calibrate_steps = -1;
  config.pipeline.planner = "peers";
  EXPECT_EQ(calibration_steps(config).steps, 3);
}

// A plan with trials ahead says so in the text peers send one another; the plan to run does not.
TEST(AutoPipeline, AnAgreedPlanCarriesItsTrialSteps) {
  AutoPipeline a;
  a.stages = {{0, 3}, {4, 7}};
  a.stage_of = {0, 1};
  a.replica_of = {0, 0};
  a.peer_ids = {"0000000000000001", "0000000000000002"};
  a.trial_steps = 3;
  EXPECT_EQ(parse_auto_pipeline(auto_pipeline_text(a), "test").trial_steps, 3);
  a.trial_steps = 0;
  const std::string text = auto_pipeline_text(a);
  EXPECT_EQ(text.find("trial_steps"), std::string::npos) << text;
  EXPECT_EQ(parse_auto_pipeline(text, "test").trial_steps, 0);
  // Trials are for peers that plan themselves, which name each other by their ids.
  a.trial_steps = 3;
  a.peer_ids = {"0000000000000001", "not a peer id!!!"};
  EXPECT_THROW(parse_auto_pipeline(auto_pipeline_text(a), "test"), starling::ConfigError);
  a.peer_ids.clear();
  EXPECT_THROW(parse_auto_pipeline(auto_pipeline_text(a), "test"), starling::ConfigError);
}

// What each peer's stage is planned to compute is kept with the plan, so that a resumed run and
// the peers that planned it can set the run against it; a damaged figure is refused.
TEST(AutoPipeline, APlanKeepsEachPeersPlannedComputeAndARunIsSetAgainstIt) {
  AutoPipeline a;
  a.stages = {{0, 3}, {4, 7}};
  a.stage_of = {1, 0};
  a.replica_of = {0, 0};
  a.predicted_step_s = 2.0;
  a.planned_compute_s = {0.2, 0.1};
  const AutoPipeline back = parse_auto_pipeline(auto_pipeline_text(a), "test");
  EXPECT_EQ(back.planned_compute_s, a.planned_compute_s);
  // Records of 4 steps of 2 micro-batches: device 0 computed 0.5 s a step, device 1 0.2 s, both
  // 2.5 s of wall time a step. They sit in peer-7 and peer-3 (how a launcher's peers may hold
  // the devices of the peers' own plan).
  const fs::path dir =
      fs::temp_directory_path() / ("starling_against_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto records = [&](const std::string& name, double compute) {
    std::ofstream out(dir / name);
    for (int s = 1; s <= 4; ++s)
      out << "{\"step\": " << s << ", \"net\": {\"compute_s\": " << compute * s
          << "}, \"elapsed_s\": " << 2.5 * s << "}\n";
    return dir / name;
  };
  starling::train::RunConfig config;
  config.train.steps = 4;
  config.train.grad_accum = 2;
  config.strategy.kind = "none";
  const auto run =
      run_against_auto_pipeline(back,
                                {{.device = 1, .peer = 3, .metrics = records("three.jsonl", 0.2)},
                                 {.device = 0, .peer = 7, .metrics = records("seven.jsonl", 0.5)}},
                                config);
  ASSERT_TRUE(run.has_value());
  ASSERT_EQ(run->peers.size(), 2u);
  EXPECT_EQ(run->peers[0].peer, 3);
  EXPECT_EQ(run->peers[0].stage, 0);
  EXPECT_DOUBLE_EQ(run->peers[0].ratio(), 1.0);
  EXPECT_EQ(run->peers[1].peer, 7);
  EXPECT_EQ(run->peers[1].stage, 1);
  EXPECT_DOUBLE_EQ(run->peers[1].ratio(), 1.25);
  EXPECT_DOUBLE_EQ(run->measured_step_s, 2.5);
  // A peer without records, or a plan saved without the figures, says nothing.
  EXPECT_FALSE(
      run_against_auto_pipeline(back, {{.device = 0, .peer = 0, .metrics = dir / "none"}}, config)
          .has_value());
  AutoPipeline old = back;
  old.planned_compute_s.clear();
  EXPECT_FALSE(run_against_auto_pipeline(
                   old, {{.device = 0, .peer = 0, .metrics = dir / "seven.jsonl"}}, config)
                   .has_value());
  fs::remove_all(dir);
  a.planned_compute_s = {0.2};
  EXPECT_THROW(parse_auto_pipeline(auto_pipeline_text(a), "test"), starling::ConfigError);
  a.planned_compute_s = {0.2, -1};
  EXPECT_THROW(parse_auto_pipeline(auto_pipeline_text(a), "test"), starling::ConfigError);
  // A stage of nodes profiled at no time is planned at 0: a plan to run, with nothing to report.
  a.planned_compute_s = {0.2, 0};
  EXPECT_EQ(parse_auto_pipeline(auto_pipeline_text(a), "test").planned_compute_s[1], 0);
}

TEST(PipelineAutoPeer, AReportRoundTripsAndABadOneNamesItsSender) {
  const PeerReport r{.id = 0x1234,
                     .name = "n",
                     .compute_s = 0.25,
                     .inbound_bytes_per_s = {{0xabcdef, 3e6}},
                     .rtt_s = {{0xabcdef, 0.04}}};
  const auto back = decode_report(encode_report(r), 0x1234);
  EXPECT_EQ(back.name, "n");
  EXPECT_DOUBLE_EQ(back.compute_s, 0.25);
  EXPECT_EQ(back.inbound_bytes_per_s, r.inbound_bytes_per_s);
  EXPECT_EQ(back.rtt_s, r.rtt_s);
  // Sent by another peer than it speaks of.
  EXPECT_NE(error_of([&] { decode_report(encode_report(r), 0x99); }).find("another peer"),
            std::string::npos);
  const auto bad = [](const std::string& text) {
    return error_of([&] { decode_report(std::vector<uint8_t>(text.begin(), text.end()), 0x1234); });
  };
  const std::string id = "\"id\": \"0000000000001234\", \"name\": \"n\"";
  EXPECT_NE(bad("not json").find("measurements of peer 00000000 are malformed"), std::string::npos);
  EXPECT_NE(
      bad("{" + id + ", \"compute_s\": -1, \"inbound_bytes_per_s\": {}}").find("compute time"),
      std::string::npos);
  EXPECT_NE(bad("{" + id + ", \"compute_s\": 1, \"inbound_bytes_per_s\": {\"zz\": 1}}")
                .find("no peer id"),
            std::string::npos);
  EXPECT_NE(
      bad("{" + id + ", \"compute_s\": 1, \"inbound_bytes_per_s\": {\"0000000000000001\": 0}}")
          .find("rate of"),
      std::string::npos);
  EXPECT_NE(bad("{" + id +
                ", \"compute_s\": 1, \"inbound_bytes_per_s\": {}, \"rtt_s\": "
                "{\"0000000000000001\": -1}}")
                .find("round trip of"),
            std::string::npos);
}

TEST(PipelineConfig, StagesAreReadCheckedAndSplit) {
  auto c = model_config("gpt2-tiny", "[pipeline]\nstages = [[0, 2], [3, 7]]\n");
  EXPECT_TRUE(c.pipeline.enabled());
  EXPECT_EQ(c.pipeline.count(), 2);
  EXPECT_EQ(c.pipeline.stages[1], (std::pair<int64_t, int64_t>{3, 7}));
  // Written back and read again, it is the same.
  const auto again = starling::train::parse_run_config(starling::train::to_toml(c), "<again>");
  EXPECT_EQ(again.pipeline.stages, c.pipeline.stages);

  EXPECT_THROW(model_config("gpt2-tiny", "[pipeline]\nstages = [[0, 2], [4, 7]]\n"),
               starling::ConfigError);
  EXPECT_THROW(model_config("gpt2-tiny", "[pipeline]\nstages = [[1, 2]]\n"), starling::ConfigError);
  EXPECT_THROW(model_config("gpt2-tiny", "[pipeline]\nstages = [0, 2]\n"), starling::ConfigError);
  EXPECT_THROW(model_config("gpt2-tiny", "[pipeline]\nnum_stages = 2\nstage = 2\n"),
               starling::ConfigError);
  EXPECT_THROW(model_config("gpt2-tiny", "[pipeline]\nschedule = \"zigzag\"\n"),
               starling::ConfigError);

  PipelineConfig even;
  even.num_stages = 3;
  EXPECT_EQ(stage_ranges(even, 9), (std::vector<std::pair<int, int>>{{0, 2}, {3, 5}, {6, 8}}));
  even.num_stages = 10;
  EXPECT_THROW(stage_ranges(even, 9), starling::ConfigError);
  EXPECT_THROW(stage_ranges(c.pipeline, 9), starling::ConfigError);  // ends at 7, not 8
}

// End to end through the binary.
class PipelineRunTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = fs::temp_directory_path() / ("starling_pipeline_test_" + std::to_string(::getpid()));
    fs::remove_all(root_);
    fs::create_directories(root_ / "text");
    std::mt19937 rng(5);
    const char* words[] = {"a",    "stage", "pipe",  "batch", "micro", "send", "receive",
                           "grad", "loss",  "layer", "cut",   "edge",  "node", "peer"};
    for (int d = 0; d < 8; ++d) {
      std::ofstream out(root_ / "text" / ("doc" + std::to_string(d) + ".txt"));
      for (int s = 0; s < 60; ++s)
        for (int w = 0; w < 12; ++w) out << words[rng() % 14] << (w == 11 ? ".\n" : " ");
    }
    const auto prep = run_cli("data prepare " + (root_ / "text").string() + " --out " +
                              (root_ / "data").string() + " --val-fraction 0.2");
    ASSERT_EQ(prep.code, 0) << prep.output;
  }
  static void TearDownTestSuite() { fs::remove_all(root_); }

  static fs::path config(const std::string& name, const std::string& preset, int accum,
                         bool recompute) {
    const fs::path path = root_ / (name + ".toml");
    std::ofstream(path) << "[model]\npreset = \"" << preset
                        << "\"\nn_layer = 3\nd_model = 32\nn_head = 2\nseq_len = 16\n"
                        << "[data]\ndir = \"" << (root_ / "data").string() << "\"\n"
                        << "[train]\nsteps = 4\nbatch_size = 2\ngrad_accum = " << accum
                        << "\nthreads = 1\nlog_every = 1\neval_every = 2\neval_batches = 2\n"
                        << "checkpoint_every = 0\nsample_at_end = false\nrecompute = "
                        << (recompute ? "true" : "false") << "\nout_dir = \""
                        << (root_ / ("run_" + name)).string() << "\"\n"
                        << "[optim]\nlr = 1e-2\nwarmup_steps = 1\ngrad_clip = 0.5\n";
    return path;
  }

  // Starts `starling train <args>` in the background with its output in `log`; returns the
  // launcher's pid (so a test can kill one of its peers and watch the rest).
  static pid_t launch(const std::string& args, const fs::path& log) {
    FILE* p = ::popen(("sh -c '" + std::string(STARLING_CLI_PATH) + " train -q " + args + " >" +
                       log.string() + " 2>&1 & echo $!'")
                          .c_str(),
                      "r");
    if (p == nullptr) return -1;
    char buf[64] = {};
    const bool read = std::fgets(buf, sizeof buf, p) != nullptr;
    ::pclose(p);
    return read ? std::stoi(buf) : -1;
  }
  // Lines in a file so far (records of a metrics.jsonl being written); 0 if absent.
  static int lines(const fs::path& f) {
    std::ifstream in(f);
    int n = 0;
    for (std::string line; std::getline(in, line);) ++n;
    return n;
  }

  static fs::path root_;
};
fs::path PipelineRunTest::root_;

// (step, loss) and (step, val_loss) of a run's metrics, in order.
std::vector<std::pair<std::string, double>> losses(const fs::path& run) {
  std::ifstream in(run / "metrics.jsonl");
  std::vector<std::pair<std::string, double>> out;
  const std::regex field("\"(loss|val_loss)\":([-0-9.eE+]+)");
  for (std::string line; std::getline(in, line);)
    for (auto it = std::sregex_iterator(line.begin(), line.end(), field);
         it != std::sregex_iterator(); ++it)
      out.emplace_back((*it)[1].str(), std::stod((*it)[2].str()));
  return out;
}

// The steps a stage's metrics.jsonl records (its step records carry the strategy's "net").
std::vector<int64_t> steps_of(const fs::path& metrics) {
  std::vector<int64_t> steps;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const auto j = nlohmann::json::parse(line);
    if (j.contains("net")) steps.push_back(j["step"].get<int64_t>());
  }
  return steps;
}

struct Case {
  const char* preset;
  int stages;
  const char* schedule;
  int accum;
  bool recompute = false;
  bool explicit_cut = false;  // pipeline.stages instead of num_stages
  int extra_warmup = 0;       // pipeline.extra_warmup
};

class PipelineEquivalence : public PipelineRunTest, public ::testing::WithParamInterface<Case> {};

TEST_P(PipelineEquivalence, TrainsLikeOneProcess) {
  const Case c = GetParam();
  const std::string name = std::string(c.preset) + "_" + std::to_string(c.stages) + "_" +
                           c.schedule + "_acc" + std::to_string(c.accum) +
                           (c.recompute ? "_rc" : "") + (c.explicit_cut ? "_cut" : "") +
                           (c.extra_warmup ? "_w" + std::to_string(c.extra_warmup) : "");
  const fs::path one = config(name + "_one", c.preset, c.accum, c.recompute);
  const fs::path pipe = config(name + "_pipe", c.preset, c.accum, c.recompute);
  const auto model = starling::train::load_run_config(one);
  auto dag = starling::model::build_model(model.model, model.train.seed, c10::kCPU);
  PipelineConfig pc;
  pc.num_stages = c.stages;
  std::vector<std::pair<int, int>> ranges = stage_ranges(pc, dag->size());
  std::string cut = "--set pipeline.num_stages=" + std::to_string(c.stages);
  if (c.explicit_cut) {
    // An uneven cut: the first stage one node longer than the even split.
    ranges[0].second += 1;
    ranges[1].first += 1;
    cut = "--set 'pipeline.stages=[";
    for (size_t s = 0; s < ranges.size(); ++s)
      cut += (s ? ", [" : "[") + std::to_string(ranges[s].first) + ", " +
             std::to_string(ranges[s].second) + "]";
    cut += "]'";
  }

  const auto a = run_cli("train -q --config " + one.string());
  ASSERT_EQ(a.code, 0) << a.output;
  const auto b =
      run_cli("train -q --config " + pipe.string() + " --peers " + std::to_string(c.stages) + " " +
              cut + " --set pipeline.schedule=" + c.schedule +
              " --set pipeline.extra_warmup=" + std::to_string(c.extra_warmup));
  ASSERT_EQ(b.code, 0) << b.output;

  const fs::path run_one = root_ / ("run_" + name + "_one");
  const fs::path run_pipe = root_ / ("run_" + name + "_pipe");
  const auto la = losses(run_one);
  ASSERT_EQ(la.size(), 4u + 2u);  // 4 steps, 2 evaluations
  for (int s = 0; s < c.stages; ++s) {
    const auto lb = losses(run_pipe / ("peer-" + std::to_string(s)));
    ASSERT_EQ(lb.size(), la.size()) << "stage " << s;
    for (size_t i = 0; i < la.size(); ++i) {
      EXPECT_EQ(la[i].first, lb[i].first);
      EXPECT_NEAR(la[i].second, lb[i].second, 1e-5 * std::abs(la[i].second))
          << "stage " << s << ", record " << i;
    }
  }

  // Each stage's parameters after 4 steps are the single process's.
  const PipelineLayout layout(*dag, ranges);
  const auto whole =
      starling::read_safetensors(run_one / "checkpoints" / "step_00000004" / "model.safetensors");
  for (int s = 0; s < c.stages; ++s) {
    const auto part =
        starling::read_safetensors(run_pipe / ("peer-" + std::to_string(s)) / "checkpoints" /
                                   "step_00000004" / "model.safetensors");
    // A stage holds and checkpoints its own parameters and no others.
    EXPECT_EQ(part.tensors.size(), layout.stage(s).params.size()) << "stage " << s;
    for (const std::string& pname : layout.stage(s).params) {
      const at::Tensor x = whole.at(pname), y = part.at(pname);
      EXPECT_TRUE(at::allclose(x, y, 1e-4, 1e-5))
          << pname << " on stage " << s << ": max difference "
          << (x - y).abs().max().item<double>();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Cuts, PipelineEquivalence,
                         ::testing::Values(Case{"gpt2-tiny", 2, "gpipe", 2},
                                           Case{"gpt2-tiny", 2, "1f1b", 3, false, true},
                                           Case{"gpt2-tiny", 3, "1f1b", 4, true},
                                           Case{"gpt2-tiny", 3, "1f1b", 4, false, false, 2},
                                           Case{"llama-tiny", 4, "1f1b", 4},
                                           Case{"llama-tiny", 3, "gpipe", 1},
                                           Case{"llama-tiny", 2, "1f1b", 2, true}),
                         [](const auto& info) {
                           const Case& c = info.param;
                           return std::string(c.preset[0] == 'g' ? "Gpt2" : "Llama") +
                                  std::to_string(c.stages) + "Stages" +
                                  (c.schedule[0] == 'g' ? "Gpipe" : "OneFOneB") + "Accum" +
                                  std::to_string(c.accum) + (c.recompute ? "Recompute" : "") +
                                  (c.explicit_cut ? "UnevenCut" : "") +
                                  (c.extra_warmup ? "ExtraWarmup" + std::to_string(c.extra_warmup)
                                                  : "");
                         });

TEST_F(PipelineRunTest, BadPipelineSettingsAreRefusedBeforeAnyPeerStarts) {
  const fs::path cfg = config("bad", "gpt2-tiny", 1, false);
  const auto peers =
      run_cli("train -q --config " + cfg.string() + " --peers 3 --set pipeline.num_stages=2");
  EXPECT_NE(peers.code, 0);
  EXPECT_NE(peers.output.find("multiple of the stage count"), std::string::npos) << peers.output;
  const auto alone =
      run_cli("train -q --config " + cfg.string() + " --peers 4 --set pipeline.num_stages=2");
  EXPECT_NE(alone.code, 0);
  EXPECT_NE(alone.output.find("need a strategy"), std::string::npos) << alone.output;
  const auto few = run_cli("train -q --config " + cfg.string() +
                           " --peers 2 --set pipeline.num_stages=2 --set pipeline.replicas=2 "
                           "--set strategy.kind=ddp");
  EXPECT_NE(few.code, 0);
  EXPECT_NE(few.output.find("one peer per stage, 4 for pipeline.replicas = 2"), std::string::npos)
      << few.output;
  const auto fp16 = run_cli("train -q --config " + cfg.string() +
                            " --peers 2 --set pipeline.num_stages=2 --set train.dtype=fp16");
  EXPECT_NE(fp16.code, 0);
  EXPECT_NE(fp16.output.find("fp16"), std::string::npos) << fp16.output;
  const auto strat = run_cli("train -q --config " + cfg.string() +
                             " --peers 4 --set pipeline.num_stages=2 --set strategy.kind=atom");
  EXPECT_NE(strat.code, 0);
  EXPECT_NE(strat.output.find("not \"atom\""), std::string::npos) << strat.output;
  // Only the peers know the model's nodes: the failing peer's error reaches the launcher's output.
  const auto cover = run_cli("train --config " + cfg.string() +
                             " --peers 2 --set 'pipeline.stages=[[0, 2], [3, 4]]'");
  EXPECT_NE(cover.code, 0);
  EXPECT_NE(cover.output.find("cover every node"), std::string::npos) << cover.output;
}

}  // namespace

namespace {

TEST_F(PipelineRunTest, AResumedPipelineMatchesAStraightOne) {
  const fs::path straight = config("straight", "gpt2-tiny", 2, false);
  const fs::path resumed = config("resumed", "gpt2-tiny", 2, false);
  const std::string pipe = " --peers 2 --set pipeline.num_stages=2";
  // The straight run's first stage also serves the swarm dashboard (it changes nothing else).
  const auto a = run_cli("train -q --config " + straight.string() + pipe +
                         " --set 'net.dashboard=\"127.0.0.1:0\"'");
  ASSERT_EQ(a.code, 0) << a.output;
  const std::string log0 = starling::testing::read_file(root_ / "run_straight" / "peer-0.log");
  EXPECT_NE(log0.find("dashboard at http://127.0.0.1:"), std::string::npos) << log0;
  EXPECT_EQ(
      starling::testing::read_file(root_ / "run_straight" / "peer-1.log").find("dashboard at"),
      std::string::npos)
      << "only peer 0 serves it";
  const auto b1 = run_cli("train -q --config " + resumed.string() + pipe + " --stop-at 2");
  ASSERT_EQ(b1.code, 0) << b1.output;
  const auto b2 = run_cli("train -q --config " + resumed.string() + pipe + " --resume");
  ASSERT_EQ(b2.code, 0) << b2.output;
  for (int s = 0; s < 2; ++s) {
    const std::string peer = "peer-" + std::to_string(s);
    const fs::path ck = fs::path(peer) / "checkpoints" / "step_00000004" / "model.safetensors";
    const auto x = starling::read_safetensors(root_ / "run_straight" / ck);
    const auto y = starling::read_safetensors(root_ / "run_resumed" / ck);
    ASSERT_EQ(x.tensors.size(), y.tensors.size());
    for (size_t i = 0; i < x.tensors.size(); ++i)
      EXPECT_TRUE(at::equal(x.tensors[i].second, y.tensors[i].second))
          << x.tensors[i].first << " on stage " << s;
    const auto la = losses(root_ / "run_straight" / peer);
    const auto lb = losses(root_ / "run_resumed" / peer);
    ASSERT_FALSE(la.empty());
    EXPECT_EQ(la.back(), lb.back()) << "the last record of stage " << s;
  }
  // Another cut: each stage's checkpoint holds other tensors, which is said as such (it used to
  // read "missing tensor ... (different model config?)").
  const auto b3 = run_cli("train -q --config " + resumed.string() +
                          " --peers 2 --set 'pipeline.stages=[[0, 2], [3, 9]]' --resume "
                          "--set train.steps=6");
  EXPECT_EQ(b3.code, 2) << b3.output;
  EXPECT_NE(b3.output.find("was written with pipeline.num_stages = 2, this run has "
                           "pipeline.stages = [[0, 2], [3, 9]]: a pipeline resumes with the cut "
                           "it began with"),
            std::string::npos)
      << b3.output;
}

TEST_F(PipelineRunTest, AKilledStageStopsThePipelineWithAClearError) {
  const fs::path cfg = config("kill", "llama-tiny", 2, false);
  const fs::path run = root_ / "run_kill";
  const fs::path log = root_ / "kill.log";
  // The swarm in the background (its pid on stdout), 3 stages and many steps.
  const pid_t launcher = launch("--config " + cfg.string() +
                                    " --peers 3 --set pipeline.num_stages=3 --set "
                                    "train.steps=100000 --set train.eval_every=0 --set "
                                    "net.peer_timeout_ms=2000",
                                log);
  ASSERT_GT(launcher, 0);
  // Until stage 1 has trained a few steps.
  const auto records = lines;
  for (int i = 0; i < 600 && records(run / "peer-1" / "metrics.jsonl") < 3; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_GE(records(run / "peer-1" / "metrics.jsonl"), 3) << starling::testing::read_file(log);
  // "[p]" keeps the pattern from matching the shell that runs pkill.
  ASSERT_EQ(std::system(("pkill -9 -f '" + (run / "[p]eer-1").string() + "\"'").c_str()), 0);
  const auto killed = std::chrono::steady_clock::now();
  while (::kill(launcher, 0) == 0 &&
         std::chrono::steady_clock::now() - killed < std::chrono::seconds(90))
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - killed).count();
  ASSERT_NE(::kill(launcher, 0), 0) << "the swarm still runs 90 s after a stage died";
  // The other stages stop within about one peer timeout, each naming the dead stage.
  EXPECT_LT(took, 30) << starling::testing::read_file(log);
  for (const int s : {0, 2}) {
    const std::string peer_log =
        starling::testing::read_file(run / ("peer-" + std::to_string(s) + ".log"));
    EXPECT_TRUE(
        std::regex_search(peer_log, std::regex("error: pipeline.*(stage 1 \\(peer|peer-1)")))
        << peer_log;
  }
  const std::string out = starling::testing::read_file(log);
  EXPECT_NE(out.find("peers failed"), std::string::npos) << out;
}

}  // namespace

namespace {

// Pipeline replicas: R pipelines of S stages, each stage averaged with its counterparts by a
// strategy, train like R plain replicas of the whole model with that strategy (the same data
// shares, the same rounds), loss for loss and weight for weight within fp32 rounding.
struct ReplicaCase {
  const char* preset;
  const char* strategy;
  int stages;
  bool zero = false;  // co2's sharded outer state
};

class PipelineReplicas : public PipelineRunTest,
                         public ::testing::WithParamInterface<ReplicaCase> {};

TEST_P(PipelineReplicas, TrainLikeReplicasOfTheWholeModel) {
  const ReplicaCase c = GetParam();
  const std::string name = std::string("replicas_") + c.preset + "_" + c.strategy + "_" +
                           std::to_string(c.stages) + (c.zero ? "_zero" : "");
  const fs::path plain = config(name + "_plain", c.preset, 2, false);
  const fs::path piped = config(name + "_piped", c.preset, 2, false);
  // Rounds of two local steps where the strategy has rounds; evaluations at round boundaries.
  const std::string strategy = std::string(" --set strategy.kind=") + c.strategy +
                               " --set strategy.local_steps=2 --set net.peer_timeout_ms=20000" +
                               (c.zero ? " --set strategy.zero=true" : "");
  const auto a = run_cli("train -q --config " + plain.string() + " --peers 2" + strategy);
  ASSERT_EQ(a.code, 0) << a.output;
  const auto b =
      run_cli("train -q --config " + piped.string() + " --peers " + std::to_string(2 * c.stages) +
              " --set pipeline.num_stages=" + std::to_string(c.stages) + strategy);
  ASSERT_EQ(b.code, 0) << b.output;
  EXPECT_NE(b.output.find("2 pipelines of " + std::to_string(c.stages) + " stages"),
            std::string::npos)
      << b.output;

  const auto model = starling::train::load_run_config(plain);
  auto dag = starling::model::build_model(model.model, model.train.seed, c10::kCPU);
  PipelineConfig pc;
  pc.num_stages = c.stages;
  const PipelineLayout layout(*dag, stage_ranges(pc, dag->size()));
  for (int r = 0; r < 2; ++r) {
    const fs::path whole_run = root_ / ("run_" + name + "_plain") / ("peer-" + std::to_string(r));
    const auto la = losses(whole_run);
    ASSERT_EQ(la.size(), 4u + 2u);  // 4 steps, 2 evaluations
    const auto whole = starling::read_safetensors(whole_run / "checkpoints" / "step_00000004" /
                                                  "model.safetensors");
    for (int s = 0; s < c.stages; ++s) {
      // Peer r * stages + s runs stage s of replica r, on replica r's share of the data.
      const fs::path stage_run =
          root_ / ("run_" + name + "_piped") / ("peer-" + std::to_string(r * c.stages + s));
      const auto lb = losses(stage_run);
      ASSERT_EQ(lb.size(), la.size()) << "replica " << r << ", stage " << s;
      for (size_t i = 0; i < la.size(); ++i) {
        EXPECT_EQ(la[i].first, lb[i].first);
        EXPECT_NEAR(la[i].second, lb[i].second, 1e-5 * std::abs(la[i].second))
            << "replica " << r << ", stage " << s << ", record " << i;
      }
      const auto part = starling::read_safetensors(stage_run / "checkpoints" / "step_00000004" /
                                                   "model.safetensors");
      EXPECT_EQ(part.tensors.size(), layout.stage(s).params.size())
          << "replica " << r << ", stage " << s;
      for (const std::string& pname : layout.stage(s).params) {
        const at::Tensor x = whole.at(pname), y = part.at(pname);
        EXPECT_TRUE(at::allclose(x, y, 1e-4, 1e-5))
            << pname << " on replica " << r << ", stage " << s << ": max difference "
            << (x - y).abs().max().item<double>();
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Strategies, PipelineReplicas,
                         ::testing::Values(ReplicaCase{"gpt2-tiny", "ddp", 2},
                                           ReplicaCase{"llama-tiny", "diloco", 2},
                                           ReplicaCase{"gpt2-tiny", "co2", 2},
                                           ReplicaCase{"gpt2-tiny", "co2", 3, true}),
                         [](const auto& info) {
                           const ReplicaCase& c = info.param;
                           return std::string(c.preset[0] == 'g' ? "Gpt2" : "Llama") + c.strategy +
                                  std::to_string(c.stages) + "Stages" + (c.zero ? "Zero" : "");
                         });

// A tied weight (GPT-2's embedding and head) has a copy on the first and on the last stage. Each
// copy is averaged in its own stage's group; with three or more replicas those sums may add the
// replicas in different orders. The copies must still end every step equal, bit for bit.
TEST_F(PipelineRunTest, TiedWeightCopiesStayEqualUnderThreeReplicas) {
  const fs::path cfg = config("tied3", "gpt2-tiny", 1, false);
  const auto r = run_cli("train -q --config " + cfg.string() +
                         " --peers 6 --set pipeline.num_stages=2 --set strategy.kind=diloco "
                         "--set strategy.local_steps=1 --set net.peer_timeout_ms=20000");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto model = starling::train::load_run_config(cfg);
  auto dag = starling::model::build_model(model.model, model.train.seed, c10::kCPU);
  PipelineConfig pc;
  pc.num_stages = 2;
  const PipelineLayout layout(*dag, stage_ranges(pc, dag->size()));
  ASSERT_FALSE(layout.shared().empty()) << "gpt2-tiny has no tied weight";
  for (int replica = 0; replica < 3; ++replica) {
    auto weights = [&](int stage) {
      return starling::read_safetensors(root_ / "run_tied3" /
                                        ("peer-" + std::to_string(replica * 2 + stage)) /
                                        "checkpoints" / "step_00000004" / "model.safetensors");
    };
    const auto first = weights(0), last = weights(1);
    for (const auto& sp : layout.shared()) {
      const at::Tensor a = first.at(sp.name), b = last.at(sp.name);
      EXPECT_TRUE(at::equal(a, b)) << sp.name << " on replica " << replica << ": max difference "
                                   << (a - b).abs().max().item<double>();
    }
  }
}

TEST_F(PipelineRunTest, AKilledStageStopsItsPipelineWhileTheOtherReplicaGoesOn) {
  const fs::path cfg = config("kill_replica", "gpt2-tiny", 2, false);
  const fs::path run = root_ / "run_kill_replica";
  const fs::path log = root_ / "kill_replica.log";
  const pid_t launcher = launch("--config " + cfg.string() +
                                    " --peers 4 --set pipeline.num_stages=2 --set "
                                    "strategy.kind=ddp --set train.steps=150 --set "
                                    "train.eval_every=0 --set net.peer_timeout_ms=2000",
                                log);
  ASSERT_GT(launcher, 0);
  const auto records = lines;
  for (int i = 0; i < 600 && records(run / "peer-3" / "metrics.jsonl") < 3; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_GE(records(run / "peer-3" / "metrics.jsonl"), 3) << starling::testing::read_file(log);
  // Stage 1 of replica 1.
  ASSERT_EQ(std::system(("pkill -9 -f '" + (run / "[p]eer-3").string() + "\"'").c_str()), 0);
  const int at_kill = records(run / "peer-0" / "metrics.jsonl");
  while (::kill(launcher, 0) == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const std::string out = starling::testing::read_file(log);
  // Replica 1's other stage stops, naming the dead one.
  const std::string peer2 = starling::testing::read_file(run / "peer-2.log");
  EXPECT_TRUE(std::regex_search(peer2, std::regex("error: pipeline.*(stage 1 \\(peer|peer-3)")))
      << peer2;
  // Replica 0 trains on to the end and saves its final checkpoint on both stages.
  for (const int s : {0, 1}) {
    const fs::path dir = run / ("peer-" + std::to_string(s));
    EXPECT_TRUE(fs::exists(dir / "checkpoints" / "step_00000150" / "model.safetensors"))
        << "stage " << s << " of replica 0 did not finish:\n"
        << starling::testing::read_file(run / ("peer-" + std::to_string(s) + ".log"));
    EXPECT_GT(records(dir / "metrics.jsonl"), at_kill) << out;
  }
  EXPECT_NE(out.find("peers failed"), std::string::npos) << out;
}

// Top-k on the links sends a fraction of the bytes and still trains; AdaTopK on loopback, where
// the links keep up with compute, sends whole tensors; int8 sends a quarter and loses nearly
// nothing.
TEST_F(PipelineRunTest, CompressedLinksSendFewerBytesAndAdaTopKOnlyWhereTheyBind) {
  const auto run_with = [&](const std::string& name, const std::string& compression) {
    const fs::path cfg = config("compress_" + name, "gpt2-tiny", 4, false);
    const auto r = run_cli("train -q --config " + cfg.string() +
                           " --peers 2 --set pipeline.num_stages=2 --set train.steps=30 "
                           "--set train.eval_every=0 " +
                           compression);
    EXPECT_EQ(r.code, 0) << r.output;
    const std::string log =
        starling::testing::read_file(root_ / ("run_compress_" + name) / "peer-0.log");
    std::smatch m;
    double sent = -1;
    if (std::regex_search(log, m, std::regex("sent ([0-9.]+) MB over 30 steps")))
      sent = std::stod(m[1].str());
    const auto l = losses(root_ / ("run_compress_" + name) / "peer-1");
    return std::tuple{sent, l.empty() ? -1.0 : l.back().second, log};
  };
  const auto [whole_mb, whole_loss, whole_log] = run_with("none", "");
  const auto [topk_mb, topk_loss, topk_log] =
      run_with("topk", "--set pipeline.compression=\"topk\" --set pipeline.topk_ratio=0.2");
  const auto [ada_mb, ada_loss, ada_log] =
      run_with("ada", "--set pipeline.compression=\"adatopk\"");
  ASSERT_GT(whole_mb, 0) << whole_log;
  ASSERT_GT(topk_mb, 0) << topk_log;
  // Stage 0 sends activations, int8 by default: a quarter of the bytes, and some scales.
  EXPECT_LT(topk_mb, 0.3 * whole_mb) << topk_log;
  EXPECT_NE(topk_log.find("activations int8"), std::string::npos) << topk_log;
  EXPECT_NE(topk_log.find("topk: "), std::string::npos) << topk_log;
  // It trains: the loss falls from ln(256) and stays near the uncompressed one.
  EXPECT_LT(topk_loss, 0.9 * std::log(256.0));
  EXPECT_LT(std::abs(topk_loss - whole_loss), 0.15 * whole_loss)
      << "whole " << whole_loss << ", top-k " << topk_loss;
  EXPECT_NE(ada_log.find("keeping 100.0% of gradient entries)"), std::string::npos) << ada_log;
  EXPECT_NEAR(ada_mb, whole_mb, 0.05 * whole_mb) << ada_log;
  // int8 both ways: about a quarter of the bytes, no entry dropped, nearly the same loss.
  const auto [int8_mb_rounded, int8_loss, int8_log] =
      run_with("int8", "--set pipeline.compression=\"int8\"");
  std::smatch ratio;
  ASSERT_TRUE(std::regex_search(int8_log, ratio, std::regex("MB whole, ([0-9.]+)x;"))) << int8_log;
  EXPECT_GT(std::stod(ratio[1].str()), 3.3) << int8_log;
  EXPECT_LT(std::stod(ratio[1].str()), 4.1) << int8_log;
  EXPECT_NE(int8_log.find("activations int8, gradients int8"), std::string::npos) << int8_log;
  EXPECT_LT(std::abs(int8_loss - whole_loss), 0.02 * whole_loss)
      << "whole " << whole_loss << ", int8 " << int8_loss;
}

// stages = "auto": the launcher plans the cut and each peer's place for the lab, keeps the plan in
// the run directory, and a resumed run places every peer as the plan it began with did.
TEST_F(PipelineRunTest, AutoStagesArePlannedOnceAndKeptForResume) {
  const fs::path cfg = config("auto", "gpt2-tiny", 2, false);
  const fs::path run = root_ / "run_auto";
  const std::string args = "train --config " + cfg.string() +
                           " --peers 2 --set 'pipeline.stages=\"auto\"' --set train.steps=4";
  const auto first = run_cli(args + " --stop-at 2");
  ASSERT_EQ(first.code, 0) << first.output;
  EXPECT_NE(first.output.find("plan: OP-Fence for 2 peers"), std::string::npos) << first.output;
  EXPECT_NE(first.output.find("1 replica of 2 stages"), std::string::npos) << first.output;
  // Four steps are too few to pay for a trial of the plan (pipeline.calibrate_steps = -1).
  EXPECT_NE(first.output.find("plan: calibration: not calibrated: train.steps = 4 is under 20 "
                              "times a trial of 3 steps"),
            std::string::npos)
      << first.output;
  EXPECT_FALSE(fs::exists(run / "calibration"));
  // The run, stopped after step 2, against its plan: step 2 timed from the records of steps 1-2.
  EXPECT_NE(first.output.find("plan: against the run: a step took "), std::string::npos)
      << first.output;
  EXPECT_NE(first.output.find(" predicted (predicted / measured "), std::string::npos)
      << first.output;
  EXPECT_NE(first.output.find(") over steps 2-2\n  peer 0, stage 0: computed "), std::string::npos)
      << first.output;
  EXPECT_NE(first.output.find("  peer 1, stage 1: computed "), std::string::npos) << first.output;
  const std::string plan = starling::testing::read_file(run / "auto_pipeline.json");
  EXPECT_NE(plan.find("\"stage_of\""), std::string::npos) << plan;
  const auto resumed = run_cli(args + " --resume");
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("plan: the run's own"), std::string::npos) << resumed.output;
  // The plan read back still knows what it predicted: step 4 against it (the resumed records
  // begin at step 3).
  EXPECT_NE(resumed.output.find(") over steps 4-4\n  peer 0, stage 0: computed "),
            std::string::npos)
      << resumed.output;
  EXPECT_TRUE(fs::exists(run / "peer-1" / "checkpoints" / "step_00000004"));
  // A damaged plan is named, and nothing starts.
  std::ofstream(run / "auto_pipeline.json") << "{\"format\": \"starling-auto-pipeline\"}";
  const auto damaged = run_cli(args + " --resume");
  EXPECT_NE(damaged.code, 0);
  EXPECT_NE(damaged.output.find("auto_pipeline.json: damaged pipeline plan"), std::string::npos)
      << damaged.output;
  // A peer started by hand plans with the others, so it must know how many there are.
  const auto peer = run_cli("peer --config " + cfg.string() +
                            " --set 'pipeline.stages=\"auto\"' --insecure --listen "
                            "tcp://127.0.0.1:0");
  EXPECT_NE(peer.code, 0);
  EXPECT_NE(peer.output.find("set net.min_peers to the swarm's size"), std::string::npos)
      << peer.output;
}

// pipeline.calibrate_steps: the launcher trains its plan for a few steps in <out_dir>/calibration,
// sets each peer's speed to what its stage measured there, plans again, and the run starts from
// step 0 with that plan. Misplaced settings are named before any peer starts.
TEST_F(PipelineRunTest, AutoStagesCalibratedByATrial) {
  const fs::path cfg = config("calibrated", "gpt2-tiny", 2, false);
  const fs::path run = root_ / "run_calibrated";
  const std::string args = "train -q --config " + cfg.string() +
                           " --peers 2 --set 'pipeline.stages=\"auto\"' --set train.steps=4";
  const auto r = run_cli(args + " --set pipeline.calibrate_steps=3");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("plan: calibrating: 3 steps of this plan in " +
                          (run / "calibration" / "trial-1").string()),
            std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("trial(s) timed over steps 2-3, their median"), std::string::npos)
      << r.output;
  for (int d = 0; d < 2; ++d)
    EXPECT_NE(r.output.find("    device " + std::to_string(d) + " (peer " + std::to_string(d) +
                            "): nodes "),
              std::string::npos)
        << r.output;
  // Each tried plan is priced at its own trial's speeds, and the run keeps one of them.
  EXPECT_NE(r.output.find("    its plan predicts "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(", at the speeds its trial measured:"), std::string::npos) << r.output;
  // The plan the run keeps is the calibrated one.
  const auto plan = nlohmann::json::parse(starling::testing::read_file(run / "auto_pipeline.json"));
  EXPECT_NE(plan["report"].get<std::string>().find("calibrated by "), std::string::npos) << plan;
  // The trial ran its 3 steps and left no checkpoints; the run trained its 4 from step 0.
  for (int i = 0; i < 2; ++i) {
    const std::string peer = "peer-" + std::to_string(i);
    EXPECT_EQ(steps_of(run / "calibration" / "trial-1" / peer / "metrics.jsonl"),
              (std::vector<int64_t>{1, 2, 3}));
    EXPECT_FALSE(fs::exists(run / "calibration" / "trial-1" / peer / "checkpoints"));
    EXPECT_EQ(steps_of(run / peer / "metrics.jsonl"), (std::vector<int64_t>{1, 2, 3, 4}));
  }
  const fs::path other = root_ / "run_calibrated_bad";
  auto refused = [&](const std::string& sets) {
    return run_cli("train -q --config " + cfg.string() + " --peers 2 --set 'train.out_dir=\"" +
                   other.string() + "\"' " + sets);
  };
  auto one = refused("--set 'pipeline.stages=\"auto\"' --set pipeline.calibrate_steps=1");
  EXPECT_NE(one.code, 0);
  EXPECT_NE(one.output.find("pipeline.calibrate_steps = 1: the trial's first step warms up"),
            std::string::npos)
      << one.output;
  auto fixed = refused("--set pipeline.num_stages=2 --set pipeline.calibrate_steps=2");
  EXPECT_NE(fixed.code, 0);
  EXPECT_NE(fixed.output.find("calibrates the plan of pipeline.stages = \"auto\""),
            std::string::npos)
      << fixed.output;
  EXPECT_FALSE(fs::exists(other / "peer-0" / "metrics.jsonl"));
}

// pipeline.calibrate_steps with pipeline.planner = "peers": the peers train their agreed plan for
// a few steps in each one's <out_dir>/calibration, send the planner what their stages measured,
// and run the plan it keeps from step 0, with no launcher involved.
TEST_F(PipelineRunTest, AutoStagesCalibratedByThePeers) {
  const fs::path cfg = config("peers_calibrated", "gpt2-tiny", 2, false);
  const fs::path run = root_ / "run_peers_calibrated";
  const auto r = run_cli("train -q --config " + cfg.string() +
                         " --peers 2 --set 'pipeline.stages=\"auto\"' --set train.steps=4 "
                         "--set 'pipeline.planner=\"peers\"' --set pipeline.calibrate_steps=3");
  std::string logs;
  for (int i = 0; i < 2; ++i)
    logs += starling::testing::read_file(run / ("peer-" + std::to_string(i) + ".log"));
  ASSERT_EQ(r.code, 0) << r.output << logs;
  EXPECT_NE(logs.find("plan: calibration: pipeline.calibrate_steps = 3"), std::string::npos)
      << logs;
  std::string first_plan;
  for (int i = 0; i < 2; ++i) {
    const fs::path peer = run / ("peer-" + std::to_string(i));
    const fs::path trial = peer / "calibration" / "trial-1";
    EXPECT_NE(logs.find("plan: calibrating: 3 steps of this plan in " + trial.string()),
              std::string::npos)
        << logs;
    EXPECT_EQ(steps_of(trial / "metrics.jsonl"), (std::vector<int64_t>{1, 2, 3}));
    EXPECT_FALSE(fs::exists(trial / "checkpoints"));
    EXPECT_EQ(steps_of(peer / "metrics.jsonl"), (std::vector<int64_t>{1, 2, 3, 4}));
    // Both keep the planner's calibrated plan, the run's to resume with.
    auto plan = nlohmann::json::parse(starling::testing::read_file(peer / "auto_pipeline.json"));
    const std::string report = plan["report"].get<std::string>();
    EXPECT_NE(report.find("calibrated by "), std::string::npos) << report;
    EXPECT_NE(report.find("timed over steps 2-3, their median"), std::string::npos) << report;
    EXPECT_NE(report.find("    its plan predicts "), std::string::npos) << report;
    EXPECT_FALSE(plan.contains("trial_steps")) << plan;
    plan.erase("self");
    if (i == 0) first_plan = plan.dump();
    EXPECT_EQ(plan.dump(), first_plan) << "peer " << i << " kept another plan";
  }
  // Each peer sets its own part of the run against the plan; the launcher sets them side by side.
  for (int i = 0; i < 2; ++i)
    EXPECT_NE(starling::testing::read_file(run / ("peer-" + std::to_string(i) + ".log"))
                  .find("plan: against this peer's run: a step took "),
              std::string::npos)
        << logs;
  EXPECT_NE(r.output.find("plan: against the run: a step took "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("  peer 1, stage "), std::string::npos) << r.output;
}

// On a lab with one slow pair, the plan keeps the pipeline off that link: the peer between the two
// slow-linked ones runs the middle stage. The launcher plans from the lab's rates; with
// pipeline.planner = "peers" the peers find the slow link by measuring it themselves, its delay
// too.
class AutoStagesInALab : public PipelineRunTest,
                         public ::testing::WithParamInterface<std::string> {};

TEST_P(AutoStagesInALab, StepAroundASlowLink) {
  if (auto why = starling::net::NetLab::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  const std::string planner = GetParam();
  const fs::path cfg = config("auto_lab_" + planner, "gpt2-tiny", 2, false);
  const fs::path lab = root_ / "slow-pair.toml";
  std::ofstream(lab) << "peers = 3\nrate = \"1gbit\"\n[[link]]\npeers = [0, 1]\n"
                        "rate = \"1mbit\"\ndelay = \"30ms\"\n";
  const auto r = run_cli("train -q --config " + cfg.string() + " --lab " + lab.string() +
                         " --set 'pipeline.stages=\"auto\"' --set train.steps=3 --set "
                         "'pipeline.planner=\"" +
                         planner + "\"'");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("1mbit: 0-1"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("delay 30ms: 0-1"), std::string::npos) << r.output;
  const fs::path run = root_ / ("run_auto_lab_" + planner);
  if (planner == "launcher") {
    const std::string plan = starling::testing::read_file(run / "auto_pipeline.json");
    const auto j = nlohmann::json::parse(plan);
    EXPECT_EQ(j["stages"].size(), 3u) << plan;
    EXPECT_EQ(j["stage_of"][2], 1) << plan;
    return;
  }
  // Every peer keeps the same plan, and the one it names as itself is where it sits.
  std::vector<int> stage_of_peer;
  std::string first_ids;
  for (int i = 0; i < 3; ++i) {
    const std::string plan =
        starling::testing::read_file(run / ("peer-" + std::to_string(i)) / "auto_pipeline.json");
    const auto j = nlohmann::json::parse(plan);
    ASSERT_EQ(j["stages"].size(), 3u) << plan;
    if (i == 0) first_ids = j["peer_ids"].dump();
    EXPECT_EQ(j["peer_ids"].dump(), first_ids) << "peer " << i << " agreed on another plan";
    stage_of_peer.push_back(j["stage_of"][j["self"].get<int>()]);
  }
  EXPECT_EQ(stage_of_peer[2], 1) << "peer 2, between the two slow-linked peers, runs stage "
                                 << stage_of_peer[2] << ":\n"
                                 << starling::testing::read_file(run / "peer-0.log");
  // The slow pair's pings crossed the 30 ms link both ways: about 30 ms each way (the shortest of
  // four; a ping behind a probe reads seconds), the others next to nothing.
  const std::string log = starling::testing::read_file(run / "peer-0.log");
  std::vector<double> latencies;
  for (size_t at = log.find(" Mbit/s back, "); at != std::string::npos;
       at = log.find(" Mbit/s back, ", at + 1))
    latencies.push_back(std::stod(log.substr(at + 14)));
  ASSERT_EQ(latencies.size(), 3u) << log;
  std::sort(latencies.begin(), latencies.end());
  std::printf("measured latencies each way: %.3g, %.3g, %.3g ms\n", latencies[0], latencies[1],
              latencies[2]);
  EXPECT_GE(latencies[2], 29) << log;
  EXPECT_LE(latencies[2], 60) << log;
  EXPECT_LT(latencies[1], 10) << log;
}

INSTANTIATE_TEST_SUITE_P(Planners, AutoStagesInALab, ::testing::Values("launcher", "peers"),
                         [](const auto& info) { return info.param; });

// With CPU quotas, the launcher's plan takes each peer's speed from a profile of the model in
// that peer's quota, every quota profiling at once (pipeline.lab_speeds = "profiled"): a peer at
// a quarter of the other's CPU measures well under its speed. With "quotas" the plan weighs the
// quotas' shares (x0.25) and profiles nothing.
TEST_F(PipelineRunTest, AutoStagesWeighEveryPeerAsProfiledInItsQuota) {
  const fs::path cfg = config("auto_quota", "gpt2-tiny", 2, false);
  const std::string args = "train -q --config " + cfg.string() +
                           " --peers 2 --peer-cpus 1,0.25 --set 'pipeline.stages=\"auto\"' "
                           "--set train.steps=2 --set model.d_model=128 --set model.seq_len=64";
  const auto r = run_cli(args);
  if (r.code != 0 && r.output.find("needs CPU quotas") != std::string::npos)
    GTEST_SKIP() << "no CPU quotas here (cgroups need root): " << r.output;
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("profiling the model in every peer's CPU quota at once"),
            std::string::npos)
      << r.output;
  // "  peer i, <cpus> CPU: <ms> ms per micro-batch, speed <s> (assumed <the quota's share>)"
  std::vector<double> speeds;
  for (const char* line : {"  peer 0, 1 CPU: ", "  peer 1, 0.25 CPU: "}) {
    const size_t at = r.output.find(line);
    ASSERT_NE(at, std::string::npos) << line << " missing from:\n" << r.output;
    const size_t speed = r.output.find("speed ", at);
    ASSERT_NE(speed, std::string::npos) << r.output;
    speeds.push_back(std::stod(r.output.substr(speed + 6)));
  }
  std::printf("profiled speeds: %.3f at 1 CPU, %.3f at 0.25 CPU\n", speeds[0], speeds[1]);
  // A quarter of a core against a whole one; loose, as other tests may share the cores.
  EXPECT_GT(speeds[0], 0.2) << r.output;
  EXPECT_LT(speeds[1], 0.75 * speeds[0]) << r.output;
  const fs::path run = root_ / "run_auto_quota";
  for (const char* table : {"peer-0.json", "peer-1.json"})
    EXPECT_TRUE(fs::exists(run / "lab_speeds" / table)) << table;

  const auto shares = run_cli(args +
                              " --set 'pipeline.lab_speeds=\"quotas\"' --set "
                              "'train.out_dir=\"" +
                              (root_ / "run_auto_quota_shares").string() + "\"'");
  ASSERT_EQ(shares.code, 0) << shares.output;
  EXPECT_EQ(shares.output.find("profiling the model in every peer's CPU quota"), std::string::npos)
      << shares.output;
  EXPECT_NE(shares.output.find("(x0.25)"), std::string::npos) << shares.output;
}

// Without quotas, peers whose threads outnumber the cores share them: the launcher profiles the
// model in every peer's place at once, and each peer's speed is its share of the cores as it
// measured it, not the speed of the reference profile taken alone.
TEST_F(PipelineRunTest, AutoStagesWeighPeersThatShareTheCores) {
  const fs::path cfg = config("auto_crowd", "gpt2-tiny", 2, false);
  const int cores = starling::default_threads();  // the cores, within a cgroup's CPU limit
  const auto r = run_cli("train -q --config " + cfg.string() +
                         " --peers 2 --set 'pipeline.stages=\"auto\"' --set train.steps=2 --set "
                         "model.d_model=128 --set model.seq_len=64 --set train.threads=" +
                         std::to_string(cores));
  ASSERT_EQ(r.code, 0) << r.output;
  // The cores they share: a fraction under a cgroup's limit of, say, 1.5 CPUs.
  char room[32];
  std::snprintf(room, sizeof room, "%g",
                std::min<double>(starling::physical_cores(), starling::usable_cpus()));
  const std::string crowd = "2 peers x " + std::to_string(cores) + " threads on " + room + " cores";
  EXPECT_NE(r.output.find("profiling the model in every peer's place (" + crowd + ") at once"),
            std::string::npos)
      << r.output;
  double total = 0;
  for (const char* line : {"  peer 0, no quota: ", "  peer 1, no quota: "}) {
    const size_t at = r.output.find(line);
    ASSERT_NE(at, std::string::npos) << line << " missing from:\n" << r.output;
    const size_t speed = r.output.find("speed ", at);
    ASSERT_NE(speed, std::string::npos) << r.output;
    const double s = std::stod(r.output.substr(speed + 6));
    std::printf("%sspeed %.3f\n", line, s);
    EXPECT_GT(s, 0) << r.output;
    total += s;
  }
  // Two peers on every core cannot each compute as fast as one alone (here they measure far
  // slower: their threads spin waiting for each other's cores). Loose, as the reference's threads
  // do not speed a tiny model up in proportion, and other tests may share the cores.
  EXPECT_LT(total, 1.7) << r.output;
  for (const char* table : {"peer-0.json", "peer-1.json"})
    EXPECT_TRUE(fs::exists(root_ / "run_auto_crowd" / "lab_speeds" / table)) << table;
}

// With pipeline.replacement_wait_s, a peer started with a dead stage's key takes its place: the
// dead stage's partner leaves and rejoins, a whole replica admits both at one step, they take its
// state, and all four peers train to the end with the replicas equal.
TEST_F(PipelineRunTest, AReplacementTakesOverADeadStageFromItsCounterpart) {
  const fs::path cfg = config("replace", "gpt2-tiny", 2, false);
  const fs::path run = root_ / "run_replace";
  const fs::path log = root_ / "replace.log";
  // 1500 steps: the healthy replica trains on for some 15 s after the kill on a fast machine
  // (about 100 steps a second), three times what the replacement takes to be admitted there;
  // on a slow one both take proportionally longer.
  const std::string settings =
      " --set pipeline.num_stages=2 --set strategy.kind=ddp --set train.steps=1500 --set "
      "train.log_every=10 --set train.eval_every=0 --set train.checkpoint_every=1000 --set "
      "net.peer_timeout_ms=2000 --set pipeline.replacement_wait_s=120";
  const pid_t launcher = launch("--config " + cfg.string() + " --peers 4" + settings, log);
  ASSERT_GT(launcher, 0);
  const auto records = lines;
  for (int i = 0; i < 600 && records(run / "peer-3" / "metrics.jsonl") < 5; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_GE(records(run / "peer-3" / "metrics.jsonl"), 5) << starling::testing::read_file(log);
  // Stage 1 of replica 1.
  ASSERT_EQ(std::system(("pkill -9 -f '" + (run / "[p]eer-3").string() + "\"'").c_str()), 0);
  // Its partner notices, leaves and waits to rejoin.
  for (int i = 0; i < 300; ++i) {
    if (starling::testing::read_file(run / "peer-2.log").find("for a replacement") !=
        std::string::npos)
      break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_NE(starling::testing::read_file(run / "peer-2.log").find("for a replacement"),
            std::string::npos)
      << starling::testing::read_file(run / "peer-2.log");

  // The replacement: peer 3's key, rank and directory, through the launcher's entry point.
  std::smatch m;
  const std::string launched = starling::testing::read_file(log);
  ASSERT_TRUE(std::regex_search(launched, m, std::regex("entry point (\\S+)"))) << launched;
  const fs::path script = root_ / "replace.sh";
  std::ofstream(script) << STARLING_CLI_PATH << " peer -q --resume --data-rank 3 --data-world 4 "
                        << "--config " << cfg.string() << settings << " --set 'train.out_dir=\""
                        << (run / "peer-3").string() << "\"' --set 'net.key=\""
                        << (run / "keys" / "peer-3.key").string() << "\"' --set 'net.allow=\""
                        << (run / "keys" / "allowlist").string()
                        << "\"' --set 'net.name=\"peer-3\"' --set "
                        << "'net.listen=\"tcp://127.0.0.1:0\"' --set 'net.join=[\"" << m[1].str()
                        << "\"]' > " << (root_ / "replacement.log").string() << " 2>&1\n";
  const int replaced = std::system(("timeout 300 sh " + script.string()).c_str());
  while (::kill(launcher, 0) == 0) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  const std::string replacement = starling::testing::read_file(root_ / "replacement.log");
  EXPECT_EQ(replaced, 0) << replacement;
  EXPECT_NE(replacement.find("waiting until a whole replica admits"), std::string::npos)
      << replacement;
  EXPECT_TRUE(std::regex_search(replacement, std::regex("adopting the swarm's state from peer "
                                                        "\\S+ (\\(\\S+\\) )?\\(step [1-9]")))
      << replacement;
  const std::string healthy = starling::testing::read_file(run / "peer-1.log");
  EXPECT_NE(healthy.find("admitting peer"), std::string::npos) << healthy;

  // Every stage of both replicas finished, and the replicas hold the same weights.
  for (const int s : {0, 1}) {
    const auto path = [&](int peer) {
      return run / ("peer-" + std::to_string(peer)) / "checkpoints" / "step_00001500" /
             "model.safetensors";
    };
    ASSERT_TRUE(fs::exists(path(s)) && fs::exists(path(s + 2)))
        << "stage " << s << " did not finish in both replicas:\n"
        << starling::testing::read_file(run / ("peer-" + std::to_string(s + 2) + ".log"));
    const auto a = starling::read_safetensors(path(s));
    const auto b = starling::read_safetensors(path(s + 2));
    ASSERT_EQ(a.tensors.size(), b.tensors.size());
    for (const auto& [name, t] : a.tensors)
      EXPECT_TRUE(at::equal(t, b.at(name))) << name << " differs between the replicas' stage " << s;
  }
}

}  // namespace

namespace {

// Starts `ranks` peers the way torchrun does (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), rank r
// with `settings` and `rank_settings[r]` (when given), each writing under `run`/r and logging to
// `run`r.log; waits for all of them. Returns the shell's exit code, with every log in `logs`.
int run_torchrun_group(const fs::path& cfg, const fs::path& run, int ranks, int port_salt,
                       const std::string& settings, const std::vector<std::string>& rank_settings,
                       std::string& logs) {
  const std::string port = std::to_string(20000 + (::getpid() + port_salt) % 20000);
  const fs::path script = run.string() + ".sh";
  {
    std::ofstream out(script);
    for (int r = 0; r < ranks; ++r)
      out << "RANK=" << r << " WORLD_SIZE=" << ranks
          << " MASTER_ADDR=127.0.0.1 MASTER_PORT=" << port << " timeout 180 " << STARLING_CLI_PATH
          << " peer -q --insecure --config " << cfg.string() << settings << " "
          << (r < static_cast<int>(rank_settings.size()) ? rank_settings[r] : "")
          << " --set 'train.out_dir=\"" << (run / "{rank}").string() << "\"' > "
          << (run.string() + std::to_string(r)) << ".log 2>&1 &\n";
    out << "wait\n";
  }
  const int code = std::system(("sh " + script.string()).c_str());
  logs.clear();
  for (int r = 0; r < ranks; ++r)
    logs += starling::testing::read_file(run.string() + std::to_string(r) + ".log");
  return code;
}

// Under a torchrun-style launch (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT), each `starling peer`
// finds its stage (rank mod stages) and replica (rank / stages) itself, and each replica trains
// on its own share of the data.
TEST_F(PipelineRunTest, TorchrunRanksPlaceStagesAndReplicas) {
  const fs::path cfg = config("torchrun", "gpt2-tiny", 2, false);
  const fs::path run = root_ / "run_torchrun";
  std::string logs;
  const int code = run_torchrun_group(
      cfg, run, 4, 4243, " --set pipeline.num_stages=2 --set strategy.kind=ddp", {}, logs);
  ASSERT_EQ(code, 0) << logs;
  for (int r = 0; r < 4; ++r) {
    const std::string log = starling::testing::read_file(run.string() + std::to_string(r) + ".log");
    EXPECT_NE(log.find("(pipeline stage " + std::to_string(r % 2) + " of 2, replica " +
                       std::to_string(r / 2) + " of 2)"),
              std::string::npos)
        << log;
  }
  // The stages of a replica log its loss; the replicas' first losses differ (their data does).
  const auto r0 = losses(run / "0"), r1 = losses(run / "1"), r2 = losses(run / "2");
  ASSERT_FALSE(r0.empty());
  EXPECT_EQ(r0.size(), r1.size());
  EXPECT_NEAR(r0[0].second, r1[0].second, 1e-5 * r0[0].second);
  ASSERT_FALSE(r2.empty());
  EXPECT_GT(std::abs(r0[0].second - r2[0].second), 1e-4) << "both replicas read the same data";
}

// Peers started one by one (here as torchrun's ranks) with stages = "auto" measure themselves and
// agree on one plan, each keeps it, and a resumed run places every peer as that plan did.
TEST_F(PipelineRunTest, PeersStartedOneByOnePlanAutoStagesTogether) {
  const fs::path cfg = config("peers_auto", "gpt2-tiny", 2, false);
  const fs::path run = root_ / "run_peers_auto";
  const std::string settings =
      " --set 'pipeline.stages=\"auto\"' --set strategy.kind=ddp --set train.steps=4"
      " --set train.checkpoint_every=2";
  std::string logs;
  ASSERT_EQ(run_torchrun_group(cfg, run, 4, 6121, settings + " --stop-at 2", {}, logs), 0) << logs;
  std::set<std::pair<int, int>> places;
  std::string stages;
  for (int r = 0; r < 4; ++r) {
    const auto j = nlohmann::json::parse(
        starling::testing::read_file(run / std::to_string(r) / "auto_pipeline.json"));
    if (r == 0) stages = j["stages"].dump();
    EXPECT_EQ(j["stages"].dump(), stages) << "rank " << r << " planned another cut";
    const int self = j["self"];
    places.emplace(j["stage_of"][self], j["replica_of"][self]);
  }
  EXPECT_EQ(places.size(), 4u) << "two peers took one place:\n" << logs;
  EXPECT_NE(logs.find("plan: agreed by the peers"), std::string::npos) << logs;
  EXPECT_NE(logs.find("measured by the peers:"), std::string::npos) << logs;
  ASSERT_EQ(run_torchrun_group(cfg, run, 4, 6187, settings + " --resume", {}, logs), 0) << logs;
  EXPECT_NE(logs.find("plan: this peer's own"), std::string::npos) << logs;
  EXPECT_EQ(logs.find("plan: agreed by the peers"), std::string::npos) << logs;
  for (int r = 0; r < 4; ++r)
    EXPECT_TRUE(fs::exists(run / std::to_string(r) / "checkpoints" / "step_00000004")) << logs;
}

// Only tensors cross a link, so the stages of one pipeline may run on different devices: stage 0
// on the CPU and stage 1 on a GPU train like two CPU stages (up to the devices' rounding; TF32
// off).
TEST_F(PipelineRunTest, AStageOnTheCpuAndOneOnAGpuTrainLikeTwoCpuStages) {
  if (!at::hasCUDA()) GTEST_SKIP() << "no GPU: this libtorch has no CUDA support or sees no GPU";
  const fs::path cfg = config("mixed", "gpt2-tiny", 2, false);
  const std::string settings =
      " --set pipeline.num_stages=2 --set strategy.kind=ddp --set train.tf32=false";
  std::string logs;
  const fs::path cpu = root_ / "run_mixed_cpu", mixed = root_ / "run_mixed_gpu";
  ASSERT_EQ(run_torchrun_group(cfg, cpu, 2, 5311, settings, {}, logs), 0) << logs;
  ASSERT_EQ(
      run_torchrun_group(cfg, mixed, 2, 5377, settings, {"", "--set train.device=cuda"}, logs), 0)
      << logs;
  const auto a = losses(cpu / "0"), b = losses(mixed / "0");
  ASSERT_FALSE(a.empty());
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].first, b[i].first);
    EXPECT_NEAR(a[i].second, b[i].second, 1e-4 * a[i].second) << "record " << i;
  }
}

}  // namespace
