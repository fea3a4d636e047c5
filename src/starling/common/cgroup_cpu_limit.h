// The CPU time a cgroup lets this process use: a container started with `--cpus 2`, a systemd
// unit's CPUQuota=, or a local swarm's `--peer-cpus`. The affinity mask does not show such a
// limit (the process may run on every core, only not all the time), so a thread count taken from
// the cores alone would start more threads than the quota can run: they are throttled together
// at the end of each period, and a thread stalled in a parallel region stalls the others.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

namespace starling {

// The tightest CPU bandwidth limit on this process's cgroup and the cgroups above it, in CPUs
// (quota / period: 1.5 = one and a half cores' worth of time), from the cpu controller's cgroup
// v1 hierarchy or else cgroup v2. nullopt where none is set or none can be read: no limit.
std::optional<double> cgroup_cpu_limit();

// The limit at the top of the hierarchy this process sees (its mount point: a container's own
// cgroup, under a cgroup namespace), which binds every cgroup made there, as a local swarm's
// peers' are (cli/cpu_quota.h), whatever limit this process's own cgroup has below it.
std::optional<double> top_cgroup_cpu_limit();

// Where this process's cgroup of the cpu controller lies: `mount` (the hierarchy's mount point
// in this mount namespace) and `dir` (the cgroup's directory under it).
struct CpuCgroup {
  std::filesystem::path mount;
  std::filesystem::path dir;
  bool v2 = false;
};

// This process's, from /proc/self (find_cpu_cgroup()); cli/cpu_quota.h makes its cgroups under
// the mount point. For v2 it does not check that the cpu controller is enabled there.
std::optional<CpuCgroup> own_cpu_cgroup();

// The parts, for tests.

// From the text of /proc/self/cgroup and /proc/self/mountinfo: the v1 hierarchy with the cpu
// controller if one is mounted, else the v2 one; nullopt if neither is (or the texts name none).
std::optional<CpuCgroup> find_cpu_cgroup(const std::string& proc_cgroup,
                                         const std::string& mountinfo);

// The tightest limit from `cg.dir` up to `cg.mount`: v2's cpu.max ("max 100000" or "150000
// 100000"), v1's cpu.cfs_quota_us (-1: none) over cpu.cfs_period_us. Unreadable or malformed
// files count as no limit.
std::optional<double> cpu_limit_under(const CpuCgroup& cg);

}  // namespace starling
