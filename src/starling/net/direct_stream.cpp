#include "starling/net/direct_stream.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "starling/common/error.h"
#include "starling/net/chunk_buffers.h"

namespace starling::net {
namespace {

bool would_block() { return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR; }

}  // namespace

void DirectStream::configure(size_t max_frame_bytes, std::string left_name,
                             std::string right_name) {
  max_frame_bytes_ = max_frame_bytes;
  left_name_ = std::move(left_name);
  right_name_ = std::move(right_name);
}

void DirectStream::queue(uint32_t step, uint32_t chunk, zmq::message_t payload) {
  Out o;
  const uint64_t n = payload.size();
  for (int i = 0; i < 4; ++i) {
    o.header[i] = static_cast<uint8_t>(step >> (8 * i));
    o.header[4 + i] = static_cast<uint8_t>(chunk >> (8 * i));
  }
  for (int i = 0; i < 8; ++i) o.header[8 + i] = static_cast<uint8_t>(n >> (8 * i));
  o.payload = std::move(payload);
  if (right_.cipher) {
    right_.cipher->seal({o.header, kFrameHeaderBytes}, static_cast<uint8_t*>(o.payload.data()),
                        o.payload.size(), o.tag);
    o.tag_bytes = LinkCipher::kTagBytes;
  }
  out_.push_back(std::move(o));
}

void DirectStream::write_some() {
  while (!out_.empty()) {
    Out& o = out_.front();
    // The frame's three parts, from where the last write stopped.
    const std::pair<uint8_t*, size_t> parts[3] = {
        {o.header, kFrameHeaderBytes},
        {static_cast<uint8_t*>(o.payload.data()), o.payload.size()},
        {o.tag, o.tag_bytes}};
    iovec iov[3];
    int count = 0;
    size_t skip = o.done;
    for (const auto& [data, size] : parts) {
      if (skip >= size) {
        skip -= size;
        continue;
      }
      iov[count++] = {data + skip, size - skip};
      skip = 0;
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(count);
    const ssize_t w = ::sendmsg(right_.fd.get(), &msg, MSG_NOSIGNAL);
    if (w < 0) {
      if (would_block()) return;
      throw NetError("the direct link to " + right_name_ + " broke: " + std::strerror(errno));
    }
    o.done += static_cast<size_t>(w);
    written_ += static_cast<uint64_t>(w);
    if (o.done < o.size()) return;  // the socket is full
    out_.pop_front();
  }
}

void DirectStream::read_some(const std::function<void(Frame)>& on_frame) {
  const size_t tag_bytes = left_.tag_bytes();
  // A bounded number of reads, so a fast sender cannot keep this side from writing.
  for (int round = 0; round < 64 && !left_ended_; ++round) {
    uint8_t* part = rx_header_;
    size_t part_bytes = kFrameHeaderBytes;
    if (rx_part_ == Part::payload) {
      part = static_cast<uint8_t*>(rx_frame_.payload.data());
      part_bytes = rx_frame_.payload.size();
    } else if (rx_part_ == Part::tag) {
      part = rx_tag_;
      part_bytes = tag_bytes;
    }
    const ssize_t n = ::recv(left_.fd.get(), part + rx_have_, part_bytes - rx_have_, 0);
    if (n < 0) {
      if (would_block()) return;
      throw NetError("the direct link from " + left_name_ + " broke: " + std::strerror(errno));
    }
    if (n == 0)
      throw LinkClosed(left_name_ + " closed its direct link in the middle of the operation");
    rx_have_ += static_cast<size_t>(n);
    if (rx_have_ < part_bytes) continue;
    rx_have_ = 0;
    bool complete = false;
    switch (rx_part_) {
      case Part::header: {
        uint32_t step = 0, chunk = 0;
        uint64_t bytes = 0;
        for (int i = 3; i >= 0; --i) {
          step = (step << 8) | rx_header_[i];
          chunk = (chunk << 8) | rx_header_[4 + i];
        }
        for (int i = 7; i >= 0; --i) bytes = (bytes << 8) | rx_header_[8 + i];
        rx_marker_ = step == kEndMarker && chunk == kEndMarker && bytes == 0;
        if (bytes > max_frame_bytes_)
          throw NetError(left_name_ + " announced a chunk of " + std::to_string(bytes) +
                         " bytes on its direct link; a chunk is at most " +
                         std::to_string(max_frame_bytes_));
        rx_frame_.step = step;
        rx_frame_.chunk = chunk;
        rx_frame_.payload = chunk_message(static_cast<size_t>(bytes));
        if (bytes > 0)
          rx_part_ = Part::payload;
        else if (tag_bytes > 0)
          rx_part_ = Part::tag;
        else
          complete = true;
        break;
      }
      case Part::payload:
        if (tag_bytes > 0)
          rx_part_ = Part::tag;
        else
          complete = true;
        break;
      case Part::tag:
        complete = true;
        break;
    }
    if (complete) {
      rx_part_ = Part::header;
      frame_read(on_frame);
    }
  }
}

void DirectStream::frame_read(const std::function<void(Frame)>& on_frame) {
  if (left_.cipher && !left_.cipher->open({rx_header_, kFrameHeaderBytes},
                                          static_cast<uint8_t*>(rx_frame_.payload.data()),
                                          rx_frame_.payload.size(), rx_tag_))
    throw NetError("a chunk from " + left_name_ +
                   " failed authentication on its sealed direct link (damaged or forged)");
  if (rx_marker_) {
    left_ended_ = true;
    rx_frame_ = Frame{};
    return;
  }
  on_frame(std::move(rx_frame_));
  rx_frame_ = Frame{};
}

void DirectStream::pump(std::chrono::steady_clock::time_point until, int wake_fd,
                        const std::function<void(Frame)>& on_frame) {
  // Having written something is progress: then only look, without waiting, whether there is
  // anything to read.
  const uint64_t before = written_;
  if (right_ && !out_.empty()) write_some();
  const bool wrote = written_ != before;
  pollfd fds[3];
  nfds_t n = 0;
  int left_at = -1, right_at = -1, wake_at = -1;
  if (left_ && !left_ended_) {
    left_at = static_cast<int>(n);
    fds[n++] = {left_.fd.get(), POLLIN, 0};
  }
  if (right_ && !out_.empty()) {
    right_at = static_cast<int>(n);
    fds[n++] = {right_.fd.get(), POLLOUT, 0};
  }
  if (wake_fd >= 0) {
    wake_at = static_cast<int>(n);
    fds[n++] = {wake_fd, POLLIN, 0};
  }
  const auto left_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                           until - std::chrono::steady_clock::now())
                           .count();
  const int timeout = wrote ? 0 : static_cast<int>(std::clamp<int64_t>(left_ms, 0, 1000));
  if (n == 0 || ::poll(fds, n, timeout) <= 0) return;
  if (wake_at >= 0 && fds[wake_at].revents) {
    uint64_t drain = 0;
    [[maybe_unused]] const ssize_t r = ::read(wake_fd, &drain, sizeof drain);
  }
  if (right_at >= 0 && fds[right_at].revents) write_some();
  if (left_at >= 0 && fds[left_at].revents) read_some(on_frame);
}

}  // namespace starling::net
