#include "starling/data/prepare.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "starling/common/error.h"
#include "starling/data/dataset.h"
#include "starling/data/shard.h"
#include "test_util.h"

namespace starling::data {
namespace {

using nlohmann::json;
using testing::TempDir;

// Documents with a unique marker each ("<doc 7>") so a split's text shows which documents it holds.
std::filesystem::path make_corpus(const TempDir& dir, int documents,
                                  std::size_t bytes_each = 2000) {
  const auto root = dir / "corpus";
  for (int i = 0; i < documents; ++i) {
    // Nested directories exercise the recursive search.
    const std::string name = (i % 2 ? "a/" : "b/nested/") + std::string("doc") +
                             (i < 10 ? "0" : "") + std::to_string(i) + ".txt";
    testing::write_text(
        root / name, "<doc " + std::to_string(i) + ">\n" + testing::generated_text(i, bytes_each));
  }
  return root;
}

std::string split_text(const DatasetInfo& info, const std::vector<std::filesystem::path>& shards) {
  const auto tok = load_dataset_tokenizer(info);
  std::string text;
  for (const auto& path : shards) {
    MappedShard shard(path);
    std::vector<uint32_t> ids(shard.tokens().begin(), shard.tokens().end());
    text += tok->decode(ids);
  }
  return text;
}

std::set<int> markers(const std::string& text, int documents) {
  std::set<int> found;
  for (int i = 0; i < documents; ++i) {
    if (text.find("<doc " + std::to_string(i) + ">") != std::string::npos) found.insert(i);
  }
  return found;
}

json read_meta(const std::filesystem::path& dir) {
  return json::parse(testing::read_bytes(dir / "meta.json"));
}

void write_meta(const std::filesystem::path& dir, const json& meta) {
  testing::write_text(dir / "meta.json", meta.dump(2));
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const DataError& e) {
    return e.what();
  }
  return "<no DataError>";
}

TEST(Prepare, ByteTokenizerWritesShardsAndMeta) {
  TempDir dir;
  constexpr int kDocs = 20;
  PrepareOptions o;
  o.inputs = {make_corpus(dir, kDocs)};
  o.out_dir = dir / "out";
  o.val_fraction = 0.2;
  o.shard_tokens = 10'000;  // forces several train shards
  std::vector<std::string> stages;
  const DatasetInfo info =
      prepare_dataset(o, [&](const std::string& what, uint64_t done, uint64_t total) {
        EXPECT_LE(done, total);
        stages.push_back(what);
      });
  EXPECT_NE(std::find(stages.begin(), stages.end(), "tokenize"), stages.end());

  EXPECT_EQ(info.tokenizer_kind, "byte");
  EXPECT_EQ(info.vocab_size, 256u);
  EXPECT_TRUE(info.tokenizer_model.empty());
  EXPECT_GT(info.train_shards.size(), 1u);
  EXPECT_GE(info.val_shards.size(), 1u);
  EXPECT_EQ(info.train_shards[0].filename(), "train_000.bin");
  EXPECT_EQ(info.val_shards[0].filename(), "val_000.bin");

  const json meta = read_meta(o.out_dir);
  EXPECT_EQ(meta["format"], "starling-data");
  EXPECT_EQ(meta["version"], 1);
  EXPECT_EQ(meta["tokenizer"]["kind"], "byte");
  EXPECT_EQ(meta["tokenizer"]["vocab_size"], 256);
  EXPECT_FALSE(meta["tokenizer"].contains("model"));
  uint64_t listed = 0;
  for (const auto& entry : meta["train"]) {
    EXPECT_EQ(read_shard_token_count(o.out_dir / entry["file"].get<std::string>()),
              entry["tokens"]);
    EXPECT_LE(entry["tokens"].get<uint64_t>(), o.shard_tokens);
    listed += entry["tokens"].get<uint64_t>();
  }
  EXPECT_EQ(listed, info.train_tokens);

  // Every document lands in exactly one split; 20% of 20 documents are validation.
  const auto train = markers(split_text(info, info.train_shards), kDocs);
  const auto val = markers(split_text(info, info.val_shards), kDocs);
  EXPECT_EQ(val.size(), 4u);
  EXPECT_EQ(train.size() + val.size(), static_cast<std::size_t>(kDocs));
  for (const int v : val) EXPECT_EQ(train.count(v), 0u) << v;

  // Documents are separated by a blank line; the total is every byte of every document plus
  // the separators.
  const std::string all_train = split_text(info, info.train_shards);
  EXPECT_NE(all_train.find("\n\n<doc "), std::string::npos);
  EXPECT_EQ(info.train_tokens + info.val_tokens, [&] {
    uint64_t bytes = 0;
    for (const auto& e : std::filesystem::recursive_directory_iterator(o.inputs[0])) {
      if (e.is_regular_file()) bytes += e.file_size();
    }
    return bytes + 2 * (kDocs - 2);
  }());

  // open_dataset sees the same thing.
  const DatasetInfo reopened = open_dataset(o.out_dir);
  EXPECT_EQ(reopened.train_shards, info.train_shards);
  EXPECT_EQ(reopened.val_tokens, info.val_tokens);
}

TEST(Prepare, SameSeedGivesIdenticalBytesAndSeedChangesTheSplit) {
  TempDir dir;
  PrepareOptions o;
  o.inputs = {make_corpus(dir, 12, 500)};
  o.val_fraction = 0.25;
  o.out_dir = dir / "one";
  const DatasetInfo a = prepare_dataset(o);
  o.out_dir = dir / "two";
  const DatasetInfo b = prepare_dataset(o);
  ASSERT_EQ(a.train_shards.size(), b.train_shards.size());
  for (std::size_t i = 0; i < a.train_shards.size(); ++i) {
    EXPECT_EQ(testing::read_bytes(a.train_shards[i]), testing::read_bytes(b.train_shards[i]));
  }
  EXPECT_EQ(testing::read_bytes(a.val_shards[0]), testing::read_bytes(b.val_shards[0]));
  EXPECT_EQ(testing::read_bytes(a.dir / "meta.json"), testing::read_bytes(b.dir / "meta.json"));

  const auto val_of = [&](uint64_t seed) {
    o.seed = seed;
    o.out_dir = dir / ("seed" + std::to_string(seed));
    const DatasetInfo info = prepare_dataset(o);
    return markers(split_text(info, info.val_shards), 12);
  };
  std::set<std::set<int>> splits;
  for (uint64_t seed = 1; seed <= 4; ++seed) splits.insert(val_of(seed));
  EXPECT_GT(splits.size(), 1u);
}

TEST(Prepare, TwoDocumentsGiveOneToEachSplit) {
  TempDir dir;
  PrepareOptions o;
  o.inputs = {make_corpus(dir, 2, 300)};
  o.out_dir = dir / "out";
  o.val_fraction = 0.01;  // rounds to 0 documents, but val must not be empty
  const DatasetInfo info = prepare_dataset(o);
  EXPECT_EQ(markers(split_text(info, info.val_shards), 2).size(), 1u);
  EXPECT_EQ(markers(split_text(info, info.train_shards), 2).size(), 1u);
}

TEST(Prepare, AnInputThatIsTheOutputIsNamed) {
  // Its files would be skipped as the output's, and the error would say "no input files".
  TempDir dir;
  PrepareOptions o;
  o.inputs = {make_corpus(dir, 2, 300)};
  o.out_dir = o.inputs[0];
  const std::string same = error_of([&] { prepare_dataset(o); });
  EXPECT_NE(same.find("is the output directory"), std::string::npos) << same;
  o.out_dir = dir.path();  // the input inside the output
  EXPECT_NE(error_of([&] { prepare_dataset(o); }).find("is the output directory"),
            std::string::npos);
}

TEST(Prepare, SingleDocumentSplitsItsTokens) {
  TempDir dir;
  const std::string text = testing::generated_text(3, 1000);
  testing::write_text(dir / "only.txt", text);
  PrepareOptions o;
  o.inputs = {dir / "only.txt"};
  o.out_dir = dir / "out";
  o.val_fraction = 0.1;
  const DatasetInfo info = prepare_dataset(o);
  EXPECT_EQ(info.train_tokens + info.val_tokens, text.size());
  EXPECT_EQ(info.val_tokens, 100u);
  EXPECT_EQ(split_text(info, info.train_shards) + split_text(info, info.val_shards), text);
}

TEST(Prepare, RerunRemovesStaleShardsAndSkipsItsOwnOutput) {
  TempDir dir;
  PrepareOptions o;
  o.inputs = {make_corpus(dir, 6, 3000)};
  o.out_dir = o.inputs[0] / "tokens";  // inside the input directory
  o.shard_tokens = 2000;
  const DatasetInfo big = prepare_dataset(o);
  ASSERT_GT(big.train_shards.size(), 2u);
  o.shard_tokens = 1'000'000;
  const DatasetInfo small = prepare_dataset(o);  // would read its own shards if not skipped
  EXPECT_EQ(small.train_tokens, big.train_tokens);
  EXPECT_EQ(small.train_shards.size(), 1u);
  EXPECT_FALSE(std::filesystem::exists(o.out_dir / "train_001.bin"));
}

TEST(Prepare, SentencePieceTrainsAndReusesAModel) {
  TempDir dir;
  constexpr int kDocs = 8;
  PrepareOptions o;
  o.inputs = {make_corpus(dir, kDocs, 20'000)};
  o.out_dir = dir / "sp";
  o.tokenizer = "sentencepiece";
  o.vocab_size = 400;
  o.val_fraction = 0.25;
  const DatasetInfo info = prepare_dataset(o);
  EXPECT_EQ(info.tokenizer_kind, "sentencepiece");
  EXPECT_EQ(info.vocab_size, 400u);
  EXPECT_EQ(info.tokenizer_model, info.dir / "tokenizer.model");
  EXPECT_TRUE(std::filesystem::exists(info.dir / "tokenizer.vocab"));
  const json meta = read_meta(o.out_dir);
  EXPECT_EQ(meta["tokenizer"]["kind"], "sentencepiece");
  EXPECT_EQ(meta["tokenizer"]["model"], "tokenizer.model");

  const auto tok = load_dataset_tokenizer(info);
  const auto train = markers(split_text(info, info.train_shards), kDocs);
  const auto val = markers(split_text(info, info.val_shards), kDocs);
  EXPECT_EQ(val.size(), 2u);
  EXPECT_EQ(train.size(), 6u);
  for (const int v : val) EXPECT_EQ(train.count(v), 0u);
  // Documents are separated by the model's end-of-sequence id.
  MappedShard first(info.train_shards[0]);
  const auto eos = *tok->document_separator();
  EXPECT_EQ(std::count(first.tokens().begin(), first.tokens().end(), eos), 5);

  // Applying the trained model to the same inputs reproduces the shards exactly.
  PrepareOptions reuse = o;
  reuse.out_dir = dir / "reuse";
  reuse.sentencepiece_model = info.tokenizer_model;
  const DatasetInfo again = prepare_dataset(reuse);
  EXPECT_EQ(testing::read_bytes(again.tokenizer_model), testing::read_bytes(info.tokenizer_model));
  EXPECT_EQ(testing::read_bytes(again.train_shards[0]), testing::read_bytes(info.train_shards[0]));
  EXPECT_EQ(testing::read_bytes(again.val_shards[0]), testing::read_bytes(info.val_shards[0]));
}

// A vocabulary below what the text's characters need fails inside SentencePiece's trainer: said
// with the smallest size that works, which then trains.
TEST(Prepare, ASentencePieceVocabularyTooSmallForTheTextSaysWhatItNeeds) {
  TempDir dir;
  PrepareOptions o;
  o.inputs = {make_corpus(dir, 4, 3000)};
  o.out_dir = dir / "sp";
  o.tokenizer = "sentencepiece";
  o.vocab_size = 100;
  const std::string what = error_of([&] { prepare_dataset(o); });
  const std::string said =
      "a SentencePiece vocabulary of 100 is too small for this text: it needs "
      "at least ";
  ASSERT_NE(what.find(said), std::string::npos) << what;
  const uint32_t needed =
      static_cast<uint32_t>(std::stoul(what.substr(what.find(said) + said.size())));
  EXPECT_GT(needed, 259u) << what;
  o.vocab_size = needed;
  EXPECT_EQ(prepare_dataset(o).vocab_size, needed);
}

// An earlier run's shards or a program in an input directory were tokenized as text: skipped,
// with a note naming them; named as an input, one is an error.
TEST(Prepare, BinaryFilesAreSkippedWithANote) {
  TempDir dir;
  PrepareOptions o;
  o.inputs = {make_corpus(dir, 4, 500)};
  o.out_dir = dir / "out";
  const DatasetInfo text_only = prepare_dataset(o);
  std::string binary =
      "\x7f"
      "ELF";
  binary += std::string(3, '\0') + testing::generated_text(9, 500);
  testing::write_text(o.inputs[0] / "a" / "program", binary);
  std::vector<std::string> notes;
  o.note = [&](const std::string& line) { notes.push_back(line); };
  o.out_dir = dir / "out2";
  const DatasetInfo again = prepare_dataset(o);
  EXPECT_EQ(again.train_tokens + again.val_tokens, text_only.train_tokens + text_only.val_tokens);
  ASSERT_EQ(notes.size(), 1u);
  EXPECT_NE(notes[0].find("skipped 1 binary file(s)"), std::string::npos) << notes[0];
  EXPECT_NE(notes[0].find("program"), std::string::npos) << notes[0];
  // A dataset made into the input directory earlier: skipped whole, its meta.json too.
  o.out_dir = o.inputs[0] / "made";
  o.note = nullptr;
  prepare_dataset(o);
  notes.clear();
  o.note = [&](const std::string& line) { notes.push_back(line); };
  o.out_dir = dir / "out3";
  const DatasetInfo beside = prepare_dataset(o);
  EXPECT_EQ(beside.train_tokens + beside.val_tokens, text_only.train_tokens + text_only.val_tokens);
  ASSERT_EQ(notes.size(), 2u);
  EXPECT_NE(notes[0].find("a dataset that data prepare made"), std::string::npos) << notes[0];
  o.inputs = {o.inputs[0] / "a" / "program"};
  o.out_dir = dir / "out4";
  EXPECT_NE(error_of([&] { prepare_dataset(o); }).find("is not text"), std::string::npos);
}

TEST(Prepare, RejectsBadOptions) {
  TempDir dir;
  testing::write_text(dir / "a.txt", "hello\n");
  PrepareOptions good;
  good.inputs = {dir / "a.txt"};
  good.out_dir = dir / "out";
  auto with = [&](auto change) {
    PrepareOptions o = good;
    change(o);
    return o;
  };
  EXPECT_THROW(prepare_dataset(with([](auto& o) { o.inputs.clear(); })), ConfigError);
  EXPECT_THROW(prepare_dataset(with([](auto& o) { o.out_dir.clear(); })), ConfigError);
  EXPECT_THROW(prepare_dataset(with([](auto& o) { o.tokenizer = "gpt3"; })), ConfigError);
  EXPECT_THROW(prepare_dataset(with([](auto& o) { o.val_fraction = 0; })), ConfigError);
  EXPECT_THROW(prepare_dataset(with([](auto& o) { o.val_fraction = 1; })), ConfigError);
  EXPECT_THROW(prepare_dataset(with([](auto& o) { o.shard_tokens = 0; })), ConfigError);
  EXPECT_THROW(prepare_dataset(with([&](auto& o) { o.sentencepiece_model = dir / "m.model"; })),
               ConfigError);
  EXPECT_THROW(prepare_dataset(with([](auto& o) {
                 o.tokenizer = "sentencepiece";
                 o.vocab_size = 70000;
               })),
               ConfigError);
}

TEST(Prepare, RejectsBadInputs) {
  TempDir dir;
  PrepareOptions o;
  o.out_dir = dir / "out";
  o.inputs = {dir / "missing.txt"};
  EXPECT_NE(error_of([&] { prepare_dataset(o); }).find("missing.txt"), std::string::npos);
  testing::write_text(dir / "empty.txt", "");
  o.inputs = {dir / "empty.txt"};
  EXPECT_NE(error_of([&] { prepare_dataset(o); }).find("empty.txt"), std::string::npos);
  std::filesystem::create_directories(dir / "nothing");
  o.inputs = {dir / "nothing"};
  EXPECT_THROW(prepare_dataset(o), DataError);
  testing::write_text(dir / "x.txt", "x");  // one token cannot be split into train and val
  o.inputs = {dir / "x.txt"};
  EXPECT_THROW(prepare_dataset(o), DataError);
  o.inputs = {dir / "x.txt"};
  o.tokenizer = "sentencepiece";
  o.sentencepiece_model = dir / "no.model";
  EXPECT_NE(error_of([&] { prepare_dataset(o); }).find("no.model"), std::string::npos);
  // The output directory that failed call made is gone (it held nothing of use); one that was
  // there before stays.
  EXPECT_FALSE(std::filesystem::exists(o.out_dir));
  std::filesystem::create_directories(o.out_dir);
  EXPECT_NE(error_of([&] { prepare_dataset(o); }).find("no.model"), std::string::npos);
  EXPECT_TRUE(std::filesystem::is_directory(o.out_dir));
  // Parents it made go too; the ones that were there stay.
  o.out_dir = dir / "made" / "for" / "out";
  EXPECT_NE(error_of([&] { prepare_dataset(o); }).find("no.model"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir / "made"));
  EXPECT_TRUE(std::filesystem::is_directory(dir.path()));
}

class OpenDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    PrepareOptions o;
    o.inputs = {make_corpus(dir_, 4, 500)};
    o.out_dir = dir_ / "out";
    out_ = o.out_dir;
    prepare_dataset(o);
    meta_ = read_meta(out_);
  }
  // Writes a modified meta.json and returns open_dataset's error.
  std::string error_with(const std::function<void(json&)>& change) {
    json meta = meta_;
    change(meta);
    write_meta(out_, meta);
    return error_of([&] { open_dataset(out_); });
  }

  TempDir dir_;
  std::filesystem::path out_;
  json meta_;
};

TEST_F(OpenDatasetTest, MissingKeysAreNamed) {
  for (const char* key : {"format", "version", "tokenizer", "train", "val"}) {
    const std::string error = error_with([&](json& m) { m.erase(key); });
    EXPECT_NE(error.find(std::string("\"") + key + "\""), std::string::npos) << error;
    EXPECT_NE(error.find("meta.json"), std::string::npos) << error;
  }
  const std::string error = error_with([](json& m) { m["tokenizer"].erase("vocab_size"); });
  EXPECT_NE(error.find("\"vocab_size\""), std::string::npos) << error;
  const std::string tokens = error_with([](json& m) { m["train"][0].erase("tokens"); });
  EXPECT_NE(tokens.find("\"tokens\""), std::string::npos) << tokens;
}

TEST_F(OpenDatasetTest, WrongValuesAreNamed) {
  EXPECT_NE(error_with([](json& m) { m["version"] = "1"; }).find("\"version\""), std::string::npos);
  EXPECT_NE(error_with([](json& m) { m["version"] = 2; }).find("expected 1"), std::string::npos);
  EXPECT_NE(error_with([](json& m) { m["format"] = "other"; }).find("starling-data"),
            std::string::npos);
  EXPECT_NE(error_with([](json& m) { m["tokenizer"]["kind"] = "wordpiece"; }).find("wordpiece"),
            std::string::npos);
  EXPECT_NE(error_with([](json& m) { m["tokenizer"]["vocab_size"] = 300; }).find("256"),
            std::string::npos);
  EXPECT_NE(error_with([](json& m) { m["train"] = json::array(); }).find("train"),
            std::string::npos);
  EXPECT_NE(error_with([](json& m) { m["train"][0]["file"] = "../x.bin"; }).find("../x.bin"),
            std::string::npos);
  EXPECT_NE(error_with([](json& m) { m["train"][0]["tokens"] = -3; }).find("\"tokens\""),
            std::string::npos);
  testing::write_text(out_ / "meta.json", "{ not json");
  EXPECT_NE(error_of([&] { open_dataset(out_); }).find("not valid JSON"), std::string::npos);
}

TEST_F(OpenDatasetTest, MissingOrMismatchedShardIsNamed) {
  std::filesystem::remove(out_ / "val_000.bin");
  const std::string missing = error_of([&] { open_dataset(out_); });
  EXPECT_NE(missing.find("val_000.bin"), std::string::npos) << missing;
  EXPECT_NE(missing.find("does not exist"), std::string::npos) << missing;

  const uint64_t real = meta_["train"][0]["tokens"];
  const std::string mismatch = error_with([&](json& m) { m["train"][0]["tokens"] = real + 1; });
  EXPECT_NE(mismatch.find("train_000.bin"), std::string::npos) << mismatch;
  EXPECT_NE(mismatch.find(std::to_string(real)), std::string::npos) << mismatch;
  EXPECT_NE(mismatch.find(std::to_string(real + 1)), std::string::npos) << mismatch;
}

TEST(OpenDataset, LlmcDirectoryWithoutMeta) {
  TempDir dir;
  write_shard(dir / "tiny_train_000001.bin", std::vector<uint16_t>(100, 50256));
  write_shard(dir / "tiny_train_000000.bin", std::vector<uint16_t>(50, 1));
  write_shard(dir / "tiny_val_000000.bin", std::vector<uint16_t>(30, 2));
  testing::write_text(dir / "notes.txt", "ignored");
  const DatasetInfo info = open_dataset(dir.path());
  EXPECT_EQ(info.tokenizer_kind, "gpt2");
  EXPECT_EQ(info.vocab_size, 50257u);
  ASSERT_EQ(info.train_shards.size(), 2u);
  EXPECT_EQ(info.train_shards[0].filename(), "tiny_train_000000.bin");
  EXPECT_TRUE(info.train_shards[0].is_absolute());
  EXPECT_EQ(info.train_tokens, 150u);
  EXPECT_EQ(info.val_tokens, 30u);
  EXPECT_THROW(load_dataset_tokenizer(info), DataError);
}

TEST(OpenDataset, NotADataset) {
  TempDir dir;
  EXPECT_NE(error_of([&] { open_dataset(dir / "missing"); }).find("missing"), std::string::npos);
  testing::write_text(dir / "readme.txt", "hi");
  EXPECT_NE(error_of([&] { open_dataset(dir.path()); }).find("train"), std::string::npos);
  testing::write_text(dir / "bad_train.bin", "not a shard");
  EXPECT_NE(error_of([&] { open_dataset(dir.path()); }).find("bad_train.bin"), std::string::npos);
}

}  // namespace
}  // namespace starling::data
