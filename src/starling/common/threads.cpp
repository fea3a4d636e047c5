#include "starling/common/threads.h"

#include <ATen/Parallel.h>
#include <sched.h>

#include <fstream>
#include <set>
#include <string>
#include <utility>

namespace starling {

int physical_cores() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof mask, &mask) != 0) return 1;
  std::set<std::pair<int, int>> cores;  // (package, core) pairs seen
  int logical = 0;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &mask)) continue;
    ++logical;
    const std::string base = "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/";
    std::ifstream core(base + "core_id"), pkg(base + "physical_package_id");
    int c = cpu, p = 0;
    if (core) core >> c;
    if (pkg) pkg >> p;
    cores.insert({p, c});
  }
  const int n = cores.empty() ? logical : static_cast<int>(cores.size());
  return n > 0 ? n : 1;
}

int configure_threads(int requested) {
  const int n = requested > 0 ? requested : physical_cores();
  at::set_num_threads(n);
  // Inter-op threads can only be set before the first parallel work; later calls are no-ops.
  static const bool interop_set = [] {
    try {
      at::set_num_interop_threads(1);
    } catch (...) {
    }
    return true;
  }();
  (void)interop_set;
  return n;
}

}  // namespace starling
