
#include "starling/net/ring_channel.h"

namespace starling::net {

namespace detail {

void all_gather_receive(std::span<float> data, const RingSpec& spec, RingChannel& channel,
                        uint32_t base_step) {
  const int P = spec.size, r = spec.position;
  const auto mod = [P](int x) { return ((x % P) + P) % P; };
  const size_t ce = spec.chunk_elements;
  // Step s: receive segment r-s-1 (owned by the peer s+1 places to the left) and forward it.
  for (int s = 0; s <= P - 2; ++s) {
    const Shard seg = shard_of(data.size(), P, mod(r - s - 1));
    const uint32_t chunks = chunk_count(seg.end - seg.begin, ce);
    for (uint32_t c = 0; c < chunks; ++c) {
      const size_t b = seg.begin + c * ce, n = std::min(ce, seg.end - b);
      zmq::message_t in = channel.receive_left(base_step + static_cast<uint32_t>(s), c,
                                               compress::encoded_bytes(spec.precision, n));
      compress::decode(spec.precision, static_cast<const std::byte*>(in.data()), n,
                       data.data() + b);
      if (spec.reject_non_finite && !all_finite(data.data() + b, n)) throw NonFiniteValues(false);
      if (s < P - 2) channel.send_right(base_step + static_cast<uint32_t>(s + 1), c, std::move(in));
    }
  }
}

}  // namespace detail

void ring_all_gather(std::span<float> data, const RingSpec& spec, RingChannel& channel) {
  if (spec.size == 1) return;
  // Our own segment goes out encoded, and we keep the decoded copy of exactly those bytes, so
  // every peer ends with the same values even at a lossy precision.
  const Shard own = shard_of(data.size(), spec.size, spec.position);
  const size_t ce = spec.chunk_elements;
  const uint32_t chunks = detail::chunk_count(own.end - own.begin, ce);
  for (uint32_t c = 0; c < chunks; ++c) {
    const size_t b = own.begin + c * ce, n = std::min(ce, own.end - b);
    zmq::message_t msg = detail::encode_message(spec.precision, data.data() + b, n);
    compress::decode(spec.precision, static_cast<const std::byte*>(msg.data()), n, data.data() + b);
    channel.send_right(0, c, std::move(msg));
  }
  detail::all_gather_receive(data, spec, channel, 0);
}

}  // namespace starling::net
