// The [strategy] table: how peers train together (docs/strategies.md). The strategy layer owns
// these settings, their keys and the one list of strategy kinds; train/config.h places the table
// in a run's config. Torch-free.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "starling/config/keys_fwd.h"

namespace starling::strategy {

// The strategies a swarm trains with (strategy.kind besides "none"); every list of them in
// messages and checks comes from here.
const std::vector<std::string>& swarm_strategy_kinds();
// The same list for messages: "ddp, localsgd, diloco, co2 or atom".
std::string swarm_strategy_list();

// What a run resumed from checkpoints of another strategy.kind (`saved`) keeps and leaves
// behind, for the launcher and the peer to say alike: "the checkpoint was written by
// strategy.kind = "co2", this run is "ddp": ...".
std::string kind_change_note(const std::string& saved, const std::string& kind);

// "none" trains one replica.
struct StrategyConfig {
  std::string kind = "none";       // "none", "ddp", "localsgd", "diloco", "co2" or "atom"
  int64_t local_steps = 16;        // tau: inner steps per round (localsgd, diloco, co2)
  double outer_lr = 0.7;           // alpha: outer learning rate (diloco, co2)
  double outer_momentum = 0.9;     // beta: outer momentum
  bool outer_nesterov = true;      // co2: Nesterov's outer step, x -= alpha (beta m + Delta);
                                   // false: the heavy ball's (the published form), x -= alpha m
  double staleness_penalty = 1.0;  // gamma (co2): divide the stale update by 1 + gamma*gap
  std::string clip = "norm";       // co2 outer-momentum clipping: "norm", "value" or "none"
  double clip_threshold = 5.0;     // phi: max norm (clip = "norm") or max |m_i| ("value")
  // co2: how the run's last average moves the anchor: "average" (x -= Delta: the peers' mean,
  // without the momentum's extrapolation) or "outer" (the outer step, as every round's).
  std::string final_step = "average";
  bool zero = false;  // co2: shard anchor and outer momentum across peers
  // co2: inner steps a round's exchange overlaps before its average is applied; 0 (or
  // local_steps) applies it at the next round boundary, one round late (the published form);
  // -1: adapted to how long the exchanges take, where that can work (co2_overlap_steps()).
  int64_t overlap_steps = -1;
  int64_t target_batch = 0;        // atom: samples per step; 0 = batch x accum per peer
  std::string precision = "fp32";  // on the wire: "fp32", "fp16", "bf16" or "int8"
  // atom: a step's last micro-batch on a peer may be smaller than train.batch_size, so that the
  // peers end together; false keeps every micro-batch whole (the same shape every pass).
  bool partial_micro_batches = true;
  // How a round's updates combine (ddp, localsgd, diloco): "mean" (a ring all-reduce) or
  // "trimmed_mean" (robust to misbehaving peers; robust_aggregate.h).
  std::string aggregation = "mean";
  int64_t trim = 1;  // trimmed_mean: values dropped at each end of every element
  // Step events carry a CRC-32C of the shared state at the latest round (the chaos harness
  // compares the peers' round by round).
  bool fingerprint = false;
  // When the peers of a round change (one died, one joined), the rest of the epoch's training
  // windows are dealt again among the peers present, so a departed peer's share is still read
  // (ddp, localsgd, diloco, co2; data/loader.h). false: each peer keeps the share it started with.
  bool redeal_data = true;
  // A state transfer (a joiner adopting the swarm's state) travels in pieces of at most this
  // many bytes, each read and written a tensor at a time, so no peer holds the whole state twice
  // and a swapped replica's state stays in its tier. The root's setting holds for a transfer.
  std::string transfer_piece = "64MB";
};

// strategy.transfer_piece in bytes (checked by check()).
int64_t transfer_piece_bytes(const StrategyConfig& c);

// co2's overlap_steps in effect: the configured value, or for -1 on rounds of at least 8 steps of
// a whole model without zero, -1 again: adaptive, chosen each round from how long the exchanges
// take; otherwise 0 (sharded and pipeline-stage co2 keep the published form, and shorter rounds
// leave too few steps to adapt in).
int64_t co2_overlap_steps(const StrategyConfig& c, bool pipeline_stage);

// Appends the [strategy] keys, bound to `c`'s fields.
void add_config_keys(StrategyConfig& c, config::Keys& keys);
// Checks that span keys (each key's own range is checked when it is read); ConfigError
// prefixed with `source`.
void check(const StrategyConfig& c, const std::string& source);
// What a peer refuses about its strategy with the rest of its config (the net backend, fault
// injection's variables); ConfigError naming the keys. Checked before a peer joins anyone, and
// by the local launcher before it starts any, so a refusal never leaves other peers waiting for
// it.
void check_peer(const StrategyConfig& c, const std::string& net_backend);

}  // namespace starling::strategy
