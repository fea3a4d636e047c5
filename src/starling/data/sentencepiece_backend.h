// SentencePiece behind a narrow, std-only interface, implemented in a separately loaded module
// (libstarling_sentencepiece.so). Debian's libsentencepiece carries and exports its own copy of
// protobuf, which clashes with the system protobuf that libtorch loads (the process crashes in
// protobuf's static initialisers). The module is opened with RTLD_LOCAL | RTLD_DEEPBIND, so
// sentencepiece binds to its own protobuf and nothing else sees it.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace starling::data::spm {

class Processor {
 public:
  virtual ~Processor() = default;
  // Each returns false and sets *error on failure.
  virtual bool encode(std::string_view text, std::vector<int>* ids, std::string* error) const = 0;
  virtual bool decode(const std::vector<int>& ids, std::string* text, std::string* error) const = 0;
  virtual int piece_size() const = 0;
  virtual int eos_id() const = 0;  // -1 if the model has none
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::unique_ptr<Processor> load(const std::string& model_file, std::string* error) = 0;
  // Trains from the lines of `files` (lines longer than max_line are cut at a space).
  virtual bool train(const std::unordered_map<std::string, std::string>& args,
                     const std::vector<std::string>& files, std::size_t max_line,
                     std::string* error) = 0;
};

// The module's backend, loaded on first use. Search order: $STARLING_SENTENCEPIECE_MODULE, the
// directory of the running executable, the build directory it was compiled in. DataError naming
// the paths tried if none loads.
Backend& backend();

}  // namespace starling::data::spm

// The module's single entry point.
extern "C" starling::data::spm::Backend* starling_sentencepiece_backend();
