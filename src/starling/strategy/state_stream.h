// A replica's shared state (the tensors a strategy lists: weights, AdamW moments) streamed as a
// vector in pieces of a bounded size, for a state transfer between peers. The sender reads a
// tensor at a time (StepRunner::read_state, which reads a swapped tensor from its tier), a
// receiver writes a tensor at a time (StepRunner::write_state, which stores it there), so neither
// holds more of the state than one piece and one tensor: a transfer between replicas larger than
// memory works, and a whole-state transfer costs no second copy of the state. A tensor larger than
// a piece spans several pieces (the receiver assembles it in a buffer of its size). The pieces
// follow the tensors' elements one after the other, so the vector is the same whatever the piece
// size, and every peer cuts it alike from the same tensors and piece size.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <vector>

namespace starling::strategy {

class StateStream {
 public:
  using Reader = std::function<at::Tensor(const at::Tensor&)>;
  using Writer = std::function<void(const at::Tensor&, const at::Tensor&)>;

  // `tensors`: float32 tensors, in the vector's order. `piece_numel` >= 1.
  StateStream(std::vector<at::Tensor> tensors, int64_t piece_numel);

  int64_t numel() const { return numel_; }        // the whole vector's elements
  int64_t pieces() const { return pieces_; }      // ceil(numel / piece_numel), at least 1
  int64_t piece_numel() const { return piece_; }  // the largest piece's elements
  // The elements of piece `k` (the last may be shorter).
  int64_t numel_of(int64_t k) const;

  // The next piece (the first at the first call), in order: `part` (a float32 vector of
  // numel_of(k) elements on any device) is filled from the tensors, each read through `read`.
  void read_next(at::Tensor& part, const Reader& read);
  // The next piece, in order, goes into the tensors: each tensor is written through `write` once
  // its last element has arrived (with a tensor of its shape).
  void write_next(const at::Tensor& part, const Writer& write);
  // The next piece, in order, changed where it lies (a swapped replica's weights averaged in
  // place): `part` is filled as read_next fills it, `update(part)` changes it, and the values go
  // back into the tensors, each written through `write` once its last element is back. A tensor
  // wholly inside the piece is written from `part`; one that crosses an edge of the piece is held
  // as the copy `read` gave until its last element is back. So a stream holds, beside the piece,
  // at most the two tensors that cross its edges. A crossing tensor that `read` returns as itself
  // is copied first, so that nothing changes before `write`: when `update` returns false nothing of
  // the piece is written (the tensors still open keep its elements as they were read), and false is
  // returned. The stream goes on to the next piece either way; a caller that stops writing at a
  // failure has every later update return false too.
  using Update = std::function<bool(at::Tensor&)>;
  bool update_next(at::Tensor& part, const Reader& read, const Writer& write, const Update& update);

 private:
  // Walks the next piece's `n` elements: `span(tensor, offset in it, offset in the piece, count)`
  // for each run of them in one tensor, in order; then moves on to the piece after.
  void walk(int64_t n,
            const std::function<void(const at::Tensor&, int64_t, int64_t, int64_t)>& span);

  std::vector<at::Tensor> tensors_;
  int64_t piece_ = 1;
  int64_t numel_ = 0;
  int64_t pieces_ = 1;
  int64_t next_ = 0;    // the next piece
  size_t tensor_ = 0;   // the tensor the next element belongs to
  int64_t offset_ = 0;  // that element's index in it
  at::Tensor open_;     // that tensor's values being read / assembled (flat), if open
};

}  // namespace starling::strategy
