// A prepared dataset directory: token shards plus meta.json describing the tokenizer. A directory
// of llm.c shards without meta.json is accepted too (GPT-2 tokenizer, vocab 50257).
//
// meta.json: {"format": "starling-data", "version": 1,
//             "tokenizer": {"kind": "byte"|"sentencepiece"|"gpt2", "vocab_size": N,
//                           "model": "tokenizer.model" (sentencepiece only, relative to the dir)},
//             "train": [{"file": "train_000.bin", "tokens": N}, ...],
//             "val":   [{"file": "val_000.bin",   "tokens": N}, ...]}
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "starling/data/tokenizer.h"

namespace starling::data {

struct DatasetInfo {
  std::filesystem::path dir;
  std::string tokenizer_kind;  // "byte", "sentencepiece" or "gpt2"
  uint32_t vocab_size = 0;
  // Absolute: the SentencePiece model, or the directory of GPT-2's BPE files (empty when an llm.c
  // dataset has none beside its shards).
  std::filesystem::path tokenizer_model;
  std::vector<std::filesystem::path> train_shards;  // absolute, in order
  std::vector<std::filesystem::path> val_shards;
  uint64_t train_tokens = 0;
  uint64_t val_tokens = 0;
};

// Reads meta.json (or, without one, finds llm.c shards named *train*.bin / *val*.bin) and checks
// every listed shard's header. DataError names the directory/file and what is wrong.
DatasetInfo open_dataset(const std::filesystem::path& dir);

// The tokenizer the dataset was made with. DataError for "gpt2" (decoding GPT-2 BPE is not
// built in; such data trains fine, only text sampling needs a tokenizer).
std::unique_ptr<Tokenizer> load_dataset_tokenizer(const DatasetInfo& info);

}  // namespace starling::data
