// The caching CPU allocator: large blocks are reused instead of returned to the OS, small ones
// are left to the system, and tensors built on it compute what they should.
#include "starling/common/cpu_runtime.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace starling {
namespace {

// Default threads: the cores, within a cgroup's CPU limit rounded up, never 0.
TEST(DefaultThreads, StayWithinACpuLimit) {
  EXPECT_EQ(threads_within(8, std::nullopt), 8);
  EXPECT_EQ(threads_within(8, 0.3), 1);
  EXPECT_EQ(threads_within(8, 1.0), 1);
  EXPECT_EQ(threads_within(8, 1.0005), 1);  // a quota's rounding in microseconds
  EXPECT_EQ(threads_within(8, 1.5), 2);
  EXPECT_EQ(threads_within(8, 64), 8);
  EXPECT_EQ(threads_within(0, 2.0), 1);
  EXPECT_LE(default_threads(), physical_cores());
  EXPECT_GE(default_threads(), 1);
}

TEST(CachingCpuAllocator, ReusesFreedLargeBlocks) {
  install_caching_cpu_allocator();
  const auto before = caching_cpu_allocator_stats();
  { at::Tensor a = at::empty({1 << 20}); }  // 4 MiB, freed at once
  at::Tensor b = at::empty({1 << 20});      // same size: served from the cache
  const auto after = caching_cpu_allocator_stats();
  EXPECT_EQ(after.allocations - before.allocations, 2u);
  EXPECT_GE(after.hits - before.hits, 1u);
  EXPECT_GE(after.mapped_bytes, uint64_t{4} << 20);
}

TEST(CachingCpuAllocator, SmallTensorsBypassTheCache) {
  install_caching_cpu_allocator();
  const auto before = caching_cpu_allocator_stats();
  at::Tensor small = at::ones({1000});
  EXPECT_EQ(caching_cpu_allocator_stats().allocations, before.allocations);
  EXPECT_EQ(small.sum().item<float>(), 1000.0f);
}

TEST(CachingCpuAllocator, BlocksOfNearlyEqualSizeAreShared) {
  install_caching_cpu_allocator();
  { at::Tensor a = at::empty({(3 << 20) / 4 + 100}); }  // just over 3 MiB
  const auto before = caching_cpu_allocator_stats();
  at::Tensor b = at::empty({(3 << 20) / 4 + 7});  // a different size in the same 1 MiB granule
  EXPECT_EQ(caching_cpu_allocator_stats().hits - before.hits, 1u);
}

TEST(CachingCpuAllocator, TensorsAreCorrectAndAligned) {
  install_caching_cpu_allocator();
  for (int round = 0; round < 3; ++round) {
    at::Tensor x = at::arange(1 << 19, at::kFloat);
    at::Tensor y = x * 2 + 1;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(y.data_ptr()) % 64, 0u);
    EXPECT_DOUBLE_EQ(y[12345].item<double>(), 2 * 12345 + 1);
    EXPECT_DOUBLE_EQ(y.sum().item<double>(), (double(1 << 19) - 1) * (1 << 19) + (1 << 19));
  }
}

// Blocks of a huge page or more start on one, so the kernel can back them with huge pages (whether
// it does is its policy's choice); smaller large blocks need only a page, for O_DIRECT.
TEST(CachingCpuAllocator, BlocksOfAHugePageStartOnOne) {
  install_caching_cpu_allocator();
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  std::vector<at::Tensor> held;  // fresh blocks, not ones the cache hands back
  for (int64_t mib : {2, 3, 6, 17}) {
    held.push_back(at::empty({mib << 18}));  // mib MiB of floats
    EXPECT_EQ(reinterpret_cast<uintptr_t>(held.back().data_ptr()) % kHuge, 0u) << mib << " MiB";
    EXPECT_EQ(cached_cpu_block_bytes(held.back().data_ptr()), static_cast<size_t>(mib) << 20);
  }
  held.push_back(at::empty({1 << 18}));  // 1 MiB
  EXPECT_EQ(reinterpret_cast<uintptr_t>(held.back().data_ptr()) % 4096, 0u);
}

}  // namespace
}  // namespace starling
