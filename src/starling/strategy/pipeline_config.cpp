#include "starling/strategy/pipeline_config.h"

#include "starling/common/error.h"
#include "starling/config/config_keys.h"

namespace starling::strategy {
namespace {

std::string range_text(const std::pair<int64_t, int64_t>& r) {
  return "[" + std::to_string(r.first) + ", " + std::to_string(r.second) + "]";
}

// pipeline.stages: an array of [first, last] integer pairs, or "auto".
config::Key stages_key(PipelineConfig& c) {
  auto* p = &c.stages;
  auto* automatic = &c.auto_stages;
  return {
      "pipeline",
      "stages",
      "array of [first, last], or \"auto\"",
      "node ranges of the stages, e.g. [[0, 4], [5, 9]] (`starling model show` numbers "
      "the nodes); [] = pipeline.num_stages stages of about equal node count; \"auto\" = "
      "OP-Fence's cut and placement for the swarm's peers and links: a local swarm's "
      "(`starling train --peers N`, with --lab for unequal ones), or peers started one by one "
      "that measure themselves once net.min_peers are in (docs/scheduler.md)",
      [=](const toml::node& n, const std::string& where) {
        if (n.is_string() && n.as_string()->get() == "auto") {
          p->clear();
          *automatic = true;
          return;
        }
        *automatic = false;
        const auto* a = n.as_array();
        if (!a) config::wrong_type(n, where, "an array of [first, last] pairs, or \"auto\"");
        std::vector<std::pair<int64_t, int64_t>> v;
        for (const auto& e : *a) {
          const std::string at = where + "[" + std::to_string(v.size()) + "]";
          const auto* pair = e.as_array();
          if (!pair || pair->size() != 2 || !(*pair)[0].is_integer() || !(*pair)[1].is_integer())
            config::wrong_type(e, at, "a pair of node indices [first, last]");
          v.emplace_back((*pair)[0].as_integer()->get(), (*pair)[1].as_integer()->get());
        }
        *p = std::move(v);
      },
      [=](toml::table& t) {
        if (*automatic) {
          t.insert_or_assign("stages", "auto");
          return;
        }
        toml::array a;
        for (const auto& [first, last] : *p) a.push_back(toml::array{first, last});
        t.insert_or_assign("stages", std::move(a));
      }};
}

}  // namespace

void add_config_keys(PipelineConfig& c, config::Keys& k) {
  using namespace config;
  k.push_back(stages_key(c));
  k.push_back(string_key("pipeline", "profile", &c.profile,
                         "with stages = \"auto\": the cost table (`starling plan profile`) the "
                         "plan weighs (its times are a device of speed 1); \"\" = the launcher, or "
                         "the planning peer, profiles the model first"));
  k.push_back(string_key("pipeline", "planner", &c.planner,
                         "who plans stages = \"auto\" for `starling train --peers N`: "
                         "\"launcher\" (from the lab, before the peers start) or \"peers\" (the "
                         "peers measure their speeds and links and agree, as peers started one "
                         "by one do)",
                         {"launcher", "peers"}));
  k.push_back(int_key("pipeline", "calibrate_steps", &c.calibrate_steps, -1,
                      "with stages = \"auto\" and the launcher's planner: steps of a trial run "
                      "of the plan whose measured stage times replace the peers' assumed speeds "
                      "before it plans again; 0 = none, else 2 or more; -1 = two rounds of the "
                      "strategy (3 steps without rounds) when train.steps is at least 20 times "
                      "that, else none"));
  k.push_back(string_key("pipeline", "lab_speeds", &c.lab_speeds,
                         "with stages = \"auto\", the launcher's planner and CPU quotas: "
                         "\"profiled\" (every peer's quota profiles the model at once before "
                         "the plan) or \"quotas\" (each peer at its quota's share of the "
                         "profiled threads)",
                         {"profiled", "quotas"}));
  k.push_back(int_key("pipeline", "num_stages", &c.num_stages, 0,
                      "stages of an even split by node count when pipeline.stages is empty; 0 or "
                      "1 = no pipeline"));
  k.push_back(string_key("pipeline", "schedule", &c.schedule,
                         "micro-batch order on each stage: \"1f1b\" (one forward, one backward: "
                         "at most stages - stage micro-batches held) or \"gpipe\" (all forwards, "
                         "then all backwards)",
                         {"1f1b", "gpipe"}));
  k.push_back(int_key("pipeline", "extra_warmup", &c.extra_warmup, 0,
                      "1f1b: micro-batches each stage but the last runs forward beyond 1F1B's "
                      "warm-up before its first backward; on slow links 1-2 overlap the two "
                      "directions of a link, at the memory of as many more held activations"));
  k.push_back(int_key("pipeline", "stage", &c.stage, -1,
                      "the stage this peer runs; -1 = the peer's rank (RANK, --data-rank) "
                      "modulo the stage count"));
  k.push_back(int_key("pipeline", "replicas", &c.replicas, 0,
                      "pipeline replicas, each stage averaged with its counterparts by "
                      "strategy.kind (ddp, localsgd, diloco, co2); 0 = the world size (WORLD_SIZE, "
                      "--data-world, `starling train --peers N`) over the stage count"));
  k.push_back(int_key("pipeline", "replica", &c.replica, -1,
                      "the replica this peer belongs to; -1 = the peer's rank over the stage "
                      "count"));
  k.push_back(int_key("pipeline", "replacement_wait_s", &c.replacement_wait_s, 0,
                      "with replicas: seconds the other stages of a pipeline that lost a stage "
                      "peer wait for a replacement (a peer started with the dead one's net.key) "
                      "to take over its stage; 0 = they stop at once"));
  k.push_back(string_key("pipeline", "compression", &c.compression,
                         "what crosses the links between stages in training: \"none\" (whole "
                         "tensors), \"int8\" (every entry, quantized: a quarter of the bytes), "
                         "\"int4\" (every entry in 4 bits: a seventh of the bytes), \"topk\" "
                         "(the pipeline.topk_ratio of entries of largest magnitude) or "
                         "\"adatopk\" (as little compression as lets each stage's tensors cross "
                         "its slowest link within the slowest stage's compute time: int8, then "
                         "int4, then top-k of the gradients)",
                         {"none", "int8", "int4", "topk", "adatopk"}));
  k.push_back(float_key("pipeline", "topk_ratio", &c.topk_ratio, 0,
                        "the fraction of entries \"topk\" keeps, in (0, 1]"));
  k.push_back(float_key("pipeline", "adatopk_min_ratio", &c.adatopk_min_ratio, 0,
                        "the least fraction of entries \"adatopk\" keeps, in (0, 1]"));
  k.push_back(float_key("pipeline", "adatopk_topk_beyond", &c.adatopk_topk_beyond, 0,
                        "\"adatopk\" drops entries (top-k) only where even int4 would take more "
                        "than this many times the slowest stage's compute time to cross the "
                        "link; slower than that, int4 (1 = as soon as int4 does not fit), >= 1"));
  k.push_back(string_key("pipeline", "compress_activations", &c.compress_activations,
                         "with \"topk\" or \"adatopk\", how activations cross: \"int8\" "
                         "(every entry, quantized: a quarter of the bytes), \"topk\" (sparsified "
                         "like the gradients) or \"none\" (whole)",
                         {"int8", "topk", "none"}));
  k.push_back(bool_key("pipeline", "error_feedback", &c.error_feedback,
                       "with compression: what an edge's activation gradient did not send is "
                       "added to its next one"));
}

void check(const PipelineConfig& c, const std::string& source) {
  for (size_t i = 0; i < c.stages.size(); ++i) {
    const auto& r = c.stages[i];
    const int64_t expected_first = i == 0 ? 0 : c.stages[i - 1].second + 1;
    if (r.first != expected_first || r.second < r.first)
      throw ConfigError(source + ": pipeline.stages[" + std::to_string(i) + "] = " + range_text(r) +
                        ": stages must be contiguous node ranges in order from "
                        "node 0, each [first, last] with last >= first (expected it to start at " +
                        std::to_string(expected_first) + ")");
  }
  if (c.stage >= 0 && c.enabled() && !c.auto_stages && c.stage >= c.count())
    throw ConfigError(source + ": pipeline.stage = " + std::to_string(c.stage) +
                      " but the pipeline has " + std::to_string(c.count()) + " stages");
  for (const auto& [key, v] :
       {std::pair{"topk_ratio", c.topk_ratio}, std::pair{"adatopk_min_ratio", c.adatopk_min_ratio}})
    if (!(v > 0 && v <= 1))
      throw ConfigError(source + ": pipeline." + key + " = " + std::to_string(v) +
                        " must be in (0, 1] (the fraction of entries kept)");
  if (!(c.adatopk_topk_beyond >= 1))
    throw ConfigError(source +
                      ": pipeline.adatopk_topk_beyond = " + std::to_string(c.adatopk_topk_beyond) +
                      " must be >= 1 (how many times the slowest stage's time int4 may take)");
  if (c.calibrate_steps == 1)
    throw ConfigError(
        source +
        ": pipeline.calibrate_steps = 1: the trial's first step warms up and is "
        "left out, so calibrating takes 2 or more (0 = none, -1 = two rounds when the "
        "run is long enough)");
  if (c.replicas < 0)
    throw ConfigError(source + ": pipeline.replicas = " + std::to_string(c.replicas) +
                      " must be 0 (from the world size) or more");
  if (c.replica >= 0 && c.replicas > 0 && c.replica >= c.replicas)
    throw ConfigError(source + ": pipeline.replica = " + std::to_string(c.replica) +
                      " but there are " + std::to_string(c.replicas) + " replicas");
}

void refuse_auto_stages(const PipelineConfig& c) {
  if (c.auto_stages)
    throw ConfigError(
        "pipeline.stages = \"auto\" must be planned first: by the local launcher (`starling "
        "train --peers N`), by the peers themselves (`starling peer` with net.min_peers = N), "
        "or print a plan with `starling plan pipeline --profile P --lab L` and set the stages "
        "it prints");
}

void place_pipeline_peer(PipelineConfig& c, int64_t rank, int64_t world) {
  refuse_auto_stages(c);
  const int64_t stages = c.count();
  if (c.replicas <= 0) {
    if (world > 1 && world % stages != 0)
      throw ConfigError("a swarm of " + std::to_string(world) +
                        " peers (WORLD_SIZE, --data-world "
                        "or --peers) for a pipeline of " +
                        std::to_string(stages) +
                        " stages: pipeline replicas need a multiple of the stage count");
    c.replicas = world > stages ? world / stages : 1;
  }
  if (c.stage < 0) c.stage = rank % stages;
  if (c.replica < 0) c.replica = c.replicas > 1 ? rank / stages : 0;
}

std::vector<std::pair<int, int>> stage_ranges(const PipelineConfig& c, int nodes) {
  std::vector<std::pair<int, int>> out;
  if (!c.stages.empty()) {
    if (c.stages.back().second != nodes - 1)
      throw ConfigError("pipeline.stages end at node " + std::to_string(c.stages.back().second) +
                        ", but the model's nodes are 0 .. " + std::to_string(nodes - 1) +
                        ": the stages must cover every node once");
    for (const auto& [first, last] : c.stages)
      out.emplace_back(static_cast<int>(first), static_cast<int>(last));
    return out;
  }
  const int64_t s = c.num_stages;
  if (s > nodes)
    throw ConfigError("pipeline.num_stages = " + std::to_string(s) + " but the model has only " +
                      std::to_string(nodes) + " nodes");
  for (int64_t i = 0; i < s; ++i)
    out.emplace_back(static_cast<int>(i * nodes / s), static_cast<int>((i + 1) * nodes / s - 1));
  return out;
}

void check_pipeline_peer(const PipelineConfig& c, const PipelinePeerSettings& s) {
  refuse_auto_stages(c);
  const std::string& k = s.strategy_kind;
  if (k != "none" && k != "ddp" && k != "localsgd" && k != "diloco" && k != "co2")
    throw ConfigError(
        "pipeline replicas average their stages with strategy.kind = \"ddp\", "
        "\"localsgd\", \"diloco\" or \"co2\", not \"" +
        k +
        "\" (atom's open-ended steps would need every stage to agree on each "
        "step's micro-batches)");
  if (k == "none" && s.replicas > 1)
    throw ConfigError(std::to_string(s.replicas) +
                      " pipeline replicas need a strategy to average their stages: set "
                      "strategy.kind to \"ddp\", \"localsgd\", \"diloco\" or \"co2\"");
  if (s.swapped)
    throw ConfigError(
        "a pipeline stage cannot swap yet: drop swap.budget (each stage holds only "
        "its own layers' training state)");
  if (s.dtype == "fp16")
    throw ConfigError(
        "train.dtype = \"fp16\" is not available in a pipeline (its loss scale "
        "would have to agree across stages); use \"bf16\" or \"fp32\"");
  if (s.net_backend != "starling")
    throw ConfigError(
        "a pipeline's activations travel on the swarm's point-to-point messages: "
        "it needs net.backend = \"starling\", not \"" +
        s.net_backend + "\"");
  if (s.stage < 0 || s.stage >= c.count())
    throw ConfigError("this peer's pipeline stage is " + std::to_string(s.stage) +
                      "; set pipeline.stage to 0 .. " + std::to_string(c.count() - 1) +
                      " (or net.rank)");
  if (s.replicas < 1 || s.replica < 0 || s.replica >= s.replicas)
    throw ConfigError("this peer's pipeline replica is " + std::to_string(s.replica) + " of " +
                      std::to_string(s.replicas) + "; set pipeline.replica to 0 .. " +
                      std::to_string(s.replicas - 1));
}

}  // namespace starling::strategy
