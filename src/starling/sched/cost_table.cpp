#include "starling/sched/cost_table.h"

#include <cctype>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "starling/common/error.h"
#include "starling/common/parse_number.h"

namespace starling::sched {
namespace {

using nlohmann::json;

const json& field(const json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) throw ConfigError(where + ": missing \"" + key + "\"");
  return j.at(key);
}

double number(const json& j, const char* key, const std::string& where) {
  const json& v = field(j, key, where);
  if (!v.is_number()) throw ConfigError(where + "." + key + ": expected a number");
  return v.get<double>();
}

int64_t integer(const json& j, const char* key, const std::string& where) {
  const json& v = field(j, key, where);
  if (!v.is_number_integer()) throw ConfigError(where + "." + key + ": expected an integer");
  return v.get<int64_t>();
}

std::string text(const json& j, const char* key, const std::string& where) {
  const json& v = field(j, key, where);
  if (!v.is_string()) throw ConfigError(where + "." + key + ": expected a string");
  return v.get<std::string>();
}

void check(bool ok, const std::string& what) {
  if (!ok) throw ConfigError(what);
}

}  // namespace

LinkCost CostTable::link(size_t a, size_t b) const {
  const LinkCost& x = links.at(a).at(b);
  const LinkCost& y = links.at(b).at(a);
  return {std::min(x.bytes_per_s, y.bytes_per_s), std::max(x.latency_s, y.latency_s)};
}

double CostTable::forward_s(size_t node) const {
  const NodeCost& n = nodes.at(node);
  return n.forward_s >= 0 ? n.forward_s : n.compute_s / 3;
}

void CostTable::validate(const std::string& where) const {
  check(!nodes.empty(), where + ": no nodes");
  check(!devices.empty(), where + ": no devices");
  check(micro_batches >= 1 && micro_batches <= (int64_t{1} << 20),
        where + ": micro_batches must be from 1 to 1048576 (train.grad_accum's range)");
  check(extra_warmup >= 0, where + ": extra_warmup must be >= 0");
  for (size_t i = 0; i < nodes.size(); ++i) {
    const std::string at = where + ": nodes[" + std::to_string(i) + "] (" + nodes[i].name + ")";
    check(std::isfinite(nodes[i].compute_s) && nodes[i].compute_s >= 0,
          at + ": compute_s must be a finite time >= 0");
    check(std::isfinite(nodes[i].forward_s) && nodes[i].forward_s <= nodes[i].compute_s,
          at + ": forward_s must be a finite time no longer than compute_s");
    check(nodes[i].param_bytes >= 0 && nodes[i].cut_bytes >= 0, at + ": negative bytes");
  }
  for (size_t d = 0; d < devices.size(); ++d) {
    const std::string at = where + ": devices[" + std::to_string(d) + "] (" + devices[d].name + ")";
    check(std::isfinite(devices[d].speed) && devices[d].speed > 0, at + ": speed must be > 0");
    check(std::isfinite(devices[d].egress_bytes_per_s) && devices[d].egress_bytes_per_s >= 0,
          at + ": egress_bytes_per_s must be >= 0 (0 = none)");
    check(std::isfinite(devices[d].ingress_bytes_per_s) && devices[d].ingress_bytes_per_s >= 0,
          at + ": ingress_bytes_per_s must be >= 0 (0 = none)");
  }
  check(links.size() == devices.size(), where + ": links must be a " +
                                            std::to_string(devices.size()) + " x " +
                                            std::to_string(devices.size()) + " matrix");
  for (size_t a = 0; a < links.size(); ++a) {
    check(links[a].size() == devices.size(), where + ": links[" + std::to_string(a) +
                                                 "] must have " + std::to_string(devices.size()) +
                                                 " entries");
    for (size_t b = 0; b < links.size(); ++b) {
      if (a == b) continue;
      const LinkCost& l = links[a][b];
      const std::string at = where + ": links[" + std::to_string(a) + "][" + std::to_string(b) +
                             "] (" + devices[a].name + " to " + devices[b].name + ")";
      check(std::isfinite(l.bytes_per_s) && l.bytes_per_s > 0, at + ": bytes_per_s must be > 0");
      check(std::isfinite(l.latency_s) && l.latency_s >= 0, at + ": latency_s must be >= 0");
    }
  }
}

void CostTable::scale_cuts(double fraction) {
  for (auto& node : nodes)
    node.cut_bytes =
        static_cast<int64_t>(std::llround(static_cast<double>(node.cut_bytes) * fraction));
}

double parse_link_rate(const std::string& text, const std::string& what) {
  // tc's units (decimal; "bps" is bytes a second), in any case, as scripts/netlab.sh takes them.
  // A bare number, bits to tc, is refused: "5" is far likelier a missing "mbit" than 5 bit/s.
  static const std::pair<const char*, double> units[] = {
      {"kbit", 1e3}, {"mbit", 1e6}, {"gbit", 1e9}, {"tbit", 1e12}, {"bit", 1},
      {"kbps", 8e3}, {"mbps", 8e6}, {"gbps", 8e9}, {"bps", 8}};
  std::string lower = text;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const auto& [unit, bits] : units) {
    const std::string u = unit;
    if (lower.size() <= u.size() || lower.compare(lower.size() - u.size(), u.size(), u) != 0)
      continue;
    if (const auto v = parse_positive_number(lower.substr(0, lower.size() - u.size()))) {
      // Beyond any link's rate: a typo, or a link that is not to be shaped (scripts/netlab.sh
      // shapes up to here).
      if (*v * bits > kMaxLinkBits)
        throw ConfigError(what + " = \"" + text +
                          "\": faster than 100tbit, more than any link carries; leave the link "
                          "unshaped instead");
      return *v * bits / 8;
    }
    break;
  }
  throw ConfigError(what + " = \"" + text +
                    "\": expected a rate such as \"250kbit\", \"10mbit\" or \"1gbit\" (tc's "
                    "units: bit, kbit, mbit, gbit, tbit, bps, kbps, mbps, gbps)");
}

json to_json(const CostTable& t) {
  json nodes = json::array(), devices = json::array(), links = json::array();
  for (const auto& n : t.nodes) {
    json node = {{"name", n.name},
                 {"compute_s", n.compute_s},
                 {"param_bytes", n.param_bytes},
                 {"cut_bytes", n.cut_bytes}};
    if (n.forward_s >= 0) node["forward_s"] = n.forward_s;
    nodes.push_back(node);
  }
  for (const auto& d : t.devices) {
    json device = {{"name", d.name}, {"speed", d.speed}};
    if (d.egress_bytes_per_s > 0) device["egress_bytes_per_s"] = d.egress_bytes_per_s;
    if (d.ingress_bytes_per_s > 0) device["ingress_bytes_per_s"] = d.ingress_bytes_per_s;
    devices.push_back(device);
  }
  for (const auto& row : t.links) {
    json r = json::array();
    for (const auto& l : row)
      r.push_back({{"bytes_per_s", l.bytes_per_s}, {"latency_s", l.latency_s}});
    links.push_back(r);
  }
  return {{"format", "starling-cost-table"},
          {"version", 1},
          {"micro_batches", t.micro_batches},
          {"schedule", t.one_f_one_b ? "1f1b" : "gpipe"},
          {"extra_warmup", t.extra_warmup},
          {"reference_cpus", t.reference_cpus},
          {"nodes", nodes},
          {"devices", devices},
          {"links", links}};
}

CostTable cost_table_from_json(const json& j, const std::string& where) {
  check(j.is_object(), where + ": expected a JSON object");
  check(j.value("format", "") == "starling-cost-table",
        where + ": \"format\" must be \"starling-cost-table\"");
  CostTable t;
  t.micro_batches = integer(j, "micro_batches", where);
  if (j.contains("schedule")) {
    const std::string schedule = text(j, "schedule", where);
    check(schedule == "1f1b" || schedule == "gpipe",
          where + ".schedule: expected \"1f1b\" or \"gpipe\", not \"" + schedule + "\"");
    t.one_f_one_b = schedule == "1f1b";
  }
  if (j.contains("extra_warmup")) t.extra_warmup = integer(j, "extra_warmup", where);
  if (j.contains("reference_cpus")) {
    t.reference_cpus = number(j, "reference_cpus", where);
    check(t.reference_cpus > 0, where + ".reference_cpus must be > 0");
  }
  const json& nodes = field(j, "nodes", where);
  check(nodes.is_array(), where + ".nodes: expected an array");
  for (size_t i = 0; i < nodes.size(); ++i) {
    const std::string at = where + ".nodes[" + std::to_string(i) + "]";
    t.nodes.push_back(
        {.name = text(nodes[i], "name", at),
         .compute_s = number(nodes[i], "compute_s", at),
         .param_bytes = integer(nodes[i], "param_bytes", at),
         .cut_bytes = integer(nodes[i], "cut_bytes", at),
         .forward_s = nodes[i].contains("forward_s") ? number(nodes[i], "forward_s", at) : -1.0});
    check(t.nodes.back().forward_s >= 0 || !nodes[i].contains("forward_s"),
          at + ".forward_s must be >= 0");
  }
  const json& devices = field(j, "devices", where);
  check(devices.is_array(), where + ".devices: expected an array");
  for (size_t i = 0; i < devices.size(); ++i) {
    const std::string at = where + ".devices[" + std::to_string(i) + "]";
    t.devices.push_back({.name = text(devices[i], "name", at),
                         .speed = number(devices[i], "speed", at),
                         .egress_bytes_per_s = devices[i].contains("egress_bytes_per_s")
                                                   ? number(devices[i], "egress_bytes_per_s", at)
                                                   : 0.0,
                         .ingress_bytes_per_s = devices[i].contains("ingress_bytes_per_s")
                                                    ? number(devices[i], "ingress_bytes_per_s", at)
                                                    : 0.0});
  }
  const json& links = field(j, "links", where);
  check(links.is_array(), where + ".links: expected an array of arrays");
  for (size_t a = 0; a < links.size(); ++a) {
    check(links[a].is_array(), where + ".links[" + std::to_string(a) + "]: expected an array");
    auto& row = t.links.emplace_back();
    for (size_t b = 0; b < links[a].size(); ++b) {
      const std::string at = where + ".links[" + std::to_string(a) + "][" + std::to_string(b) + "]";
      if (a == b) {
        row.push_back({});
        continue;
      }
      row.push_back({.bytes_per_s = number(links[a][b], "bytes_per_s", at),
                     .latency_s = number(links[a][b], "latency_s", at)});
    }
  }
  t.validate(where);
  return t;
}

CostTable read_cost_table(const std::filesystem::path& file) {
  // A directory opens as a stream whose first read throws the C++ library's own words.
  if (std::filesystem::is_directory(file))
    throw ConfigError(file.string() + ": is a directory, not a cost table (plan profile -o)");
  std::ifstream in(file);
  if (!in) throw ConfigError(file.string() + ": cannot open the cost table");
  json j;
  try {
    in >> j;
  } catch (const json::exception& e) {
    throw ConfigError(file.string() + ": not valid JSON: " + e.what());
  }
  return cost_table_from_json(j, file.string());
}

void write_cost_table(const std::filesystem::path& file, const CostTable& t) {
  std::ofstream out(file);
  out << to_json(t).dump(2) << "\n";
  if (!out) throw ConfigError(file.string() + ": cannot write the cost table");
}

double total_compute_s(const CostTable& t) {
  double s = 0;
  for (const auto& n : t.nodes) s += n.compute_s;
  return s;
}

}  // namespace starling::sched
