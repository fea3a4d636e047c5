#include "starling/data/gpt2_bpe.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <fstream>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <unordered_map>
#include <vector>

#include "starling/common/error.h"

namespace starling::data {
namespace {

namespace fs = std::filesystem;

// GPT-2's pre-split pattern (encoder.py); \s, \p{L} and \p{N} in Unicode's sense (PCRE2_UCP).
constexpr const char* kPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kEndOfText = "<|endoftext|>";

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// The length of the valid UTF-8 sequence at s[i], or 0 if there is none (overlong forms,
// surrogates and code points above U+10FFFF are invalid).
size_t utf8_length(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  if (c < 0x80) return 1;
  size_t n = 0;
  uint32_t cp = 0;
  if ((c & 0xE0) == 0xC0) {
    n = 2, cp = c & 0x1F;
  } else if ((c & 0xF0) == 0xE0) {
    n = 3, cp = c & 0x0F;
  } else if ((c & 0xF8) == 0xF0) {
    n = 4, cp = c & 0x07;
  } else {
    return 0;
  }
  if (i + n > s.size()) return 0;
  for (size_t k = 1; k < n; ++k) {
    if ((b(k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (b(k) & 0x3F);
  }
  static constexpr std::array<uint32_t, 5> kMin = {0, 0, 0x80, 0x800, 0x10000};
  if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return n;
}

// `text` with every byte that starts no valid UTF-8 sequence read as U+FFFD.
std::string valid_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const size_t n = utf8_length(text, i);
    if (n == 0) {
      append_utf8(out, 0xFFFD);
      ++i;
    } else {
      out.append(text.substr(i, n));
      i += n;
    }
  }
  return out;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw DataError("cannot read GPT-2 BPE file '" + path.string() +
                    "' (fetch it with scripts/fetch-gpt2-bpe.sh)");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class Gpt2Bpe final : public Tokenizer {
 public:
  explicit Gpt2Bpe(const fs::path& dir) {
    // Bytes that print as themselves keep their code point; the others (controls, space, ...)
    // move to 256 and up, in byte order.
    uint32_t shifted = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const uint32_t cp = printable ? b : shifted++;
      append_utf8(byte_symbol_[b], cp);
      byte_of_[cp] = static_cast<uint8_t>(b);
    }
    load_vocabulary(dir / kGpt2EncoderFile);
    load_merges(dir / kGpt2MergesFile);
    int error = 0;
    PCRE2_SIZE offset = 0;
    pattern_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                             PCRE2_UTF | PCRE2_UCP, &error, &offset, nullptr);
    if (pattern_ == nullptr) throw std::logic_error("GPT-2 BPE: the pre-split pattern failed");
  }
  ~Gpt2Bpe() override { pcre2_code_free(pattern_); }
  Gpt2Bpe(const Gpt2Bpe&) = delete;
  Gpt2Bpe& operator=(const Gpt2Bpe&) = delete;

  std::vector<uint32_t> encode(std::string_view raw) const override {
    const std::string text = valid_utf8(raw);
    std::vector<uint32_t> ids;
    pcre2_match_data* match = pcre2_match_data_create_from_pattern(pattern_, nullptr);
    const auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    for (PCRE2_SIZE at = 0; at < text.size();) {
      // The input is valid UTF-8: checking it again for every piece would be quadratic.
      const int rc =
          pcre2_match(pattern_, subject, text.size(), at, PCRE2_NO_UTF_CHECK, match, nullptr);
      if (rc < 0) break;  // nothing matches what is left (every character is matched, but safe)
      const PCRE2_SIZE* range = pcre2_get_ovector_pointer(match);
      if (range[1] <= range[0]) break;
      encode_piece(std::string_view(text).substr(range[0], range[1] - range[0]), ids);
      at = range[1];
    }
    pcre2_match_data_free(match);
    return ids;
  }

  std::string decode(std::span<const uint32_t> ids) const override {
    std::string out;
    for (const uint32_t id : ids) {
      if (id >= tokens_.size())
        throw DataError("token id " + std::to_string(id) + " is outside GPT-2's vocabulary of " +
                        std::to_string(tokens_.size()));
      const std::string& symbols = tokens_[id];
      for (size_t i = 0; i < symbols.size();) {
        const size_t n = utf8_length(symbols, i);
        if (n == 0)
          throw DataError("GPT-2 vocabulary: token " + std::to_string(id) + " is not UTF-8");
        uint32_t cp = static_cast<unsigned char>(symbols[i]) & (n == 1 ? 0x7F : 0xFF >> (n + 1));
        for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (symbols[i + k] & 0x3F);
        const auto byte = byte_of_.find(cp);
        if (byte == byte_of_.end())
          throw DataError("GPT-2 vocabulary: token " + std::to_string(id) +
                          " holds a character outside the byte table");
        out.push_back(static_cast<char>(byte->second));
        i += n;
      }
    }
    return out;
  }

  uint32_t vocab_size() const override { return static_cast<uint32_t>(tokens_.size()); }
  std::string kind() const override { return "gpt2"; }
  std::optional<uint32_t> document_separator() const override { return kGpt2EndOfText; }

 private:
  void load_vocabulary(const fs::path& file) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(read_file(file));
    } catch (const nlohmann::json::exception& e) {
      throw DataError("GPT-2 vocabulary '" + file.string() + "' is not JSON: " + e.what());
    }
    if (!j.is_object() || j.empty())
      throw DataError("GPT-2 vocabulary '" + file.string() + "' is not an object of token -> id");
    tokens_.assign(j.size(), std::string());
    std::vector<bool> seen(j.size(), false);
    for (const auto& [token, id] : j.items()) {
      if (!id.is_number_unsigned() || id.get<uint64_t>() >= j.size() || seen[id.get<size_t>()])
        throw DataError("GPT-2 vocabulary '" + file.string() + "': token \"" + token.substr(0, 40) +
                        "\" has id " + id.dump() + ", expected ids 0.." +
                        std::to_string(j.size() - 1) + " each once");
      seen[id.get<size_t>()] = true;
      tokens_[id.get<size_t>()] = token;
      id_of_[token] = id.get<uint32_t>();
    }
    if (tokens_.size() <= kGpt2EndOfText || tokens_[kGpt2EndOfText] != kEndOfText)
      throw DataError("GPT-2 vocabulary '" + file.string() + "' has no " + kEndOfText + " at " +
                      std::to_string(kGpt2EndOfText) + ": not GPT-2's");
  }

  void load_merges(const fs::path& file) {
    std::istringstream in(read_file(file));
    std::string line;
    std::getline(in, line);  // "#version: 0.2"
    int line_number = 1;
    while (std::getline(in, line)) {
      ++line_number;
      if (line.empty()) continue;
      const size_t space = line.find(' ');
      if (space == std::string::npos || space == 0 || space + 1 == line.size() ||
          line.find(' ', space + 1) != std::string::npos)
        throw DataError("GPT-2 merges '" + file.string() + "' line " + std::to_string(line_number) +
                        ": expected two symbols, got \"" + line.substr(0, 40) + "\"");
      rank_.emplace(line, static_cast<int>(rank_.size()));  // "a b": tokens hold no space
    }
    if (rank_.empty()) throw DataError("GPT-2 merges '" + file.string() + "' hold no merges");
  }

  // The ids of one piece of the pre-split, appended to `ids`.
  void encode_piece(std::string_view piece, std::vector<uint32_t>& ids) const {
    std::string key(piece);
    {
      std::lock_guard lock(cache_mutex_);
      if (const auto it = cache_.find(key); it != cache_.end()) {
        ids.insert(ids.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<std::string> word;
    for (const char c : piece) word.push_back(byte_symbol_[static_cast<unsigned char>(c)]);
    // Merge the ranked pair of lowest rank, every occurrence left to right, until none is left.
    while (word.size() > 1) {
      int best = std::numeric_limits<int>::max();
      size_t at = 0;
      for (size_t i = 0; i + 1 < word.size(); ++i)
        if (const auto it = rank_.find(word[i] + " " + word[i + 1]);
            it != rank_.end() && it->second < best) {
          best = it->second;
          at = i;
        }
      if (best == std::numeric_limits<int>::max()) break;
      const std::string first = word[at], second = word[at + 1];
      std::vector<std::string> merged;
      merged.reserve(word.size());
      for (size_t i = 0; i < word.size();) {
        if (i + 1 < word.size() && word[i] == first && word[i + 1] == second) {
          merged.push_back(first + second);
          i += 2;
        } else {
          merged.push_back(word[i++]);
        }
      }
      word = std::move(merged);
    }
    std::vector<uint32_t> out;
    for (const std::string& symbol : word) {
      const auto it = id_of_.find(symbol);
      // Every single byte's symbol is in GPT-2's vocabulary, and so is every merge's result.
      if (it == id_of_.end())
        throw DataError("GPT-2 BPE: symbol \"" + symbol + "\" is not in the vocabulary");
      out.push_back(it->second);
    }
    ids.insert(ids.end(), out.begin(), out.end());
    std::lock_guard lock(cache_mutex_);
    if (cache_.size() > 200'000) cache_.clear();  // bounded: a corpus has a long tail of words
    cache_.emplace(std::move(key), std::move(out));
  }

  std::array<std::string, 256> byte_symbol_;
  std::unordered_map<uint32_t, uint8_t> byte_of_;
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, uint32_t> id_of_;
  std::unordered_map<std::string, int> rank_;
  pcre2_code* pattern_ = nullptr;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<uint32_t>> cache_;
};

}  // namespace

std::unique_ptr<Tokenizer> load_gpt2_bpe(const std::filesystem::path& dir) {
  return std::make_unique<Gpt2Bpe>(dir);
}

}  // namespace starling::data
