// Typed errors for everything Starling validates at a boundary (configs, data files, checkpoints,
// command lines). The message is for the user and names the file/field and what was expected;
// the source location is kept separately for developers (printed with --verbose).
#pragma once

#include <source_location>
#include <stdexcept>
#include <string>

namespace starling {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message,
                 std::source_location where = std::source_location::current())
      : std::runtime_error(message), where_(where) {}

  // "file.cpp:123" of the throw site.
  std::string origin() const {
    return std::string(where_.file_name()) + ":" + std::to_string(where_.line());
  }

 private:
  std::source_location where_;
};

// A config file, config key or command-line value is malformed or out of range.
class ConfigError : public Error {
  using Error::Error;
};

// A data file (text input, token shard, meta.json, tokenizer model) is missing or malformed.
class DataError : public Error {
  using Error::Error;
};

// A checkpoint or weight file is missing, malformed or does not match the model.
class CheckpointError : public Error {
  using Error::Error;
};

// A network peer, swarm or message misbehaved: unreachable entry point, refused key, a collective
// that failed because a peer died or disagreed.
class NetError : public Error {
  using Error::Error;
};

}  // namespace starling
