// Per-peer overrides for a local swarm (`starling train --peers N --peer-set I:KEY=VALUE`): unequal
// peers on one machine without root, each with its own threads, device or swap budget, where
// --peer-cpus (cgroup quotas) needs root. Torch-free.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace starling::cli {

// Whether a peer of a swarm may set `key` apart from the others: the keys that say what the peer
// runs on (train.threads, train.device, train.device_memory, and every swap.* key). Everything
// else (the model, the data, the schedule, the strategy) must be the swarm's.
bool peer_may_set(const std::string& key);

// Parses the --peer-set arguments, each "I:KEY=VALUE" with 0 <= I < peers and a key that
// peer_may_set takes: the overrides of each peer, in order (an empty list for a peer without any).
// ConfigError naming the argument and what is wrong with it. The values are checked by whoever
// loads them (train::load_run_config).
std::vector<std::vector<std::string>> parse_peer_sets(const std::vector<std::string>& args,
                                                      int peers);

// A local swarm keeps its --peer-set arguments in its run directory, so that `--resume` without
// any goes on with the peers as they began (a swapped peer swapped, a slow one slow).
inline constexpr const char* kPeerSetsFile = "peer_sets.json";
// Writes `args` into out/kPeerSetsFile (written aside and renamed), or removes the file where
// there are none. ConfigError naming the file where it cannot be written.
void save_peer_sets(const std::filesystem::path& out, const std::vector<std::string>& args);
// The arguments out/kPeerSetsFile holds, or none where there is no such file. ConfigError naming
// the file where it is not what save_peer_sets writes.
std::vector<std::string> saved_peer_sets(const std::filesystem::path& out);

}  // namespace starling::cli
