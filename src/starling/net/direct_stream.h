// The chunks of one ring run on direct links (direct_links.h): frames queued for the right
// neighbour are written as its socket takes them, frames from the left neighbour are read as they
// arrive, both from the run's own thread. Nothing blocks on one direction while the other could
// move, so two neighbours that both send before they receive never wait on each other.
//
// A frame is a 16-byte header (u32 step, u32 chunk, u64 payload bytes; little-endian) and the
// payload, read straight into the message the ring algorithm gets. The sender ends its operation
// with an end marker (step and chunk 0xFFFFFFFF, no payload); the reader stops there, so the
// sender's next operation on the same connection (its op hello) is left for the accept thread.
//
// On a sealed link (link_crypto.h) each frame is a record: the header in clear, the payload
// encrypted in place, and a 16-byte tag after it that authenticates both; the end marker carries
// a tag too. A payload is decrypted where it was read, once its tag has arrived.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <string>
#include <zmq.hpp>

#include "starling/common/error.h"
#include "starling/net/direct_links.h"

namespace starling::net {

inline constexpr size_t kFrameHeaderBytes = 16;

// The left neighbour closed its direct link in the middle of an operation: most often because
// the operation failed there first, for a reason its abort carries on the control channel.
struct LinkClosed : starling::NetError {
  using starling::NetError::NetError;
};
inline constexpr uint32_t kEndMarker = 0xFFFFFFFF;

class DirectStream {
 public:
  struct Frame {
    uint32_t step = 0, chunk = 0;
    zmq::message_t payload;
  };

  // `max_frame_bytes` bounds what the left neighbour may announce; `left_name` and
  // `right_name` name the neighbours in errors.
  void configure(size_t max_frame_bytes, std::string left_name, std::string right_name);

  void set_right(DirectConnection conn) { right_ = std::move(conn); }
  void set_left(DirectConnection conn) { left_ = std::move(conn); }
  bool has_right() const { return static_cast<bool>(right_); }
  bool has_left() const { return static_cast<bool>(left_); }

  // Queues a frame for the right neighbour (set_right first). On a sealed link the payload is
  // encrypted in place: the caller hands over a buffer nobody else reads.
  void queue(uint32_t step, uint32_t chunk, zmq::message_t payload);
  // Queues the end marker: nothing more of this operation follows.
  void queue_end() { queue(kEndMarker, kEndMarker, zmq::message_t()); }
  // Whether queued bytes have not all been written yet.
  bool sending() const { return !out_.empty(); }
  // Whether the left connection is between frames (nothing of a frame half read).
  bool between_frames() const { return rx_have_ == 0 && rx_part_ == Part::header; }
  // Whether the left neighbour's end marker has been read (nothing more will be).
  bool left_ended() const { return left_ended_; }

  // Writes what the right socket takes and reads what the left one has (up to its end marker),
  // waiting (unless something was written) until `until`
  // for either to be ready or for `wake_fd` (-1: none) to become readable. Each complete frame
  // from the left goes to `on_frame`. Throws NetError for a reset connection or a frame over
  // the limit or a record that fails authentication, LinkClosed for a closed connection, naming
  // the neighbour.
  void pump(std::chrono::steady_clock::time_point until, int wake_fd,
            const std::function<void(Frame)>& on_frame);

  uint64_t bytes_written() const { return written_; }
  DirectConnection release_right() { return std::move(right_); }
  DirectConnection release_left() { return std::move(left_); }

 private:
  struct Out {
    uint8_t header[kFrameHeaderBytes];
    zmq::message_t payload;
    uint8_t tag[LinkCipher::kTagBytes];
    size_t tag_bytes = 0;
    size_t done = 0;  // bytes of header + payload + tag written
    size_t size() const { return kFrameHeaderBytes + payload.size() + tag_bytes; }
  };
  enum class Part { header, payload, tag };  // of the frame being read
  void write_some();
  void read_some(const std::function<void(Frame)>& on_frame);
  // A frame whose header (and tag, on a sealed link) has been read whole.
  void frame_read(const std::function<void(Frame)>& on_frame);

  size_t max_frame_bytes_ = 0;
  std::string left_name_, right_name_;
  DirectConnection left_, right_;
  std::deque<Out> out_;
  uint64_t written_ = 0;
  uint8_t rx_header_[kFrameHeaderBytes] = {};
  uint8_t rx_tag_[LinkCipher::kTagBytes] = {};
  Part rx_part_ = Part::header;
  size_t rx_have_ = 0;      // bytes of the part being read
  bool rx_marker_ = false;  // the frame being read is the end marker
  bool left_ended_ = false;
  Frame rx_frame_;
};

}  // namespace starling::net
