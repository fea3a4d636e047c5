// Direct data links: plain TCP connections that carry the chunks of a collective from one ring
// thread straight to its neighbour's, outside ZeroMQ. On a fast network the ZeroMQ path costs
// three thread hand-offs per chunk each way (ring thread, communication thread, ZeroMQ's I/O
// thread) and a copy in each; a direct link costs the kernel's copy alone, as Gloo's pairs do.
// Control messages, gossip and point-to-point messages always use ZeroMQ.
//
// A peer advertises its listener's port in its member record, and a link is direct when both
// ends advertise one (membership.h); otherwise that link falls back to ZeroMQ. In a CURVE swarm
// the links are sealed (link_crypto.h): each new connection starts with a handshake keyed by the
// two peers' CURVE keys from the allowlist, and every record after it is encrypted and
// authenticated. In an --insecure swarm they are plain, as ZeroMQ's traffic is there.
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
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "starling/net/link_crypto.h"
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
// Sealed links' handshake: "STRS", version, sender, receiver, the sender's fresh X25519 key; the
// reply: "STRA", version, the receiver's fresh X25519 key.
inline constexpr uint32_t kSealedHelloMagic = 0x53525453;  // "STRS"
inline constexpr uint32_t kSealedReplyMagic = 0x41525453;  // "STRA"
inline constexpr size_t kSealedHelloBytes = 56;
inline constexpr size_t kSealedReplyBytes = 40;

// One direct connection: its socket and, on a sealed link, the cipher of its one direction
// (sealing at the sender, opening at the receiver), which counts the connection's records.
struct DirectConnection {
  Fd fd;
  std::unique_ptr<LinkCipher> cipher;  // null on a plain link
  PeerId peer = 0;                     // sealed: the other end, as the handshake proved it
  explicit operator bool() const { return static_cast<bool>(fd); }
  size_t tag_bytes() const { return cipher ? LinkCipher::kTagBytes : 0; }
};

// What sealed links authenticate with: this peer's id and CURVE secret key, and the CURVE public
// key of every peer on the allowlist (raw 32 bytes, by peer id).
struct LinkIdentity {
  PeerId self = 0;
  Key32 secret{};
  std::map<PeerId, Key32> public_keys;
};

class DirectLinks {
 public:
  // Listens on `bind_host` (an address or name; "0.0.0.0" or "*" for every interface) with a
  // free port and starts the accept thread. With an `identity` every link is sealed, and only
  // peers on its allowlist get one. Throws NetError when it cannot listen.
  DirectLinks(const std::string& bind_host, LogFn log,
              std::optional<LinkIdentity> identity = std::nullopt);
  ~DirectLinks();
  DirectLinks(const DirectLinks&) = delete;
  DirectLinks& operator=(const DirectLinks&) = delete;

  uint16_t port() const { return port_; }

  // A connection to peer `to` at host:port that announces operation `op` from `self`: an idle
  // one kept from an earlier operation, else a new one (sealed: after the handshake).
  // Non-blocking, TCP_NODELAY. Throws NetError naming the address when it cannot connect (or
  // finish the handshake) before `deadline`, or when a sealed link's `to` is not on the
  // allowlist.
  DirectConnection open(PeerId to, const std::string& host, uint16_t port, PeerId self, uint64_t op,
                        Clock::time_point deadline);
  // Keeps an outgoing connection whose operation ended cleanly (everything written).
  void keep_outgoing(PeerId to, DirectConnection conn);

  // The connection peer `from` opened for operation `op`, once its hello has arrived (sealed:
  // and proved authentic).
  std::optional<DirectConnection> take(PeerId from, uint64_t op);
  // Waits until another connection has been filed, or `until`.
  void wait_for_arrival(Clock::time_point until);
  // Hands back an incoming connection whose operation ended cleanly (every chunk read, up to or
  // before the sender's end marker: `end_marker_read`): the accept thread reads the marker if
  // it is still due, then watches the connection for the sender's next operation.
  void keep_incoming(DirectConnection conn, bool end_marker_read);

 private:
  static constexpr size_t kMarkerBytes = 16;  // direct_stream.h's end marker
  // A connection the accept thread reads: what it expects next, and the bytes of it so far.
  struct Pending {
    enum class Expect { sealed_hello, end_marker, op_hello };
    DirectConnection conn;
    Expect expect = Expect::op_hello;
    uint8_t bytes[kSealedHelloBytes] = {};
    size_t have = 0;
    Clock::time_point since;  // when the first byte of the current read came
    size_t want() const;
  };
  struct Arrived {
    DirectConnection conn;
    Clock::time_point at;
  };

  void accept_loop();
  void wake();
  // Reads what `p` has pending; true when `p` is finished with (filed or dropped).
  bool read_pending(Pending& p);
  // The receiver's half of a sealed handshake; false (logged) when the hello is refused.
  bool answer_sealed_hello(Pending& p);
  // The sender's half on a new connection.
  void seal_outgoing(DirectConnection& conn, PeerId to, PeerId self, const std::string& where,
                     Clock::time_point deadline);

  LogFn log_;
  std::optional<LinkIdentity> identity_;
  Fd listener_;
  uint16_t port_ = 0;
  Fd wake_read_, wake_write_;
  std::thread thread_;
  bool stop_ = false;  // guarded by mutex_

  std::mutex mutex_;
  std::condition_variable arrived_cv_;
  std::map<std::pair<PeerId, uint64_t>, Arrived> arrived_;      // by (sender, op)
  std::vector<std::pair<DirectConnection, bool>> handed_back_;  // for the accept thread
  std::map<PeerId, std::vector<DirectConnection>> idle_outgoing_;
};

}  // namespace starling::net
