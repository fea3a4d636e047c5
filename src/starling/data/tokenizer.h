// Tokenizers: byte-level (vocab 256, the default) and SentencePiece (a BPE model trained on the
// corpus, or a given .model file).
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace starling::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<uint32_t> encode(std::string_view text) const = 0;
  // Ids outside the vocabulary throw DataError.
  virtual std::string decode(std::span<const uint32_t> ids) const = 0;
  virtual uint32_t vocab_size() const = 0;
  // "byte" or "sentencepiece".
  virtual std::string kind() const = 0;
  // Token placed between documents, if the tokenizer has one (none for "byte": documents are
  // separated by a blank line instead).
  virtual std::optional<uint32_t> document_separator() const = 0;
};

std::unique_ptr<Tokenizer> make_byte_tokenizer();

// Loads a SentencePiece .model file; DataError if it is missing or not a valid model.
std::unique_ptr<Tokenizer> load_sentencepiece(const std::filesystem::path& model_file);

// Trains a BPE SentencePiece model on text files; writes `<prefix>.model` and `<prefix>.vocab`.
// vocab_size must be in [64, 65536] (shards store uint16 tokens). split_digits makes every digit
// a piece of its own (LLaMA's choice: numbers are spelled out digit by digit); without it numbers
// merge like words, so a common year or "000" is one piece.
void train_sentencepiece(const std::vector<std::filesystem::path>& text_files,
                         const std::filesystem::path& model_prefix, uint32_t vocab_size,
                         bool split_digits = true);

}  // namespace starling::data
