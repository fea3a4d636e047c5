// The reduce-scatter phase shared by ring_reduce_scatter and the fused ring_all_reduce
// (included from ring_channel.h; a template so the all-reduce's per-chunk continuation inlines).
#pragma once

namespace starling::net::detail {

// Step-0 chunks a peer sends ahead of those it has received: enough to keep its link busy
// while the neighbour's first chunk travels, few enough to bound the queued copies.
inline constexpr uint32_t kStep0Window = 8;

template <typename OnReduced>
void reduce_scatter_phase(std::span<float> data, const RingSpec& spec, RingChannel& channel,
                          OnReduced&& on_reduced) {
  const int P = spec.size, r = spec.position;
  const auto mod = [P](int x) { return ((x % P) + P) % P; };
  const size_t ce = spec.chunk_elements;
  // Our own values are checked before any leaves, so a non-finite partial sum that arrives later
  // can only have come from the left (see CollectiveOptions::reject_non_finite).
  if (spec.reject_non_finite && !all_finite(data.data(), data.size())) throw NonFiniteValues(true);
  // Step 0: send our own contribution to segment r-1 (it travels r -> r+1 -> ... -> r-1). Its
  // chunks go out a window ahead of the chunks coming in rather than all at once, so a large
  // tensor is not copied into a segment's worth of queued messages before anything arrives.
  const Shard seg0 = shard_of(data.size(), P, mod(r - 1));
  const uint32_t chunks0 = chunk_count(seg0.end - seg0.begin, ce);
  uint32_t sent0 = 0;
  const auto send_step0_upto = [&](uint32_t upto) {
    for (; sent0 < std::min(upto, chunks0); ++sent0) {
      const size_t b = seg0.begin + sent0 * ce, n = std::min(ce, seg0.end - b);
      channel.send_right(0, sent0, encode_message(spec.precision, data.data() + b, n));
    }
  };
  send_step0_upto(kStep0Window);
  // Step s: receive the partial sum of segment r-s-2, add ours, and pass it on; pipelined per
  // chunk, so a chunk moves on as soon as it arrives.
  for (int s = 0; s <= P - 2; ++s) {
    const Shard seg = shard_of(data.size(), P, mod(r - s - 2));
    const uint32_t chunks = chunk_count(seg.end - seg.begin, ce);
    for (uint32_t c = 0; c < chunks; ++c) {
      if (s == 0) send_step0_upto(c + 1 + kStep0Window);
      const size_t b = seg.begin + c * ce, n = std::min(ce, seg.end - b);
      zmq::message_t in = channel.receive_left(static_cast<uint32_t>(s), c,
                                               compress::encoded_bytes(spec.precision, n));
      compress::decode_add(spec.precision, static_cast<const std::byte*>(in.data()), n,
                           data.data() + b);
      if (spec.reject_non_finite && !all_finite(data.data() + b, n)) throw NonFiniteValues(false);
      if (s < P - 2) {
        channel.send_right(static_cast<uint32_t>(s + 1), c,
                           encode_message(spec.precision, data.data() + b, n));
      } else {
        on_reduced(b, n, c);
      }
    }
    if (s == 0) send_step0_upto(chunks0);  // segments may differ by one chunk
  }
}

}  // namespace starling::net::detail
