// The CPU side of the runtime: thread counts for libtorch and the BLAS under it, and the memory
// allocator for CPU tensors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>

namespace starling {

// Physical cores this process may run on (affinity mask, hyperthread siblings counted once).
int physical_cores();

// Logical CPUs this process may run on (its affinity mask): what a CPU quota counts.
int logical_cpus();

// The CPUs' worth of time this process may use: logical_cpus(), or its cgroup's CPU limit where
// that is less (cgroup_cpu_limit.h; 1.5 = one and a half cores).
double usable_cpus();

// The default intra-op thread count: physical_cores(), but no more than a cgroup's CPU limit
// rounded up (a container with `--cpus 2` on a 64-core host runs 2, a quota of 0.3 CPU runs 1).
int default_threads();
// That rule: `cores` within `limit` (CPUs), rounded up, at least 1.
int threads_within(int cores, std::optional<double> limit);

// Sets intra-op threads to `requested`, or to default_threads() when it is 0; inter-op threads to
// 1 (one executor runs nodes in order). OpenBLAS's OpenMP build shares this pool, so the one
// setting governs both. Returns the number set. Safe to call more than once.
int configure_threads(int requested);

// Makes CPU tensors of at least 1 MiB come from a cache of freed blocks instead of the system
// allocator. libtorch's default CPU allocator hands every large tensor back to the OS when it is
// freed, so each training step faults its activations in afresh, page by page; on virtual
// machines a 16 MiB activation can cost ten times the kernel that fills it. The cache keeps the
// step's working set mapped. Blocks of 2 MiB or more start on a 2 MiB boundary and ask for
// transparent huge pages: an O_DIRECT transfer from or into one reaches the disk in few segments
// (docs/swap.md). Idempotent; call before the model is built so its tensors use it.
void install_caching_cpu_allocator();

// Whether install_caching_cpu_allocator() ran: CPU tensors of 1 MiB or more come from its cache.
bool caching_cpu_allocator_installed();

struct CpuCacheStats {
  uint64_t allocations = 0;   // large allocations requested
  uint64_t hits = 0;          // served from the cache
  uint64_t cached_bytes = 0;  // bytes held in free blocks now
  uint64_t mapped_bytes = 0;  // bytes of all large blocks (in use + cached)
};
CpuCacheStats caching_cpu_allocator_stats();

// The cache's blocks are page-aligned (4096 bytes) and span whole MiBs. If `data` is the start of
// a block the cache handed out and has not taken back, returns the block's bytes; otherwise 0.
// A swapped tensor can keep such a block as its storage (the disk tier's O_DIRECT transfers need
// the alignment) instead of being copied into one.
size_t cached_cpu_block_bytes(const void* data);

// Gives the cache's free blocks back to the system and returns their bytes. For after a one-off
// pass (the swap planner's profiling) whose blocks the steps will not ask for again.
uint64_t release_cached_cpu_blocks();

// configure_threads(threads), then install_caching_cpu_allocator() unless `system_allocator`.
int setup_cpu_runtime(int threads, bool system_allocator = false);

}  // namespace starling
