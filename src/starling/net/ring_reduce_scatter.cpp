#include "starling/net/chunk_buffers.h"
#include "starling/net/ring_channel.h"

namespace starling::net {

namespace detail {

zmq::message_t encode_message(WirePrecision p, const float* src, size_t count) {
  zmq::message_t msg = chunk_message(compress::encoded_bytes(p, count));
  compress::encode(p, src, count, static_cast<std::byte*>(msg.data()));
  return msg;
}

}  // namespace detail

void ring_reduce_scatter(std::span<float> data, const RingSpec& spec, RingChannel& channel) {
  if (spec.size == 1) return;  // our shard is the whole buffer, already "reduced" (x / 1 == x)
  const float divisor = static_cast<float>(spec.size);
  const bool mean = spec.op == ReduceOp::mean;
  detail::reduce_scatter_phase(data, spec, channel, [&](size_t begin, size_t n, uint32_t) {
    if (mean)
      for (size_t i = begin; i < begin + n; ++i) data[i] /= divisor;
  });
}

}  // namespace starling::net
