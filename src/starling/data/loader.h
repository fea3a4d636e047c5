// Training windows over token shards: each sample is seq_len+1 consecutive tokens (input = first
// seq_len, target = last seq_len). Windows start every seq_len tokens within each shard (none
// crosses a shard boundary) and are numbered across the shards in order; each epoch visits them
// in an order shuffled by (seed, epoch). Peer `rank` of `world` takes every world-th window of
// that order, so peers see disjoint data and a data-parallel run needs no change here.
//
// When the peers change (one died, one joined), a swarm whose peers draw in lockstep re-deals the
// rest of the epoch among the peers present (redeal): from the position the swarm has read up to,
// the new `world` peers each take every world-th window again, so no window of the epoch goes
// unread because its reader left, and none is read twice. Later epochs keep the new share.
// Deterministic: the same (shards, seq_len, batch, seed, rank, world, state) always yields the
// same batches.
#pragma once

#include <cstdint>
#include <filesystem>
#include <nlohmann/json_fwd.hpp>
#include <vector>

#include "starling/data/shard.h"

namespace starling::data {

struct Batch {
  int64_t batch = 0;
  int64_t seq_len = 0;
  std::vector<int64_t> inputs;   // batch * seq_len, row-major
  std::vector<int64_t> targets;  // batch * seq_len
};

// Position in the stream; saved in checkpoints so a resumed run continues exactly.
struct LoaderState {
  uint64_t epoch = 0;
  uint64_t cursor = 0;  // index into this peer's part of the epoch's window order
  // The share since the last re-deal: this peer takes positions base + rank + k * world of the
  // epoch's order (base applies to the epoch of the re-deal only; later epochs start at 0).
  // world = 0: no re-deal yet, the share LoaderOptions gives (rank of world, from position 0).
  uint64_t base = 0;
  int rank = 0;
  int world = 0;
};

void to_json(nlohmann::json& j, const LoaderState& s);
void from_json(const nlohmann::json& j, LoaderState& s);

struct LoaderOptions {
  int64_t seq_len = 256;
  int64_t batch = 8;
  uint64_t seed = 1337;
  int rank = 0;
  int world = 1;
  bool shuffle = true;  // false: windows in file order (used for evaluation)
  // The model's vocabulary: a token id at or above it is a DataError naming the shard and the
  // token's position when its window is read (an embedding would fail on it with no such
  // context). 0 = any uint16 id is accepted.
  int64_t vocab_size = 0;
};

class TokenLoader {
 public:
  // DataError if the shards hold fewer windows than world (every peer needs at least one);
  // ConfigError for seq_len/batch < 1 or rank outside [0, world).
  TokenLoader(const std::vector<std::filesystem::path>& shards, LoaderOptions options);

  // The next options().batch windows, as one batch.
  Batch next() { return next(options_.batch); }
  // The next `rows` windows (rows >= 1), as one batch: an open-ended step (atom) may end on a
  // micro-batch smaller than the others. The position advances by `rows` windows, so a run
  // that drew batches of different sizes resumes as exactly as one that drew whole ones.
  // ConfigError for rows < 1.
  Batch next(int64_t rows);
  LoaderState state() const { return state_; }
  // CheckpointError if the cursor lies past this peer's windows per epoch.
  void restore(const LoaderState& state);
  // The position after `batches` batches from the start of epoch 0: where a run that drew that
  // many is, whatever this loader drew before (peers that must draw the same batches from the
  // same step on, such as a pipeline's stages, meet there). The options' share again: a re-deal
  // is undone.
  void seek(uint64_t batches);
  // Windows this peer sees in the current epoch (its share of the whole epoch unless a re-deal
  // started it part-way).
  uint64_t windows_per_epoch() const;
  // Windows in the whole epoch (all peers together).
  uint64_t total_windows() const { return total_windows_; }

  // The share this peer reads now: rank of world (the options' unless re-dealt).
  struct Share {
    int rank = 0;
    int world = 1;
  };
  Share share() const;
  // How far the swarm has read, if every peer of this share read as far as this one: epochs
  // completed times total_windows() plus the positions of the current epoch's order read.
  uint64_t swarm_position() const;
  // From swarm position `position` (as swarm_position() counts), this peer takes every world-th
  // window of the rest of that epoch, starting with the rank-th, and the same share of later
  // epochs. ConfigError for rank outside [0, world).
  void redeal(uint64_t position, int rank, int world);
  // Tokens each window yields for training (seq_len).
  const LoaderOptions& options() const { return options_; }

 private:
  // Makes `order_` this peer's windows of the current epoch (no-op if it already is).
  void build_order();
  // Copies window `window` (global index) into row `row` of `batch`; DataError on a token id
  // outside options_.vocab_size.
  void fill_row(uint64_t window, int64_t row, Batch& batch) const;

  uint64_t total_windows_ = 0;
  // window_start_[s] is the global index of shard s's first window; one past the end at the back.
  std::vector<uint64_t> window_start_;
  std::vector<uint64_t> order_;  // this peer's windows for `order_epoch_`, in visiting order
  uint64_t order_epoch_ = 0, order_base_ = 0;
  Share order_share_;
  bool order_valid_ = false;
  LoaderOptions options_;
  LoaderState state_;
  std::vector<MappedShard> shards_;
};

}  // namespace starling::data
