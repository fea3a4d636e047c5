// Where the network layer reports what it refused or noticed (a rejected message, a dead peer).
// A plain callback so the CLI can prefix lines and tests can capture them.
#pragma once

#include <chrono>
#include <functional>
#include <string>

namespace starling::net {

using LogFn = std::function<void(const std::string& line)>;

// Writes "[starling net <name>] line" to stderr.
LogFn stderr_log(const std::string& name);

// A timeout as messages state it: "1.50 s".
std::string seconds_text(std::chrono::milliseconds d);

}  // namespace starling::net
