// Helpers shared by the data tests: a private temporary directory and small file utilities.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

namespace starling::data::testing {

// A fresh directory under the system temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    static int counter = 0;
    path_ = std::filesystem::temp_directory_path() /
            ("starling-data-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
    std::filesystem::remove_all(path_);
    std::filesystem::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

inline void write_text(const std::filesystem::path& path, const std::string& text) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out << text;
}

inline std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Pseudo-English from a fixed word list: enough repetition for a tokenizer to learn merges.
inline std::string generated_text(uint64_t seed, std::size_t bytes) {
  static const std::vector<std::string> words = {
      "the", "quick",  "brown",  "fox",     "jumps",   "over",   "lazy",   "dog",   "and",
      "a",   "river",  "runs",   "through", "valley",  "where",  "old",    "trees", "stand",
      "of",  "in",     "light",  "morning", "evening", "bright", "stones", "water", "sings",
      "we",  "walked", "slowly", "toward",  "hills",   "under",  "clouds", "1961",  "42"};
  std::mt19937_64 rng(seed);
  std::string text;
  std::size_t in_sentence = 0;
  bool capital = true;
  while (text.size() < bytes) {
    std::string word = words[rng() % words.size()];
    if (capital) word[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(word[0])));
    capital = false;
    text += word;
    if (++in_sentence >= 6 + rng() % 8) {
      text += (rng() % 5 == 0) ? "?\n" : ".\n";
      in_sentence = 0;
      capital = true;
    } else {
      text += (rng() % 9 == 0) ? ", " : " ";
    }
  }
  return text;
}

}  // namespace starling::data::testing
