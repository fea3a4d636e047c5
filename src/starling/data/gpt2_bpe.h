// GPT-2's tokenizer: byte-level BPE with GPT-2's vocabulary (encoder.json, 50257 tokens) and
// merges (vocab.bpe, 50000 ranked pairs), as OpenAI's encoder.py defines it:
// 1. the text is split into pieces by GPT-2's pattern (contractions, letters, numbers, other
//    symbols, each with one leading space; runs of whitespace), matched with PCRE2 in Unicode mode;
// 2. each piece's UTF-8 bytes become printable characters through GPT-2's byte-to-unicode table;
// 3. the piece's characters are merged pairwise, lowest rank first, until no ranked pair is left;
// 4. each resulting symbol is looked up in the vocabulary.
// Decoding reverses 4 and 2. Documents are separated by <|endoftext|> (50256), which llm.c's
// shards also put before every document. The files come as data (scripts/fetch-gpt2-bpe.sh).
// Torch-free.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>

#include "starling/data/tokenizer.h"

namespace starling::data {

inline constexpr uint32_t kGpt2EndOfText = 50256;
inline constexpr const char* kGpt2EncoderFile = "encoder.json";
inline constexpr const char* kGpt2MergesFile = "vocab.bpe";

// Loads `dir`/encoder.json and `dir`/vocab.bpe. DataError naming the file when one is missing,
// malformed (not a JSON object of token -> id, ids not 0..n-1, a merge line that is not two
// symbols) or not GPT-2's (no <|endoftext|> at 50256).
//
// encode() takes text as UTF-8; bytes that are not valid UTF-8 are read as U+FFFD, as Python's
// decode(errors="replace") would. Text equal to "<|endoftext|>" is encoded as text, not as the
// special token (as encoder.py does).
std::unique_ptr<Tokenizer> load_gpt2_bpe(const std::filesystem::path& dir);

}  // namespace starling::data
