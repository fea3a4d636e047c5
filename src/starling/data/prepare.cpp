#include "starling/data/prepare.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <string>

#include "starling/common/error.h"
#include "starling/common/made_dirs.h"
#include "starling/data/atomic_file.h"
#include "starling/data/gpt2_bpe.h"
#include "starling/data/shard.h"

namespace starling::data {

namespace fs = std::filesystem;

namespace {

constexpr const char* kMetaFile = "meta.json";
constexpr const char* kModelFile = "tokenizer.model";
constexpr const char* kGpt2Dir = "gpt2";  // the GPT-2 BPE files, inside the dataset

void validate(const PrepareOptions& o) {
  if (o.inputs.empty()) throw ConfigError("data prepare: no inputs given (files or directories)");
  if (o.out_dir.empty()) throw ConfigError("data prepare: no output directory given");
  if (o.tokenizer != "byte" && o.tokenizer != "sentencepiece" && o.tokenizer != "gpt2") {
    throw ConfigError(
        "data prepare: tokenizer must be \"byte\", \"sentencepiece\" or \"gpt2\", got \"" +
        o.tokenizer + "\"");
  }
  if (o.tokenizer != "sentencepiece" && !o.sentencepiece_model.empty()) {
    throw ConfigError("data prepare: a SentencePiece model was given but the tokenizer is \"" +
                      o.tokenizer + "\"");
  }
  if (o.tokenizer == "sentencepiece" && o.sentencepiece_model.empty() &&
      (o.vocab_size < 64 || o.vocab_size > 65536)) {
    throw ConfigError(
        "data prepare: vocab_size must be in [64, 65536] (shards store uint16 "
        "tokens), got " +
        std::to_string(o.vocab_size));
  }
  if (!(o.val_fraction > 0.0 && o.val_fraction < 1.0)) {
    throw ConfigError("data prepare: val_fraction must be in (0, 1), got " +
                      std::to_string(o.val_fraction));
  }
  if (o.shard_tokens < 1 || o.shard_tokens > static_cast<uint64_t>(INT32_MAX)) {
    throw ConfigError("data prepare: shard_tokens must be in [1, " + std::to_string(INT32_MAX) +
                      "] (the shard header stores an int32 count), got " +
                      std::to_string(o.shard_tokens));
  }
}

bool is_within(const fs::path& path, const fs::path& dir) {
  auto [d, p] = std::mismatch(dir.begin(), dir.end(), path.begin(), path.end());
  return d == dir.end();
}

bool is_hidden(const fs::path& path) {
  const std::string name = path.filename().string();
  return !name.empty() && name[0] == '.';
}

// Whether the file looks binary: a NUL byte in its first 8 KiB, which no text in UTF-8 holds.
// (Text in UTF-16 does, and would be tokenized as bytes of little use.)
bool looks_binary(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  char head[8192];
  in.read(head, sizeof head);
  return std::find(head, head + in.gcount(), '\0') != head + in.gcount();
}

// Every input file, in the order given; each directory's files sorted by path. Hidden files and
// the output directory (which may sit inside an input directory) are skipped, and so are empty
// and binary files found in directories (binary ones with a note); an empty or binary file named
// directly is an error.
std::vector<fs::path> collect_documents(const PrepareOptions& o) {
  const fs::path out = fs::weakly_canonical(fs::absolute(o.out_dir));
  std::vector<fs::path> docs;
  for (const auto& input : o.inputs) {
    if (!fs::exists(input)) throw DataError("input '" + input.string() + "' does not exist");
    if (fs::is_regular_file(input)) {
      if (fs::file_size(input) == 0)
        throw DataError("input file '" + input.string() + "' is empty");
      if (looks_binary(input))
        throw DataError("input file '" + input.string() +
                        "' is not text (it holds a NUL byte): data prepare reads UTF-8 text");
      docs.push_back(input);
      continue;
    }
    if (!fs::is_directory(input)) {
      throw DataError("input '" + input.string() + "' is neither a file nor a directory");
    }
    // Its files would all be skipped as the output's: "no input files" would hide why.
    if (is_within(fs::weakly_canonical(fs::absolute(input)), out))
      throw DataError("input '" + input.string() + "' is the output directory --out '" +
                      o.out_dir.string() +
                      "' or inside it: give the dataset a directory of its own");
    std::vector<fs::path> found, binary;
    try {
      for (auto it = fs::recursive_directory_iterator(input);
           it != fs::recursive_directory_iterator(); ++it) {
        const bool inside_out = is_within(fs::weakly_canonical(it->path()), out);
        if (is_hidden(it->path()) || inside_out) {
          if (it->is_directory()) it.disable_recursion_pending();
          continue;
        }
        // An earlier dataset (this command's output: meta.json beside its shards) is tokens, not
        // text: skipped whole, its meta.json with its shards.
        if (it->is_directory() && fs::exists(it->path() / kMetaFile) &&
            fs::exists(it->path() / "train_000.bin")) {
          it.disable_recursion_pending();
          if (o.note)
            o.note("skipped '" + it->path().string() +
                   "': a dataset that data prepare made (meta.json and its shards)");
          continue;
        }
        if (it->is_regular_file() && it->file_size() > 0)
          (looks_binary(it->path()) ? binary : found).push_back(it->path());
      }
    } catch (const fs::filesystem_error& e) {
      throw DataError("cannot read input directory '" + input.string() + "': " + e.what());
    }
    if (!binary.empty() && o.note) {
      std::sort(binary.begin(), binary.end());
      std::string names;
      for (size_t i = 0; i < binary.size() && i < 3; ++i)
        names += (i ? ", " : "") + binary[i].string();
      if (binary.size() > 3) names += ", ...";
      o.note("skipped " + std::to_string(binary.size()) + " binary file(s) in '" + input.string() +
             "' (a NUL byte in the first 8 KiB): " + names);
    }
    std::sort(found.begin(), found.end());
    docs.insert(docs.end(), found.begin(), found.end());
  }
  if (docs.empty()) throw DataError("no non-empty input files found in the given inputs");
  return docs;
}

std::string read_document(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  if (in) text << in.rdbuf();
  if (!in || in.bad()) throw DataError("cannot read input file '" + path.string() + "'");
  return text.str();
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

uint64_t fraction_of(uint64_t n, double fraction) {
  const auto k = static_cast<uint64_t>(std::llround(static_cast<double>(n) * fraction));
  return std::clamp<uint64_t>(k, 1, n - 1);
}

// Marks round(n * fraction) documents (at least one, at most n - 1) for validation: those whose
// seeded hash of their index is smallest. Depends only on (n, fraction, seed).
std::vector<bool> choose_validation(std::size_t n, double fraction, uint64_t seed) {
  std::vector<bool> is_val(n, false);
  if (n < 2) return is_val;
  std::vector<std::pair<uint64_t, std::size_t>> keys(n);
  const uint64_t base = splitmix64(seed);
  for (std::size_t i = 0; i < n; ++i) keys[i] = {splitmix64(base + i), i};
  std::sort(keys.begin(), keys.end());
  const uint64_t count = fraction_of(n, fraction);
  for (uint64_t k = 0; k < count; ++k) is_val[keys[k].second] = true;
  return is_val;
}

// Buffers one split's tokens and writes a shard every `shard_tokens` tokens.
class ShardSink {
 public:
  ShardSink(fs::path dir, std::string split, uint64_t shard_tokens)
      : dir_(std::move(dir)), split_(std::move(split)), shard_tokens_(shard_tokens) {}

  void append(std::span<const uint16_t> tokens) {
    while (!tokens.empty()) {
      const std::size_t take = std::min<std::size_t>(tokens.size(), shard_tokens_ - buffer_.size());
      buffer_.insert(buffer_.end(), tokens.begin(), tokens.begin() + take);
      tokens = tokens.subspan(take);
      if (buffer_.size() == shard_tokens_) flush();
    }
  }

  void finish() {
    if (!buffer_.empty() || written_.empty()) flush();
  }

  bool empty() const { return written_.empty() && buffer_.empty(); }
  const std::vector<std::pair<std::string, uint64_t>>& written() const { return written_; }

 private:
  void flush() {
    char name[64];
    std::snprintf(name, sizeof(name), "%s_%03zu.bin", split_.c_str(), written_.size());
    write_shard(dir_ / name, buffer_);
    written_.emplace_back(name, buffer_.size());
    buffer_.clear();
  }

  fs::path dir_;
  std::string split_;
  uint64_t shard_tokens_;
  std::vector<uint16_t> buffer_;
  std::vector<std::pair<std::string, uint64_t>> written_;
};

std::vector<uint16_t> to_shard_tokens(const std::vector<uint32_t>& ids, uint32_t vocab,
                                      const fs::path& source) {
  std::vector<uint16_t> out;
  out.reserve(ids.size());
  for (const uint32_t id : ids) {
    if (id >= vocab || id > 0xFFFF) {
      throw DataError("tokenizing '" + source.string() + "' gave token id " + std::to_string(id) +
                      ", outside the vocabulary of " + std::to_string(vocab) +
                      " (shards hold ids below 65536)");
    }
    out.push_back(static_cast<uint16_t>(id));
  }
  return out;
}

std::unique_ptr<Tokenizer> make_tokenizer(const PrepareOptions& o,
                                          const std::vector<fs::path>& train_docs,
                                          const PrepareProgress& progress) {
  if (o.tokenizer == "byte") return make_byte_tokenizer();
  if (o.tokenizer == "gpt2") {
    auto tokenizer = load_gpt2_bpe(o.gpt2_bpe_dir);  // validates before copying
    const fs::path into = o.out_dir / kGpt2Dir;
    std::error_code ec;
    if (!fs::equivalent(o.gpt2_bpe_dir, into, ec)) {
      fs::create_directories(into);
      for (const char* file : {kGpt2EncoderFile, kGpt2MergesFile}) {
        const std::string bytes = read_document(o.gpt2_bpe_dir / file);
        write_file_atomically(into / file, {std::as_bytes(std::span(bytes))});
      }
    }
    return tokenizer;
  }
  const fs::path model = o.out_dir / kModelFile;
  if (!o.sentencepiece_model.empty()) {
    auto tokenizer = load_sentencepiece(o.sentencepiece_model);  // validates before copying
    std::error_code ec;
    if (!fs::equivalent(o.sentencepiece_model, model, ec)) {
      const std::string bytes = read_document(o.sentencepiece_model);
      write_file_atomically(model, {std::as_bytes(std::span(bytes))});
      // A .vocab left by an earlier run would describe a different model.
      fs::remove(o.out_dir / "tokenizer.vocab", ec);
    }
    return tokenizer;
  }
  if (progress) progress("train tokenizer", 0, 1);
  train_sentencepiece(train_docs, o.out_dir / "tokenizer", o.vocab_size, o.split_digits);
  if (progress) progress("train tokenizer", 1, 1);
  return load_sentencepiece(model);
}

void write_meta(const fs::path& out_dir, const Tokenizer& tokenizer, const ShardSink& train,
                const ShardSink& val) {
  nlohmann::ordered_json meta;
  meta["format"] = "starling-data";
  meta["version"] = 1;
  meta["tokenizer"] = {{"kind", tokenizer.kind()}, {"vocab_size", tokenizer.vocab_size()}};
  if (tokenizer.kind() == "sentencepiece") meta["tokenizer"]["model"] = kModelFile;
  if (tokenizer.kind() == "gpt2") meta["tokenizer"]["bpe"] = kGpt2Dir;
  for (const auto* sink : {&train, &val}) {
    auto list = nlohmann::ordered_json::array();
    for (const auto& [file, tokens] : sink->written())
      list.push_back({{"file", file}, {"tokens", tokens}});
    meta[sink == &train ? "train" : "val"] = std::move(list);
  }
  const std::string text = meta.dump(2) + "\n";
  write_file_atomically(out_dir / kMetaFile, {std::as_bytes(std::span(text))});
}

// Shards named like ours but not written by this run belong to an earlier, larger dataset.
void remove_stale_shards(const fs::path& out_dir, const ShardSink& train, const ShardSink& val) {
  std::set<std::string> keep;
  for (const auto* sink : {&train, &val}) {
    for (const auto& entry : sink->written()) keep.insert(entry.first);
  }
  static const std::regex ours(R"((train|val)_\d+\.bin)");
  for (const auto& entry : fs::directory_iterator(out_dir)) {
    const std::string name = entry.path().filename().string();
    if (entry.is_regular_file() && std::regex_match(name, ours) && !keep.count(name)) {
      fs::remove(entry.path());
    }
  }
}

// prepare_dataset() once its output directory is there.
DatasetInfo prepare_into(const PrepareOptions& options, const std::vector<fs::path>& docs,
                         const std::vector<bool>& is_val, const PrepareProgress& progress) {
  std::vector<fs::path> train_docs;
  for (std::size_t i = 0; i < docs.size(); ++i) {
    if (!is_val[i]) train_docs.push_back(docs[i]);
  }
  const auto tokenizer = make_tokenizer(options, train_docs, progress);
  const uint32_t vocab = tokenizer->vocab_size();
  if (vocab > 65536) {
    throw DataError("tokenizer has " + std::to_string(vocab) +
                    " ids but shards hold uint16 tokens (at most 65536)");
  }
  const auto separator_ids = tokenizer->document_separator()
                                 ? std::vector<uint32_t>{*tokenizer->document_separator()}
                                 : tokenizer->encode("\n\n");
  const std::vector<uint16_t> separator = to_shard_tokens(separator_ids, vocab, "separator");

  ShardSink train(options.out_dir, "train", options.shard_tokens);
  ShardSink val(options.out_dir, "val", options.shard_tokens);
  const uint64_t step = std::max<uint64_t>(1, docs.size() / 100);
  for (std::size_t i = 0; i < docs.size(); ++i) {
    const std::vector<uint16_t> tokens =
        to_shard_tokens(tokenizer->encode(read_document(docs[i])), vocab, docs[i]);
    if (docs.size() == 1) {
      // One document: its last val_fraction of tokens is the validation split.
      if (tokens.size() < 2) {
        throw DataError("input '" + docs[i].string() + "' is the only document and has " +
                        std::to_string(tokens.size()) +
                        " token(s); at least 2 are needed to make train and val splits");
      }
      const std::size_t cut = tokens.size() - fraction_of(tokens.size(), options.val_fraction);
      if (tokenizer->kind() == "gpt2") train.append(separator);  // llm.c's document start
      train.append(std::span(tokens).first(cut));
      val.append(std::span(tokens).subspan(cut));
    } else {
      ShardSink& sink = is_val[i] ? val : train;
      // GPT-2's <|endoftext|> starts every document, the first too, as in llm.c's shards; other
      // separators only stand between documents.
      if (!sink.empty() || tokenizer->kind() == "gpt2") sink.append(separator);
      sink.append(tokens);
    }
    if (progress && ((i + 1) % step == 0 || i + 1 == docs.size())) {
      progress("tokenize", i + 1, docs.size());
    }
  }
  train.finish();
  val.finish();
  remove_stale_shards(options.out_dir, train, val);
  write_meta(options.out_dir, *tokenizer, train, val);
  return open_dataset(options.out_dir);
}

}  // namespace

DatasetInfo prepare_dataset(const PrepareOptions& options, const PrepareProgress& progress) {
  validate(options);
  const std::vector<fs::path> docs = collect_documents(options);
  const std::vector<bool> is_val =
      choose_validation(docs.size(), options.val_fraction, options.seed);
  if (progress) progress("find documents", docs.size(), docs.size());

  std::error_code ec;
  // The outermost directory this call makes (the output's or a missing parent's), if any.
  const fs::path made = outermost_missing(options.out_dir);
  fs::create_directories(options.out_dir, ec);
  if (!fs::is_directory(options.out_dir)) {
    throw DataError("cannot create output directory '" + options.out_dir.string() + "'" +
                    (ec ? ": " + ec.message() : ""));
  }
  // Until the new meta.json lands, the directory must not look like a finished dataset.
  fs::remove(options.out_dir / kMetaFile, ec);
  try {
    return prepare_into(options, docs, is_val, progress);
  } catch (...) {
    // Directories this call made hold nothing of use after a failure (missing tokenizer
    // files, a bad document): they go, parents it made included, rather than stay behind empty
    // or half-written. A parent goes only if empty: another prepare may have made an output
    // beside this one in it meanwhile.
    if (!made.empty()) {
      fs::remove_all(options.out_dir, ec);
      // Parents up to the one it made; none where it made only the output itself.
      fs::path out = options.out_dir.lexically_normal();
      if (!out.has_filename()) out = out.parent_path();  // "a/b/" is "a/b"
      if (out != made) remove_made_empty_dirs(out.parent_path(), made);
    }
    throw;
  }
}

}  // namespace starling::data
