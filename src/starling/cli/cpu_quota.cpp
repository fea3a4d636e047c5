#include "starling/cli/cpu_quota.h"

#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>

#include "starling/cli/number_list.h"
#include "starling/common/cgroup_cpu_limit.h"
#include "starling/common/error.h"

namespace starling::cli {
namespace fs = std::filesystem;
namespace {

// A 10 ms period rather than the kernel's 100 ms default: a process that spends its quota early is
// throttled until the period ends, and a peer stalled for 70 ms in the middle of a ring all-reduce
// would stall every other peer with it.
constexpr long kPeriodUs = 10000;

struct Hierarchy {
  fs::path root;
  bool v2 = false;
};

// Where the cpu controller is mounted (own_cpu_cgroup(): a v1 hierarchy with the "cpu" option,
// or else v2), for v2 only where its root offers the cpu controller.
std::optional<Hierarchy> find_hierarchy(std::string& why) {
  const auto cg = own_cpu_cgroup();
  bool offered = cg && !cg->v2;
  if (cg && cg->v2) {
    std::ifstream controllers(cg->mount / "cgroup.controllers");
    std::string list;
    std::getline(controllers, list);
    std::istringstream words(list);
    for (std::string w; words >> w;) offered = offered || w == "cpu";
  }
  if (!offered) {
    why = "no cgroup hierarchy with the cpu controller is mounted (/proc/self/mountinfo)";
    return std::nullopt;
  }
  return Hierarchy{cg->mount, cg->v2};
}

void write_file(const fs::path& file, const std::string& text) {
  std::ofstream out(file);
  out << text;
  out.flush();
  if (!out)
    throw Error("cannot write \"" + text + "\" to " + file.string() + ": " + std::strerror(errno));
}

}  // namespace

std::string CpuQuota::unavailable_reason() {
  std::string why;
  const auto h = find_hierarchy(why);
  if (!h) return why;
  if (::access(h->root.c_str(), W_OK) != 0)
    return "cannot create cgroups under " + h->root.string() + " (needs root)";
  return "";
}

CpuQuota::CpuQuota(const std::string& name, double cpus) {
  if (!(cpus > 0) || !std::isfinite(cpus))
    throw ConfigError("a CPU quota must be a positive number of CPUs, got " + std::to_string(cpus));
  std::string why;
  const auto h = find_hierarchy(why);
  if (!h) throw ConfigError("CPU quotas are unavailable: " + why);
  if (h->v2) {
    // The controller must be enabled for the root's children; harmless when it already is.
    std::ofstream(h->root / "cgroup.subtree_control") << "+cpu";
  }
  dir_ = h->root / name;
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) throw ConfigError("cannot create the cgroup " + dir_.string() + ": " + ec.message());
  const long quota = std::max(1000L, std::lround(cpus * kPeriodUs));
  if (h->v2) {
    write_file(dir_ / "cpu.max", std::to_string(quota) + " " + std::to_string(kPeriodUs));
  } else {
    write_file(dir_ / "cpu.cfs_period_us", std::to_string(kPeriodUs));
    write_file(dir_ / "cpu.cfs_quota_us", std::to_string(quota));
  }
}

CpuQuota::~CpuQuota() {
  // Fails (and is left for the system to clean) only if a process somehow outlived its swarm.
  if (!dir_.empty()) ::rmdir(dir_.c_str());
}

std::vector<std::string> CpuQuota::exec_prefix() const {
  // $$ is the shell's pid, which exec hands on to the program.
  return {"/bin/sh", "-c", "echo $$ > \"$0\" && exec \"$@\"", (dir_ / "cgroup.procs").string()};
}

std::vector<double> parse_peer_cpus(const std::string& list, int peers) {
  std::vector<double> cpus =
      parse_positive_numbers(list, "--peer-cpus", "a positive number of CPUs (e.g. 0.5 or 2)");
  if (cpus.size() == 1) cpus.assign(static_cast<size_t>(peers), cpus[0]);
  if (static_cast<int>(cpus.size()) != peers)
    throw ConfigError("--peer-cpus lists " + std::to_string(cpus.size()) + " values for " +
                      std::to_string(peers) + " peers; give one per peer, or one for all");
  return cpus;
}

}  // namespace starling::cli
