#include "starling/data/dataset.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "starling/common/error.h"
#include "starling/data/gpt2_bpe.h"
#include "starling/data/shard.h"

namespace starling::data {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The vocabulary GPT-2-tokenized llm.c shards are made with.
constexpr uint32_t kGpt2VocabSize = 50257;

// Reads meta.json fields with errors that name the file and the key.
class MetaReader {
 public:
  explicit MetaReader(fs::path file) : file_(std::move(file)) {}

  [[noreturn]] void fail(const std::string& what) const {
    throw DataError("'" + file_.string() + "': " + what);
  }

  const json& field(const json& object, const std::string& key, const std::string& where) const {
    const auto it = object.find(key);
    if (it == object.end()) fail("missing key \"" + key + "\"" + where);
    return *it;
  }

  std::string string(const json& object, const std::string& key,
                     const std::string& where = "") const {
    const json& value = field(object, key, where);
    if (!value.is_string()) fail("\"" + key + "\"" + where + " must be a string");
    return value.get<std::string>();
  }

  uint64_t unsigned_int(const json& object, const std::string& key,
                        const std::string& where = "") const {
    const json& value = field(object, key, where);
    if (!value.is_number_unsigned()) {
      fail("\"" + key + "\"" + where + " must be a non-negative integer");
    }
    return value.get<uint64_t>();
  }

  // A path inside the dataset directory; absolute paths and ".." would let a meta.json point
  // anywhere on disk, which a copied or downloaded dataset should never do.
  fs::path relative_file(const json& object, const std::string& key,
                         const std::string& where) const {
    const fs::path rel = string(object, key, where);
    if (rel.empty() || rel.is_absolute() ||
        std::any_of(rel.begin(), rel.end(), [](const fs::path& part) { return part == ".."; })) {
      fail("\"" + key + "\"" + where + " must be a file name inside the dataset directory, got \"" +
           rel.string() + "\"");
    }
    return file_.parent_path() / rel;
  }

 private:
  fs::path file_;
};

json read_json(const fs::path& file) {
  if (fs::is_directory(file)) throw DataError("'" + file.string() + "' is a directory, not a file");
  std::ifstream in(file, std::ios::binary);
  if (!in) throw DataError("cannot read '" + file.string() + "'");
  try {
    return json::parse(in);
  } catch (const json::parse_error& e) {
    throw DataError("'" + file.string() + "' is not valid JSON: " + e.what());
  }
}

void read_split(const MetaReader& meta, const json& root, const std::string& split,
                std::vector<fs::path>* shards, uint64_t* total) {
  const json& list = meta.field(root, split, "");
  if (!list.is_array()) meta.fail("\"" + split + "\" must be a list of shards");
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string where = " in \"" + split + "\"[" + std::to_string(i) + "]";
    if (!list[i].is_object()) meta.fail("entry" + where + " must be an object");
    const fs::path shard = meta.relative_file(list[i], "file", where);
    const uint64_t listed = meta.unsigned_int(list[i], "tokens", where);
    if (!fs::exists(shard)) {
      meta.fail("lists shard '" + shard.string() + "'" + where + ", which does not exist");
    }
    const uint64_t actual = read_shard_token_count(shard);
    if (actual != listed) {
      meta.fail("lists " + std::to_string(listed) + " tokens for shard '" + shard.string() +
                "' but its header says " + std::to_string(actual));
    }
    shards->push_back(shard);
    *total += actual;
  }
}

DatasetInfo open_with_meta(const fs::path& dir, const fs::path& meta_file) {
  const MetaReader meta(meta_file);
  const json root = read_json(meta_file);
  if (!root.is_object()) meta.fail("must hold a JSON object");
  const std::string format = meta.string(root, "format");
  if (format != "starling-data")
    meta.fail("\"format\" is \"" + format + "\", expected \"starling-data\"");
  const uint64_t version = meta.unsigned_int(root, "version");
  if (version != 1) meta.fail("\"version\" is " + std::to_string(version) + ", expected 1");

  DatasetInfo info;
  info.dir = dir;
  const json& tok = meta.field(root, "tokenizer", "");
  if (!tok.is_object()) meta.fail("\"tokenizer\" must be an object");
  const std::string where = " in \"tokenizer\"";
  info.tokenizer_kind = meta.string(tok, "kind", where);
  const uint64_t vocab = meta.unsigned_int(tok, "vocab_size", where);
  if (vocab < 1 || vocab > 65536) {
    meta.fail("\"vocab_size\" is " + std::to_string(vocab) +
              ", expected 1..65536 (shards store uint16 tokens)");
  }
  info.vocab_size = static_cast<uint32_t>(vocab);
  if (info.tokenizer_kind == "byte") {
    if (vocab != 256)
      meta.fail("byte tokenizer with \"vocab_size\" " + std::to_string(vocab) + ", expected 256");
  } else if (info.tokenizer_kind == "sentencepiece") {
    info.tokenizer_model = meta.relative_file(tok, "model", where);
    if (!fs::is_regular_file(info.tokenizer_model)) {
      meta.fail("tokenizer model '" + info.tokenizer_model.string() + "' does not exist");
    }
  } else if (info.tokenizer_kind == "gpt2") {
    if (vocab != kGpt2VocabSize)
      meta.fail("gpt2 tokenizer with \"vocab_size\" " + std::to_string(vocab) + ", expected " +
                std::to_string(kGpt2VocabSize));
    if (tok.contains("bpe")) info.tokenizer_model = meta.relative_file(tok, "bpe", where);
  } else {
    meta.fail("tokenizer \"kind\" is \"" + info.tokenizer_kind +
              "\", expected \"byte\", \"sentencepiece\" or \"gpt2\"");
  }

  read_split(meta, root, "train", &info.train_shards, &info.train_tokens);
  read_split(meta, root, "val", &info.val_shards, &info.val_tokens);
  if (info.train_shards.empty()) meta.fail("lists no \"train\" shards");
  return info;
}

// A directory of llm.c shards (e.g. fineweb_train_000001.bin, fineweb_val_000000.bin).
DatasetInfo open_llmc(const fs::path& dir) {
  DatasetInfo info;
  info.dir = dir;
  info.tokenizer_kind = "gpt2";
  info.vocab_size = kGpt2VocabSize;
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (entry.is_regular_file() && entry.path().extension() == ".bin")
      files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  for (const auto& file : files) {
    const std::string name = file.filename().string();
    if (name.find("val") != std::string::npos) {
      info.val_shards.push_back(file);
      info.val_tokens += read_shard_token_count(file);
    } else if (name.find("train") != std::string::npos) {
      info.train_shards.push_back(file);
      info.train_tokens += read_shard_token_count(file);
    }
  }
  if (info.train_shards.empty()) {
    throw DataError("'" + dir.string() +
                    "' is not a dataset: it has no meta.json and no llm.c shards named *train*.bin "
                    "(run `starling data prepare` to make one)");
  }
  // GPT-2's BPE files beside the shards, if someone put them there, decode samples.
  for (const fs::path& bpe : {dir / "gpt2", dir})
    if (fs::is_regular_file(bpe / kGpt2EncoderFile) && fs::is_regular_file(bpe / kGpt2MergesFile)) {
      info.tokenizer_model = bpe;
      break;
    }
  return info;
}

}  // namespace

DatasetInfo open_dataset(const fs::path& dir) {
  if (!fs::exists(dir)) throw DataError("dataset directory '" + dir.string() + "' does not exist");
  if (!fs::is_directory(dir)) {
    throw DataError("dataset path '" + dir.string() + "' is not a directory");
  }
  const fs::path abs = fs::absolute(dir).lexically_normal();
  const fs::path meta = abs / "meta.json";
  if (fs::exists(meta)) return open_with_meta(abs, meta);
  return open_llmc(abs);
}

std::unique_ptr<Tokenizer> load_dataset_tokenizer(const DatasetInfo& info) {
  if (info.tokenizer_kind == "byte") return make_byte_tokenizer();
  if (info.tokenizer_kind == "sentencepiece") {
    auto tokenizer = load_sentencepiece(info.tokenizer_model);
    if (tokenizer->vocab_size() != info.vocab_size) {
      throw DataError("tokenizer model '" + info.tokenizer_model.string() + "' has " +
                      std::to_string(tokenizer->vocab_size()) + " pieces but dataset '" +
                      info.dir.string() + "' says vocab_size " + std::to_string(info.vocab_size));
    }
    return tokenizer;
  }
  if (info.tokenizer_kind == "gpt2") {
    if (info.tokenizer_model.empty())
      throw DataError("dataset '" + info.dir.string() +
                      "' holds GPT-2 tokens but not GPT-2's BPE files to encode or decode text: "
                      "put encoder.json and vocab.bpe in '" +
                      (info.dir / "gpt2").string() + "' (scripts/fetch-gpt2-bpe.sh " +
                      (info.dir / "gpt2").string() + ")");
    return load_gpt2_bpe(info.tokenizer_model);
  }
  throw DataError("dataset '" + info.dir.string() + "' has unknown tokenizer kind '" +
                  info.tokenizer_kind + "'");
}

}  // namespace starling::data
