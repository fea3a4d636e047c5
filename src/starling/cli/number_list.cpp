#include "starling/cli/number_list.h"

#include <sstream>

#include "starling/common/error.h"
#include "starling/common/parse_number.h"

namespace starling::cli {

std::vector<double> parse_positive_numbers(const std::string& list, const std::string& option,
                                           const std::string& what) {
  std::vector<double> out;
  std::istringstream in(list);
  for (std::string item; std::getline(in, item, ',');) {
    const auto v = parse_positive_number(item);
    if (!v) throw ConfigError(option + ": \"" + item + "\" is not " + what);
    out.push_back(*v);
  }
  if (out.empty()) throw ConfigError(option + ": no values given");
  return out;
}

}  // namespace starling::cli
