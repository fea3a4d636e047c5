#include "starling/common/cpu_runtime.h"

#include <ATen/Parallel.h>
#include <c10/core/CPUAllocator.h>
#include <malloc.h>
#include <sched.h>
#include <sys/mman.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "starling/common/cgroup_cpu_limit.h"

namespace starling {

int logical_cpus() {
  cpu_set_t mask;
  CPU_ZERO(&mask);
  if (sched_getaffinity(0, sizeof mask, &mask) != 0) return 1;
  return std::max(1, CPU_COUNT(&mask));
}

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

double usable_cpus() {
  const double cpus = logical_cpus();
  const auto limit = cgroup_cpu_limit();
  return limit ? std::min(cpus, *limit) : cpus;
}

int default_threads() { return threads_within(physical_cores(), cgroup_cpu_limit()); }

int threads_within(int cores, std::optional<double> limit) {
  cores = std::max(1, cores);
  if (!limit) return cores;
  // A limit a hair above a whole number (rounding in the quota's microseconds) is that number.
  return std::clamp(static_cast<int>(std::ceil(*limit - 1e-3)), 1, cores);
}

int configure_threads(int requested) {
  const int n = requested > 0 ? requested : default_threads();
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

namespace {

// Blocks below this go to the system allocator: small blocks come from malloc's free lists
// without page faults anyway, and caching them would only fragment the cache.
constexpr size_t kMinCached = size_t{1} << 20;
// Large requests are rounded up to this granularity so that tensors of nearly equal size (e.g.
// the last, shorter micro-batch) share blocks.
constexpr size_t kGranule = size_t{1} << 20;
constexpr size_t kAlignment = 64;         // what libtorch's own CPU allocator guarantees
constexpr size_t kBlockAlignment = 4096;  // large blocks: a page, for O_DIRECT transfers
// Blocks of at least a huge page start on one and ask for transparent huge pages (where the
// kernel's policy is "madvise", the default on Debian). Their pages are then physically
// contiguous in 2 MiB runs: an O_DIRECT transfer from or into such a block reaches the disk as a
// few large requests instead of being cut at every 4 KiB page, which on a virtio disk raised
// the disk tier's read bandwidth 1.3-2x (docs/swap.md, bench/swap/tier_pages.cpp).
constexpr size_t kHugePage = size_t{2} << 20;

class CachingCpuAllocator final : public c10::Allocator {
 public:
  // libtorch declares allocate() const up to 2.2 and non-const from 2.3 on, when it also made
  // copy_data() pure virtual. Defining both overloads (without `override`) overrides whichever
  // the libtorch at hand declares, so one source builds against every version.
  c10::DataPtr allocate(size_t n) const { return allocate_block(n); }
  c10::DataPtr allocate(size_t n) { return allocate_block(n); }
  void copy_data(void* dest, const void* src, std::size_t count) const {
    std::memcpy(dest, src, count);
  }

  // raw_allocate()/raw_deallocate() (used by parts of libtorch 2.x) need a deleter that takes
  // only the pointer; release() recognises small blocks by their absence from the size table.
  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  CpuCacheStats stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_;
  }

  size_t block_bytes(const void* data) const {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = sizes_.find(const_cast<void*>(data));
    if (it == sizes_.end()) return 0;
    const auto f = free_.find(it->second);
    if (f != free_.end() && std::find(f->second.begin(), f->second.end(), data) != f->second.end())
      return 0;  // in the cache, not handed out
    return it->second;
  }

  uint64_t release_free() {
    std::lock_guard<std::mutex> lock(mutex_);
    uint64_t bytes = 0;
    for (auto& [size, blocks] : free_) {
      for (void* p : blocks) {
        sizes_.erase(p);
        std::free(p);
        bytes += size;
      }
      blocks.clear();
    }
    stats_.cached_bytes -= bytes;
    stats_.mapped_bytes -= bytes;
    return bytes;
  }

  static CachingCpuAllocator& instance() {
    static CachingCpuAllocator* a = new CachingCpuAllocator();  // lives until exit, by design
    return *a;
  }

 private:
  c10::DataPtr allocate_block(size_t n) const {
    if (n < kMinCached) {
      void* p = system_alloc(n == 0 ? 1 : n);
      return {p, p, &system_free, c10::Device(c10::DeviceType::CPU)};
    }
    const size_t size = (n + kGranule - 1) / kGranule * kGranule;
    void* p = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++stats_.allocations;
      auto it = free_.find(size);
      if (it != free_.end() && !it->second.empty()) {
        p = it->second.back();
        it->second.pop_back();
        ++stats_.hits;
        stats_.cached_bytes -= size;
      }
    }
    if (!p) {
      p = map_block(size);
      std::lock_guard<std::mutex> lock(mutex_);
      sizes_[p] = size;
      stats_.mapped_bytes += size;
    }
    return {p, p, &release, c10::Device(c10::DeviceType::CPU)};
  }

  static void* map_block(size_t size) {
    void* p = nullptr;
    const bool huge = size >= kHugePage;
    if (posix_memalign(&p, huge ? kHugePage : kBlockAlignment, size) != 0) throw std::bad_alloc();
    // Advice only: a kernel without transparent huge pages, or with them off, keeps small pages.
    if (huge) ::madvise(p, size / kHugePage * kHugePage, MADV_HUGEPAGE);
    return p;
  }

  static void* system_alloc(size_t n) {
    void* p = nullptr;
    if (posix_memalign(&p, kAlignment, n) != 0) throw std::bad_alloc();
    return p;
  }
  static void system_free(void* p) { std::free(p); }

  static void release(void* p) {
    auto& self = instance();
    std::lock_guard<std::mutex> lock(self.mutex_);
    const auto it = self.sizes_.find(p);
    if (it == self.sizes_.end()) {  // a small block from system_alloc()
      std::free(p);
      return;
    }
    const size_t size = it->second;
    self.free_[size].push_back(p);
    self.stats_.cached_bytes += size;
  }

  mutable std::mutex mutex_;
  mutable std::unordered_map<size_t, std::vector<void*>> free_;  // block size -> free blocks
  mutable std::unordered_map<void*, size_t> sizes_;              // every large block ever made
  mutable CpuCacheStats stats_;
};

}  // namespace

namespace {
std::atomic<bool> g_caching_installed{false};
}  // namespace

void install_caching_cpu_allocator() {
  static const bool installed = [] {
    // Priority above the default allocator's, so nothing later silently replaces it.
    c10::SetCPUAllocator(&CachingCpuAllocator::instance(), /*priority=*/10);
    g_caching_installed = true;
    return true;
  }();
  (void)installed;
}

bool caching_cpu_allocator_installed() { return g_caching_installed; }

CpuCacheStats caching_cpu_allocator_stats() { return CachingCpuAllocator::instance().stats(); }

size_t cached_cpu_block_bytes(const void* data) {
  return CachingCpuAllocator::instance().block_bytes(data);
}

uint64_t release_cached_cpu_blocks() {
  const uint64_t bytes = CachingCpuAllocator::instance().release_free();
  // Blocks glibc kept in its heap (below its mmap threshold) go back too.
  ::malloc_trim(0);
  return bytes;
}

int setup_cpu_runtime(int threads, bool system_allocator) {
  const int n = configure_threads(threads);
  if (!system_allocator) install_caching_cpu_allocator();
  return n;
}

}  // namespace starling
