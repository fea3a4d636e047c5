// A number typed by a user (a command-line list entry, the digits of a rate), read whole.
#pragma once

#include <cmath>
#include <optional>
#include <stdexcept>
#include <string>

namespace starling {

// The value of `text` if all of it is a finite number > 0; nullopt otherwise ("", "x", "1x",
// "0", "-2", "inf").
inline std::optional<double> parse_positive_number(const std::string& text) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    return std::nullopt;
  }
  if (used == 0 || used != text.size() || !std::isfinite(v) || !(v > 0)) return std::nullopt;
  return v;
}

}  // namespace starling
