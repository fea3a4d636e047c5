#include "starling/data/loader.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <numeric>
#include <set>
#include <vector>

#include "starling/common/error.h"
#include "starling/data/shard.h"
#include "test_util.h"

namespace starling::data {
namespace {

using testing::TempDir;

constexpr int64_t kSeqLen = 16;
constexpr uint16_t kSecondBase = 10000;

// Two shards of consecutive token values, 0..999 and 10000..10516, so a window's first token
// names it and a window crossing the shard boundary would show a jump. With seq_len 16 they hold
// 62 + 32 = 94 windows.
class LoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::vector<uint16_t> a(1000), b(517);
    std::iota(a.begin(), a.end(), uint16_t{0});
    std::iota(b.begin(), b.end(), kSecondBase);
    shards_ = {dir_ / "train_000.bin", dir_ / "train_001.bin"};
    write_shard(shards_[0], a);
    write_shard(shards_[1], b);
  }

  LoaderOptions options(int64_t batch = 1, int rank = 0, int world = 1) const {
    LoaderOptions o;
    o.seq_len = kSeqLen;
    o.batch = batch;
    o.rank = rank;
    o.world = world;
    return o;
  }

  // The first input token of every row of the next `batches` batches.
  static std::vector<int64_t> firsts(TokenLoader& loader, int batches) {
    std::vector<int64_t> out;
    for (int i = 0; i < batches; ++i) {
      const Batch b = loader.next();
      for (int64_t row = 0; row < b.batch; ++row) out.push_back(b.inputs[row * b.seq_len]);
    }
    return out;
  }

  static constexpr uint64_t kWindows = 94;
  TempDir dir_;
  std::vector<std::filesystem::path> shards_;
};

std::set<int64_t> all_window_starts() {
  std::set<int64_t> starts;
  for (int64_t w = 0; w < 62; ++w) starts.insert(w * kSeqLen);
  for (int64_t w = 0; w < 32; ++w) starts.insert(kSecondBase + w * kSeqLen);
  return starts;
}

TEST_F(LoaderTest, RowsAreConsecutiveTokensWithTargetsShiftedByOne) {
  TokenLoader loader(shards_, options(8));
  for (int i = 0; i < 30; ++i) {
    const Batch b = loader.next();
    ASSERT_EQ(b.batch, 8);
    ASSERT_EQ(b.seq_len, kSeqLen);
    ASSERT_EQ(b.inputs.size(), static_cast<std::size_t>(8 * kSeqLen));
    ASSERT_EQ(b.targets.size(), b.inputs.size());
    for (int64_t row = 0; row < b.batch; ++row) {
      const int64_t* in = &b.inputs[row * kSeqLen];
      const int64_t* tg = &b.targets[row * kSeqLen];
      const int64_t offset = in[0] < kSecondBase ? in[0] : in[0] - kSecondBase;
      EXPECT_EQ(offset % kSeqLen, 0) << "windows start every seq_len tokens";
      for (int64_t t = 0; t < kSeqLen; ++t) {
        ASSERT_EQ(in[t], in[0] + t) << "window crosses a shard boundary";
        ASSERT_EQ(tg[t], in[t] + 1);
        if (t + 1 < kSeqLen) {
          ASSERT_EQ(tg[t], in[t + 1]);
        }
      }
    }
  }
}

TEST_F(LoaderTest, UnshuffledIsFileOrder) {
  LoaderOptions o = options(1);
  o.shuffle = false;
  TokenLoader loader(shards_, o);
  EXPECT_EQ(loader.windows_per_epoch(), kWindows);
  const auto seen = firsts(loader, kWindows + 2);
  for (int64_t w = 0; w < 62; ++w) EXPECT_EQ(seen[w], w * kSeqLen);
  for (int64_t w = 0; w < 32; ++w) EXPECT_EQ(seen[62 + w], kSecondBase + w * kSeqLen);
  EXPECT_EQ(seen[kWindows], 0);  // the next epoch starts over
  EXPECT_EQ(loader.state().epoch, 1u);
  EXPECT_EQ(loader.state().cursor, 2u);
}

TEST_F(LoaderTest, ATokenOutsideTheVocabularyNamesTheShardAndItsIndex) {
  // Tokens 0..499 fit a vocabulary of 500: windows 0..30 (tokens 0..496) load, window 31
  // (tokens 496..512) holds the first token that does not.
  LoaderOptions o = options(1);
  o.shuffle = false;
  o.vocab_size = 500;
  TokenLoader loader(shards_, o);
  for (int i = 0; i < 31; ++i) ASSERT_NO_THROW(loader.next()) << "window " << i;
  try {
    loader.next();
    FAIL() << "expected a DataError";
  } catch (const DataError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("train_000.bin"), std::string::npos) << what;
    EXPECT_NE(what.find("token 500 at token index 500"), std::string::npos) << what;
    EXPECT_NE(what.find("model.vocab_size"), std::string::npos) << what;
  }
}

TEST_F(LoaderTest, EachEpochIsAPermutationInADifferentOrder) {
  TokenLoader loader(shards_, options(1));
  const auto epoch0 = firsts(loader, kWindows);
  const auto epoch1 = firsts(loader, kWindows);
  const auto all = all_window_starts();
  EXPECT_EQ(std::set<int64_t>(epoch0.begin(), epoch0.end()), all);
  EXPECT_EQ(std::set<int64_t>(epoch1.begin(), epoch1.end()), all);
  EXPECT_NE(epoch0, epoch1);
  std::vector<int64_t> file_order(all.begin(), all.end());
  EXPECT_NE(epoch0, file_order);
}

TEST_F(LoaderTest, DeterministicForTheSameOptions) {
  TokenLoader a(shards_, options(5));
  TokenLoader b(shards_, options(5));
  for (int i = 0; i < 50; ++i) {  // 250 windows: crosses two epoch boundaries
    const Batch x = a.next();
    const Batch y = b.next();
    ASSERT_EQ(x.inputs, y.inputs) << i;
    ASSERT_EQ(x.targets, y.targets) << i;
  }
  LoaderOptions other = options(5);
  other.seed = 7;
  TokenLoader c(shards_, other);
  TokenLoader d(shards_, options(5));
  EXPECT_NE(c.next().inputs, d.next().inputs);
}

// Pins the shuffle so a change to it (which would silently change every run's data order) fails.
TEST_F(LoaderTest, ShuffleOrderIsPinned) {
  TokenLoader loader(shards_, options(1));
  const auto seen = firsts(loader, 8);
  const std::vector<int64_t> expected = {10160, 10432, 464, 672, 416, 10080, 144, 320};
  EXPECT_EQ(seen, expected);
}

TEST_F(LoaderTest, RanksSplitEachEpochDisjointly) {
  constexpr int kWorld = 3;
  std::multiset<int64_t> seen;
  uint64_t total = 0;
  for (int rank = 0; rank < kWorld; ++rank) {
    TokenLoader loader(shards_, options(1, rank, kWorld));
    // 94 = 32 + 31 + 31: the remainder goes to the lowest ranks.
    EXPECT_EQ(loader.windows_per_epoch(), rank == 0 ? 32u : 31u);
    total += loader.windows_per_epoch();
    for (const int64_t first : firsts(loader, static_cast<int>(loader.windows_per_epoch()))) {
      seen.insert(first);
    }
    EXPECT_EQ(loader.state().epoch, 0u);
  }
  EXPECT_EQ(total, kWindows);
  EXPECT_EQ(seen.size(), kWindows);
  const auto all = all_window_starts();
  EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()), all);  // every window, none twice
}

TEST_F(LoaderTest, RestoredStateContinuesIdentically) {
  TokenLoader first(shards_, options(5, 1, 2));
  for (int i = 0; i < 7; ++i) first.next();
  // Through JSON, as a checkpoint stores it.
  const nlohmann::json saved = first.state();
  std::vector<Batch> expected;
  for (int i = 0; i < 30; ++i) expected.push_back(first.next());

  TokenLoader resumed(shards_, options(5, 1, 2));
  resumed.restore(saved.get<LoaderState>());
  EXPECT_EQ(resumed.state().cursor, 35u);
  for (int i = 0; i < 30; ++i) {
    const Batch b = resumed.next();
    ASSERT_EQ(b.inputs, expected[i].inputs) << i;
    ASSERT_EQ(b.targets, expected[i].targets) << i;
  }
  EXPECT_EQ(resumed.state().epoch, first.state().epoch);
  EXPECT_EQ(resumed.state().cursor, first.state().cursor);
}

// An open-ended step's last micro-batch may be smaller (atom): batches of any size draw the same
// windows in the same order as whole ones, across an epoch's end, and the position they leave
// restores exactly.
TEST_F(LoaderTest, BatchesOfAnySizeDrawTheSameWindows) {
  TokenLoader whole(shards_, options(4, 1, 2));
  std::vector<int64_t> expected;
  for (int i = 0; i < 30; ++i) {  // 120 windows: past the end of this peer's 47 of an epoch
    const Batch b = whole.next();
    ASSERT_EQ(b.batch, 4);
    for (int64_t row = 0; row < b.batch; ++row) expected.push_back(b.inputs[row * b.seq_len]);
    for (int64_t row = 0; row < b.batch; ++row)
      ASSERT_EQ(b.targets[row * b.seq_len], b.inputs[row * b.seq_len] + 1);
  }
  TokenLoader mixed(shards_, options(4, 1, 2));
  std::vector<int64_t> got;
  for (const int64_t rows : {4, 3, 1, 2, 4, 1, 1, 4, 2, 3}) {  // 25 windows
    const Batch b = mixed.next(rows);
    ASSERT_EQ(b.batch, rows);
    ASSERT_EQ(b.inputs.size(), static_cast<size_t>(rows * kSeqLen));
    for (int64_t row = 0; row < b.batch; ++row) got.push_back(b.inputs[row * b.seq_len]);
  }
  EXPECT_EQ(mixed.state().cursor, 25u);
  TokenLoader resumed(shards_, options(4, 1, 2));
  resumed.restore(nlohmann::json(mixed.state()).get<LoaderState>());
  while (got.size() < expected.size()) {
    const Batch b = resumed.next(got.size() % 2 == 0 ? 3 : 4);
    for (int64_t row = 0; row < b.batch && got.size() < expected.size(); ++row)
      got.push_back(b.inputs[row * b.seq_len]);
  }
  EXPECT_EQ(got, expected);
  EXPECT_THROW(resumed.next(0), ConfigError);
}

TEST_F(LoaderTest, RestoreAtTheEndOfAnEpochRollsOver) {
  TokenLoader a(shards_, options(1));
  firsts(a, kWindows);
  const LoaderState end = a.state();
  EXPECT_EQ(end.epoch, 0u);
  EXPECT_EQ(end.cursor, kWindows);
  TokenLoader b(shards_, options(1));
  b.restore(end);
  EXPECT_EQ(a.next().inputs, b.next().inputs);
  EXPECT_EQ(b.state().epoch, 1u);
}

// Seeking to k batches lands where a loader that drew k batches from the start is, across epochs
// and whatever the loader drew before.
TEST_F(LoaderTest, SeekLandsWhereAFreshLoaderIsAfterThatManyBatches) {
  TokenLoader fresh(shards_, options(5, 1, 2));
  std::vector<Batch> drawn;
  for (int i = 0; i < 40; ++i) drawn.push_back(fresh.next());
  for (const int k : {0, 7, 13, 39}) {
    TokenLoader sought(shards_, options(5, 1, 2));
    for (int i = 0; i < 3; ++i) sought.next();
    sought.seek(static_cast<uint64_t>(k));
    EXPECT_EQ(sought.next().inputs, drawn[static_cast<size_t>(k)].inputs) << "after " << k;
  }
}

// Four peers read 5 rows each; one leaves; the three left deal the rest of the epoch among them.
// Together they read every window of the epoch once: the departed peer's unread windows too.
TEST_F(LoaderTest, ARedealCoversTheRestOfTheEpochOnce) {
  constexpr int kBefore = 4, kAfter = 3, kRows = 5;
  std::multiset<int64_t> seen;
  std::vector<TokenLoader> loaders;
  for (int rank = 0; rank < kBefore; ++rank) {
    loaders.emplace_back(shards_, options(1, rank, kBefore));
    for (const int64_t first : firsts(loaders.back(), kRows)) seen.insert(first);
  }
  const uint64_t position = loaders[0].swarm_position();
  EXPECT_EQ(position, uint64_t{kBefore * kRows});
  for (const TokenLoader& l : loaders) EXPECT_EQ(l.swarm_position(), position);
  loaders.pop_back();  // the last peer leaves; its 5 rows were read
  uint64_t rest = 0;
  for (int rank = 0; rank < kAfter; ++rank) {
    TokenLoader& l = loaders[static_cast<size_t>(rank)];
    l.redeal(position, rank, kAfter);
    EXPECT_EQ(l.share().rank, rank);
    EXPECT_EQ(l.share().world, kAfter);
    rest += l.windows_per_epoch();
    for (const int64_t first : firsts(l, static_cast<int>(l.windows_per_epoch()))) {
      seen.insert(first);
    }
    EXPECT_EQ(l.state().epoch, 0u);
    // The epoch's last windows fall to the lower ranks: a position is exact to within a round.
    EXPECT_LE(kWindows - l.swarm_position(), uint64_t{kAfter});
  }
  EXPECT_EQ(rest, kWindows - position);
  EXPECT_EQ(seen.size(), kWindows);
  EXPECT_EQ(std::set<int64_t>(seen.begin(), seen.end()), all_window_starts());

  // The next epoch keeps the new share, from its start: 94 = 32 + 31 + 31 again.
  std::multiset<int64_t> next;
  for (TokenLoader& l : loaders) {
    for (const int64_t first : firsts(l, l.share().rank == 0 ? 32 : 31)) next.insert(first);
    EXPECT_EQ(l.state().epoch, 1u);
    EXPECT_LE(2 * kWindows - l.swarm_position(), uint64_t{kAfter});
  }
  EXPECT_EQ(std::set<int64_t>(next.begin(), next.end()), all_window_starts());
  EXPECT_EQ(next.size(), kWindows);
}

// A re-deal at the last window leaves a peer nothing of that epoch: it starts the next one.
TEST_F(LoaderTest, ARedealAtTheEndOfAnEpochStartsTheNext) {
  TokenLoader l(shards_, options(1, 0, 1));
  l.redeal(2 * kWindows - 1, 1, 2);
  EXPECT_EQ(l.windows_per_epoch(), 0u);
  TokenLoader plain(shards_, options(1, 1, 2));
  plain.seek(kWindows);  // rank 1 of 2 reads 47 windows an epoch: epoch 2 from its start
  EXPECT_EQ(l.next().inputs, plain.next().inputs);
  EXPECT_EQ(l.state().epoch, 2u);
  EXPECT_THROW(l.redeal(0, 2, 2), ConfigError);
}

// A re-dealt share travels in the checkpoint's JSON; one without a share reads as before.
TEST_F(LoaderTest, ARedealtShareIsRestored) {
  TokenLoader a(shards_, options(3, 2, 4));
  a.next();
  a.redeal(a.swarm_position() + kWindows, 1, 3);
  a.next();
  const nlohmann::json saved = a.state();
  ASSERT_TRUE(saved.contains("share"));
  TokenLoader b(shards_, options(3, 2, 4));
  b.restore(saved.get<LoaderState>());
  EXPECT_EQ(b.share().rank, 1);
  EXPECT_EQ(b.share().world, 3);
  for (int i = 0; i < 40; ++i) ASSERT_EQ(a.next().inputs, b.next().inputs) << i;
  EXPECT_FALSE(nlohmann::json(TokenLoader(shards_, options(1)).state()).contains("share"));
  EXPECT_THROW((nlohmann::json{
                   {"epoch", 1}, {"cursor", 0}, {"share", {{"base", 0}, {"rank", 3}, {"world", 3}}}}
                    .get<LoaderState>()),
               CheckpointError);
  EXPECT_THROW(
      (nlohmann::json{{"epoch", 1}, {"cursor", 0}, {"share", {{"base", 0}}}}.get<LoaderState>()),
      CheckpointError);
  LoaderState far;
  far.base = kWindows;
  far.world = 2;
  EXPECT_THROW(b.restore(far), CheckpointError);
}

TEST_F(LoaderTest, RejectsBadState) {
  TokenLoader loader(shards_, options(1));
  EXPECT_THROW(loader.restore(LoaderState{0, kWindows + 1}), CheckpointError);
  EXPECT_THROW(nlohmann::json({{"epoch", 1}}).get<LoaderState>(), CheckpointError);
  EXPECT_THROW(nlohmann::json({{"epoch", 1}, {"cursor", -2}}).get<LoaderState>(), CheckpointError);
  EXPECT_THROW(nlohmann::json(3).get<LoaderState>(), CheckpointError);
  const LoaderState ok = nlohmann::json({{"epoch", 4}, {"cursor", 2}}).get<LoaderState>();
  EXPECT_EQ(ok.epoch, 4u);
  EXPECT_EQ(ok.cursor, 2u);
}

TEST_F(LoaderTest, RejectsBadOptions) {
  auto make = [&](auto change) {
    LoaderOptions o = options();
    change(o);
    TokenLoader loader(shards_, o);
  };
  EXPECT_THROW(make([](LoaderOptions& o) { o.seq_len = 0; }), ConfigError);
  EXPECT_THROW(make([](LoaderOptions& o) { o.batch = 0; }), ConfigError);
  EXPECT_THROW(make([](LoaderOptions& o) { o.world = 0; }), ConfigError);
  EXPECT_THROW(make([](LoaderOptions& o) { o.rank = -1; }), ConfigError);
  EXPECT_THROW(make([](LoaderOptions& o) {
                 o.world = 3;
                 o.rank = 3;
               }),
               ConfigError);
}

TEST_F(LoaderTest, RejectsTooLittleData) {
  // One window per peer at most 94 peers.
  LoaderOptions o = options(1, 0, 95);
  EXPECT_THROW(TokenLoader(shards_, o), DataError);
  o = options();
  o.seq_len = 1000;  // neither shard holds 1001 tokens
  try {
    TokenLoader loader(shards_, o);
    FAIL() << "no error";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("1001"), std::string::npos) << e.what();
  }
  EXPECT_THROW(TokenLoader({}, options()), DataError);
  EXPECT_THROW(TokenLoader({dir_ / "missing.bin"}, options()), DataError);
}

TEST_F(LoaderTest, ExactFitShardHasOneWindow) {
  std::vector<uint16_t> tokens(kSeqLen + 1);
  std::iota(tokens.begin(), tokens.end(), uint16_t{5});
  write_shard(dir_ / "tiny.bin", tokens);
  TokenLoader loader({dir_ / "tiny.bin"}, options(3));
  EXPECT_EQ(loader.windows_per_epoch(), 1u);
  const Batch b = loader.next();  // the same window fills all three rows, one per epoch
  EXPECT_EQ(b.inputs[0], 5);
  EXPECT_EQ(b.targets[kSeqLen - 1], 5 + kSeqLen);
  EXPECT_EQ(loader.state().epoch, 2u);
}

}  // namespace
}  // namespace starling::data
