#include "starling/net/direct_links.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "starling/common/error.h"
#include "starling/net/quiet_thread.h"

namespace starling::net {
namespace {

using std::chrono::milliseconds;

// A hello that started but has not finished within this long is dropped (a stray connection).
constexpr auto kHelloTimeout = std::chrono::seconds(10);
// A connection filed for an operation that never ran here is closed after this long.
constexpr auto kUnclaimedTimeout = std::chrono::seconds(120);
// Idle outgoing connections kept per peer (one per collective that ran at once).
constexpr size_t kIdlePerPeer = 8;
// Connections being read (new, or kept and waiting for their next hello), at most.
constexpr size_t kMaxWatched = 1024;

std::string errno_text() { return std::strerror(errno); }

void set_no_delay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

int poll_ms_until(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1000));
}

// Writes all of `bytes` to a non-blocking socket before `deadline`; false on error or timeout.
bool write_all(int fd, const uint8_t* bytes, size_t n, Clock::time_point deadline) {
  while (n > 0) {
    const ssize_t w = ::send(fd, bytes, n, MSG_NOSIGNAL);
    if (w > 0) {
      bytes += w;
      n -= static_cast<size_t>(w);
      continue;
    }
    if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
    if (Clock::now() >= deadline) return false;
    pollfd p{fd, POLLOUT, 0};
    ::poll(&p, 1, poll_ms_until(deadline));
  }
  return true;
}

// Reads exactly `n` bytes from a non-blocking socket before `deadline`; false on error, close
// or timeout.
bool read_all(int fd, uint8_t* bytes, size_t n, Clock::time_point deadline) {
  while (n > 0) {
    const ssize_t r = ::recv(fd, bytes, n, 0);
    if (r > 0) {
      bytes += r;
      n -= static_cast<size_t>(r);
      continue;
    }
    if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return false;
    if (Clock::now() >= deadline) return false;
    pollfd p{fd, POLLIN, 0};
    ::poll(&p, 1, poll_ms_until(deadline));
  }
  return true;
}

void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// A kept outgoing connection is usable while the other end has not closed it (after the
// handshake it never sends anything on it, so readable means closed or reset).
bool still_open(int fd) {
  pollfd p{fd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 0;
}

}  // namespace

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    reset();
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

void Fd::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

DirectLinks::DirectLinks(const std::string& bind_host, LogFn log,
                         std::optional<LinkIdentity> identity)
    : log_(std::move(log)), identity_(std::move(identity)) {
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  const bool any = bind_host.empty() || bind_host == "*" || bind_host == "0.0.0.0";
  if (const int rc = getaddrinfo(any ? nullptr : bind_host.c_str(), "0", &hints, &res);
      rc != 0 || !res)
    throw NetError("direct data links: cannot resolve '" + bind_host + "': " + gai_strerror(rc));
  std::string why;
  for (addrinfo* a = res; a && !listener_; a = a->ai_next) {
    Fd fd(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    if (!fd) continue;
    if (::bind(fd.get(), a->ai_addr, a->ai_addrlen) != 0 || ::listen(fd.get(), 128) != 0) {
      why = errno_text();
      continue;
    }
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&addr)->sin6_port
                                             : reinterpret_cast<sockaddr_in*>(&addr)->sin_port);
    listener_ = std::move(fd);
  }
  freeaddrinfo(res);
  if (!listener_) throw NetError("direct data links: cannot listen on '" + bind_host + "': " + why);
  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_NONBLOCK | O_CLOEXEC) != 0)
    throw NetError("direct data links: pipe: " + errno_text());
  wake_read_ = Fd(pipe_fds[0]);
  wake_write_ = Fd(pipe_fds[1]);
  thread_ = quiet_thread([this] { accept_loop(); });
}

DirectLinks::~DirectLinks() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake();
  if (thread_.joinable()) thread_.join();
}

void DirectLinks::wake() {
  const uint8_t b = 1;
  [[maybe_unused]] const ssize_t w = ::write(wake_write_.get(), &b, 1);
}

void DirectLinks::seal_outgoing(DirectConnection& conn, PeerId to, PeerId self,
                                const std::string& where, Clock::time_point deadline) {
  const auto theirs = identity_->public_keys.find(to);
  if (theirs == identity_->public_keys.end())
    throw NetError("direct data link to " + where + ": peer " + short_peer_id(to) +
                   " is not on this peer's allowlist");
  const EphemeralKey mine = make_ephemeral_key();
  uint8_t transcript[kSealedHelloBytes + kSealedReplyBytes];
  uint8_t* hello = transcript;
  uint8_t* reply = transcript + kSealedHelloBytes;
  put_u32(hello, kSealedHelloMagic);
  put_u32(hello + 4, 1);
  put_u64(hello + 8, self);
  put_u64(hello + 16, to);
  std::copy(mine.public_key.begin(), mine.public_key.end(), hello + 24);
  if (!write_all(conn.fd.get(), hello, kSealedHelloBytes, deadline))
    throw NetError("direct data link to " + where + ": the handshake could not be sent");
  if (!read_all(conn.fd.get(), reply, kSealedReplyBytes, deadline))
    throw NetError("direct data link to " + where +
                   ": no handshake reply (is this peer on the other's allowlist?)");
  if (get_u32(reply) != kSealedReplyMagic || get_u32(reply + 4) != 1)
    throw NetError("direct data link to " + where + ": the handshake reply is malformed");
  Key32 their_fresh{};
  std::copy(reply + 8, reply + 40, their_fresh.begin());
  const Key32 key = derive_link_key(x25519(identity_->secret, theirs->second),
                                    x25519(mine.secret, their_fresh), transcript);
  conn.cipher = std::make_unique<LinkCipher>(key, LinkCipher::Role::seal);
  conn.peer = to;
}

DirectConnection DirectLinks::open(PeerId to, const std::string& host, uint16_t port, PeerId self,
                                   uint64_t op, Clock::time_point deadline) {
  // The op hello, and on a sealed link its tag (the hello is the record's header).
  uint8_t hello[kOpHelloBytes + LinkCipher::kTagBytes];
  put_u32(hello, kDirectMagic);
  put_u32(hello + 4, 1);
  put_u64(hello + 8, self);
  put_u64(hello + 16, op);
  const auto say_hello = [&](DirectConnection& conn) {
    if (conn.cipher) conn.cipher->seal({hello, kOpHelloBytes}, nullptr, 0, hello + kOpHelloBytes);
    return write_all(conn.fd.get(), hello, kOpHelloBytes + conn.tag_bytes(), deadline);
  };
  for (;;) {  // a kept connection first
    DirectConnection conn;
    {
      std::lock_guard lock(mutex_);
      auto it = idle_outgoing_.find(to);
      if (it == idle_outgoing_.end() || it->second.empty()) break;
      conn = std::move(it->second.back());
      it->second.pop_back();
    }
    if (still_open(conn.fd.get()) && say_hello(conn)) return conn;
  }
  const std::string where = host + ":" + std::to_string(port);
  addrinfo hints{}, *res = nullptr;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  if (const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
      rc != 0 || !res)
    throw NetError("direct data link to " + where + ": " + gai_strerror(rc));
  DirectConnection conn;
  conn.fd = Fd(::socket(res->ai_family, res->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  int err = conn.fd ? 0 : errno;
  if (conn.fd && ::connect(conn.fd.get(), res->ai_addr, res->ai_addrlen) != 0) {
    err = errno;
    if (err == EINPROGRESS) {
      pollfd p{conn.fd.get(), POLLOUT, 0};
      while (::poll(&p, 1, poll_ms_until(deadline)) == 0 && Clock::now() < deadline) {
      }
      socklen_t len = sizeof err;
      err = ETIMEDOUT;
      if (p.revents) ::getsockopt(conn.fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    }
  }
  freeaddrinfo(res);
  if (err != 0) throw NetError("direct data link to " + where + ": " + std::strerror(err));
  set_no_delay(conn.fd.get());
  if (identity_) seal_outgoing(conn, to, self, where, deadline);
  if (!say_hello(conn))
    throw NetError("direct data link to " + where + ": the hello could not be sent");
  return conn;
}

void DirectLinks::keep_outgoing(PeerId to, DirectConnection conn) {
  std::lock_guard lock(mutex_);
  auto& idle = idle_outgoing_[to];
  if (idle.size() < kIdlePerPeer) idle.push_back(std::move(conn));
}

std::optional<DirectConnection> DirectLinks::take(PeerId from, uint64_t op) {
  std::lock_guard lock(mutex_);
  auto it = arrived_.find({from, op});
  if (it == arrived_.end()) return std::nullopt;
  DirectConnection conn = std::move(it->second.conn);
  arrived_.erase(it);
  return conn;
}

void DirectLinks::wait_for_arrival(Clock::time_point until) {
  std::unique_lock lock(mutex_);
  arrived_cv_.wait_until(lock, until);
}

void DirectLinks::keep_incoming(DirectConnection conn, bool end_marker_read) {
  {
    std::lock_guard lock(mutex_);
    handed_back_.emplace_back(std::move(conn), end_marker_read);
  }
  wake();
}

size_t DirectLinks::Pending::want() const {
  switch (expect) {
    case Expect::sealed_hello:
      return kSealedHelloBytes;
    case Expect::end_marker:
      return kMarkerBytes + conn.tag_bytes();
    case Expect::op_hello:
      break;
  }
  return kOpHelloBytes + conn.tag_bytes();
}

bool DirectLinks::answer_sealed_hello(Pending& p) {
  const uint8_t* hello = p.bytes;
  if (get_u32(hello) != kSealedHelloMagic || get_u32(hello + 4) != 1) {
    log_("dropped a direct data connection: it did not start with a sealed-link hello");
    return false;
  }
  const PeerId sender = get_u64(hello + 8);
  if (get_u64(hello + 16) != identity_->self) {
    log_("dropped a direct data connection from " + short_peer_id(sender) +
         ": it was meant for peer " + short_peer_id(get_u64(hello + 16)));
    return false;
  }
  const auto theirs = identity_->public_keys.find(sender);
  if (theirs == identity_->public_keys.end()) {
    log_("dropped a direct data connection: peer " + short_peer_id(sender) +
         " is not on the allowlist");
    return false;
  }
  const EphemeralKey mine = make_ephemeral_key();
  uint8_t transcript[kSealedHelloBytes + kSealedReplyBytes];
  std::copy(hello, hello + kSealedHelloBytes, transcript);
  uint8_t* reply = transcript + kSealedHelloBytes;
  put_u32(reply, kSealedReplyMagic);
  put_u32(reply + 4, 1);
  std::copy(mine.public_key.begin(), mine.public_key.end(), reply + 8);
  Key32 their_fresh{};
  std::copy(hello + 24, hello + 56, their_fresh.begin());
  // A fresh connection's send buffer is empty: the reply goes out whole or the peer is gone.
  if (::send(p.conn.fd.get(), reply, kSealedReplyBytes, MSG_NOSIGNAL) !=
      static_cast<ssize_t>(kSealedReplyBytes))
    return false;
  const Key32 key = derive_link_key(x25519(identity_->secret, theirs->second),
                                    x25519(mine.secret, their_fresh), transcript);
  p.conn.cipher = std::make_unique<LinkCipher>(key, LinkCipher::Role::open);
  p.conn.peer = sender;
  p.expect = Pending::Expect::op_hello;
  return true;
}

bool DirectLinks::read_pending(Pending& p) {
  const size_t want = p.want();
  const ssize_t n = ::recv(p.conn.fd.get(), p.bytes + p.have, want - p.have, 0);
  if (n < 0) return errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
  if (n == 0) return true;  // closed: the sender dropped a kept connection
  if (p.have == 0) p.since = Clock::now();
  p.have += static_cast<size_t>(n);
  if (p.have < want) return false;
  p.have = 0;
  // On a sealed link each record after the handshake must prove itself before it is read.
  const auto authentic = [&](size_t header_bytes) {
    if (!p.conn.cipher ||
        p.conn.cipher->open({p.bytes, header_bytes}, nullptr, 0, p.bytes + header_bytes))
      return true;
    log_("dropped a direct data connection from " + short_peer_id(p.conn.peer) +
         ": a record failed authentication");
    return false;
  };
  switch (p.expect) {
    case Pending::Expect::sealed_hello:
      return !answer_sealed_hello(p);
    case Pending::Expect::end_marker:  // of the operation the connection carried before
      if (!authentic(kMarkerBytes)) return true;
      p.expect = Pending::Expect::op_hello;
      if (get_u32(p.bytes) == 0xFFFFFFFF && get_u32(p.bytes + 4) == 0xFFFFFFFF &&
          get_u64(p.bytes + 8) == 0)
        return false;
      log_("dropped a direct data connection: its operation did not end with an end marker");
      return true;
    case Pending::Expect::op_hello:
      break;
  }
  if (!authentic(kOpHelloBytes)) return true;
  const uint8_t* hello = p.bytes;
  if (get_u32(hello) != kDirectMagic || get_u32(hello + 4) != 1) {
    log_("dropped a direct data connection: it did not start with an operation hello");
    return true;
  }
  const PeerId sender = get_u64(hello + 8);
  const uint64_t op = get_u64(hello + 16);
  if (p.conn.cipher && sender != p.conn.peer) {
    log_("dropped a direct data connection from " + short_peer_id(p.conn.peer) +
         ": its hello claims peer " + short_peer_id(sender));
    return true;
  }
  {
    std::lock_guard lock(mutex_);
    arrived_.insert_or_assign({sender, op}, Arrived{std::move(p.conn), Clock::now()});
  }
  arrived_cv_.notify_all();
  return true;
}

void DirectLinks::accept_loop() {
  std::vector<Pending> watched;
  std::vector<pollfd> fds;
  for (;;) {
    const auto now = Clock::now();
    {
      std::lock_guard lock(mutex_);
      if (stop_) break;
      for (auto& [conn, marker_read] : handed_back_) {
        Pending p;
        p.conn = std::move(conn);
        p.expect = marker_read ? Pending::Expect::op_hello : Pending::Expect::end_marker;
        p.since = now;
        watched.push_back(std::move(p));
      }
      handed_back_.clear();
      for (auto it = arrived_.begin(); it != arrived_.end();)
        it = now - it->second.at > kUnclaimedTimeout ? arrived_.erase(it) : std::next(it);
    }
    std::erase_if(watched,
                  [&](const Pending& p) { return p.have > 0 && now - p.since > kHelloTimeout; });
    fds.assign({{wake_read_.get(), POLLIN, 0}, {listener_.get(), POLLIN, 0}});
    for (const auto& p : watched) fds.push_back({p.conn.fd.get(), POLLIN, 0});
    if (::poll(fds.data(), fds.size(), 1000) <= 0) continue;
    if (fds[0].revents) {
      uint8_t drain[64];
      while (::read(wake_read_.get(), drain, sizeof drain) > 0) {
      }
    }
    // Connections that had something to read, before new ones are appended.
    std::vector<bool> done(watched.size(), false);
    for (size_t i = 0; i < watched.size(); ++i)
      if (fds[i + 2].revents) {
        try {
          done[i] = read_pending(watched[i]);
        } catch (const NetError& e) {  // a handshake with a key that gives no secret
          log_(std::string("dropped a direct data connection: ") + e.what());
          done[i] = true;
        }
      }
    size_t k = 0;
    for (size_t i = 0; i < watched.size(); ++i)
      if (!done[i]) watched[k++] = std::move(watched[i]);
    watched.resize(k);
    if (fds[1].revents) {
      for (;;) {
        Fd fd(::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
        if (!fd) break;
        if (watched.size() >= kMaxWatched) {
          log_("refused a direct data connection: " + std::to_string(kMaxWatched) +
               " are already open");
          continue;
        }
        set_no_delay(fd.get());
        Pending p;
        p.conn.fd = std::move(fd);
        p.expect = identity_ ? Pending::Expect::sealed_hello : Pending::Expect::op_hello;
        p.since = Clock::now();
        watched.push_back(std::move(p));
      }
    }
  }
}

}  // namespace starling::net
