#include "starling/strategy/pipeline_peer.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <thread>

#include "starling/common/error.h"
#include "starling/net/dashboard.h"
#include "starling/net/endpoint.h"
#include "starling/strategy/auto_pipeline.h"
#include "starling/strategy/pipeline_admission.h"
#include "starling/strategy/pipeline_auto_peer.h"
#include "starling/strategy/pipeline_runner.h"
#include "starling/strategy/shared_copies.h"
#include "starling/train/checkpoint_dir.h"
#include "starling/train/events.h"
#include "starling/train/precision.h"
#include "starling/train/session.h"

namespace starling::strategy {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

std::string place_name(int stage, int replica, int replicas) {
  return "stage " + std::to_string(stage) +
         (replicas > 1 ? " of replica " + std::to_string(replica) : std::string());
}

std::string grid_name(int stages, int replicas) {
  return std::to_string(replicas) + " replica" + (replicas == 1 ? "" : "s") + " of " +
         std::to_string(stages) + " stages";
}

std::string member_name(const net::MemberView& m) {
  return "peer " + net::short_peer_id(m.info.id) +
         (m.info.name.empty() ? std::string() : " (" + m.info.name + ")");
}

// Waits until every member of `grid` is seen taking part in collectives, so that no collective
// of the stages or of their counterparts starts without one of them.
void wait_until_active(const net::Node& node, const PipelineGrid& grid, milliseconds timeout) {
  const auto deadline = steady_clock::now() + timeout;
  for (;;) {
    std::string waiting;
    const auto members = node.members();
    for (size_t r = 0; r < grid.size(); ++r)
      for (size_t s = 0; s < grid[r].size(); ++s) {
        const auto it = std::find_if(members.begin(), members.end(),
                                     [&](const auto& m) { return m.info.id == grid[r][s]; });
        if (it == members.end() || it->state != net::MemberState::alive || !it->info.active)
          waiting +=
              (waiting.empty() ? "" : ", ") +
              place_name(static_cast<int>(s), static_cast<int>(r), static_cast<int>(grid.size()));
      }
    if (waiting.empty()) return;
    if (steady_clock::now() > deadline)
      throw NetError("pipeline: " + waiting + " did not start within " +
                     std::to_string(timeout.count() / 1000) + " s of every place being held");
    std::this_thread::sleep_for(milliseconds(50));
  }
}

}  // namespace

std::string pipeline_role(const PipelinePlace& p) {
  return "pipeline stage " + std::to_string(p.stage) + "/" + std::to_string(p.stages) +
         " replica " + std::to_string(p.replica) + "/" + std::to_string(p.replicas);
}

std::optional<PipelinePlace> parse_pipeline_role(const std::string& role) {
  PipelinePlace p;
  if (std::sscanf(role.c_str(), "pipeline stage %d/%d replica %d/%d", &p.stage, &p.stages,
                  &p.replica, &p.replicas) != 4)
    return std::nullopt;
  if (p.stages < 1 || p.replicas < 1 || p.stage < 0 || p.stage >= p.stages || p.replica < 0 ||
      p.replica >= p.replicas || pipeline_role(p) != role)
    return std::nullopt;
  return p;
}

PipelineGrid wait_for_places(const net::Node& node, const PipelinePlace& mine,
                             milliseconds timeout) {
  const auto deadline = steady_clock::now() + timeout;
  const auto stages = static_cast<size_t>(mine.stages);
  const auto replicas = static_cast<size_t>(mine.replicas);
  for (;;) {
    PipelineGrid grid(replicas, std::vector<net::PeerId>(stages, 0));
    for (const net::MemberView& m : node.members()) {
      if (m.state != net::MemberState::alive) continue;
      // A peer of a planned swarm that has not announced its place yet: its place is empty for
      // now (it is being planned, or the news is one heartbeat away).
      if (m.info.role == kAutoPipelineRole) continue;
      const auto p = parse_pipeline_role(m.info.role);
      if (!p)
        throw NetError("pipeline: " + member_name(m) + " is not a pipeline stage (it announces " +
                       (m.info.role.empty() ? std::string("no role")
                                            : "\"" + m.info.role.substr(0, 64) + "\"") +
                       "); a swarm of pipelines holds only their stages");
      if (p->stages != mine.stages || p->replicas != mine.replicas)
        throw NetError("pipeline: " + member_name(m) + " runs " +
                       place_name(p->stage, p->replica, p->replicas) + " in a swarm of " +
                       grid_name(p->stages, p->replicas) + ", this peer in one of " +
                       grid_name(mine.stages, mine.replicas) +
                       " (pipeline.replicas and the stage count must agree on every peer)");
      net::PeerId& slot = grid[static_cast<size_t>(p->replica)][static_cast<size_t>(p->stage)];
      if (slot != 0)
        throw NetError("pipeline: " + place_name(p->stage, p->replica, mine.replicas) +
                       " is claimed by " + member_name(m) + " and by peer " +
                       net::short_peer_id(slot) +
                       "; give each peer its own pipeline.stage and pipeline.replica");
      slot = m.info.id;
    }
    std::string empty;
    for (size_t r = 0; r < replicas; ++r)
      for (size_t s = 0; s < stages; ++s)
        if (grid[r][s] == 0)
          empty += (empty.empty() ? "" : ", ") +
                   place_name(static_cast<int>(s), static_cast<int>(r), mine.replicas);
    if (empty.empty()) return grid;
    if (steady_clock::now() > deadline)
      throw NetError(
          "pipeline: no peer holds " + empty + " of the " + grid_name(mine.stages, mine.replicas) +
          " within net.join_timeout_s = " + std::to_string(timeout.count() / 1000) + " s");
    std::this_thread::sleep_for(milliseconds(100));
  }
}

namespace {

// One attempt at training this stage on `node`, every place of `grid` held and active. The peer
// leaves the swarm afterwards unless `stay` (a trial, which the run follows on the same node).
train::TrainResult train_stage(const train::RunConfig& c, train::TrainOptions t, net::Node& node,
                               const PipelineGrid& grid, const PipelinePlace& place,
                               bool stay = false) {
  const int stage = place.stage;
  // This stage's counterparts in every replica average it through the strategy.
  std::vector<net::PeerId> counterparts;
  for (const auto& pipeline : grid) counterparts.push_back(pipeline[static_cast<size_t>(stage)]);
  // A stage builds, holds, steps and checkpoints only the parameters its nodes read.
  t.model_part = [&c, stage](int nodes) {
    return stage_ranges(c.pipeline, nodes).at(static_cast<size_t>(stage));
  };
  std::unique_ptr<train::StepHooks> hooks;
  // A strategy with rounds averages a shared weight's copies in separate groups: they are
  // realigned after each round (shared_copies.h). ddp averages gradients, which the stages then
  // add up themselves, so its copies never part.
  AlignSharedCopies* aligner = nullptr;
  if (c.strategy.kind != "none") hooks = make_strategy(c, node, counterparts);
  if (hooks && c.strategy.kind != "ddp") {
    auto wrapped = std::make_unique<AlignSharedCopies>(std::move(hooks));
    aligner = wrapped.get();
    hooks = std::move(wrapped);
  }
  t.hooks = hooks.get();
  t.on_record = publish_progress(node);
  std::optional<PipelineAdmission> admission;
  if (place.replicas > 1) admission.emplace(node, grid, stage);
  t.step_runner = [&](train::Session& s,
                      train::ProgressLine&) -> std::unique_ptr<train::StepRunner> {
    PipelineLayout layout(*s.dag, stage_ranges(c.pipeline, s.dag->size()));
    const graph::StageRange r = layout.stage(stage).range;
    std::cerr << "pipeline stage " << stage << ": nodes " << r.first << "-" << r.last << " ("
              << s.dag->nodes()[static_cast<size_t>(r.first)].name << " .. "
              << s.dag->nodes()[static_cast<size_t>(r.last)].name << "), "
              << s.dag->params().params().size() << " parameters ("
              << train::fmt("%.1f", static_cast<double>(s.dag->params().bytes()) / 1e6)
              << " MB; the other stages hold " << s.dag->params().elsewhere().size() << "), "
              << c.pipeline.schedule << " schedule\n";
    PipelineRunnerOptions o{.stage = stage,
                            .peers = grid[static_cast<size_t>(place.replica)],
                            .one_f_one_b = c.pipeline.schedule == "1f1b",
                            .extra_warmup = c.pipeline.extra_warmup,
                            .batch = c.train.batch_size,
                            .seq_len = c.model.seq_len,
                            .autocast = train::parse_dtype(c.train.dtype, "train.dtype"),
                            .micro_batches = c.train.grad_accum,
                            .compression = c.pipeline.compression,
                            .topk_ratio = c.pipeline.topk_ratio,
                            .adatopk_min_ratio = c.pipeline.adatopk_min_ratio,
                            .adatopk_topk_beyond = c.pipeline.adatopk_topk_beyond,
                            .compress_activations = c.pipeline.compress_activations,
                            .error_feedback = c.pipeline.error_feedback,
                            .admission = admission ? &*admission : nullptr};
    auto runner =
        std::make_unique<PipelineStepRunner>(node, std::move(layout), std::move(o), *s.executor,
                                             *s.dag, *s.optimizer, *s.loader, s.device);
    if (aligner != nullptr) aligner->set_runner(runner.get());
    return runner;
  };
  train::TrainResult result = train::train(c, t);
  if (!stay) node.leave();
  return result;
}

// The places of a plan the peers agreed on, once every peer it names announces the place the plan
// gives it. Unlike wait_for_places this trusts the plan, not the roles, for who holds what: after
// a trial a peer may still see another's role from the trial's plan (gossip is a heartbeat
// behind the plan), which is only a reason to wait. NetError naming the places not yet taken
// after `timeout`.
PipelineGrid wait_for_plan_places(const net::Node& node, const AutoPipeline& plan,
                                  milliseconds timeout) {
  const auto deadline = steady_clock::now() + timeout;
  const int stages = static_cast<int>(plan.stages.size());
  PipelineGrid grid(static_cast<size_t>(plan.replicas),
                    std::vector<net::PeerId>(static_cast<size_t>(stages), 0));
  for (size_t d = 0; d < plan.peer_ids.size(); ++d)
    grid[static_cast<size_t>(plan.replica_of[d])][static_cast<size_t>(plan.stage_of[d])] =
        net::parse_peer_id(plan.peer_ids[d]).value();
  for (;;) {
    std::string waiting;
    const auto members = node.members();
    for (size_t d = 0; d < plan.peer_ids.size(); ++d) {
      const PipelinePlace p{.stage = plan.stage_of[d],
                            .stages = stages,
                            .replica = plan.replica_of[d],
                            .replicas = plan.replicas};
      const net::PeerId id = grid[static_cast<size_t>(p.replica)][static_cast<size_t>(p.stage)];
      const auto it = std::find_if(members.begin(), members.end(),
                                   [&](const auto& m) { return m.info.id == id; });
      if (id != node.id() && (it == members.end() || it->state != net::MemberState::alive ||
                              it->info.role != pipeline_role(p)))
        waiting += (waiting.empty() ? "" : ", ") + place_name(p.stage, p.replica, p.replicas) +
                   " (peer " + net::short_peer_id(id) + ")";
    }
    if (waiting.empty()) return grid;
    if (steady_clock::now() > deadline)
      throw NetError("pipeline: " + waiting + " did not take the place the plan gives it within " +
                     std::to_string(timeout.count() / 1000) + " s");
    std::this_thread::sleep_for(milliseconds(50));
  }
}

// Where a peer that leaves can join again: every other alive member.
std::vector<std::string> entry_points(const net::Node& node, bool insecure) {
  std::vector<std::string> out;
  for (const net::MemberView& m : node.members())
    if (m.info.id != node.id() && m.state == net::MemberState::alive && !m.info.endpoint.empty())
      out.push_back(net::format_entry_point(insecure ? "" : m.info.public_key, m.info.endpoint));
  return out;
}

// Runs the plan's place of device `self`: explicit stages from here on.
void take_place(train::RunConfig& c, const AutoPipeline& plan, int self) {
  c.pipeline.auto_stages = false;
  c.pipeline.stages = plan.stages;
  c.pipeline.replicas = plan.replicas;
  c.pipeline.stage = plan.stage_of.at(static_cast<size_t>(self));
  c.pipeline.replica = plan.replica_of.at(static_cast<size_t>(self));
}

PipelinePlace place_of(const PipelineConfig& p) {
  return {.stage = static_cast<int>(p.stage),
          .stages = static_cast<int>(p.count()),
          .replica = static_cast<int>(p.replica),
          .replicas = static_cast<int>(p.replicas)};
}

// pipeline.calibrate_steps among peers that plan themselves: a trial of a plan trains this peer's
// place for the plan's trial_steps in <out_dir>/calibration/trial-<n> (no evaluation, no sample,
// its checkpoints deleted) on the node the run goes on with, and reads this stage's compute per
// micro-batch from its step records.
RunTrial trial_runner(const train::RunConfig& config, const train::TrainOptions& options,
                      net::Node& node, const std::filesystem::path& out) {
  return [&config, &options, &node, out](const AutoPipeline& plan, int n) {
    train::RunConfig c = config;
    take_place(c, plan, plan.self);
    const std::filesystem::path dir = out / "calibration" / ("trial-" + std::to_string(n));
    if (n == 1) std::filesystem::remove_all(out / "calibration");
    c.train.out_dir = dir.string();
    c.train.steps = plan.trial_steps;
    c.train.log_every = 1;
    c.train.eval_every = 0;
    c.train.checkpoint_every = 0;
    const PipelinePlace place = place_of(c.pipeline);
    train::TrainOptions t = options;
    t.resume = false;
    t.data_rank = place.replica;
    t.data_world = place.replicas;
    std::cerr << "plan: calibrating: " << plan.trial_steps << " steps of this plan in "
              << dir.string() << " (pipeline.calibrate_steps), as stage " << place.stage << " of "
              << place.stages
              << (place.replicas > 1 ? ", replica " + std::to_string(place.replica) + " of " +
                                           std::to_string(place.replicas)
                                     : std::string())
              << "\n";
    node.set_role(pipeline_role(place));
    const auto timeout = std::chrono::seconds(config.net.join_timeout_s);
    const PipelineGrid grid = wait_for_plan_places(node, plan, timeout);
    node.activate();
    wait_until_active(node, grid, timeout);
    const train::TrainResult result = train_stage(c, t, node, grid, place, /*stay=*/true);
    // Until the next plan: no place of this one is announced any more.
    node.set_role(kAutoPipelineRole);
    if (result.interrupted)
      throw Error("pipeline: stopped during calibration trial " + std::to_string(n) +
                  "; nothing was trained yet (start the run again)");
    std::filesystem::remove_all(dir / "checkpoints");
    return trial_seconds_per_micro_batch(dir / "metrics.jsonl", c.train.grad_accum,
                                         sched::timed_steps(plan.trial_steps, round_steps(c)));
  };
}

// When the run of a plan the peers agreed on ends, each peer sets its own part against it (no
// peer reads the others' records; a local launcher sets them all side by side).
void report_own_part(const AutoPipeline& plan, const train::RunConfig& c) {
  const auto run = run_against_auto_pipeline(
      plan,
      {{.device = plan.self,
        .peer = plan.self,
        .metrics = std::filesystem::path(c.train.out_dir) / "metrics.jsonl"}},
      c);
  if (run) std::cerr << "plan: against this peer's run: " << run->describe_own();
}

}  // namespace

train::TrainResult run_pipeline_peer(const train::RunConfig& config, const PeerOptions& options) {
  // The end-of-run sample would need the whole model on one peer.
  train::RunConfig c = config;
  c.train.sample_at_end = false;
  train::TrainOptions t = options.train;
  const auto join_timeout = std::chrono::seconds(config.net.join_timeout_s);
  // stages = "auto": the peers plan together once all are in (pipeline_auto_peer.h), unless this
  // run resumes, whose checkpoints hold the stages of the plan it began with.
  bool planning = false;
  std::optional<AutoPipeline> auto_plan;  // the plan this peer takes its place from
  const std::filesystem::path plan_file =
      std::filesystem::path(config.train.out_dir) / "auto_pipeline.json";
  if (config.pipeline.auto_stages) {
    if (t.resume && std::filesystem::exists(plan_file)) {
      const AutoPipeline saved = read_auto_pipeline(plan_file);
      if (saved.self < 0)
        throw ConfigError(plan_file.string() +
                          " is a local launcher's plan: resume that run with `starling train "
                          "--peers N --resume`");
      take_place(c, saved, saved.self);
      std::cerr << "plan: this peer's own, from " << plan_file.string() << "\n" << saved.report;
      auto_plan = saved;
    } else if (t.resume && train::holds_checkpoint(config.train.out_dir)) {
      throw ConfigError(config.train.out_dir +
                        " holds checkpoints of a run that did not begin with pipeline.stages = "
                        "\"auto\" (no auto_pipeline.json): resume it with the stages it began "
                        "with");
    } else {
      planning = true;
    }
  }
  PipelinePlace place = planning ? PipelinePlace{} : place_of(c.pipeline);
  net::NodeOptions node_opts = net::node_options(config.net);
  node_opts.role = planning ? kAutoPipelineRole : pipeline_role(place);
  // No collective waits for a stage before every place is held and every stage says it takes
  // part (below): one that arrives late holds no one up meanwhile.
  node_opts.active = false;
  auto node = std::make_unique<net::Node>(node_opts);
  const std::string entry = net::format_entry_point(
      node_opts.insecure ? "" : node_opts.keys.public_key, node->endpoint());
  if (options.train.json_events) std::cout << train::events::listening(entry).dump() << std::endl;
  // Declared after the node: it stops sampling before the node goes. A stage that rejoins makes
  // a new node, which the dashboard follows.
  const auto current = std::make_shared<net::CurrentNode>(node.get());
  const auto dashboard = net::serve_dashboard(config.net, current);
  if (dashboard) {
    if (options.train.json_events)
      std::cout << train::events::dashboard(dashboard->url()).dump() << std::endl;
    std::cerr << "dashboard at " << dashboard->url() << "\n";
  }
  if (planning) {
    std::cerr << "peer " << net::short_peer_id(node->id()) << " (pipeline stages to be planned) "
              << "listening at " << entry << "\n";
    sched::CostTable swarm;  // the planner's, for calibrating
    AutoPipeline plan = agree_on_pipeline(*node, config, join_timeout, &swarm);
    if (plan.trial_steps > 0) {
      plan = calibrate_among_peers(*node, config, std::move(plan), swarm,
                                   trial_runner(c, t, *node, plan_file.parent_path()),
                                   std::chrono::seconds(config.net.collective_timeout_s));
      // Every place is announced before the run's own wait reads the roles.
      take_place(c, plan, plan.self);
      node->set_role(pipeline_role(place_of(c.pipeline)));
      wait_for_plan_places(*node, plan, join_timeout);
    }
    take_place(c, plan, plan.self);
    place = place_of(c.pipeline);
    std::filesystem::create_directories(plan_file.parent_path());
    write_auto_pipeline(plan_file, plan);
    std::cerr << "plan: agreed by the peers, kept in " << plan_file.string() << "\n" << plan.report;
    auto_plan = plan;
    node_opts.role = pipeline_role(place);
    node->set_role(node_opts.role);
  }
  if (config.pipeline.auto_stages) {
    // Every stage of a replica reads that replica's batches.
    t.data_rank = place.replica;
    t.data_world = place.replicas;
  }
  const int stage = place.stage;
  const int64_t replacement_wait_s = place.replicas > 1 ? c.pipeline.replacement_wait_s : 0;
  if (replacement_wait_s > 0 && node_opts.insecure)
    throw ConfigError(
        "pipeline.replacement_wait_s needs the peers' keys: a replacement takes over a stage "
        "under the dead peer's key, and --insecure peers draw a new id at every start");
  // One write: the network's thread logs its own lines meanwhile, and a line written in parts
  // could be cut by one of them.
  std::string line = "peer " + net::short_peer_id(node->id()) + " (pipeline stage " +
                     std::to_string(stage) + " of " + std::to_string(place.stages);
  if (place.replicas > 1)
    line += ", replica " + std::to_string(place.replica) + " of " + std::to_string(place.replicas);
  line += ") " + (planning ? std::string("takes its place") : "listening at " + entry) + "\n";
  std::cerr << line;

  const auto rejoin_timeout = std::max<std::chrono::seconds>(
      join_timeout, std::chrono::seconds(std::max<int64_t>(replacement_wait_s, 0)));
  for (bool rejoined = false;; rejoined = true) {
    // Only other replicas can let a returning stage in; a lone pipeline starts afresh.
    const bool returning = node->returning() && place.replicas > 1;
    const auto timeout = rejoined || returning ? rejoin_timeout : join_timeout;
    const PipelineGrid grid = wait_for_places(*node, place, timeout);
    if (returning) {
      // The swarm trains on: a whole replica lets this stage in with the rest of its pipeline.
      std::cerr << "pipeline stage " << stage << " of replica " << place.replica
                << ": back in the swarm; waiting until a whole replica admits this pipeline\n";
      wait_for_admission(*node, grid, place, timeout);
    }
    node->activate();
    wait_until_active(*node, grid, timeout);
    try {
      train::TrainResult result = train_stage(c, t, *node, grid, place);
      // Also after --stop-at or a signal: over the steps it took.
      if (auto_plan) report_own_part(*auto_plan, c);
      return result;
    } catch (const NetError& e) {
      if (replacement_wait_s <= 0) throw;
      // The other replicas train on. This stage leaves and joins again inactive under its key,
      // and waits for the rest of its pipeline to be held (a replacement started with the dead
      // peer's key) and for the replicas to admit it.
      std::cerr << "pipeline stage " << stage << " of replica " << place.replica << ": " << e.what()
                << "\npipeline stage " << stage << " of replica " << place.replica
                << ": waiting up to " << replacement_wait_s
                << " s for a replacement of the lost stage (a peer started with its net.key)\n";
      node_opts.join = entry_points(*node, node_opts.insecure);
      current->set(nullptr);
      node->leave();
      node.reset();
      if (node_opts.join.empty())
        throw NetError(std::string(e.what()) + "; no other peer is alive to rejoin through");
      node = std::make_unique<net::Node>(node_opts);
      current->set(node.get());
      // It trains on from its checkpoints, and from the state its counterparts hold.
      t.resume = true;
    }
  }
}

}  // namespace starling::strategy
