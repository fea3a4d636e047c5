#include "starling/strategy/state_stream.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <vector>

namespace starling::strategy {
namespace {

// Tensors of several shapes, one of them empty, with distinct values.
std::vector<at::Tensor> some_state(float base) {
  std::vector<at::Tensor> out;
  for (const auto& shape : std::vector<std::vector<int64_t>>{{7, 3}, {5}, {0}, {40}, {2, 2, 2}})
    out.push_back(
        at::arange(base, base + static_cast<float>(c10::multiply_integers(shape)), at::kFloat)
            .reshape(shape));
  return out;
}

at::Tensor flat(const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> pieces;
  for (const at::Tensor& t : ts) pieces.push_back(t.reshape({-1}));
  return at::cat(pieces);
}

// Whatever the piece size (smaller than a tensor, larger than all of them), the pieces follow
// the tensors' elements in order, the receiver's tensors end equal to the sender's, each written
// once, whole, and the sender reads each tensor once.
TEST(StateStream, PiecesCarryTheTensorsInOrderWhateverTheirSize) {
  const std::vector<at::Tensor> sent = some_state(1000);
  const at::Tensor expected = flat(sent);
  for (const int64_t piece : {1, 4, 21, 22, 64, 1000}) {
    SCOPED_TRACE("piece " + std::to_string(piece));
    StateStream out(sent, piece);
    std::vector<at::Tensor> kept = some_state(0);
    StateStream in(kept, piece);
    ASSERT_EQ(out.numel(), expected.numel());
    ASSERT_EQ(out.pieces(), (expected.numel() + piece - 1) / piece);
    int reads = 0, writes = 0;
    std::vector<at::Tensor> wire;
    for (int64_t k = 0; k < out.pieces(); ++k) {
      at::Tensor part = at::full({out.numel_of(k)}, -1.f);
      out.read_next(part, [&](const at::Tensor& t) {
        ++reads;
        return t;
      });
      wire.push_back(part);
      in.write_next(part, [&](const at::Tensor& t, const at::Tensor& values) {
        ++writes;
        EXPECT_EQ(values.sizes(), t.sizes());
        t.copy_(values);
      });
    }
    EXPECT_TRUE(at::equal(at::cat(wire), expected));
    EXPECT_TRUE(at::equal(flat(kept), expected));
    EXPECT_EQ(reads, 4);  // the empty tensor is never read nor written
    EXPECT_EQ(writes, 4);
  }
}

// A receiver that fails midway has written whole tensors only: those complete before the break
// hold the sender's values, the rest their own.
TEST(StateStream, AReceiverWritesOnlyWholeTensors) {
  const std::vector<at::Tensor> sent = some_state(1000);
  std::vector<at::Tensor> kept = some_state(0);
  StateStream out(sent, 10), in(kept, 10);
  for (int k = 0; k < 2; ++k) {  // 20 elements: the 21-element first tensor is not complete
    at::Tensor part = at::empty({out.numel_of(k)});
    out.read_next(part, [](const at::Tensor& t) { return t; });
    in.write_next(part, [](const at::Tensor& t, const at::Tensor& v) { t.copy_(v); });
  }
  EXPECT_TRUE(at::equal(kept[0], some_state(0)[0]));
  at::Tensor part = at::empty({out.numel_of(2)});
  out.read_next(part, [](const at::Tensor& t) { return t; });
  in.write_next(part, [](const at::Tensor& t, const at::Tensor& v) { t.copy_(v); });
  // 30 elements: the first two tensors (21 + 5) are the sender's; the 40-element one that began
  // in this piece is still this peer's own.
  EXPECT_TRUE(at::equal(kept[0], sent[0]));
  EXPECT_TRUE(at::equal(kept[1], sent[1]));
  EXPECT_TRUE(at::equal(kept[3], some_state(0)[3]));
}

// Updated where they lie (a swapped replica's weights averaged in pieces): every element is
// changed once whatever the piece size, each tensor is read once and written once, whole, and a
// tensor the reader hands back as itself is not changed before its write. Both readers: one that
// hands back the tensor itself (kept in memory), one that hands back a copy (read from a tier).
TEST(StateStream, PiecesUpdatedInPlaceWriteEachTensorOnceWhole) {
  const at::Tensor before = flat(some_state(1000));
  for (const bool copies : {false, true})
    for (const int64_t piece : {1, 4, 21, 22, 64, 1000}) {
      SCOPED_TRACE(std::string(copies ? "a copy" : "itself") + ", piece " + std::to_string(piece));
      std::vector<at::Tensor> state = some_state(1000);
      StateStream stream(state, piece);
      int reads = 0, writes = 0;
      for (int64_t k = 0; k < stream.pieces(); ++k) {
        at::Tensor part = at::full({stream.numel_of(k)}, -1.f);
        const bool done = stream.update_next(
            part,
            [&](const at::Tensor& t) {
              ++reads;
              return copies ? t.clone() : t;
            },
            [&](const at::Tensor& t, const at::Tensor& values) {
              ++writes;
              EXPECT_EQ(values.sizes(), t.sizes());
              EXPECT_TRUE(at::equal(t * 2, values)) << "changed before its write";
              t.copy_(values);
            },
            [](at::Tensor& values) {
              values.mul_(2);
              return true;
            });
        ASSERT_TRUE(done);
      }
      EXPECT_TRUE(at::equal(flat(state), before * 2));
      EXPECT_EQ(reads, 4);
      EXPECT_EQ(writes, 4);
    }
}

// An update that fails midway leaves the tensors still open untouched, even one the reader
// handed back as itself; those written before keep their new values.
TEST(StateStream, AFailedUpdateLeavesTheOpenTensorsUntouched) {
  std::vector<at::Tensor> state = some_state(1000);
  StateStream stream(state, 10);
  const auto same = [](const at::Tensor& t) { return t; };
  const auto store = [](const at::Tensor& t, const at::Tensor& v) { t.copy_(v); };
  const auto twice = [](at::Tensor& values) {
    values.mul_(2);
    return true;
  };
  for (int k = 0; k < 3; ++k) {  // the first two tensors (21 + 5 elements), 4 of the third's
    at::Tensor part = at::empty({stream.numel_of(k)});
    ASSERT_TRUE(stream.update_next(part, same, store, twice));
  }
  for (int k = 3; k < 5; ++k) {  // 20 more of that 40-element tensor...
    at::Tensor part = at::empty({stream.numel_of(k)});
    ASSERT_TRUE(stream.update_next(part, same, store, twice));
  }
  at::Tensor part = at::empty({stream.numel_of(5)});
  EXPECT_FALSE(stream.update_next(part, same, store, [](at::Tensor&) { return false; }));
  EXPECT_TRUE(at::equal(state[0], some_state(1000)[0] * 2));
  EXPECT_TRUE(at::equal(state[1], some_state(1000)[1] * 2));
  EXPECT_TRUE(at::equal(state[3], some_state(1000)[3])) << "...and no more: it is untouched";
  // The stream goes on: the later pieces are read as they were, and nothing more is written.
  std::vector<at::Tensor> read;
  for (int64_t k = 6; k < stream.pieces(); ++k) {
    part = at::empty({stream.numel_of(k)});
    EXPECT_FALSE(stream.update_next(part, same, store, [&](at::Tensor& values) {
      read.push_back(values.clone());
      return false;
    }));
  }
  EXPECT_TRUE(at::equal(at::cat(read), flat(some_state(1000)).narrow(0, 60, 14)));
  EXPECT_TRUE(at::equal(flat(state).narrow(0, 26, 48), flat(some_state(1000)).narrow(0, 26, 48)));
}

}  // namespace
}  // namespace starling::strategy
