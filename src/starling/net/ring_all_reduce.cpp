#include "starling/net/ring_channel.h"

namespace starling::net {

// Reduce-scatter then all-gather, streamed: a chunk of our own segment starts its all-gather
// journey the moment it is fully reduced. Each segment is reduced in one place (its owner), then
// encoded once; everyone, the owner included, decodes those same bytes: bit-identical results.
void ring_all_reduce(std::span<float> data, const RingSpec& spec, RingChannel& channel) {
  if (spec.size == 1) return;
  const float divisor = static_cast<float>(spec.size);
  const bool mean = spec.op == ReduceOp::mean;
  const uint32_t gather_base = static_cast<uint32_t>(spec.size - 1);
  detail::reduce_scatter_phase(data, spec, channel, [&](size_t b, size_t n, uint32_t c) {
    if (mean)
      for (size_t i = b; i < b + n; ++i) data[i] /= divisor;
    zmq::message_t msg = detail::encode_message(spec.precision, data.data() + b, n);
    compress::decode(spec.precision, static_cast<const std::byte*>(msg.data()), n, data.data() + b);
    channel.send_right(gather_base, c, std::move(msg));
  });
  detail::all_gather_receive(data, spec, channel, gather_base);
}

}  // namespace starling::net
