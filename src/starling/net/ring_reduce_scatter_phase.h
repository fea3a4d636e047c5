// The reduce-scatter phase shared by ring_reduce_scatter and the fused ring_all_reduce
// (included from ring_channel.h; a template so the all-reduce's per-chunk continuation inlines).
#pragma once

namespace starling::net::detail {

template <typename OnReduced>
void reduce_scatter_phase(std::span<float> data, const RingSpec& spec, RingChannel& channel,
                          OnReduced&& on_reduced) {
  const int P = spec.size, r = spec.position;
  const auto mod = [P](int x) { return ((x % P) + P) % P; };
  const size_t ce = spec.chunk_elements;
  // Step 0: send our own contribution to segment r-1 (it travels r -> r+1 -> ... -> r-1).
  {
    const Shard seg = shard_of(data.size(), P, mod(r - 1));
    const uint32_t chunks = chunk_count(seg.end - seg.begin, ce);
    for (uint32_t c = 0; c < chunks; ++c) {
      const size_t b = seg.begin + c * ce, n = std::min(ce, seg.end - b);
      channel.send_right(0, c, encode_message(spec.precision, data.data() + b, n));
    }
  }
  // Step s: receive the partial sum of segment r-s-2, add ours, and pass it on; pipelined per
  // chunk, so a chunk moves on as soon as it arrives.
  for (int s = 0; s <= P - 2; ++s) {
    const Shard seg = shard_of(data.size(), P, mod(r - s - 2));
    const uint32_t chunks = chunk_count(seg.end - seg.begin, ce);
    for (uint32_t c = 0; c < chunks; ++c) {
      const size_t b = seg.begin + c * ce, n = std::min(ce, seg.end - b);
      zmq::message_t in = channel.receive_left(static_cast<uint32_t>(s), c,
                                               compress::encoded_bytes(spec.precision, n));
      compress::decode_add(spec.precision, static_cast<const std::byte*>(in.data()), n,
                           data.data() + b);
      if (s < P - 2) {
        channel.send_right(static_cast<uint32_t>(s + 1), c,
                           encode_message(spec.precision, data.data() + b, n));
      } else {
        on_reduced(b, n, c);
      }
    }
  }
}

}  // namespace starling::net::detail
