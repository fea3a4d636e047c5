// NcclBackend on the one GPU a test machine has: a group of one rank, so every operation's result
// is this rank's own data (NCCL refuses two ranks on one GPU). What it checks is the part
// Starling adds: spans of device memory in and out, completion reported without stalling the
// caller's stream, refused options, and the group's identity. Multi-rank arithmetic is c10d's,
// and the same strategy code is checked across ranks over Gloo (swarm_cli_test).
#include "starling/net/nccl_backend.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "starling/common/error.h"

namespace starling::net {
namespace {

class NcclBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!nccl_available()) GTEST_SKIP() << "this libtorch has no NCCL";
    if (!at::hasCUDA()) GTEST_SKIP() << "no GPU";
    NcclOptions o;
    o.timeout = std::chrono::seconds(60);
    group_ = make_nccl_backend(o);
  }

  static std::span<float> span_of(at::Tensor& t) {
    return {t.data_ptr<float>(), static_cast<size_t>(t.numel())};
  }

  std::unique_ptr<Collectives> group_;
};

TEST_F(NcclBackendTest, IsAFixedGroupWorkingOnDeviceMemory) {
  EXPECT_EQ(group_->backend_name(), "nccl");
  EXPECT_EQ(group_->self(), 0u);
  EXPECT_FALSE(group_->elastic());
  EXPECT_EQ(group_->buffers(), BufferPlace::device);
  EXPECT_EQ(group_->joined_at_ms(), 0);
}

TEST_F(NcclBackendTest, EveryOperationRunsOnTheGpusData) {
  const at::Tensor expected = at::arange(1001, at::kFloat).cuda();
  for (const auto kind : {CollectiveKind::all_reduce, CollectiveKind::reduce_scatter,
                          CollectiveKind::all_gather, CollectiveKind::broadcast}) {
    SCOPED_TRACE(to_string(kind));
    at::Tensor data = expected.clone();
    CollectiveOptions o;
    o.op = ReduceOp::mean;
    Work w;
    switch (kind) {
      case CollectiveKind::all_reduce:
        w = group_->all_reduce(span_of(data), o);
        break;
      case CollectiveKind::reduce_scatter:
        w = group_->reduce_scatter(span_of(data), o);
        break;
      case CollectiveKind::all_gather:
        w = group_->all_gather(span_of(data), o);
        break;
      case CollectiveKind::broadcast:
        w = group_->broadcast(span_of(data), o);
        break;
    }
    const CollectiveResult r = w.wait();
    EXPECT_EQ(r.ring, std::vector<PeerId>{0});
    EXPECT_EQ(r.shard.begin, 0u);
    EXPECT_EQ(r.shard.end, 1001u);
    EXPECT_TRUE(at::equal(data, expected));
  }
}

TEST_F(NcclBackendTest, CompletionIsReportedAfterTheQueuedWork) {
  // A long matmul chain queued before the launch: NCCL's stream waits for it, so the sum must
  // see its final value, and test() must not claim completion before the GPU got there.
  at::Tensor a = at::full({2048, 2048}, 1.0f / 2048, at::kCUDA);
  at::Tensor data = at::zeros({1 << 20}, at::kCUDA);
  for (int i = 0; i < 20; ++i) a = at::mm(a, a);
  data.fill_(1.0f).mul_(a.sum() / a.sum());  // queued after the chain, on the same stream
  Work w = group_->all_reduce(span_of(data), {});
  w.wait();
  EXPECT_TRUE(w.test());
  EXPECT_EQ(data.sum().item<double>(), static_cast<double>(1 << 20));
}

TEST_F(NcclBackendTest, RefusesWhatNcclDoesNotDoHere) {
  at::Tensor data = at::ones({16}, at::kCUDA);
  CollectiveOptions o;
  o.precision = WirePrecision::bf16;
  EXPECT_THROW(group_->all_reduce(span_of(data), o), NetError);
  o.precision = WirePrecision::fp32;
  o.root = 1;
  EXPECT_THROW(group_->broadcast(span_of(data), o), NetError);
  group_->all_reduce(span_of(data), {}).wait();  // still usable
  EXPECT_EQ(data.sum().item<float>(), 16.0f);
}

// Runs everywhere: a build without NCCL says so, one with NCCL names the missing device.
TEST(NcclBackend, BadOptionsAreClearErrors) {
  NcclOptions o;
  o.device_index = 99;
  EXPECT_THROW(make_nccl_backend(o), ConfigError);
}

}  // namespace
}  // namespace starling::net
