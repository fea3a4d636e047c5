#include "starling/strategy/auto_pipeline.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <set>
#include <span>
#include <sstream>
#include <stdexcept>

#include "starling/common/error.h"
#include "starling/compress/ada_topk.h"
#include "starling/data/atomic_file.h"
#include "starling/graph/dag.h"
#include "starling/model/build.h"
#include "starling/net/peer_id.h"
#include "starling/sched/op_fence.h"
#include "starling/sched/plan_report.h"
#include "starling/sched/workload.h"
#include "starling/train/config.h"

namespace starling::strategy {

std::vector<std::string> AutoPipeline::overrides(int i) const {
  std::string ranges = "[";
  for (size_t s = 0; s < stages.size(); ++s)
    ranges += (s ? ", [" : "[") + std::to_string(stages[s].first) + ", " +
              std::to_string(stages[s].second) + "]";
  ranges += "]";
  return {"pipeline.stages=" + ranges,
          "pipeline.stage=" + std::to_string(stage_of.at(static_cast<size_t>(i))),
          "pipeline.replica=" + std::to_string(replica_of.at(static_cast<size_t>(i))),
          "pipeline.replicas=" + std::to_string(replicas)};
}

sched::CostTable model_costs(const train::RunConfig& config) {
  sched::CostTable t;
  if (!config.pipeline.profile.empty()) {
    t = sched::read_cost_table(config.pipeline.profile);
    t.micro_batches = config.train.grad_accum;
    t.one_f_one_b = config.pipeline.schedule == "1f1b";
    t.extra_warmup = config.pipeline.extra_warmup;
    // A table of another model would cut this one at the wrong nodes, or past its end.
    const auto dag = model::build_model(config.model, config.train.seed, c10::kCPU);
    bool same = static_cast<int>(t.nodes.size()) == dag->size();
    for (int i = 0; same && i < dag->size(); ++i)
      same = t.nodes[static_cast<size_t>(i)].name == dag->nodes()[static_cast<size_t>(i)].name;
    if (!same)
      throw ConfigError("pipeline.profile = " + config.pipeline.profile + ": its " +
                        std::to_string(t.nodes.size()) + " nodes are not the model's " +
                        std::to_string(dag->size()) +
                        " (profile this config with `starling plan profile`)");
    return t;
  }
  std::cerr << "plan: profiling the model on this machine for pipeline.stages = \"auto\" (set "
               "pipeline.profile to a table from `starling plan profile` to skip this)\n";
  return sched::profile_workload(config);
}

sched::CostTable lab_costs(const train::RunConfig& config, const sched::LabSpec& lab) {
  sched::CostTable t = model_costs(config);
  sched::apply_lab(t, lab);
  return t;
}

AutoPipeline plan_auto_pipeline(const train::RunConfig& config, const sched::CostTable& costs) {
  return plan_on_costs(config, costs,
                       config.pipeline.profile.empty() ? "the profile" : config.pipeline.profile);
}

int64_t round_steps(const train::RunConfig& config) {
  const std::string& kind = config.strategy.kind;
  return kind == "localsgd" || kind == "diloco" || kind == "co2" ? config.strategy.local_steps : 1;
}

CalibrationChoice calibration_steps(const train::RunConfig& config) {
  const int64_t set = config.pipeline.calibrate_steps;
  if (set >= 0)
    return {set, set == 0 ? "pipeline.calibrate_steps = 0: planned from the assumed speeds"
                          : "pipeline.calibrate_steps = " + std::to_string(set)};
  const int64_t round = round_steps(config);
  const int64_t trial = round > 1 ? 2 * round : 3;
  const std::string what = round > 1 ? "two " + config.strategy.kind +
                                           " rounds, the second timed beside the first's averaging"
                                     : "the warm-up step and two more";
  if (config.train.steps >= kAutoCalibrationRuns * trial)
    return {trial, "a trial of " + std::to_string(trial) + " steps (" + what +
                       "; pipeline.calibrate_steps = -1 with train.steps = " +
                       std::to_string(config.train.steps) + ")"};
  return {0, "not calibrated: train.steps = " + std::to_string(config.train.steps) + " is under " +
                 std::to_string(kAutoCalibrationRuns) + " times a trial of " +
                 std::to_string(trial) + " steps (" + what +
                 "), so the plan keeps the assumed speeds; pipeline.calibrate_steps = " +
                 std::to_string(trial) + " calibrates it anyway"};
}

namespace {

// A peer's step records in its metrics.jsonl: each carries the stage's compute so far
// (net.compute_s); evaluations and the end's summary carry none. ConfigError naming the file
// and line when it is missing or a line is not a record.
std::vector<sched::StepRecord> read_step_records(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) throw ConfigError(file.string() + ": the run left no step records");
  std::vector<sched::StepRecord> records;
  std::string line;
  for (int n = 1; std::getline(in, line); ++n) {
    if (line.empty()) continue;
    try {
      const auto j = nlohmann::json::parse(line);
      if (!j.contains("net") || !j["net"].is_object() || !j["net"].contains("compute_s")) continue;
      records.push_back({.step = j.at("step").get<int64_t>(),
                         .compute_s = j["net"]["compute_s"].get<double>(),
                         .elapsed_s = j.value("elapsed_s", 0.0),
                         .run_from = j.value("run_from", int64_t{-1})});
    } catch (const nlohmann::json::exception& e) {
      throw ConfigError(file.string() + ":" + std::to_string(n) +
                        ": not a step record: " + e.what());
    }
  }
  return records;
}

std::filesystem::path metrics_of(const std::filesystem::path& root, size_t peer) {
  return root / ("peer-" + std::to_string(peer)) / "metrics.jsonl";
}

}  // namespace

double trial_seconds_per_micro_batch(const std::filesystem::path& file, int64_t micro_batches,
                                     const sched::TimedSteps& timed) {
  std::vector<std::pair<int64_t, double>> cumulative;
  for (const sched::StepRecord& r : read_step_records(file))
    cumulative.emplace_back(r.step, r.compute_s);
  const double per_mb = sched::compute_per_micro_batch(cumulative, micro_batches, timed);
  if (per_mb <= 0)
    throw ConfigError(file.string() + ": " + std::to_string(cumulative.size()) +
                      " step record(s); calibrating times " + timed.describe() +
                      " and needs the records of those and the step before");
  return per_mb;
}

std::vector<sched::StageTiming> trial_timings(const AutoPipeline& plan,
                                              const std::filesystem::path& root,
                                              int64_t micro_batches,
                                              const sched::TimedSteps& timed) {
  std::vector<sched::StageTiming> timings;
  for (size_t i = 0; i < plan.stage_of.size(); ++i) {
    const auto& range = plan.stages.at(static_cast<size_t>(plan.stage_of[i]));
    timings.push_back({.device = static_cast<int>(i),
                       .first = range.first,
                       .last = range.second,
                       .seconds_per_micro_batch = trial_seconds_per_micro_batch(
                           metrics_of(root, i), micro_batches, timed)});
  }
  return timings;
}

std::vector<PeerRecords> launcher_peer_records(const std::filesystem::path& root, int peers) {
  std::vector<PeerRecords> records;
  for (int i = 0; i < peers; ++i)
    records.push_back(
        {.device = i, .peer = i, .metrics = metrics_of(root, static_cast<size_t>(i))});
  return records;
}

std::optional<sched::RunAgainstPlan> run_against_auto_pipeline(
    const AutoPipeline& plan, const std::vector<PeerRecords>& records,
    const train::RunConfig& config) {
  if (plan.planned_compute_s.size() != plan.stage_of.size()) return std::nullopt;
  std::vector<sched::PlannedPeer> planned;
  std::vector<std::vector<sched::StepRecord>> read;
  try {
    for (const PeerRecords& r : records) {
      const auto d = static_cast<size_t>(r.device);
      if (r.device < 0 || d >= plan.stage_of.size()) return std::nullopt;
      planned.push_back(
          {.stage = plan.stage_of[d], .seconds_per_micro_batch = plan.planned_compute_s[d]});
      read.push_back(read_step_records(r.metrics));
    }
  } catch (const ConfigError&) {
    return std::nullopt;  // a peer that failed to start, or damaged records: nothing to say
  }
  sched::TimedSteps timed = sched::timed_steps(config.train.steps, round_steps(config));
  // co2's last step waits for the averaging still in flight, which every other step overlaps.
  if (config.strategy.kind == "co2" && timed.last > timed.first) --timed.last;
  auto run =
      sched::run_against_plan(read, planned, config.train.grad_accum, plan.predicted_step_s, timed);
  if (run)
    for (size_t i = 0; i < run->peers.size(); ++i) run->peers[i].peer = records[i].peer;
  return run;
}

namespace {

// The fraction of a cut's whole bytes AdaTopK sends one way over a link, as it chooses it.
double sent_fraction(const compress::StageCompression& c, bool activations, double int8,
                     double int4) {
  if (activations ? c.int4_activations : c.int4_gradients) return int4;
  if (activations ? c.int8_activations : c.int8_gradients) return int8;
  if (activations) return 1;               // top-k applies to the gradients only
  return std::min(1.0, 2 * c.keep_ratio);  // 8 bytes per kept entry against 4
}

// "adatopk" cuts the model at its most compressed (int4) sizes, but sends over each link only
// what that link needs (compress::adaptive_compression, per direction, within the slowest
// stage's time of the plan): the plan priced at that, every cut at the heavier direction's bytes
// over its replicas' links.
void price_as_adatopk_sends(const sched::CostTable& whole, const PipelineConfig& p,
                            const sched::ReplicaSync& sync, sched::ReplicatedPlan& plan,
                            sched::CostTable& sent) {
  const double int8 = compress::planned_wire_fraction("int8", "none", 1);
  const double int4 = compress::planned_wire_fraction("int4", "none", 1);
  const bool quantize = p.compress_activations == "int8";
  sent = whole;
  const auto& front = plan.pipelines.front().stages;
  for (size_t s = 0; s + 1 < front.size(); ++s) {
    const auto node = static_cast<size_t>(front[s].last);
    const double entries = static_cast<double>(whole.nodes[node].cut_bytes) / 4;
    double fraction = 0;
    for (const auto& pipe : plan.pipelines) {
      double critical = 0;
      for (const auto& st : pipe.stages) critical = std::max(critical, st.compute_s);
      const double mbit = whole
                              .link(static_cast<size_t>(pipe.stages[s].device),
                                    static_cast<size_t>(pipe.stages[s + 1].device))
                              .bytes_per_s *
                          8 / 1e6;
      const auto forward = compress::adaptive_compression(
          critical, mbit, entries, 0, quantize, p.adatopk_min_ratio, p.adatopk_topk_beyond);
      const auto backward = compress::adaptive_compression(
          critical, mbit, 0, entries, quantize, p.adatopk_min_ratio, p.adatopk_topk_beyond);
      fraction = std::max({fraction, sent_fraction(forward, true, int8, int4),
                           sent_fraction(backward, false, int8, int4)});
    }
    sent.nodes[node].cut_bytes = static_cast<int64_t>(
        std::llround(static_cast<double>(whole.nodes[node].cut_bytes) * fraction));
  }
  sched::reprice(sent, plan, sync);
}

// What crosses a cut is what compression leaves of it.
double wire_fraction(const PipelineConfig& p) {
  return compress::planned_wire_fraction(p.compression, p.compress_activations, p.topk_ratio);
}

// How replicas average: every step (ddp), every round of local steps (localsgd, diloco), or
// every round behind the next round's computation (co2).
sched::ReplicaSync replica_sync(const train::RunConfig& config) {
  const std::string& kind = config.strategy.kind;
  return {.every_steps = kind == "ddp" ? 1.0 : static_cast<double>(config.strategy.local_steps),
          .overlapped = kind == "co2"};
}

// The AutoPipeline of OP-Fence's `plan`, priced on `whole` (the table as profiled) with its links
// at what pipeline.compression sends: `t` is `whole` with its cuts scaled to that.
AutoPipeline auto_pipeline_of(const train::RunConfig& config, const sched::CostTable& whole,
                              sched::CostTable t, sched::ReplicatedPlan plan) {
  const double wire = wire_fraction(config.pipeline);
  const bool adaptive = config.pipeline.compression == "adatopk" && wire < 1;
  if (adaptive) price_as_adatopk_sends(whole, config.pipeline, replica_sync(config), plan, t);

  AutoPipeline a;
  a.replicas = plan.replicas;
  a.predicted_step_s = plan.step_s;
  for (const auto& st : plan.pipelines.front().stages) a.stages.emplace_back(st.first, st.last);
  a.stage_of.assign(t.devices.size(), -1);
  a.replica_of.assign(t.devices.size(), -1);
  for (int r = 0; r < plan.replicas; ++r)
    for (int s = 0; s < plan.stages; ++s) {
      const int peer = plan.pipelines[static_cast<size_t>(r)].stages[static_cast<size_t>(s)].device;
      a.stage_of[static_cast<size_t>(peer)] = s;
      a.replica_of[static_cast<size_t>(peer)] = r;
    }
  a.report = sched::describe_plan(t, plan);
  if (adaptive)
    a.report +=
        "  (cut at int4's sizes; links priced at what pipeline.compression = \"adatopk\" "
        "sends over each)\n";
  else if (wire < 1)
    a.report += "  (links priced at " + std::to_string(static_cast<int>(std::lround(100 * wire))) +
                "% of whole tensors: pipeline.compression = \"" + config.pipeline.compression +
                "\")\n";
  a.planned_compute_s.assign(t.devices.size(), 0);
  for (const auto& pipe : plan.pipelines)
    for (const auto& st : pipe.stages)
      a.planned_compute_s.at(static_cast<size_t>(st.device)) = st.compute_s;
  a.priced = std::move(plan);
  return a;
}

}  // namespace

AutoPipeline plan_on_costs(const train::RunConfig& config, sched::CostTable t,
                           const std::string& where) {
  const sched::CostTable whole = t;
  t.scale_cuts(wire_fraction(config.pipeline));
  t.validate(where);
  // Without a strategy there is one pipeline of every peer.
  const bool replicas_allowed = config.strategy.kind != "none";
  sched::ReplicatedPlan plan;
  try {
    plan = sched::plan_replicas(t, replicas_allowed, replica_sync(config));
  } catch (const std::invalid_argument& e) {
    throw ConfigError(std::string("pipeline.stages = \"auto\": ") + e.what());
  }
  return auto_pipeline_of(config, whole, std::move(t), std::move(plan));
}

AutoPipeline reprice_auto_pipeline(const train::RunConfig& config, sched::CostTable t,
                                   const AutoPipeline& planned) {
  if (planned.priced.pipelines.empty())
    throw Error("reprice_auto_pipeline: the plan holds no OP-Fence plan to price again");
  const sched::CostTable whole = t;
  t.scale_cuts(wire_fraction(config.pipeline));
  t.validate(config.pipeline.profile.empty() ? "the profile" : config.pipeline.profile);
  sched::ReplicatedPlan plan = planned.priced;
  sched::reprice(t, plan, replica_sync(config));
  return auto_pipeline_of(config, whole, std::move(t), std::move(plan));
}

std::string auto_pipeline_text(const AutoPipeline& a) {
  nlohmann::json stages = nlohmann::json::array();
  for (const auto& [first, last] : a.stages) stages.push_back({first, last});
  nlohmann::json j = {{"format", "starling-auto-pipeline"},
                      {"stages", stages},
                      {"replicas", a.replicas},
                      {"stage_of", a.stage_of},
                      {"replica_of", a.replica_of},
                      {"predicted_step_s", a.predicted_step_s},
                      {"report", a.report}};
  if (!a.peer_ids.empty()) j["peer_ids"] = a.peer_ids;
  if (a.self >= 0) j["self"] = a.self;
  if (a.trial_steps > 0) j["trial_steps"] = a.trial_steps;
  if (!a.planned_compute_s.empty()) j["planned_compute_s"] = a.planned_compute_s;
  return j.dump(2) + "\n";
}

void write_auto_pipeline(const std::filesystem::path& file, const AutoPipeline& a) {
  const std::string text = auto_pipeline_text(a);
  data::write_file_atomically(file, {std::as_bytes(std::span(text.data(), text.size()))});
}

AutoPipeline read_auto_pipeline(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in) throw ConfigError("cannot read " + file.string());
  std::stringstream text;
  text << in.rdbuf();
  return parse_auto_pipeline(text.str(), file.string());
}

AutoPipeline parse_auto_pipeline(const std::string& text, const std::string& where) {
  AutoPipeline a;
  try {
    const auto j = nlohmann::json::parse(text);
    if (j.value("format", "") != "starling-auto-pipeline")
      throw ConfigError(where + ": not a pipeline plan (\"format\")");
    for (const auto& r : j.at("stages")) a.stages.emplace_back(r.at(0), r.at(1));
    a.replicas = j.at("replicas");
    a.stage_of = j.at("stage_of").get<std::vector<int>>();
    a.replica_of = j.at("replica_of").get<std::vector<int>>();
    a.predicted_step_s = j.value("predicted_step_s", 0.0);
    a.report = j.value("report", "");
    if (j.contains("peer_ids")) a.peer_ids = j.at("peer_ids").get<std::vector<std::string>>();
    a.self = j.value("self", -1);
    a.trial_steps = j.value("trial_steps", int64_t{0});
    // Plans saved before it was kept have none: their run gets no report against them.
    if (j.contains("planned_compute_s"))
      a.planned_compute_s = j.at("planned_compute_s").get<std::vector<double>>();
  } catch (const nlohmann::json::exception& e) {
    throw ConfigError(where + ": damaged pipeline plan: " + e.what());
  }
  const int stages = static_cast<int>(a.stages.size());
  bool ok = stages >= 1 && a.replicas >= 1 && a.stage_of.size() == a.replica_of.size() &&
            static_cast<int>(a.stage_of.size()) == stages * a.replicas;
  for (size_t i = 0; ok && i < a.stage_of.size(); ++i)
    ok = a.stage_of[i] >= 0 && a.stage_of[i] < stages && a.replica_of[i] >= 0 &&
         a.replica_of[i] < a.replicas;
  std::set<std::pair<int, int>> places;
  for (size_t i = 0; ok && i < a.stage_of.size(); ++i)
    ok = places.emplace(a.stage_of[i], a.replica_of[i]).second;
  if (!a.peer_ids.empty() && a.peer_ids.size() != a.stage_of.size()) ok = false;
  if (a.self >= static_cast<int>(a.stage_of.size()) || (a.self >= 0 && a.peer_ids.empty()))
    ok = false;
  if (a.trial_steps < 0 || (a.trial_steps > 0 && a.peer_ids.empty())) ok = false;
  if (!ok) throw ConfigError(where + ": damaged pipeline plan (places do not fit)");
  for (const std::string& id : a.peer_ids)
    if (!net::parse_peer_id(id))
      throw ConfigError(where + ": damaged pipeline plan (\"" + id.substr(0, 32) +
                        "\" in peer_ids is no peer id)");
  // A stage of nodes profiled at no time plans at 0: nothing to set a run against, but a plan.
  bool figures_ok = a.planned_compute_s.empty() || a.planned_compute_s.size() == a.stage_of.size();
  for (const double s : a.planned_compute_s) figures_ok = figures_ok && s >= 0 && std::isfinite(s);
  if (!figures_ok)
    throw ConfigError(where +
                      ": damaged pipeline plan (planned_compute_s needs one time, at least 0 s, "
                      "per peer)");
  return a;
}

}  // namespace starling::strategy
