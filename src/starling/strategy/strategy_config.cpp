#include "starling/strategy/strategy_config.h"

#include <algorithm>

#include "starling/common/error.h"
#include "starling/config/config_keys.h"
#include "starling/strategy/fault_injection.h"
#include "starling/swap/swap_config.h"

namespace starling::strategy {

const std::vector<std::string>& swarm_strategy_kinds() {
  static const std::vector<std::string> kinds = {"ddp", "localsgd", "diloco", "co2", "atom"};
  return kinds;
}

std::string swarm_strategy_list() {
  const auto& kinds = swarm_strategy_kinds();
  std::string list;
  for (size_t i = 0; i < kinds.size(); ++i)
    list += (i == 0 ? "" : i + 1 == kinds.size() ? " or " : ", ") + kinds[i];
  return list;
}

std::string kind_change_note(const std::string& saved, const std::string& kind) {
  const bool outer = saved == "co2" || saved == "diloco";
  return "the checkpoint was written by strategy.kind = \"" + saved + "\", this run is \"" + kind +
         "\": parameters, optimizer moments and step go on, " + saved + "'s own state (its rounds" +
         (outer ? ", outer momentum and anchor" : "") + ") is left behind";
}

void add_config_keys(StrategyConfig& st, config::Keys& k) {
  using namespace config;
  std::vector<std::string> kinds{"none"};
  kinds.insert(kinds.end(), swarm_strategy_kinds().begin(), swarm_strategy_kinds().end());
  k.push_back(string_key("strategy", "kind", &st.kind,
                         "how peers train together: \"none\" (one replica), or with peers " +
                             swarm_strategy_list() + " (docs/strategies.md)",
                         kinds));
  k.push_back(int_key("strategy", "local_steps", &st.local_steps, 1,
                      "tau: local optimizer steps per round (localsgd, diloco, co2)"));
  k.push_back(float_key("strategy", "outer_lr", &st.outer_lr, 0,
                        "alpha: outer learning rate applied to the averaged update (diloco, co2)"));
  k.push_back(
      float_key("strategy", "outer_momentum", &st.outer_momentum, 0, "beta: outer momentum; < 1"));
  k.push_back(bool_key("strategy", "outer_nesterov", &st.outer_nesterov,
                       "co2: on averages applied inside the round, take Nesterov's outer step, "
                       "anchor -= alpha * (beta * m + Delta), as diloco does; false: the heavy "
                       "ball's anchor -= alpha * m. Round-late averages (overlap_steps = 0, zero) "
                       "always take the heavy ball's"));
  k.push_back(
      float_key("strategy", "staleness_penalty", &st.staleness_penalty, 0,
                "gamma (co2): the one-round-stale update is divided by 1 + gamma * staleness gap "
                "(not with overlap_steps < local_steps, whose updates are not stale)"));
  k.push_back(string_key("strategy", "clip", &st.clip,
                         "co2 outer-momentum clipping: \"norm\" (global L2 norm), \"value\" "
                         "(each element) or \"none\"",
                         {"norm", "value", "none"}));
  k.push_back(float_key("strategy", "clip_threshold", &st.clip_threshold, 0,
                        "phi (co2): the largest momentum norm (clip = \"norm\") or |element| "
                        "(clip = \"value\")"));
  k.push_back(string_key("strategy", "final_step", &st.final_step,
                         "co2: how the run's last average moves the anchor: \"average\" "
                         "(anchor -= Delta: the peers' mean, without the outer momentum's "
                         "extrapolation) or \"outer\" (the outer step, as every round's)",
                         {"average", "outer"}));
  k.push_back(bool_key("strategy", "zero", &st.zero,
                       "co2: each peer keeps 1/N of the anchor and outer momentum "
                       "(reduce-scatter + all-gather instead of all-reduce)"));
  k.push_back(int_key("strategy", "overlap_steps", &st.overlap_steps, -1,
                      "co2: inner steps a round's exchange overlaps before its average is "
                      "applied (the peer keeps its progress since the launch); 0 or local_steps: "
                      "the published form, applied at the next round boundary, one round late; "
                      "-1: adaptive, as many steps as the last exchanges took (1 to "
                      "local_steps - 1), for rounds of 8 steps or more without zero, else 0 "
                      "(docs/strategies.md#co2)"));
  k.push_back(int_key("strategy", "target_batch", &st.target_batch, 0,
                      "atom: samples (sequences) the swarm gathers per optimizer step; 0 = "
                      "train.batch_size x train.grad_accum per peer"));
  k.push_back(bool_key("strategy", "partial_micro_batches", &st.partial_micro_batches,
                       "atom: a peer's last micro-batch of a step may hold fewer than "
                       "train.batch_size sequences, those it gains until the swarm holds "
                       "target_batch, so that the peers end the step together; false: whole "
                       "micro-batches only (one shape every pass; the first peers to stop wait "
                       "up to a micro-batch of the slowest for the last)"));
  k.push_back(string_key("strategy", "precision", &st.precision,
                         "wire precision of the averaged tensors: \"fp32\", \"fp16\", \"bf16\" "
                         "or \"int8\" (accumulation is always fp32)",
                         {"fp32", "fp16", "bf16", "int8"}));
  k.push_back(string_key("strategy", "aggregation", &st.aggregation,
                         "how a round's updates combine (ddp, localsgd, diloco): \"mean\" (ring "
                         "all-reduce) or \"trimmed_mean\" (every update to every peer; each "
                         "element drops the strategy.trim smallest and largest values; robust to "
                         "poisoned updates, P/2 times the traffic; docs/reliability.md)",
                         {"mean", "trimmed_mean"}));
  k.push_back(int_key("strategy", "trim", &st.trim, 0,
                      "trimmed_mean: peers' values dropped at each end of every element (at most "
                      "(peers - 1) / 2 are)"));
  k.push_back(bool_key(
      "strategy", "fingerprint", &st.fingerprint,
      "step events and metrics carry net.fingerprint, a CRC-32C of the shared "
      "state after the latest round this peer averaged (net.fingerprint_round, "
      "of the history net.fingerprint_lineage), so peers can be compared round by "
      "round (bench/chaos); costs a pass over "
      "the model per round (a swapped ddp or atom peer reads its weights back from its tier "
      "after each step; co2's zero takes it from the anchor it gathers)"));
  k.push_back(bool_key("strategy", "redeal_data", &st.redeal_data,
                       "when the peers of a round change (one died or left, one joined), deal "
                       "the rest of the epoch's training windows again among the peers present, "
                       "so a departed peer's share is still read and none is read twice (ddp, "
                       "localsgd, diloco, co2; atom's peers read at their own pace and keep "
                       "their shares); false: each peer keeps the share it started with"));
  k.push_back(string_key("strategy", "transfer_piece", &st.transfer_piece,
                         "the largest piece of a state transfer (a joiner adopting the swarm's "
                         "weights and AdamW moments), such as \"64MB\" (at least 4KB): each "
                         "piece is read and written a tensor at a time, so no peer holds the "
                         "state twice and a swapped replica's stays in its tier; the sending "
                         "peer's setting holds. Where a localsgd or diloco peer is swapped, the "
                         "round (the average, the outer step) goes in pieces too, of the "
                         "participants' mean setting"));
}

int64_t transfer_piece_bytes(const StrategyConfig& c) {
  return swap::parse_bytes(c.transfer_piece, "strategy.transfer_piece");
}

int64_t co2_overlap_steps(const StrategyConfig& c, bool pipeline_stage) {
  if (c.overlap_steps >= 0) return c.overlap_steps;
  if (c.zero || pipeline_stage || c.local_steps < 8) return 0;
  return -1;
}

void check(const StrategyConfig& c, const std::string& source) {
  // The peers' counts travel as fp32 in their agreement, whole numbers exact to 2^24. A rule of
  // a run's config, not a key's bound: a checkpoint written before it still reads.
  if (c.target_batch > (int64_t{1} << 24))
    throw ConfigError(source + ": strategy.target_batch = " + std::to_string(c.target_batch) +
                      " is more than 16777216 (2^24) samples a step, the most atom's counts "
                      "carry exactly (a target in tokens rather than sequences?)");
  if (swap::parse_bytes(c.transfer_piece, source + ": strategy.transfer_piece") < 4000)
    throw ConfigError(source + ": strategy.transfer_piece (\"" + c.transfer_piece +
                      "\") must be at least 4KB");
  if (c.outer_momentum >= 1) throw ConfigError(source + ": strategy.outer_momentum must be < 1");
  if (c.overlap_steps > c.local_steps)
    throw ConfigError(source + ": strategy.overlap_steps (" + std::to_string(c.overlap_steps) +
                      ") must be at most strategy.local_steps (" + std::to_string(c.local_steps) +
                      "): a round's average is applied within the next round");
  if (c.zero && c.overlap_steps > 0 && c.overlap_steps < c.local_steps)
    throw ConfigError(source +
                      ": strategy.overlap_steps < strategy.local_steps does not work "
                      "with strategy.zero yet (a sharded anchor is rebuilt at the round "
                      "boundary); set overlap_steps = 0 or zero = false");
}

void check_peer(const StrategyConfig& c, const std::string& net_backend) {
  const auto& kinds = swarm_strategy_kinds();
  if (std::find(kinds.begin(), kinds.end(), c.kind) == kinds.end())
    throw ConfigError("strategy.kind = \"" + c.kind + "\" does not train with peers; use " +
                      swarm_strategy_list());
  // Nothing is refused with a [swap] budget: ddp and atom reach a swapped replica's gradients a
  // node at a time, localsgd its parameters a piece at a time, diloco and co2 their parameters
  // and outer state (kept in the tier) a piece or a tensor at a time, and co2's zero keeps its
  // shards in memory and reads and writes the parameters a tensor at a time. Every one takes
  // strategy.fingerprint the same way.
  UpdatePoison::from_env();  // a malformed STARLING_FAULT_POISON is refused here, not mid-run
  die_in_transfer_from_env();
  slow_transfer_from_env();
  refuse_state_from_env();
  stop_at_start_from_env();
  die_in_exchange_from_env();
  lose_piece_from_env();
  die_accumulating_from_env();
  abort_agreement_from_env();
  // The robust aggregate gathers whole updates in host memory, on Starling's swarm (whose rings
  // are ordered by peer id); atom's updates are sums weighted by unequal sample counts, and co2's
  // overlap the next round in a ring.
  if (c.aggregation != "mean") {
    if (c.kind != "ddp" && c.kind != "localsgd" && c.kind != "diloco")
      throw ConfigError(
          "strategy.aggregation = \"" + c.aggregation +
          "\" works with strategy.kind = \"ddp\", \"localsgd\" or \"diloco\", not \"" + c.kind +
          "\"");
    if (net_backend != "starling")
      throw ConfigError("strategy.aggregation = \"" + c.aggregation +
                        "\" needs net.backend = \"starling\", not \"" + net_backend + "\"");
  }
  // Peers announce their progress on the swarm's point-to-point messages, which a fixed c10d
  // group does not offer.
  if (c.kind == "atom" && net_backend != "starling")
    throw ConfigError(
        "strategy.kind = \"atom\" needs net.backend = \"starling\" (peers announce their "
        "progress to each other on the swarm), not \"" +
        net_backend + "\"");
}

}  // namespace starling::strategy
