#include "starling/net/log.h"

#include <cstdio>

namespace starling::net {

LogFn stderr_log(const std::string& name) {
  return [name](const std::string& line) {
    std::fprintf(stderr, "[starling net %s] %s\n", name.c_str(), line.c_str());
  };
}

std::string seconds_text(std::chrono::milliseconds d) {
  return std::to_string(d.count() / 1000.0).substr(0, 4) + " s";
}

}  // namespace starling::net
