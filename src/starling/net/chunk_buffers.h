// Buffers for collective chunks, reused across chunks and collectives. A ring run allocates a
// message per chunk it sends or receives; fresh memory costs a page fault per 4 KiB on first
// touch, and glibc hands each new collective thread an arena whose freed chunks the next thread
// may not see, so at large sizes the faults, not the copies, bounded a peer. Buffers come back
// here when ZeroMQ or the run frees the message, from any thread.
#pragma once

#include <cstddef>
#include <zmq.hpp>

namespace starling::net {

// A message of exactly `bytes` bytes (uninitialised), backed by a pooled buffer.
zmq::message_t chunk_message(size_t bytes);

}  // namespace starling::net
