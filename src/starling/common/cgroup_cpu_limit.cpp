#include "starling/common/cgroup_cpu_limit.h"

#include <fstream>
#include <iterator>
#include <sstream>
#include <vector>

namespace starling {
namespace fs = std::filesystem;
namespace {

std::string read_text(const fs::path& file) {
  std::ifstream in(file);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// mountinfo writes a space, tab, newline or backslash in a path as a three-digit octal escape.
std::string unescape(const std::string& s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    const auto octal = [&](size_t j) { return s[j] >= '0' && s[j] <= '7'; };
    if (s[i] == '\\' && i + 3 < s.size() && octal(i + 1) && octal(i + 2) && octal(i + 3)) {
      out += static_cast<char>(std::stoi(s.substr(i + 1, 3), nullptr, 8));
      i += 3;
    } else {
      out += s[i];
    }
  }
  return out;
}

bool lists(const std::string& comma_list, const std::string& item) {
  std::istringstream in(comma_list);
  for (std::string w; std::getline(in, w, ',');)
    if (w == item) return true;
  return false;
}

// The cgroup's path for the v1 hierarchy holding `controller`, or for v2 (controller "").
std::optional<std::string> cgroup_path(const std::string& proc_cgroup,
                                       const std::string& controller) {
  std::istringstream lines(proc_cgroup);
  for (std::string line; std::getline(lines, line);) {
    const size_t a = line.find(':');
    const size_t b = a == std::string::npos ? a : line.find(':', a + 1);
    if (b == std::string::npos) continue;
    const std::string controllers = line.substr(a + 1, b - a - 1);
    const bool match = controller.empty() ? line.compare(0, a, "0") == 0 && controllers.empty()
                                          : lists(controllers, controller);
    if (match) return line.substr(b + 1);
  }
  return std::nullopt;
}

struct Mount {
  std::string root, point;
};

// The mount of the v1 hierarchy with the cpu controller, or of cgroup v2 (`v2`).
std::optional<Mount> cgroup_mount(const std::string& mountinfo, bool v2) {
  std::istringstream lines(mountinfo);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream in(line);
    std::vector<std::string> f;
    for (std::string w; in >> w;) f.push_back(w);
    // id parent major:minor root point options [optional fields...] - type source super-options
    size_t dash = 6;
    while (dash < f.size() && f[dash] != "-") ++dash;
    if (dash + 1 >= f.size()) continue;
    const std::string& type = f[dash + 1];
    const bool hit = v2 ? type == "cgroup2"
                        : type == "cgroup" && dash + 3 < f.size() && lists(f[dash + 3], "cpu");
    if (hit) return Mount{unescape(f[3]), unescape(f[4])};
  }
  return std::nullopt;
}

std::optional<double> positive_ratio(double quota, double period) {
  if (!(quota > 0) || !(period > 0)) return std::nullopt;
  return quota / period;
}

// This directory's own limit.
std::optional<double> limit_in(const fs::path& dir, bool v2) {
  try {
    if (v2) {
      std::istringstream in(read_text(dir / "cpu.max"));
      std::string quota;
      double period = 0;
      if (!(in >> quota >> period) || quota == "max") return std::nullopt;
      return positive_ratio(std::stod(quota), period);
    }
    const std::string quota = read_text(dir / "cpu.cfs_quota_us");
    const std::string period = read_text(dir / "cpu.cfs_period_us");
    if (quota.empty() || period.empty()) return std::nullopt;
    return positive_ratio(std::stod(quota), std::stod(period));
  } catch (const std::exception&) {  // std::stod on text that is no number
    return std::nullopt;
  }
}

}  // namespace

std::optional<CpuCgroup> find_cpu_cgroup(const std::string& proc_cgroup,
                                         const std::string& mountinfo) {
  for (const bool v2 : {false, true}) {
    const auto path = cgroup_path(proc_cgroup, v2 ? "" : "cpu");
    const auto mount = cgroup_mount(mountinfo, v2);
    if (!path || !mount) continue;
    // The mount shows the hierarchy from `root` down (a container's own cgroup, say); a path
    // outside it (a cgroup namespace shows "/") is the mount's top.
    const fs::path rel = fs::path(*path).lexically_relative(mount->root);
    fs::path dir = mount->point;
    if (!rel.empty() && *rel.begin() != "..")
      for (const auto& part : rel)
        if (part != ".") dir /= part;
    return CpuCgroup{mount->point, dir, v2};
  }
  return std::nullopt;
}

std::optional<double> cpu_limit_under(const CpuCgroup& cg) {
  std::optional<double> tightest;
  const fs::path top = cg.mount.lexically_normal();
  for (fs::path dir = cg.dir.lexically_normal();; dir = dir.parent_path()) {
    if (const auto limit = limit_in(dir, cg.v2); limit && (!tightest || *limit < *tightest))
      tightest = limit;
    if (dir == top || dir == dir.parent_path() || dir.native().size() <= top.native().size()) break;
  }
  return tightest;
}

std::optional<CpuCgroup> own_cpu_cgroup() {
  return find_cpu_cgroup(read_text("/proc/self/cgroup"), read_text("/proc/self/mountinfo"));
}

std::optional<double> cgroup_cpu_limit() {
  const auto cg = own_cpu_cgroup();
  return cg ? cpu_limit_under(*cg) : std::nullopt;
}

std::optional<double> top_cgroup_cpu_limit() {
  const auto cg = own_cpu_cgroup();
  return cg ? cpu_limit_under({cg->mount, cg->mount, cg->v2}) : std::nullopt;
}

}  // namespace starling
