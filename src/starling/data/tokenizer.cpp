#include "starling/data/tokenizer.h"

#include <fstream>
#include <regex>
#include <string>
#include <unordered_map>

#include "starling/common/error.h"
#include "starling/data/sentencepiece_backend.h"

namespace starling::data {

namespace fs = std::filesystem;

namespace {

class ByteTokenizer final : public Tokenizer {
 public:
  std::vector<uint32_t> encode(std::string_view text) const override {
    std::vector<uint32_t> ids;
    ids.reserve(text.size());
    for (const char c : text) ids.push_back(static_cast<unsigned char>(c));
    return ids;
  }

  std::string decode(std::span<const uint32_t> ids) const override {
    std::string text;
    text.reserve(ids.size());
    for (const uint32_t id : ids) {
      if (id >= 256) {
        throw DataError("token id " + std::to_string(id) +
                        " is outside the byte tokenizer's vocabulary of 256");
      }
      text.push_back(static_cast<char>(id));
    }
    return text;
  }

  uint32_t vocab_size() const override { return 256; }
  std::string kind() const override { return "byte"; }
  std::optional<uint32_t> document_separator() const override { return std::nullopt; }
};

// SentencePiece drops sentences longer than max_sentence_length, so the trainer's line reader
// cuts lines (whole paragraphs) longer than this at spaces instead of losing them.
constexpr std::size_t kMaxLine = 4000;

class SentencePieceTokenizer final : public Tokenizer {
 public:
  explicit SentencePieceTokenizer(const fs::path& model_file) : path_(model_file) {
    if (!fs::is_regular_file(model_file)) {
      throw DataError("SentencePiece model '" + model_file.string() + "' does not exist");
    }
    std::string error;
    processor_ = spm::backend().load(model_file.string(), &error);
    if (!processor_) {
      throw DataError("'" + model_file.string() + "' is not a valid SentencePiece model: " + error);
    }
    vocab_size_ = static_cast<uint32_t>(processor_->piece_size());
  }

  std::vector<uint32_t> encode(std::string_view text) const override {
    std::vector<int> pieces;
    std::string error;
    if (!processor_->encode(text, &pieces, &error)) {
      throw DataError("SentencePiece model '" + path_.string() +
                      "' failed to encode text: " + error);
    }
    return {pieces.begin(), pieces.end()};
  }

  std::string decode(std::span<const uint32_t> ids) const override {
    std::vector<int> pieces;
    pieces.reserve(ids.size());
    for (const uint32_t id : ids) {
      if (id >= vocab_size_) {
        throw DataError("token id " + std::to_string(id) + " is outside the vocabulary of " +
                        std::to_string(vocab_size_) + " of SentencePiece model '" + path_.string() +
                        "'");
      }
      pieces.push_back(static_cast<int>(id));
    }
    std::string text, error;
    if (!processor_->decode(pieces, &text, &error)) {
      throw DataError("SentencePiece model '" + path_.string() + "' failed to decode: " + error);
    }
    return text;
  }

  uint32_t vocab_size() const override { return vocab_size_; }
  std::string kind() const override { return "sentencepiece"; }

  std::optional<uint32_t> document_separator() const override {
    const int eos = processor_->eos_id();
    if (eos < 0) return std::nullopt;
    return static_cast<uint32_t>(eos);
  }

 private:
  fs::path path_;
  std::unique_ptr<spm::Processor> processor_;
  uint32_t vocab_size_ = 0;
};

}  // namespace

std::unique_ptr<Tokenizer> make_byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

std::unique_ptr<Tokenizer> load_sentencepiece(const fs::path& model_file) {
  return std::make_unique<SentencePieceTokenizer>(model_file);
}

void train_sentencepiece(const std::vector<fs::path>& text_files, const fs::path& model_prefix,
                         uint32_t vocab_size, bool split_digits) {
  if (vocab_size < 64 || vocab_size > 65536) {
    throw ConfigError(
        "SentencePiece vocab_size must be in [64, 65536] (shards store uint16 "
        "tokens), got " +
        std::to_string(vocab_size));
  }
  if (text_files.empty()) throw DataError("no text files to train the SentencePiece model on");
  for (const auto& file : text_files) {
    if (!fs::is_regular_file(file)) {
      throw DataError("tokenizer training file '" + file.string() + "' does not exist");
    }
  }
  // Identity normalization and kept whitespace make decode(encode(text)) == text for any valid
  // UTF-8; byte fallback makes every byte encodable, even characters never seen in training.
  const std::unordered_map<std::string, std::string> args = {
      {"model_prefix", model_prefix.string()},
      {"model_type", "bpe"},
      {"vocab_size", std::to_string(vocab_size)},
      {"character_coverage", "1.0"},
      {"byte_fallback", "true"},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"split_digits", split_digits ? "true" : "false"},
      {"input_sentence_size", "2000000"},
      {"shuffle_input_sentence", "true"},
      {"max_sentence_length", std::to_string(kMaxLine * 2)},
      {"num_threads", "2"},
      {"minloglevel", "2"},
  };
  std::vector<std::string> files;
  for (const auto& f : text_files) files.push_back(f.string());
  std::string error;
  if (!spm::backend().train(args, files, kMaxLine, &error)) {
    // SentencePiece's own words for a vocabulary too small for the text's characters end in
    // "<asked> vs <needed>.": said in the user's terms, with the smallest size that works.
    static const std::regex kTooSmall(
        "Vocabulary size is smaller than required_chars\\. "
        "([0-9]+) vs ([0-9]+)");
    std::smatch m;
    if (std::regex_search(error, m, kTooSmall))
      throw DataError("a SentencePiece vocabulary of " + m[1].str() +
                      " is too small for this text: it needs at least " + m[2].str() +
                      " (259 ids for the byte fallback and control pieces, plus one per distinct "
                      "character); raise vocab_size (data prepare --vocab-size) to " +
                      m[2].str() + " or more");
    std::string hint;
    if (error.find("Vocabulary size") != std::string::npos) {
      hint = " (byte fallback needs 259 ids plus one per distinct character; raise vocab_size)";
    }
    throw DataError("training SentencePiece model '" + model_prefix.string() +
                    ".model' failed: " + error + hint);
  }
}

}  // namespace starling::data
