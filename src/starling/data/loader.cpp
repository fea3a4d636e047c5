#include "starling/data/loader.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <random>
#include <string>

#include "starling/common/error.h"

namespace starling::data {

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform draw in [0, n) by rejection. std::uniform_int_distribution is avoided on purpose: its
// algorithm is implementation-defined, while mt19937_64's output is fixed by the standard, so this
// gives the same order with every standard library.
uint64_t bounded(std::mt19937_64& rng, uint64_t n) {
  const uint64_t threshold = (0 - n) % n;  // 2^64 mod n: the biased low values to reject
  while (true) {
    const uint64_t r = rng();
    if (r >= threshold) return r % n;
  }
}

}  // namespace

void to_json(nlohmann::json& j, const LoaderState& s) {
  j = nlohmann::json{{"epoch", s.epoch}, {"cursor", s.cursor}};
  // Written only after a re-deal, so a checkpoint of a run without one reads as before.
  if (s.world > 0) j["share"] = {{"base", s.base}, {"rank", s.rank}, {"world", s.world}};
}

namespace {

uint64_t count_field(const nlohmann::json& j, const char* key, const char* where) {
  // JSON written by hand or by other tools may store small counts as signed integers.
  const bool ok = j.is_object() && j.contains(key) &&
                  (j.at(key).is_number_unsigned() ||
                   (j.at(key).is_number_integer() && j.at(key).get<int64_t>() >= 0));
  if (!ok) {
    throw CheckpointError(std::string(where) + ": \"" + key +
                          "\" must be a non-negative integer, got " + j.dump());
  }
  return j.at(key).get<uint64_t>();
}

}  // namespace

void from_json(const nlohmann::json& j, LoaderState& s) {
  s.epoch = count_field(j, "epoch", "loader state");
  s.cursor = count_field(j, "cursor", "loader state");
  s.base = 0;
  s.rank = s.world = 0;
  if (j.contains("share")) {
    const nlohmann::json& share = j.at("share");
    s.base = count_field(share, "base", "loader state's share");
    const uint64_t rank = count_field(share, "rank", "loader state's share");
    const uint64_t world = count_field(share, "world", "loader state's share");
    if (world < 1 || world > (1u << 20) || rank >= world)
      throw CheckpointError("loader state's share: rank " + std::to_string(rank) + " of world " +
                            std::to_string(world) + " is not a share (0 <= rank < world)");
    s.rank = static_cast<int>(rank);
    s.world = static_cast<int>(world);
  }
}

TokenLoader::TokenLoader(const std::vector<std::filesystem::path>& shards, LoaderOptions options)
    : options_(options) {
  if (options_.seq_len < 1) {
    throw ConfigError("loader: seq_len must be at least 1, got " +
                      std::to_string(options_.seq_len));
  }
  if (options_.batch < 1) {
    throw ConfigError("loader: batch must be at least 1, got " + std::to_string(options_.batch));
  }
  if (options_.world < 1) {
    throw ConfigError("loader: world must be at least 1, got " + std::to_string(options_.world));
  }
  if (options_.rank < 0 || options_.rank >= options_.world) {
    throw ConfigError("loader: rank must be in [0, " + std::to_string(options_.world) + "), got " +
                      std::to_string(options_.rank));
  }
  const auto seq_len = static_cast<uint64_t>(options_.seq_len);
  uint64_t total_tokens = 0;
  window_start_.push_back(0);
  for (const auto& path : shards) {
    shards_.emplace_back(path);
    const uint64_t count = shards_.back().tokens().size();
    total_tokens += count;
    // Window k covers tokens [k*seq_len, k*seq_len + seq_len]; all must lie inside the shard.
    const uint64_t windows = count > seq_len ? (count - 1) / seq_len : 0;
    total_windows_ += windows;
    window_start_.push_back(total_windows_);
  }
  if (total_windows_ < static_cast<uint64_t>(options_.world)) {
    throw DataError("loader: " + std::to_string(shards.size()) + " shard(s) with " +
                    std::to_string(total_tokens) + " tokens hold " +
                    std::to_string(total_windows_) +
                    " window(s) of seq_len+1 = " + std::to_string(seq_len + 1) +
                    " tokens, but each of the " + std::to_string(options_.world) +
                    " peer(s) needs at least one; use more data or a smaller seq_len");
  }
}

TokenLoader::Share TokenLoader::share() const {
  if (state_.world > 0) return {state_.rank, state_.world};
  return {options_.rank, options_.world};
}

uint64_t TokenLoader::windows_per_epoch() const {
  const Share s = share();
  const uint64_t first = state_.base + static_cast<uint64_t>(s.rank);
  if (first >= total_windows_) return 0;
  return (total_windows_ - first + static_cast<uint64_t>(s.world) - 1) /
         static_cast<uint64_t>(s.world);
}

uint64_t TokenLoader::swarm_position() const {
  const uint64_t read = state_.base + state_.cursor * static_cast<uint64_t>(share().world);
  return state_.epoch * total_windows_ + std::min(read, total_windows_);
}

void TokenLoader::redeal(uint64_t position, int rank, int world) {
  if (world < 1 || rank < 0 || rank >= world)
    throw ConfigError("loader: a share must be a rank in [0, world), got " + std::to_string(rank) +
                      " of " + std::to_string(world));
  state_.epoch = position / total_windows_;
  state_.base = position % total_windows_;
  state_.cursor = 0;
  state_.rank = rank;
  state_.world = world;
}

void TokenLoader::build_order() {
  const Share s = share();
  if (order_valid_ && order_epoch_ == state_.epoch && order_base_ == state_.base &&
      order_share_.rank == s.rank && order_share_.world == s.world)
    return;
  const auto world = static_cast<uint64_t>(s.world);
  const uint64_t first = state_.base + static_cast<uint64_t>(s.rank);
  order_.clear();
  order_.reserve(windows_per_epoch());
  if (!options_.shuffle) {
    for (uint64_t w = first; w < total_windows_; w += world) order_.push_back(w);
  } else {
    std::vector<uint64_t> all(total_windows_);
    for (uint64_t w = 0; w < total_windows_; ++w) all[w] = w;
    std::mt19937_64 rng(splitmix64(splitmix64(options_.seed) + state_.epoch));
    for (uint64_t i = total_windows_ - 1; i > 0; --i) std::swap(all[i], all[bounded(rng, i + 1)]);
    for (uint64_t p = first; p < total_windows_; p += world) order_.push_back(all[p]);
  }
  order_epoch_ = state_.epoch;
  order_base_ = state_.base;
  order_share_ = s;
  order_valid_ = true;
}

void TokenLoader::fill_row(uint64_t window, int64_t row, Batch& batch) const {
  const auto it = std::upper_bound(window_start_.begin(), window_start_.end(), window);
  const auto shard = static_cast<std::size_t>(it - window_start_.begin()) - 1;
  const uint64_t first = (window - window_start_[shard]) * static_cast<uint64_t>(batch.seq_len);
  const uint16_t* tokens = shards_[shard].tokens().data() + first;
  int64_t* inputs = batch.inputs.data() + row * batch.seq_len;
  int64_t* targets = batch.targets.data() + row * batch.seq_len;
  uint16_t largest = 0;
  for (int64_t t = 0; t < batch.seq_len; ++t) {
    inputs[t] = tokens[t];
    targets[t] = tokens[t + 1];
    largest = std::max({largest, tokens[t], tokens[t + 1]});
  }
  if (options_.vocab_size > 0 && largest >= options_.vocab_size) {
    for (int64_t t = 0; t <= batch.seq_len; ++t)
      if (tokens[t] >= options_.vocab_size)
        throw DataError(shards_[shard].path().string() + ": token " + std::to_string(tokens[t]) +
                        " at token index " + std::to_string(first + static_cast<uint64_t>(t)) +
                        " is outside the model's vocabulary of " +
                        std::to_string(options_.vocab_size) +
                        " (model.vocab_size); the data was made with a larger vocabulary, or "
                        "the shard is damaged");
  }
}

Batch TokenLoader::next(int64_t rows) {
  if (rows < 1)
    throw ConfigError("loader: a batch of " + std::to_string(rows) + " windows (at least 1)");
  Batch batch;
  batch.batch = rows;
  batch.seq_len = options_.seq_len;
  batch.inputs.resize(static_cast<std::size_t>(rows * options_.seq_len));
  batch.targets.resize(batch.inputs.size());
  for (int64_t row = 0; row < rows; ++row) {
    // A re-deal at the very end of an epoch can leave this peer nothing of it.
    while (state_.cursor >= windows_per_epoch()) {
      ++state_.epoch;
      state_.cursor = 0;
      state_.base = 0;  // a re-deal's start applies to its own epoch only
    }
    build_order();
    fill_row(order_[state_.cursor++], row, batch);
  }
  return batch;
}

void TokenLoader::restore(const LoaderState& state) {
  const LoaderState before = state_;
  state_ = state;
  if (state.base >= total_windows_ && state.base > 0) {
    state_ = before;
    throw CheckpointError("loader state: its share starts at window " + std::to_string(state.base) +
                          " of an epoch of " + std::to_string(total_windows_) +
                          " (was it saved with other data or seq_len?)");
  }
  if (state.cursor > windows_per_epoch()) {
    const uint64_t per_epoch = windows_per_epoch();
    state_ = before;
    throw CheckpointError("loader state: cursor " + std::to_string(state.cursor) +
                          " is past this peer's " + std::to_string(per_epoch) +
                          " windows per epoch (was it saved with other data, seq_len or world?)");
  }
}

void TokenLoader::seek(uint64_t batches) {
  state_.base = 0;
  state_.rank = state_.world = 0;
  const uint64_t rows = batches * static_cast<uint64_t>(options_.batch);
  state_.epoch = rows / windows_per_epoch();
  state_.cursor = rows % windows_per_epoch();
}

}  // namespace starling::data
