#include "starling/data/tokenizer.h"

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "starling/common/error.h"
#include "test_util.h"

namespace starling::data {
namespace {

using testing::TempDir;

TEST(ByteTokenizer, RoundTripIncludingNonAscii) {
  const auto tok = make_byte_tokenizer();
  EXPECT_EQ(tok->kind(), "byte");
  EXPECT_EQ(tok->vocab_size(), 256u);
  EXPECT_FALSE(tok->document_separator().has_value());

  const std::string text =
      "Hello, w\xC3\xB6rld! \xE4\xB8\x96\xE7\x95\x8C \xF0\x9F\x99\x82\n\t\x01\xFF";
  const auto ids = tok->encode(text);
  ASSERT_EQ(ids.size(), text.size());  // one id per byte
  EXPECT_EQ(ids[0], static_cast<uint32_t>('H'));
  EXPECT_EQ(ids.back(), 255u);
  EXPECT_EQ(tok->decode(ids), text);
  EXPECT_TRUE(tok->encode("").empty());
}

TEST(ByteTokenizer, DecodeRejectsIdsOutsideTheVocabulary) {
  const auto tok = make_byte_tokenizer();
  const std::vector<uint32_t> ids = {65, 256};
  try {
    tok->decode(ids);
    FAIL() << "no error";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("256"), std::string::npos) << e.what();
  }
}

// Trains one small model for the whole suite: training is the slow part.
class SentencePieceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TempDir();
    for (int i = 0; i < 3; ++i) {
      const auto file = *dir_ / ("doc" + std::to_string(i) + ".txt");
      testing::write_text(file, testing::generated_text(100 + i, 60'000));
      files_.push_back(file);
    }
    train_sentencepiece(files_, *dir_ / "sp", kVocab);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
    files_.clear();
  }

  static constexpr uint32_t kVocab = 400;
  static TempDir* dir_;
  static std::vector<std::filesystem::path> files_;
};

TempDir* SentencePieceTest::dir_ = nullptr;
std::vector<std::filesystem::path> SentencePieceTest::files_;

TEST_F(SentencePieceTest, TrainWritesModelAndVocab) {
  EXPECT_TRUE(std::filesystem::is_regular_file(*dir_ / "sp.model"));
  EXPECT_TRUE(std::filesystem::is_regular_file(*dir_ / "sp.vocab"));
  const auto tok = load_sentencepiece(*dir_ / "sp.model");
  EXPECT_EQ(tok->kind(), "sentencepiece");
  EXPECT_EQ(tok->vocab_size(), kVocab);
  ASSERT_TRUE(tok->document_separator().has_value());
  EXPECT_LT(*tok->document_separator(), kVocab);
}

TEST_F(SentencePieceTest, RoundTripOnTrainingStyleText) {
  const auto tok = load_sentencepiece(*dir_ / "sp.model");
  const std::string text = testing::generated_text(7, 5000);
  const auto ids = tok->encode(text);
  // Learned merges make it far shorter than one id per byte.
  EXPECT_LT(ids.size(), text.size() / 2);
  for (const uint32_t id : ids) ASSERT_LT(id, kVocab);
  EXPECT_EQ(tok->decode(ids), text);
}

TEST_F(SentencePieceTest, RoundTripOnUnseenCharactersAndSpacing) {
  const auto tok = load_sentencepiece(*dir_ / "sp.model");
  // Characters never seen in training go through byte fallback; spacing is kept exactly.
  const std::string text =
      "  Z\xC3\xBCrich  \xE2\x98\x83 and \xF0\x9F\x99\x82!\n\nTabs\there, trailing space ";
  EXPECT_EQ(tok->decode(tok->encode(text)), text);
}

TEST_F(SentencePieceTest, TrainingIsDeterministic) {
  TempDir other;
  train_sentencepiece(files_, other / "sp", kVocab);
  // The .model embeds its own path, so compare the learned pieces and what they produce.
  EXPECT_TRUE(testing::read_bytes(other / "sp.vocab") == testing::read_bytes(*dir_ / "sp.vocab"));
  const std::string text = testing::generated_text(11, 3000);
  EXPECT_EQ(load_sentencepiece(other / "sp.model")->encode(text),
            load_sentencepiece(*dir_ / "sp.model")->encode(text));
}

TEST_F(SentencePieceTest, DigitsSplitByDefaultAndMergeWithoutIt) {
  // The corpus repeats "1961", so a model free to merge digits learns it as one piece or two; the
  // default model spells it digit by digit.
  const std::string year = " 1961 ";
  const auto split = load_sentencepiece(*dir_ / "sp.model");
  TempDir other;
  train_sentencepiece(files_, other / "sp", kVocab, /*split_digits=*/false);
  const auto merged = load_sentencepiece(other / "sp.model");
  EXPECT_GE(split->encode(year).size(), 4u);
  EXPECT_LE(merged->encode(year).size(), 3u);
  EXPECT_EQ(merged->decode(merged->encode(year)), year);
}

TEST_F(SentencePieceTest, DecodeRejectsIdsOutsideTheVocabulary) {
  const auto tok = load_sentencepiece(*dir_ / "sp.model");
  const std::vector<uint32_t> ids = {kVocab};
  EXPECT_THROW(tok->decode(ids), DataError);
}

TEST(SentencePiece, LoadMissingModel) {
  TempDir dir;
  try {
    load_sentencepiece(dir / "missing.model");
    FAIL() << "no error";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("missing.model"), std::string::npos) << e.what();
  }
}

TEST(SentencePiece, LoadInvalidModel) {
  TempDir dir;
  testing::write_text(dir / "junk.model", "this is not a protobuf");
  try {
    load_sentencepiece(dir / "junk.model");
    FAIL() << "no error";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("junk.model"), std::string::npos) << e.what();
  }
}

TEST(SentencePiece, TrainRejectsBadArguments) {
  TempDir dir;
  testing::write_text(dir / "a.txt", "some text\n");
  EXPECT_THROW(train_sentencepiece({dir / "a.txt"}, dir / "m", 10), ConfigError);
  EXPECT_THROW(train_sentencepiece({dir / "a.txt"}, dir / "m", 70000), ConfigError);
  EXPECT_THROW(train_sentencepiece({dir / "missing.txt"}, dir / "m", 300), DataError);
  EXPECT_THROW(train_sentencepiece({}, dir / "m", 300), DataError);
}

TEST(SentencePiece, TooSmallVocabularyIsAClearError) {
  TempDir dir;
  testing::write_text(dir / "a.txt", testing::generated_text(1, 5000));
  // Byte fallback alone takes 256 ids, so 100 cannot hold the required pieces.
  try {
    train_sentencepiece({dir / "a.txt"}, dir / "m", 100);
    FAIL() << "no error";
  } catch (const DataError& e) {
    EXPECT_NE(std::string(e.what()).find("vocab_size"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("is too small for this text: it needs at least "),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace starling::data
