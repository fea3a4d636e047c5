// The swapper's buffers: a freed buffer serves the next tensor of its size, what is kept stays
// under the bound its owner sets, the caching CPU allocator's large blocks can become a swapped
// tensor's storage without a copy, and the pool's large buffers come from (and go back to) that
// allocator's cache.
#include "starling/swap/buffer_pool.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstdint>

#include "starling/common/cpu_runtime.h"
#include "starling/swap/swap_slot.h"
#include "starling/swap/tier.h"

namespace {

using namespace starling::swap;

bool page_aligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kSwapAlign == 0; }

TEST(BufferPool, AGivenBufferServesTheNextTakeOfItsSize) {
  BufferPool pool;
  at::DataPtr a = pool.take(1 << 20);
  void* first = a.get();
  EXPECT_TRUE(page_aligned(first));
  pool.give(std::move(a), 1 << 20);
  EXPECT_EQ(pool.kept(), 1 << 20);
  // A different size does not take it; the same size (after alignment) does.
  at::DataPtr other = pool.take(3 << 20);
  EXPECT_NE(other.get(), first);
  EXPECT_EQ(pool.kept(), 1 << 20);
  at::DataPtr again = pool.take((1 << 20) - 100);
  EXPECT_EQ(again.get(), first);
  EXPECT_EQ(pool.kept(), 0);
}

TEST(BufferPool, TrimKeepsAtMostTheBoundLargestFirst) {
  BufferPool pool;
  pool.give(pool.take(4 << 20), 4 << 20);
  pool.give(pool.take(1 << 20), 1 << 20);
  pool.give(pool.take(100), 100);  // small: one page, from the heap
  EXPECT_EQ(pool.kept(), (5 << 20) + static_cast<int64_t>(kSwapAlign));
  pool.trim(2 << 20);  // the 4 MB buffer goes
  EXPECT_EQ(pool.kept(), (1 << 20) + static_cast<int64_t>(kSwapAlign));
  pool.trim(-5);  // a negative bound keeps nothing
  EXPECT_EQ(pool.kept(), 0);
  pool.give(at::DataPtr(nullptr, c10::Device(c10::kCPU)), 1 << 20);  // ignored
  EXPECT_EQ(pool.kept(), 0);
}

TEST(BufferPool, CachedLargeBlocksAreKeptWithoutACopy) {
  starling::install_caching_cpu_allocator();
  at::Tensor big = at::arange(1 << 19, at::kFloat);  // 2 MiB: a cached block
  EXPECT_TRUE(page_aligned(big.data_ptr()));
  EXPECT_GE(starling::cached_cpu_block_bytes(big.data_ptr()), align_up(big.nbytes()));
  EXPECT_TRUE(can_keep_storage(big));
  // A view does not own its storage from the start; a small tensor is not a cached block.
  EXPECT_FALSE(can_keep_storage(big.narrow(0, 1024, 1024)));
  EXPECT_FALSE(can_keep_storage(at::ones({1000})));
  // Freed, the block is no longer handed out, and releasing the cache gives it back.
  void* data = big.data_ptr();
  big.reset();
  EXPECT_EQ(starling::cached_cpu_block_bytes(data), 0u);
  EXPECT_GE(starling::release_cached_cpu_blocks(), uint64_t{2} << 20);
  EXPECT_EQ(starling::caching_cpu_allocator_stats().cached_bytes, 0u);
}

// A buffer the pool lets go waits in the caching allocator's cache, still mapped: the next fresh
// buffer of its size is that block again, not a new mapping to fault in page by page.
TEST(BufferPool, ATrimmedBufferWaitsInTheAllocatorsCache) {
  starling::install_caching_cpu_allocator();
  BufferPool pool;
  const size_t bytes = size_t{3} << 20;
  at::DataPtr a = pool.take(bytes);
  EXPECT_TRUE(page_aligned(a.get()));
  EXPECT_GE(starling::cached_cpu_block_bytes(a.get()), bytes);  // a block the cache handed out
  pool.give(std::move(a), bytes);
  pool.trim(0);
  EXPECT_EQ(pool.kept(), 0);
  const auto before = starling::caching_cpu_allocator_stats();
  EXPECT_GE(before.cached_bytes, bytes);
  at::DataPtr again = pool.take(bytes);
  EXPECT_EQ(starling::caching_cpu_allocator_stats().hits, before.hits + 1);
  EXPECT_GE(starling::cached_cpu_block_bytes(again.get()), bytes);
  // Below a MiB the pool's own buffers serve, as without the cache.
  at::DataPtr small = pool.take(64 << 10);
  EXPECT_EQ(starling::cached_cpu_block_bytes(small.get()), 0u);
}

TEST(BufferPool, FreedStorageComesBackWithItsBytes) {
  BufferPool pool;
  at::Tensor t = at::arange(1 << 18, at::kFloat);
  const size_t bytes = t.nbytes();
  adopt_storage(t, pool.take(bytes));
  EXPECT_TRUE(page_aligned(t.data_ptr()));
  EXPECT_EQ(t[1000].item<float>(), 1000.0f);
  void* data = t.data_ptr();
  pool.give(free_storage(t), bytes);
  EXPECT_EQ(t.storage().nbytes(), 0u);
  allocate_storage(t, pool.take(bytes), bytes);
  EXPECT_EQ(t.data_ptr(), data);  // the same buffer, reused
}

}  // namespace
