// `starling train --peers N`: a whole swarm on this machine. Starts N `starling peer` processes
// on loopback (or, with a link rate, each in its own network namespace behind a tbf-shaped link),
// with ephemeral keys generated into <out_dir>/keys, each on its 1/N share of the data and
// checkpointing into <out_dir>/peer-<i>; with CPU quotas, each peer in a cgroup of its own; shows
// one combined progress line and forwards SIGINT and SIGTERM to the peers (which checkpoint and
// leave). A process supervisor, so it lives with the command line rather than with the strategies
// the peers run.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "starling/sched/lab_spec.h"
#include "starling/train/config.h"

namespace starling::cli {

struct LocalSwarmOptions {
  int peers = 2;
  std::string link_rate;          // "" = loopback; else a tc rate ("20mbit"): needs root
  std::vector<double> peer_cpus;  // empty = no quota; else CPUs per peer (cpu_quota.h): root
  // A heterogeneous lab (--lab): a link per pair of peers and CPUs per peer, in place of
  // link_rate and peer_cpus; its peer count must be `peers`.
  std::optional<sched::LabSpec> lab;
  std::string starling;                // path of the starling binary to launch peers with
  std::string config_file;             // passed on to each peer
  std::vector<std::string> overrides;  // --set arguments, passed on to each peer
  // --peer-set arguments: peer i's own --set overrides, after the swarm's (peer_sets.h); empty,
  // or one list per peer. Not with a pipeline, whose plan places every peer alike.
  std::vector<std::vector<std::string>> peer_overrides;
  // The --peer-set arguments those come from, kept in the run's directory for a --resume.
  std::vector<std::string> peer_set_args;
  bool resume = false;
  bool progress = true;
  int64_t stop_at = -1;
};

struct LocalSwarmResult {
  int failed_peers = 0;     // peers that exited with an error
  int64_t step = 0;         // the furthest step any peer reached
  double val_loss = -1;     // the last validation loss reported
  double tokens_per_s = 0;  // the sum of the peers' own rates (evaluation and checkpoints excluded)
  std::string sample;       // peer 0's end-of-training sample
  // Peers the launcher killed because another failed before anyone trained, or that a signal
  // to the launcher stopped before their first step: not failures of their own.
  int stopped_peers = 0;
  bool signalled = false;  // the launcher was told to stop (SIGINT, SIGTERM)
};

// Thrown by run_local_swarm after a second stop signal (its peers killed, what it made removed):
// the caller dies of `signal`, as a process told twice to stop does.
struct SecondSignal {
  int signal;
};

LocalSwarmResult run_local_swarm(const train::RunConfig& config, const LocalSwarmOptions& options);

}  // namespace starling::cli
