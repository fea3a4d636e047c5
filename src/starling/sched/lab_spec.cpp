#include "starling/sched/lab_spec.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "starling/common/error.h"

namespace starling::sched {
namespace {

[[noreturn]] void fail(const std::string& source, const std::string& what) {
  throw ConfigError(source + ": " + what);
}

std::string text_of(const toml::node& n) {
  std::ostringstream s;
  if (n.is_string())
    s << '"' << n.as_string()->get() << '"';
  else
    s << toml::node_view<const toml::node>(n);
  return s.str();
}

// A rate in bits/s, 0 for "unlimited".
double rate_bits(const toml::node& n, const std::string& source, const std::string& key) {
  if (!n.is_string()) fail(source, key + " = " + text_of(n) + ": expected a rate string");
  const std::string s = n.as_string()->get();
  if (s.size() == 9 && std::equal(s.begin(), s.end(), "unlimited", [](char a, char b) {
        return std::tolower(static_cast<unsigned char>(a)) == b;
      }))
    return 0;
  const double bits = parse_link_rate(s, source + ": " + key) * 8;
  if (bits < 1000) fail(source, key + " = \"" + s + "\": a lab's links run at 1kbit or more");
  return std::round(bits);
}

// A one-way delay in seconds: "20ms", "1.5ms", "250us", "0.1s", or 0.
double parse_delay_s(const toml::node& n, const std::string& source, const std::string& key) {
  auto bad = [&] {
    fail(source, key + " = " + text_of(n) +
                     ": expected a one-way delay such as \"20ms\", \"250us\" or \"0.1s\" (at "
                     "most 10s)");
  };
  if ((n.is_integer() && n.as_integer()->get() == 0) ||
      (n.is_floating_point() && n.as_floating_point()->get() == 0.0))
    return 0;
  if (!n.is_string()) bad();
  const std::string s = n.as_string()->get();
  // Digits, an optional fraction, a unit: nothing stod would also take (signs, spaces, hex,
  // exponents, "nan").
  static const std::regex form(R"(([0-9]+(\.[0-9]+)?)(s|ms|us))");
  std::smatch m;
  if (!std::regex_match(s, m, form)) bad();
  const double v = std::stod(m[1].str());
  const std::string unit = m[3].str();
  const double scale = unit == "s" ? 1 : unit == "ms" ? 1e-3 : unit == "us" ? 1e-6 : -1;
  if (scale < 0 || !std::isfinite(v) || v < 0 || v * scale > 10) bad();
  return v * scale;
}

int peer_index(const toml::node& n, int peers, const std::string& source, const std::string& at) {
  if (!n.is_integer() || n.as_integer()->get() < 0 || n.as_integer()->get() >= peers)
    fail(source,
         at + " = " + text_of(n) + ": expected a peer number in 0.." + std::to_string(peers - 1));
  return static_cast<int>(n.as_integer()->get());
}

std::string rate_name(double bits) {
  if (bits == 0) return "unlimited";
  std::ostringstream s;
  if (bits >= 1e9 && static_cast<int64_t>(bits) % 1000000000 == 0)
    s << bits / 1e9 << "gbit";
  else if (bits >= 1e6 && static_cast<int64_t>(bits) % 1000000 == 0)
    s << bits / 1e6 << "mbit";
  else
    s << bits / 1e3 << "kbit";
  return s.str();
}

}  // namespace

LabSpec parse_lab_spec(const std::string& toml_text, const std::string& source) {
  toml::table root;
  try {
    root = toml::parse(toml_text, source);
  } catch (const toml::parse_error& e) {
    std::ostringstream s;
    s << e.description() << " (line " << e.source().begin.line << ")";
    fail(source, s.str());
  }
  static const std::set<std::string> known = {"peers",   "rate",          "delay", "clusters",
                                              "between", "between_delay", "cpus",  "link"};
  for (const auto& [k, v] : root) {
    if (!known.contains(std::string(k.str())))
      fail(source, "unknown key \"" + std::string(k.str()) +
                       "\" (a lab has peers, rate, delay, clusters, between, between_delay, cpus "
                       "and [[link]])");
  }
  LabSpec lab;
  lab.source = source;
  const auto* peers = root.get("peers");
  if (!peers) fail(source, "missing peers = N (the lab's peer count)");
  if (!peers->is_integer() || peers->as_integer()->get() < 1 || peers->as_integer()->get() > 64)
    fail(source, "peers = " + text_of(*peers) + ": expected a peer count in 1..64");
  const int n = static_cast<int>(peers->as_integer()->get());
  lab.peers = n;

  const double base = root.get("rate") ? rate_bits(*root.get("rate"), source, "rate") : 0;
  lab.bits_per_s.assign(n, std::vector<double>(n, base));
  const double base_delay =
      root.get("delay") ? parse_delay_s(*root.get("delay"), source, "delay") : 0;
  lab.delay_s.assign(n, std::vector<double>(n, base_delay));

  std::vector<int> cluster_of(n, -1);
  if (const auto* c = root.get("clusters")) {
    const auto* a = c->as_array();
    if (!a) fail(source, "clusters: expected an array of peer lists, e.g. [[0, 1], [2, 3]]");
    for (size_t g = 0; g < a->size(); ++g) {
      const std::string at = "clusters[" + std::to_string(g) + "]";
      const auto* members = (*a)[g].as_array();
      if (!members || members->empty()) fail(source, at + ": expected a non-empty list of peers");
      for (size_t m = 0; m < members->size(); ++m) {
        const int p = peer_index((*members)[m], n, source, at + "[" + std::to_string(m) + "]");
        if (cluster_of[p] >= 0)
          fail(source, at + ": peer " + std::to_string(p) + " is already in clusters[" +
                           std::to_string(cluster_of[p]) + "]");
        cluster_of[p] = static_cast<int>(g);
      }
    }
    // A peer in no cluster is a cluster of its own.
    int next = static_cast<int>(a->size());
    for (int& g : cluster_of)
      if (g < 0) g = next++;
  }
  // `between` and `between_delay` set every link that joins two clusters.
  auto between = [&](const char* key, std::vector<std::vector<double>>& matrix, auto parse) {
    const auto* v = root.get(key);
    if (!v) return;
    if (!root.get("clusters"))
      fail(source, std::string(key) + " needs clusters (the groups it joins)");
    const double value = parse(*v, source, key);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j)
        if (cluster_of[i] != cluster_of[j]) matrix[i][j] = value;
  };
  between("between", lab.bits_per_s, rate_bits);
  between("between_delay", lab.delay_s, parse_delay_s);

  if (const auto* l = root.get("link")) {
    const auto* a = l->as_array();
    if (!a) fail(source, "link: expected [[link]] tables with peers = [A, B] and rate");
    for (size_t k = 0; k < a->size(); ++k) {
      const std::string at = "link[" + std::to_string(k) + "]";
      const auto* t = (*a)[k].as_table();
      if (!t) fail(source, at + ": expected a table with peers = [A, B] and rate or delay");
      for (const auto& [key, v] : *t)
        if (key.str() != "peers" && key.str() != "rate" && key.str() != "delay")
          fail(source,
               at + ": unknown key \"" + std::string(key.str()) + "\" (peers, rate, delay)");
      const auto* pair = t->get_as<toml::array>("peers");
      if (!pair || pair->size() != 2) fail(source, at + ".peers: expected two peers, [A, B]");
      const int x = peer_index((*pair)[0], n, source, at + ".peers[0]");
      const int y = peer_index((*pair)[1], n, source, at + ".peers[1]");
      if (x == y) fail(source, at + ".peers: a link joins two different peers");
      const auto* r = t->get("rate");
      const auto* d = t->get("delay");
      if (!r && !d) fail(source, at + ": missing rate (or delay)");
      if (r) lab.bits_per_s[x][y] = lab.bits_per_s[y][x] = rate_bits(*r, source, at + ".rate");
      if (d) lab.delay_s[x][y] = lab.delay_s[y][x] = parse_delay_s(*d, source, at + ".delay");
    }
  }
  for (int i = 0; i < n; ++i) lab.bits_per_s[i][i] = lab.delay_s[i][i] = 0;

  if (const auto* c = root.get("cpus")) {
    auto cpu = [&](const toml::node& v, const std::string& at) {
      const auto d = v.value<double>();
      if (!d || !(*d > 0) || *d > 1024)
        fail(source, at + " = " + text_of(v) + ": expected CPUs > 0");
      return *d;
    };
    if (const auto* a = c->as_array()) {
      if (static_cast<int>(a->size()) != n)
        fail(source, "cpus: " + std::to_string(a->size()) + " values for " + std::to_string(n) +
                         " peers (give one per peer, or one number for all)");
      for (size_t i = 0; i < a->size(); ++i)
        lab.cpus.push_back(cpu((*a)[i], "cpus[" + std::to_string(i) + "]"));
    } else {
      lab.cpus.assign(n, cpu(*c, "cpus"));
    }
  }
  return lab;
}

LabSpec read_lab_spec(const std::filesystem::path& file) {
  if (std::filesystem::is_directory(file))
    throw ConfigError(file.string() + ": is a directory, not a lab file");
  std::ifstream in(file);
  if (!in) throw ConfigError("cannot read lab file " + file.string());
  std::ostringstream text;
  text << in.rdbuf();
  return parse_lab_spec(text.str(), file.string());
}

bool LabSpec::has_delays() const {
  for (const auto& row : delay_s)
    for (double d : row)
      if (d > 0) return true;
  return false;
}

std::string LabSpec::tc_rate(int a, int b) const {
  const double bits = bits_per_s.at(a).at(b);
  if (a == b || bits == 0) return "unlimited";
  return std::to_string(static_cast<int64_t>(bits)) + "bit";
}

std::string LabSpec::describe() const {
  // Peers grouped by the rate of their links, fastest first: "1gbit: 0-1 2-3; 10mbit: 0-2 ...".
  std::map<double, std::vector<std::string>, std::greater<>> by_rate;
  for (int a = 0; a < peers; ++a)
    for (int b = a + 1; b < peers; ++b) {
      const double r = bits_per_s[a][b] == 0 ? 1e18 : bits_per_s[a][b];
      by_rate[r].push_back(std::to_string(a) + "-" + std::to_string(b) +
                           (bits_per_s[a][b] != bits_per_s[b][a] ? "(asym)" : ""));
    }
  std::ostringstream s;
  s << peers << " peer" << (peers == 1 ? "" : "s");
  for (const auto& [r, pairs] : by_rate) {
    s << "; " << (r == 1e18 ? std::string("unlimited") : rate_name(r)) << ":";
    for (const auto& p : pairs) s << " " << p;
  }
  // Delays, grouped the same way: "; delay 20ms: 0-2 0-3 1-2 1-3".
  std::map<double, std::vector<std::string>> by_delay;
  for (int a = 0; a < peers; ++a)
    for (int b = a + 1; b < peers; ++b)
      if (has_delays() && delay_s[a][b] > 0)
        by_delay[delay_s[a][b]].push_back(std::to_string(a) + "-" + std::to_string(b) +
                                          (delay_s[a][b] != delay_s[b][a] ? "(asym)" : ""));
  for (const auto& [d, pairs] : by_delay) {
    s << "; delay " << d * 1e3 << "ms:";
    for (const auto& p : pairs) s << " " << p;
  }
  if (!cpus.empty()) {
    s << "; CPUs";
    for (double c : cpus) s << " " << c;
  }
  return s.str();
}

void apply_lab(CostTable& t, const LabSpec& lab) {
  t.devices.clear();
  for (int i = 0; i < lab.peers; ++i) {
    // A star's link is shaped both ways (netlab.h): one rate up and down.
    const double access = lab.egress_bits_per_s.empty() ? 0.0 : lab.egress_bits_per_s[i] / 8;
    t.devices.push_back({.name = "peer " + std::to_string(i),
                         .speed = lab.cpus.empty()
                                      ? 1.0
                                      : std::min(lab.cpus[i], t.reference_cpus) / t.reference_cpus,
                         .egress_bytes_per_s = access,
                         .ingress_bytes_per_s = access});
  }
  t.links.assign(lab.peers, std::vector<LinkCost>(lab.peers));
  for (int a = 0; a < lab.peers; ++a)
    for (int b = 0; b < lab.peers; ++b) {
      const double bits = lab.bits_per_s[a][b];
      t.links[a][b] = {.bytes_per_s = bits == 0 ? kUnshapedBytesPerS : bits / 8,
                       .latency_s = lab.has_delays() && a != b ? lab.delay_s[a][b] : 0};
    }
}

}  // namespace starling::sched
