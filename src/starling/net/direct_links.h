// Direct data links: plain TCP connections that carry the chunks of a collective from one ring
// thread straight to its neighbour's, outside ZeroMQ. On a fast network the ZeroMQ path costs
// three thread hand-offs per chunk each way (ring thread, communication thread, ZeroMQ's I/O
// thread) and a copy in each; a direct link costs the kernel's copy alone, as Gloo's pairs do.
//
// Only --insecure swarms use them (CURVE traffic keeps ZeroMQ, whose handshake authenticates
// both ends); control messages, gossip and point-to-point messages always use ZeroMQ. A peer
// advertises its listener's port in its member record, and a link is direct when both ends
// advertise one (membership.h); otherwise that link falls back to ZeroMQ.
//
// Each connection announces, before an operation's chunks, which peer sent it and for which
// operation (the 24-byte "op hello"); the receiving peer's accept thread reads that and files the
// connection until the ring run of that operation takes it. A connection whose operation ended
// cleanly is kept for the next operation to the same peer (the sender's pool; the receiver's
// accept thread watches it for the next hello), so a round costs no TCP handshake.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "starling/net/log.h"
#include "starling/net/membership.h"
#include "starling/net/peer_id.h"

namespace starling::net {

// An owned socket descriptor (closed on destruction).
class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  explicit operator bool() const { return fd_ >= 0; }
  void reset();

 private:
  int fd_ = -1;
};

inline constexpr uint32_t kDirectMagic = 0x44525453;  // "STRD" read as little-endian u32
inline constexpr size_t kOpHelloBytes = 24;           // magic u32, version u32, sender, op

class DirectLinks {
 public:
  // Listens on `bind_host` (an address or name; "0.0.0.0" or "*" for every interface) with a
  // free port and starts the accept thread. Throws NetError when it cannot listen.
  DirectLinks(const std::string& bind_host, LogFn log);
  ~DirectLinks();
  DirectLinks(const DirectLinks&) = delete;
  DirectLinks& operator=(const DirectLinks&) = delete;

  uint16_t port() const { return port_; }

  // A connection to peer `to` at host:port that announces operation `op` from `self`: an idle
  // one kept from an earlier operation, else a new one. Non-blocking, TCP_NODELAY. Throws
  // NetError naming the address when it cannot connect before `deadline`.
  Fd open(PeerId to, const std::string& host, uint16_t port, PeerId self, uint64_t op,
          Clock::time_point deadline);
  // Keeps an outgoing connection whose operation ended cleanly (everything written).
  void keep_outgoing(PeerId to, Fd fd);

  // The connection peer `from` opened for operation `op`, once its hello has arrived.
  std::optional<Fd> take(PeerId from, uint64_t op);
  // Waits until another connection has been filed, or `until`.
  void wait_for_arrival(Clock::time_point until);
  // Hands back an incoming connection whose operation ended cleanly (every chunk read, up to or
  // before the sender's end marker: `end_marker_read`): the accept thread reads the marker if
  // it is still due, then watches the connection for the sender's next operation.
  void keep_incoming(Fd fd, bool end_marker_read);

 private:
  static constexpr size_t kMarkerBytes = 16;  // direct_stream.h's end marker
  struct Pending {
    Fd fd;
    size_t skip = 0;                    // end-marker bytes due before the hello (0 or kMarkerBytes)
    uint8_t bytes[kOpHelloBytes] = {};  // the marker, then the hello
    size_t have = 0;
    Clock::time_point since;  // when the first byte of the current read came
  };
  struct Arrived {
    Fd fd;
    Clock::time_point at;
  };

  void accept_loop();
  void wake();
  // Reads what `p`'s hello has pending; true when `p` is finished with (filed or dropped).
  bool read_hello(Pending& p);

  LogFn log_;
  Fd listener_;
  uint16_t port_ = 0;
  Fd wake_read_, wake_write_;
  std::thread thread_;
  bool stop_ = false;  // guarded by mutex_

  std::mutex mutex_;
  std::condition_variable arrived_cv_;
  std::map<std::pair<PeerId, uint64_t>, Arrived> arrived_;  // by (sender, op)
  std::vector<std::pair<Fd, bool>> handed_back_;  // for the accept thread: fd, marker read
  std::map<PeerId, std::vector<Fd>> idle_outgoing_;
};

}  // namespace starling::net
