// `starling data prepare`: text files or directories -> tokenized train/val shards + meta.json.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "starling/data/dataset.h"

namespace starling::data {

struct PrepareOptions {
  // Files, or directories searched recursively for regular files (sorted by path for determinism).
  // Each file is one document.
  std::vector<std::filesystem::path> inputs;
  std::filesystem::path out_dir;
  std::string tokenizer = "byte";  // "byte", "sentencepiece" or "gpt2"
  // gpt2: the directory holding GPT-2's encoder.json and vocab.bpe (scripts/fetch-gpt2-bpe.sh);
  // they are copied into out_dir/gpt2, so the dataset carries its tokenizer. Every document then
  // starts with <|endoftext|>, as in llm.c's GPT-2 shards.
  std::filesystem::path gpt2_bpe_dir = "data/gpt2";
  // sentencepiece: apply this .model if given (it is copied into out_dir as tokenizer.model),
  // otherwise train a BPE model of `vocab_size` on the inputs.
  std::filesystem::path sentencepiece_model;
  uint32_t vocab_size = 4096;
  // sentencepiece, trained: every digit its own piece (true), or numbers merged like words.
  bool split_digits = true;
  // Fraction of documents (chosen deterministically by seed) that go to the validation split; at
  // least one document goes to each split when there are two or more.
  double val_fraction = 0.05;
  uint64_t seed = 1337;
  // Shards are cut at this many tokens.
  uint64_t shard_tokens = 100'000'000;
  // Told what a user should know that is not an error: the binary files (a NUL byte in their
  // first 8 KiB: an earlier run's shards, a program) skipped in input directories.
  std::function<void(const std::string&)> note;
};

// Progress callback: (what, done, total), e.g. ("tokenize", 120, 500) documents.
using PrepareProgress = std::function<void(const std::string&, uint64_t, uint64_t)>;

// Validates options (ConfigError), reads inputs (DataError for missing/unreadable/empty input, or
// a binary file named as an input), writes shards atomically and meta.json last, and returns the
// dataset as open_dataset would.
DatasetInfo prepare_dataset(const PrepareOptions& options, const PrepareProgress& progress = {});

}  // namespace starling::data
