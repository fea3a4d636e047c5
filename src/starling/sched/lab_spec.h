// A heterogeneous network lab, described in TOML (`starling train --peers N --lab lab.toml`,
// `starling plan pipeline --lab lab.toml`): how many peers, the rate of the link between every
// pair, and the CPUs each peer may use. The local launcher builds it (net/netlab.h shapes every
// pair's link, cli/cpu_quota.h sets the CPU shares); the scheduler reads the same file as its
// devices and links, so a plan and the run it predicts see one lab. Torch-free.
//
//   peers = 4
//   rate = "1gbit"               # every link not set below; "unlimited" = not shaped
//   clusters = [[0, 1], [2, 3]]  # groups of peers ...
//   between = "10mbit"           # ... and the rate of every link between two groups
//   delay = "0ms"                # one-way delay of every link not set below
//   between_delay = "20ms"       # ... of every link between two groups
//   cpus = [0.5, 0.5, 0.5, 0.25] # CPUs per peer (one number: every peer); absent = no quota
//   [[link]]                     # one pair, both directions; later entries win
//   peers = [1, 2]
//   rate = "8mbit"               # rate, delay or both
//   delay = "40ms"
//
// Rates are decimal tc rates ("250kbit", "10mbit", "1gbit"); delays are "20ms", "250us", "0.1s"
// (at most 10 s), carried by the lab's relay (net/lab_delay_relay.h).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "starling/sched/cost_table.h"

namespace starling::sched {

struct LabSpec {
  int peers = 0;
  // bits_per_s[a][b]: the link from peer a to peer b; 0 = not shaped (and on the diagonal).
  std::vector<std::vector<double>> bits_per_s;
  // delay_s[a][b]: the one-way delay from peer a to peer b in seconds (0 on the diagonal); may
  // be empty (no delays) in a LabSpec made by hand.
  std::vector<std::vector<double>> delay_s;
  std::vector<double> cpus;  // one per peer, or empty for no quotas
  // Set for a star (`--link-rate`: each peer reaches every other through one link, shaped both
  // ways): that link's rate per peer, up and down, in bits per second. Empty: every pair has a
  // link of its own.
  std::vector<double> egress_bits_per_s;
  std::string source;  // the file, for messages

  // tc's form of the rate from a to b ("10000000bit"), or "unlimited".
  std::string tc_rate(int a, int b) const;
  bool has_delays() const;  // any link with a delay above zero
  // One line: the peers, the pairs at each rate, the CPUs, e.g.
  // "4 peers; 1gbit: 0-1 2-3; 10mbit: 0-2 0-3 1-2 1-3; CPUs 0.5 0.5 0.5 0.25".
  std::string describe() const;
};

// ConfigError naming `source` and the key on anything wrong: unknown keys, peers outside 1..64, a
// peer index out of range or in two clusters, a bad rate or one under 1kbit, a bad delay or one
// over 10 s, a cpus list of the wrong length or a value outside (0, 1024].
LabSpec parse_lab_spec(const std::string& toml_text, const std::string& source);
LabSpec read_lab_spec(const std::filesystem::path& file);

// The lab as the scheduler's devices and links: device i is peer i, at speed
// min(cpus[i], t.reference_cpus) / t.reference_cpus (peers run the profiled config's threads;
// 1 without quotas), with a star's upload, the links the lab's rates (an unshaped link at
// kUnshapedBytesPerS), each link's latency its delay.
void apply_lab(CostTable& t, const LabSpec& lab);

}  // namespace starling::sched
