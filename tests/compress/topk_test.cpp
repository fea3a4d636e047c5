// Top-k sparsification of pipeline tensors: what is kept, the sparse message, and error feedback.
#include "starling/compress/topk.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <string>

#include "starling/common/error.h"
#include "starling/strategy/tensor_message.h"

namespace {

using starling::compress::ErrorFeedback;
using starling::compress::kept_entries;
using starling::compress::top_k;
using starling::strategy::decode_tensor;
using starling::strategy::encode_sparse_tensor;
using starling::strategy::TensorExpectation;
using starling::strategy::TensorKind;

TEST(TopK, KeepsTheLargestMagnitudesInIndexOrder) {
  const at::Tensor t = at::tensor({0.5f, -3.f, 0.1f, 2.f, -0.2f, 1.f}).reshape({2, 3});
  const auto kept = top_k(t, 3);
  EXPECT_TRUE(at::equal(kept.indices, at::tensor({1, 3, 5}, at::kInt)));
  EXPECT_TRUE(at::equal(kept.values, at::tensor({-3.f, 2.f, 1.f})));
  const at::Tensor dense = starling::compress::densify(kept, {2, 3}, at::kFloat);
  EXPECT_TRUE(at::equal(dense, at::tensor({0.f, -3.f, 0.f, 2.f, 0.f, 1.f}).reshape({2, 3})));
  EXPECT_EQ(top_k(t, 6).indices.numel(), 6);
  EXPECT_EQ(top_k(t, 0).indices.numel(), 0);
  EXPECT_THROW(top_k(t, 7), std::invalid_argument);
  EXPECT_EQ(kept_entries(1000, 0.1), 100);
  EXPECT_EQ(kept_entries(1000, 1e-9), 1);
  EXPECT_EQ(kept_entries(10, 3.0), 10);
}

// Over several gradients of one edge, what was sent plus what is still kept back is exactly
// what came in: nothing is dropped, only delayed.
TEST(TopK, ErrorFeedbackSendsEverythingInTheEnd) {
  ErrorFeedback feedback;
  at::Tensor sent = at::zeros({64});
  at::Tensor total = at::zeros({64});
  for (int i = 0; i < 10; ++i) {
    const at::Tensor g = at::randn({64});
    total += g;
    const auto kept = feedback.compress(7, g, 8);
    EXPECT_EQ(kept.indices.numel(), 8);
    sent += starling::compress::densify(kept, {64}, at::kFloat);
  }
  EXPECT_TRUE(at::allclose(sent + feedback.residual(7), total, 1e-5, 1e-6));
  // Another edge keeps its own residual.
  EXPECT_FALSE(feedback.residual(8).defined());
}

TEST(TensorMessage, ASparseMessageCarriesTheKeptEntriesAndRefusesBadOnes) {
  const at::Tensor t = at::randn({4, 8});
  const auto kept = top_k(t, 5);
  const auto bytes = encode_sparse_tensor({TensorKind::activation, 2, 1, 3}, t.sizes(), kept);
  const TensorExpectation want{
      .label = {TensorKind::activation, 2, 1, 3}, .shape = {4, 8}, .dtypes = {at::kFloat}};
  const at::Tensor back = decode_tensor(bytes, want, "P");
  EXPECT_TRUE(at::equal(back, starling::compress::densify(kept, {4, 8}, at::kFloat)));
  EXPECT_LT(bytes.size(), static_cast<size_t>(t.numel()) * 4);

  const auto error_of = [&](std::vector<uint8_t> b) {
    try {
      decode_tensor(b, want, "stage 0 (peer ab12)");
    } catch (const starling::NetError& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const size_t header = 24 + 8 * 2;  // magic .. node, then two dims
  auto descending = bytes;
  std::swap(descending[header + 8], descending[header + 12]);  // first two indices
  EXPECT_NE(error_of(descending).find("not ascending"), std::string::npos);
  auto outside = bytes;
  outside[header + 8 + 4 * 4 + 3] = 0x7f;  // the last index becomes huge
  EXPECT_NE(error_of(outside).find("not ascending inside"), std::string::npos);
  auto count = bytes;
  count[header] = 200;
  EXPECT_NE(error_of(count).find("kept entries of 32"), std::string::npos);
  auto cut = bytes;
  cut.pop_back();
  EXPECT_NE(error_of(cut).find("stage 0 (peer ab12)"), std::string::npos);
  auto flags = bytes;
  flags[7] = 4;
  EXPECT_NE(error_of(flags).find("unknown flags"), std::string::npos);
}

// An int8-coded activation carries every entry within half a quantization step of its group's
// scale, in about a quarter of the bytes.
TEST(TensorMessage, AnInt8MessageCarriesEveryEntryCloselyInAQuarterOfTheBytes) {
  const at::Tensor t = at::randn({4, 300});
  const auto bytes = starling::strategy::encode_int8_tensor({TensorKind::activation, 1, 0, 2}, t);
  const TensorExpectation want{
      .label = {TensorKind::activation, 1, 0, 2}, .shape = {4, 300}, .dtypes = {at::kFloat}};
  const at::Tensor back = decode_tensor(bytes, want, "P");
  const double step = t.abs().max().item<double>() / 127;
  EXPECT_LE((back - t).abs().max().item<double>(), step / 2 + 1e-6);
  EXPECT_LT(bytes.size(), static_cast<size_t>(t.numel()) * 4 / 3);
  auto cut = bytes;
  cut.pop_back();
  EXPECT_THROW(decode_tensor(cut, want, "P"), starling::NetError);
}

// An int4-coded gradient: every entry within half a step of its group's scale (absmax / 7 of 64
// entries), in about a seventh of the bytes; a truncated one, or one claiming to be bf16, refused.
TEST(TensorMessage, AnInt4MessageCarriesEveryEntryInASeventhOfTheBytes) {
  const at::Tensor t = at::randn({4, 300});
  const auto bytes = starling::strategy::encode_int4_tensor({TensorKind::gradient, 1, 0, 2}, t);
  const TensorExpectation want{
      .label = {TensorKind::gradient, 1, 0, 2}, .shape = {4, 300}, .dtypes = {at::kFloat}};
  const at::Tensor back = decode_tensor(bytes, want, "P");
  const double step = t.abs().max().item<double>() / 7;
  EXPECT_LE((back - t).abs().max().item<double>(), step / 2 + 1e-6);
  EXPECT_LT(bytes.size(), static_cast<size_t>(t.numel()) * 4 / 6);
  auto cut = bytes;
  cut.pop_back();
  try {
    decode_tensor(cut, want, "P");
    ADD_FAILURE() << "a truncated int4 message was accepted";
  } catch (const starling::NetError& e) {
    EXPECT_NE(std::string(e.what()).find("bytes of int4 groups"), std::string::npos) << e.what();
  }
}

}  // namespace
