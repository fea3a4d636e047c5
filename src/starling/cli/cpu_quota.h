// A CPU quota for one process tree: a cgroup whose CFS bandwidth limit lets its processes use
// `cpus` CPUs' worth of time (0.5 = half of one core), whatever the machine's load. Local swarms
// use it to give peers unequal speeds on one machine (`starling train --peers N --peer-cpus ...`),
// so heterogeneous swarms can be tested and benchmarked without heterogeneous hardware.
//
// cgroup v2 (cpu.max, where the cpu controller is enabled) or v1 (cpu.cfs_quota_us); both need
// root. The cgroup is created by the constructor and removed by the destructor, once its
// processes have exited.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace starling::cli {

class CpuQuota {
 public:
  // Why quotas cannot be set on this machine, or "" when they can.
  static std::string unavailable_reason();

  // Creates the cgroup `name` under the cpu hierarchy with a quota of `cpus` (> 0); throws
  // ConfigError when quotas are unavailable (naming why) and Error naming the file that could not
  // be written.
  CpuQuota(const std::string& name, double cpus);
  ~CpuQuota();
  CpuQuota(const CpuQuota&) = delete;
  CpuQuota& operator=(const CpuQuota&) = delete;

  // A command prefix that moves the process into the cgroup, then execs the rest of the command
  // line: the quota holds from the first instruction of the program.
  std::vector<std::string> exec_prefix() const;
  const std::filesystem::path& path() const { return dir_; }

 private:
  std::filesystem::path dir_;
};

// Parses --peer-cpus: `peers` comma-separated CPU counts (> 0), or one value for every peer;
// ConfigError naming the bad entry.
std::vector<double> parse_peer_cpus(const std::string& list, int peers);

}  // namespace starling::cli
