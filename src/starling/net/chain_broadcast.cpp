#include "starling/net/ring_channel.h"

namespace starling::net {

// A pipelined chain from the root around the ring: each chunk is forwarded as soon as it
// arrives, so a large tensor reaches the last peer in about (size - 1 + chunks) chunk times.
void chain_broadcast(std::span<float> data, const RingSpec& spec, int root_position,
                     RingChannel& channel) {
  const int P = spec.size;
  if (P == 1) return;
  const int rel = ((spec.position - root_position) % P + P) % P;  // distance from the root
  const size_t ce = spec.chunk_elements;
  const uint32_t chunks = detail::chunk_count(data.size(), ce);
  for (uint32_t c = 0; c < chunks; ++c) {
    const size_t b = c * ce, n = std::min(ce, data.size() - b);
    if (rel == 0) {
      zmq::message_t msg = detail::encode_message(spec.precision, data.data() + b, n);
      compress::decode(spec.precision, static_cast<const std::byte*>(msg.data()), n,
                       data.data() + b);
      channel.send_right(0, c, std::move(msg));
      continue;
    }
    zmq::message_t in = channel.receive_left(static_cast<uint32_t>(rel - 1), c,
                                             compress::encoded_bytes(spec.precision, n));
    compress::decode(spec.precision, static_cast<const std::byte*>(in.data()), n, data.data() + b);
    if (rel < P - 1) channel.send_right(static_cast<uint32_t>(rel), c, std::move(in));
  }
}

}  // namespace starling::net
