#include "starling/swap/swap_config.h"

#include <cctype>
#include <cmath>
#include <cstdio>
#include <utility>
#include <vector>

#include "starling/common/error.h"
#include "starling/config/config_keys.h"

namespace starling::swap {

void add_config_keys(SwapConfig& c, config::Keys& k) {
  using namespace config;
  k.push_back(string_key("swap", "budget", &c.budget,
                         "training state (weights, gradients, AdamW moments) kept in compute "
                         "memory, e.g. \"2GB\"; the rest streams from swap.tier. \"\" = no "
                         "swapping (docs/swap.md)"));
  k.push_back(string_key("swap", "tier", &c.tier,
                         "where swapped state lives: \"host\" (RAM; pinned RAM below a GPU) or "
                         "\"disk\" (a file under swap.dir, read and written with O_DIRECT "
                         "through io_uring; CPU only)",
                         {"host", "disk"}));
  k.push_back(string_key("swap", "dir", &c.dir,
                         "directory of the disk tier's file (unlinked while open); \"\" = "
                         "train.out_dir. Must be on a disk: a filesystem with O_DIRECT (tmpfs "
                         "keeps the bytes in RAM)"));
  k.push_back(int_key("swap", "group_nodes", &c.group_nodes, 0,
                      "nodes per swapped layer group; 0 = the planner chooses"));
  k.push_back(int_key("swap", "depth", &c.depth, -1,
                      "layer groups loaded ahead of the computing one; -1 = the planner chooses"));
  k.push_back(int_key("swap", "moment_groups", &c.moment_groups, -1,
                      "layer groups, from the first, whose AdamW moments stay in compute memory "
                      "instead of streaming through the tier; -1 = the planner chooses, 0 = none"));
  k.push_back(bool_key("swap", "overlap_update", &c.overlap_update,
                       "run the optimizer's update behind the next step's forward (true) or on "
                       "its own after the passes (false)"));
  k.push_back(bool_key("swap", "rows_first", &c.rows_first,
                       "with the update overlapped on a CPU, update the token embedding's rows the "
                       "next lookup reads first and the rest of the table while later layers "
                       "compute (true), or the whole table before the forward starts (false)"));
  k.push_back(bool_key("swap", "update_in_backward", &c.update_in_backward,
                       "without clipping (optim.grad_clip = 0), with the update overlapped on a "
                       "CPU: start each parameter's update inside the backward once its gradient "
                       "is final (true), or after the passes (false)"));
  k.push_back(
      string_key("swap", "speculative_update", &c.speculative_update,
                 "with clipping, on the disk tier below a CPU: start the update inside "
                 "the backward as if the step is not clipped, into spare rooms (the state's "
                 "weights and moments once more on disk), kept when the norm is under "
                 "optim.grad_clip and redone otherwise. \"auto\" = after an unclipped "
                 "step, where swap.dir has room; \"always\"; \"off\"",
                 {"auto", "always", "off"}));
  k.push_back(float_key("swap", "guess_break_even", &c.guess_break_even, -1,
                        "with swap.speculative_update = \"auto\": guess after an unclipped step "
                        "while more than this share of the recent steps after one were not "
                        "clipped either (0 = after every unclipped step, 1 = never); -1 = the "
                        "planner's break-even, from its predicted steps with a guess kept, "
                        "redone and none"));
  k.push_back(float_key("swap", "io_slowdown", &c.io_slowdown, -1,
                        "how much longer the computation takes while the tier moves data at full "
                        "speed (0.2 = 20% longer), for the planner's predicted step; -1 = probed "
                        "at the start, on a CPU (a matrix product and an AdamW update timed "
                        "alone and beside the tier's transfers)"));
}

void check(const SwapConfig& c, const std::string& source) {
  if (!c.enabled()) return;
  const int64_t b = parse_bytes(c.budget, source + ": swap.budget");
  if (b <= 0) throw ConfigError(source + ": swap.budget must be more than 0 bytes");
  if (c.guess_break_even < 0 && c.guess_break_even != -1) {
    char value[32];
    std::snprintf(value, sizeof value, "%g", c.guess_break_even);
    throw ConfigError(source +
                      ": swap.guess_break_even must be -1 (the planner's) or a share "
                      "from 0 up, not " +
                      value);
  }
  if (c.io_slowdown < 0 && c.io_slowdown != -1) {
    char value[32];
    std::snprintf(value, sizeof value, "%g", c.io_slowdown);
    throw ConfigError(source + ": swap.io_slowdown must be -1 (probed) or 0 and up, not " + value);
  }
}

int64_t parse_bytes(const std::string& text, const std::string& what) {
  size_t pos = 0;
  while (pos < text.size() && std::isspace(static_cast<unsigned char>(text[pos]))) ++pos;
  const size_t start = pos;
  while (pos < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[pos])) || text[pos] == '.'))
    ++pos;
  std::string unit;
  for (size_t i = pos; i < text.size(); ++i)
    if (!std::isspace(static_cast<unsigned char>(text[i])))
      unit += static_cast<char>(std::tolower(static_cast<unsigned char>(text[i])));
  const auto bad = [&]() {
    return ConfigError(what + ": \"" + text +
                       "\" is not a size; write e.g. \"2GB\", \"1.5GiB\" or " +
                       "\"512MB\" (a unit is required: B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)");
  };
  if (pos == start) throw bad();
  double number = 0;
  try {
    size_t used = 0;
    number = std::stod(text.substr(start, pos - start), &used);
    if (used != pos - start) throw bad();
  } catch (const std::logic_error&) {
    throw bad();
  }
  // A unit is required: "6" is far likelier a missing "GB" than 6 bytes.
  static const std::vector<std::pair<std::string, double>> units = {
      {"b", 1},           {"kb", 1e3},           {"mb", 1e6},
      {"gb", 1e9},        {"tb", 1e12},          {"kib", 1024.0},
      {"mib", 1048576.0}, {"gib", 1073741824.0}, {"tib", 1099511627776.0}};
  for (const auto& [name, scale] : units)
    if (unit == name) {
      const double bytes = number * scale;
      if (!std::isfinite(bytes) || bytes > 9e18)
        throw ConfigError(what + ": \"" + text +
                          "\" is more than 9 EB, beyond any machine's memory or disk");
      return static_cast<int64_t>(std::llround(bytes));
    }
  throw bad();
}

std::string format_bytes(double bytes) {
  static const char* units[] = {"B", "KB", "MB", "GB", "TB"};
  int u = 0;
  while (std::fabs(bytes) >= 1000 && u < 4) {
    bytes /= 1000;
    ++u;
  }
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%.0f B", bytes);
  else
    std::snprintf(buf, sizeof buf,
                  bytes < 10    ? "%.2f %s"
                  : bytes < 100 ? "%.1f %s"
                                : "%.0f %s",
                  bytes, units[u]);
  return buf;
}

}  // namespace starling::swap
