// What a ring algorithm needs from the network: send a chunk to the right neighbour, receive a
// chunk from the left neighbour. Messages between two neighbours arrive in the order they were
// sent, but an algorithm may ask for them in another (the reduce-scatter's step-0 chunks run a
// window ahead of its step-1 chunks), so receive_left takes the one labelled (step, chunk). The
// node implements this over ZeroMQ; tests implement it in memory to check the algorithms alone.
#pragma once

#include <cstdint>
#include <zmq.hpp>

#include "starling/common/error.h"
#include "starling/common/finite.h"
#include "starling/net/collective.h"

namespace starling::net {

class RingChannel {
 public:
  virtual ~RingChannel() = default;
  virtual void send_right(uint32_t step, uint32_t chunk, zmq::message_t payload) = 0;
  // Blocks until the message (step, chunk) from the left neighbour is there and its payload is
  // `expected_bytes` long; throws NetError on timeout, a dead participant, an abort or a
  // malformed chunk.
  virtual zmq::message_t receive_left(uint32_t step, uint32_t chunk, size_t expected_bytes) = 0;
};

struct RingSpec {
  int position = 0;  // this peer's place in the ring
  int size = 1;      // participants
  size_t chunk_elements = 128 * 1024;
  WirePrecision precision = WirePrecision::fp32;
  ReduceOp op = ReduceOp::sum;
  bool reject_non_finite = false;  // CollectiveOptions::reject_non_finite
};

// Thrown by a ring algorithm with reject_non_finite set: this peer's own contribution (`own`), or
// values that arrived from the left neighbour, are not finite. The run names the peer.
struct NonFiniteValues : NetError {
  explicit NonFiniteValues(bool own_values)
      : NetError(own_values ? "own contribution holds non-finite values"
                            : "non-finite values arrived from the left neighbour"),
        own(own_values) {}
  bool own;
};

// Ring algorithms; one per file. Steps of the reduce-scatter phase are numbered 0..size-2 and
// those of the all-gather phase follow on, so a fused all-reduce streams both phases.
void ring_reduce_scatter(std::span<float> data, const RingSpec& spec, RingChannel& channel);
void ring_all_gather(std::span<float> data, const RingSpec& spec, RingChannel& channel);
void ring_all_reduce(std::span<float> data, const RingSpec& spec, RingChannel& channel);
// `root_position` is the root's place in the ring; data flows root -> root+1 -> ... -> root-1.
void chain_broadcast(std::span<float> data, const RingSpec& spec, int root_position,
                     RingChannel& channel);

namespace detail {

// Number of chunks a segment of `elements` is cut into.
inline uint32_t chunk_count(size_t elements, size_t chunk_elements) {
  return static_cast<uint32_t>((elements + chunk_elements - 1) / chunk_elements);
}

// The encoded bytes of `count` floats, in a fresh message ready to send.
zmq::message_t encode_message(WirePrecision p, const float* src, size_t count);

// Runs the reduce-scatter phase (steps 0..size-2). Each chunk of this peer's own segment, once it
// holds everyone's contribution, is passed to `on_reduced(first_element, count, chunk)`.
template <typename OnReduced>
void reduce_scatter_phase(std::span<float> data, const RingSpec& spec, RingChannel& channel,
                          OnReduced&& on_reduced);

// Receives the all-gather phase (steps base..base+size-2), forwarding every received chunk
// unchanged (the same encoded bytes) except on the last step.
void all_gather_receive(std::span<float> data, const RingSpec& spec, RingChannel& channel,
                        uint32_t base_step);

}  // namespace detail
}  // namespace starling::net

#include "starling/net/ring_reduce_scatter_phase.h"
