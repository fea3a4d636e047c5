#include "starling/cli/number_list.h"

#include <cmath>
#include <sstream>

#include "starling/common/error.h"

namespace starling::cli {

std::vector<double> parse_positive_numbers(const std::string& list, const std::string& option,
                                           const std::string& what) {
  std::vector<double> out;
  std::istringstream in(list);
  for (std::string item; std::getline(in, item, ',');) {
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || !(v > 0) || !std::isfinite(v))
      throw ConfigError(option + ": \"" + item + "\" is not " + what);
    out.push_back(v);
  }
  if (out.empty()) throw ConfigError(option + ": no values given");
  return out;
}

}  // namespace starling::cli
