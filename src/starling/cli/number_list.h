// Comma-separated lists of positive numbers on the command line (--peer-cpus 1,1,0.5; --speeds).
#pragma once

#include <string>
#include <vector>

namespace starling::cli {

// "1,1,0.5" -> {1, 1, 0.5}. ConfigError "<option>: "<item>" is not <what>" for an entry that is
// not a finite number > 0, and for an empty list.
std::vector<double> parse_positive_numbers(const std::string& list, const std::string& option,
                                           const std::string& what);

}  // namespace starling::cli
