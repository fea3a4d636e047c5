// The caching CPU allocator: large blocks are reused instead of returned to the OS, small ones
// are left to the system, and tensors built on it compute what they should.
#include "starling/common/cpu_runtime.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace starling {
namespace {

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

}  // namespace
}  // namespace starling
