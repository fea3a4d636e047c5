// Reading one whole ZeroMQ message (all its frames) without blocking: the transport's ROUTER and
// join DEALERs and the ZAP handler's socket all take messages of several frames. Header-only and
// small, since it only wraps cppzmq.
#pragma once

#include <vector>
#include <zmq.hpp>

namespace starling::net {

// The frames of the next message waiting on `socket`, in order; empty when none waits. A
// message's frames arrive together (ZeroMQ delivers a message atomically), so once the first is
// here the rest are too.
inline std::vector<zmq::message_t> read_frames(zmq::socket_t& socket) {
  std::vector<zmq::message_t> frames;
  while (true) {
    zmq::message_t frame;
    if (!socket.recv(frame, zmq::recv_flags::dontwait)) break;
    const bool more = frame.more();
    frames.push_back(std::move(frame));
    if (!more) break;
  }
  return frames;
}

}  // namespace starling::net
