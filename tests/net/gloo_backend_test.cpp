// GlooBackend: three ranks as three threads of this process on loopback, each with its own
// backend (rank 0 hosts the store). Every collective is checked against values computed here.
// Inputs are small integers, so every summation order gives the exact same fp32 result.
#include "starling/net/gloo_backend.h"

#include <gtest/gtest.h>

#include <functional>
#include <future>
#include <thread>
#include <vector>

#include "starling/common/error.h"

namespace starling::net {
namespace {

constexpr int kWorld = 3;

float value(int rank, size_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + rank * 5) % 19) - 9);
}

std::vector<float> input(int rank, size_t count) {
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = value(rank, i);
  return v;
}

// Runs body(backend) on kWorld ranks at once; rethrows the first failure of any rank (a
// gtest assertion failure inside a thread is recorded by gtest itself).
void run_ranks(const std::function<void(GlooBackend&)>& body) {
  std::promise<uint16_t> port_promise;
  std::shared_future<uint16_t> port = port_promise.get_future().share();
  std::vector<std::future<void>> ranks;
  for (int r = 0; r < kWorld; ++r) {
    ranks.push_back(std::async(std::launch::async, [&, r] {
      GlooOptions o;
      o.rank = r;
      o.world_size = kWorld;
      o.interface = "127.0.0.1";
      o.timeout = std::chrono::seconds(30);
      if (r == 0) {
        o.store = "127.0.0.1:0";
        o.on_store_listening = [&](uint16_t p) { port_promise.set_value(p); };
      } else {
        if (port.wait_for(std::chrono::seconds(30)) != std::future_status::ready)
          throw std::runtime_error("rank 0 never reported its store port");
        o.store = "127.0.0.1:" + std::to_string(port.get());
      }
      GlooBackend backend(o);
      body(backend);
    }));
  }
  for (auto& f : ranks) f.get();
}

TEST(GlooBackend, AllReduceSumAndMean) {
  const size_t count = 1001;
  run_ranks([&](GlooBackend& b) {
    EXPECT_EQ(b.backend_name(), "gloo");
    auto data = input(b.rank(), count);
    CollectiveOptions o;
    const CollectiveResult r = b.all_reduce(data, o).wait();
    EXPECT_EQ(r.ring, (std::vector<PeerId>{0, 1, 2}));
    EXPECT_EQ(r.position, b.rank());
    for (size_t i = 0; i < count; ++i)
      ASSERT_EQ(data[i], value(0, i) + value(1, i) + value(2, i))
          << "rank " << b.rank() << " i " << i;

    data = input(b.rank(), count);
    o.op = ReduceOp::mean;
    b.all_reduce(data, o).wait();
    for (size_t i = 0; i < count; ++i)
      ASSERT_EQ(data[i], (value(0, i) + value(1, i) + value(2, i)) / 3.0f) << "i " << i;
  });
}

TEST(GlooBackend, ReduceScatterKeepsOwnShard) {
  const size_t count = 1000;  // not a multiple of 3: shards of 333, 333 and 334
  run_ranks([&](GlooBackend& b) {
    auto data = input(b.rank(), count);
    CollectiveOptions o;
    o.op = ReduceOp::mean;
    const CollectiveResult r = b.reduce_scatter(data, o).wait();
    const Shard want = shard_of(count, kWorld, b.rank());
    EXPECT_EQ(r.shard.begin, want.begin);
    EXPECT_EQ(r.shard.end, want.end);
    for (size_t i = want.begin; i < want.end; ++i)
      ASSERT_EQ(data[i], (value(0, i) + value(1, i) + value(2, i)) / 3.0f) << "i " << i;
  });
}

TEST(GlooBackend, AllGatherEvenAndUnevenShards) {
  for (size_t count : {999, 1000, 2}) {  // 2 < world: one rank owns nothing
    run_ranks([&](GlooBackend& b) {
      std::vector<float> data(count, -100.0f);  // only our shard holds our values
      const Shard own = shard_of(count, kWorld, b.rank());
      for (size_t i = own.begin; i < own.end; ++i) data[i] = value(b.rank(), i);
      b.all_gather(data, {}).wait();
      for (int p = 0; p < kWorld; ++p) {
        const Shard s = shard_of(count, kWorld, p);
        for (size_t i = s.begin; i < s.end; ++i)
          ASSERT_EQ(data[i], value(p, i))
              << "count " << count << " rank " << b.rank() << " i " << i;
      }
    });
  }
}

TEST(GlooBackend, BroadcastFromEveryRoot) {
  const size_t count = 777;
  run_ranks([&](GlooBackend& b) {
    for (int root = 0; root < kWorld; ++root) {
      auto data = input(b.rank(), count);
      CollectiveOptions o;
      o.root = static_cast<PeerId>(root);
      b.broadcast(data, o).wait();
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(data[i], value(root, i)) << "root " << root;
    }
  });
}

TEST(GlooBackend, OverlappingLaunchesCompleteInOrder) {
  // Several operations in flight at once, as a training loop overlapping compute would have.
  const size_t count = 4096;
  run_ranks([&](GlooBackend& b) {
    std::vector<std::vector<float>> buffers;
    for (int k = 0; k < 4; ++k) buffers.push_back(input((b.rank() + k) % kWorld, count));
    std::vector<Work> works;
    for (auto& buf : buffers) works.push_back(b.all_reduce(buf, {}));
    for (auto& w : works) w.wait();
    for (const auto& buf : buffers)
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(buf[i], value(0, i) + value(1, i) + value(2, i));
  });
}

TEST(GlooBackend, RefusesWhatGlooCannotDo) {
  run_ranks([&](GlooBackend& b) {
    std::vector<float> data(16, 1.0f);
    CollectiveOptions o;
    o.precision = WirePrecision::int8;
    EXPECT_THROW(b.all_reduce(data, o), NetError);
    o.precision = WirePrecision::fp32;
    o.root = kWorld;
    EXPECT_THROW(b.broadcast(data, o), NetError);
    o.root = 0;
    o.group = {0, 1};  // a subset of the ranks
    EXPECT_THROW(b.all_reduce(data, o), NetError);
    o.group = {2, 1, 0};  // all of them, in any order: fine
    b.all_reduce(data, o).wait();
    EXPECT_EQ(data[0], 3.0f);
    data.assign(16, 1.0f);
    // The group is still usable after refused calls (they never reached Gloo).
    b.all_reduce(data, {}).wait();
    EXPECT_EQ(data[0], 3.0f);
  });
}

TEST(GlooBackend, IsAFixedGroupOfRanks) {
  run_ranks([](GlooBackend& b) {
    EXPECT_EQ(b.self(), static_cast<PeerId>(b.rank()));
    EXPECT_FALSE(b.elastic());
    EXPECT_EQ(b.buffers(), BufferPlace::host);
    EXPECT_EQ(b.joined_at_ms(), 0);  // rank order stands for seniority
    EXPECT_EQ(b.bytes_sent(), 0u);
    std::vector<float> data(300, 1.0f);
    b.all_reduce(data, {}).wait();
    // A ring all-reduce sends 2 (n-1)/n of the buffer: 2 * 2/3 * 1200 bytes.
    EXPECT_EQ(b.bytes_sent(), 1600u);
  });
}

TEST(GlooBackend, RejectsBadOptions) {
  GlooOptions o;
  o.rank = 3;
  o.world_size = 3;
  EXPECT_THROW(GlooBackend{o}, ConfigError);
  o.rank = 1;
  o.store = "127.0.0.1:0";
  EXPECT_THROW(GlooBackend{o}, ConfigError);
  o.store = "no-port";
  EXPECT_THROW(GlooBackend{o}, ConfigError);
}

TEST(GlooBackend, UnreachableStoreFailsWithinTimeout) {
  GlooOptions o;
  o.rank = 1;
  o.world_size = 2;
  o.store = "127.0.0.1:1";  // nothing listens on port 1
  o.timeout = std::chrono::milliseconds(1500);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(GlooBackend{o}, NetError);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
}

}  // namespace
}  // namespace starling::net
