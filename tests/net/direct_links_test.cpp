// Direct data links (direct_links.h, direct_stream.h) on their own: frames cross a socket pair
// whole and in order however the socket splits them, the end marker stops the reader before
// the next operation's hello, a closed link and an oversized announcement are errors naming the
// neighbour, and a connection is filed by (sender, operation) and reused for the next operation.
// Sealed links (link_crypto.h): records round-trip, a flipped bit or a wrong key is caught, and
// the handshake admits only the peer the allowlist's key proves.
#include "starling/net/direct_links.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "starling/common/error.h"
#include "starling/net/direct_stream.h"
#include "starling/net/keys.h"

namespace net = starling::net;
using namespace std::chrono_literals;
using net::Clock;

namespace {

std::pair<net::DirectConnection, net::DirectConnection> socket_pair() {
  int fds[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds), 0);
  std::pair<net::DirectConnection, net::DirectConnection> p;
  p.first.fd = net::Fd(fds[0]);
  p.second.fd = net::Fd(fds[1]);
  return p;
}

zmq::message_t filled(size_t n, uint8_t seed) {
  zmq::message_t m(n);
  auto* p = static_cast<uint8_t*>(m.data());
  for (size_t i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(seed + i * 7);
  return m;
}

// A writer whose right link feeds a reader's left link over a socket pair.
struct StreamPair {
  net::DirectStream writer, reader;
};
StreamPair stream_pair(size_t reader_max_frame) {
  auto [a, b] = socket_pair();
  StreamPair p;
  p.writer.configure(4 << 20, "left", "right");
  p.reader.configure(reader_max_frame, "peer-left", "peer-right");
  p.writer.set_right(std::move(a));
  p.reader.set_left(std::move(b));
  return p;
}

// Pumps both streams until `reader` has `count` frames (or a deadline passes).
std::vector<net::DirectStream::Frame> move_frames(net::DirectStream& writer,
                                                  net::DirectStream& reader, size_t count) {
  std::vector<net::DirectStream::Frame> got;
  const auto keep = [&](net::DirectStream::Frame f) { got.push_back(std::move(f)); };
  const auto deadline = Clock::now() + 10s;
  while ((got.size() < count || writer.sending()) && Clock::now() < deadline) {
    writer.pump(Clock::now(), -1, keep);
    reader.pump(Clock::now() + 1ms, -1, keep);
  }
  return got;
}

// Everything the socket has now (it must all have arrived already).
std::vector<uint8_t> drain(const net::DirectConnection& conn) {
  std::vector<uint8_t> bytes;
  uint8_t buf[65536];
  for (;;) {
    const ssize_t n = ::recv(conn.fd.get(), buf, sizeof buf, 0);
    if (n <= 0) break;
    bytes.insert(bytes.end(), buf, buf + n);
  }
  return bytes;
}

net::Key32 test_key(uint8_t seed) {
  net::Key32 k{};
  for (size_t i = 0; i < k.size(); ++i) k[i] = static_cast<uint8_t>(seed * 31 + i);
  return k;
}

// A sealed writer/reader pair; the reader's key may differ (a forger).
StreamPair sealed_pair(const net::Key32& writer_key, const net::Key32& reader_key) {
  auto [a, b] = socket_pair();
  a.cipher = std::make_unique<net::LinkCipher>(writer_key, net::LinkCipher::Role::seal);
  b.cipher = std::make_unique<net::LinkCipher>(reader_key, net::LinkCipher::Role::open);
  StreamPair p;
  p.writer.configure(4 << 20, "left", "right");
  p.reader.configure(4 << 20, "peer-left", "peer-right");
  p.writer.set_right(std::move(a));
  p.reader.set_left(std::move(b));
  return p;
}

struct Swarmling {  // one peer's CURVE keys and its sealed-link identity
  net::KeyPair keys = net::generate_keypair();
  net::PeerId id = net::peer_id_from_public_key(keys.public_key);
};

net::LinkIdentity identity_of(const Swarmling& self, const std::vector<const Swarmling*>& allowed) {
  net::LinkIdentity id;
  id.self = self.id;
  id.secret = net::raw_key(self.keys.secret_key);
  for (const Swarmling* s : allowed) id.public_keys[s->id] = net::raw_key(s->keys.public_key);
  return id;
}

}  // namespace

TEST(DirectStreamTest, FramesArriveWholeAndInOrderAcrossPartialWrites) {
  auto [writer, reader] = stream_pair(4 << 20);
  // Payloads far larger than a socket buffer, an empty one, and odd sizes.
  const std::vector<size_t> sizes{3 << 20, 0, 1, 4097, 1 << 20, 12345};
  for (size_t i = 0; i < sizes.size(); ++i)
    writer.queue(static_cast<uint32_t>(i), static_cast<uint32_t>(100 + i),
                 filled(sizes[i], static_cast<uint8_t>(i)));
  const auto got = move_frames(writer, reader, sizes.size());
  ASSERT_EQ(got.size(), sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ(got[i].step, i);
    EXPECT_EQ(got[i].chunk, 100 + i);
    const auto want = filled(sizes[i], static_cast<uint8_t>(i));
    ASSERT_EQ(got[i].payload.size(), sizes[i]);
    EXPECT_EQ(std::memcmp(got[i].payload.data(), want.data(), sizes[i]), 0) << "frame " << i;
  }
  EXPECT_TRUE(reader.between_frames());
}

TEST(DirectStreamTest, EndMarkerStopsTheReaderBeforeWhatFollows) {
  auto [writer, reader] = stream_pair(1 << 20);
  writer.queue(0, 0, filled(1000, 1));
  writer.queue_end();
  writer.queue(7, 7, filled(10, 2));  // stands for the next operation's bytes
  const auto got = move_frames(writer, reader, 1);
  ASSERT_EQ(got.size(), 1u);
  for (int i = 0; i < 10; ++i) reader.pump(Clock::now() + 1ms, -1, [](auto) { FAIL(); });
  EXPECT_TRUE(reader.left_ended());
  // What followed the marker is still unread on the socket.
  auto rest = reader.release_left();
  uint8_t header[net::kFrameHeaderBytes];
  EXPECT_EQ(::recv(rest.fd.get(), header, sizeof header, 0), static_cast<ssize_t>(sizeof header));
  EXPECT_EQ(header[0], 7);
}

TEST(DirectStreamTest, ClosedLinkAndOversizedFrameAreErrorsNamingTheNeighbour) {
  {
    auto [a, b] = socket_pair();
    net::DirectStream reader;
    reader.configure(1024, "peer-left", "peer-right");
    reader.set_left(std::move(b));
    a.fd.reset();
    try {
      reader.pump(Clock::now() + 1s, -1, [](auto) {});
      FAIL() << "no error";
    } catch (const starling::NetError& e) {
      EXPECT_NE(std::string(e.what()).find("peer-left closed its direct link"), std::string::npos)
          << e.what();
    }
  }
  {
    auto [writer, reader] = stream_pair(1024);
    writer.queue(0, 0, filled(2048, 0));
    writer.pump(Clock::now(), -1, [](auto) {});
    try {
      reader.pump(Clock::now() + 1s, -1, [](auto) {});
      FAIL() << "no error";
    } catch (const starling::NetError& e) {
      EXPECT_NE(std::string(e.what()).find("peer-left announced a chunk of 2048 bytes"),
                std::string::npos)
          << e.what();
    }
  }
}

TEST(DirectLinksTest, ConnectionsAreFiledByOperationAndReused) {
  std::vector<std::string> logged;
  net::DirectLinks receiver("127.0.0.1", [&](const std::string& l) { logged.push_back(l); });
  net::DirectLinks sender("127.0.0.1", [](const std::string&) {});
  const net::PeerId self = 0xABC, to = 0xDEF;
  ASSERT_NE(receiver.port(), 0);

  const auto take = [&](uint64_t op) {
    const auto deadline = Clock::now() + 5s;
    while (Clock::now() < deadline) {
      if (auto conn = receiver.take(self, op)) return std::move(*conn);
      receiver.wait_for_arrival(Clock::now() + 50ms);
    }
    ADD_FAILURE() << "operation " << op << " never arrived";
    return net::DirectConnection();
  };
  const auto local_port = [](const net::DirectConnection& conn) {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    ::getsockname(conn.fd.get(), reinterpret_cast<sockaddr*>(&addr), &len);
    return reinterpret_cast<sockaddr_in*>(&addr)->sin_port;
  };

  // Operation 1 on a new connection; one frame and the end marker.
  net::DirectConnection out =
      sender.open(to, "127.0.0.1", receiver.port(), self, 1, Clock::now() + 5s);
  const auto first_port = local_port(out);
  net::DirectConnection in = take(1);
  ASSERT_TRUE(in);
  EXPECT_FALSE(receiver.take(self, 2).has_value());
  net::DirectStream w, r;
  w.configure(1 << 20, "s", "r");
  r.configure(1 << 20, "s", "r");
  w.set_right(std::move(out));
  r.set_left(std::move(in));
  w.queue(0, 0, filled(100, 3));
  EXPECT_EQ(move_frames(w, r, 1).size(), 1u);
  w.queue_end();
  while (w.sending()) w.pump(Clock::now() + 10ms, -1, [](auto) {});
  // Kept on both sides before the receiver read the end marker: the accept thread reads it.
  sender.keep_outgoing(to, w.release_right());
  receiver.keep_incoming(r.release_left(), r.left_ended());

  // Operation 2 reuses the connection.
  net::DirectConnection again =
      sender.open(to, "127.0.0.1", receiver.port(), self, 2, Clock::now() + 5s);
  EXPECT_EQ(local_port(again), first_port);
  EXPECT_TRUE(take(2));

  // A stranger that does not say hello correctly is dropped and logged.
  {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(receiver.port());
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    const char junk[net::kOpHelloBytes] = "GET / HTTP/1.1\r\n\r\n";
    ASSERT_EQ(::send(fd, junk, sizeof junk, 0), static_cast<ssize_t>(sizeof junk));
    const auto deadline = Clock::now() + 5s;
    while (logged.empty() && Clock::now() < deadline) std::this_thread::sleep_for(10ms);
    ::close(fd);
  }
  ASSERT_FALSE(logged.empty());
  EXPECT_NE(logged[0].find("did not start with an operation hello"), std::string::npos);
}

TEST(DirectLinksTest, UnreachablePeerIsAnErrorNamingTheAddress) {
  net::DirectLinks links("127.0.0.1", [](const std::string&) {});
  // A port nobody listens on: bind one, then close it.
  uint16_t port = 0;
  {
    net::DirectLinks gone("127.0.0.1", [](const std::string&) {});
    port = gone.port();
  }
  try {
    links.open(1, "127.0.0.1", port, 2, 1, Clock::now() + 2s);
    FAIL() << "no error";
  } catch (const starling::NetError& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos)
        << e.what();
  }
}

TEST(DirectStreamTest, SealedFramesRoundTripAndEndWithAnAuthenticMarker) {
  auto [writer, reader] = sealed_pair(test_key(1), test_key(1));
  const std::vector<size_t> sizes{3 << 20, 0, 1, 4097};
  for (size_t i = 0; i < sizes.size(); ++i)
    writer.queue(static_cast<uint32_t>(i), 0, filled(sizes[i], static_cast<uint8_t>(i)));
  writer.queue_end();
  const auto got = move_frames(writer, reader, sizes.size());
  ASSERT_EQ(got.size(), sizes.size());
  for (size_t i = 0; i < sizes.size(); ++i) {
    const auto want = filled(sizes[i], static_cast<uint8_t>(i));
    ASSERT_EQ(got[i].payload.size(), sizes[i]);
    EXPECT_EQ(std::memcmp(got[i].payload.data(), want.data(), sizes[i]), 0) << "frame " << i;
  }
  for (int i = 0; i < 10 && !reader.left_ended(); ++i)
    reader.pump(Clock::now() + 1ms, -1, [](auto) { FAIL(); });
  EXPECT_TRUE(reader.left_ended());
  EXPECT_TRUE(reader.between_frames());
}

TEST(DirectStreamTest, SealedLinkCatchesAFlippedBitAndAWrongKey) {
  const auto expect_rejected = [](net::DirectStream& reader) {
    try {
      for (int i = 0; i < 100; ++i) reader.pump(Clock::now() + 1ms, -1, [](auto) { FAIL(); });
      FAIL() << "no error";
    } catch (const starling::NetError& e) {
      EXPECT_NE(std::string(e.what()).find("peer-left failed authentication"), std::string::npos)
          << e.what();
    }
  };
  {  // The bytes a sealed writer sent, with one ciphertext bit flipped on the way.
    auto [writer, sniffer] = sealed_pair(test_key(2), test_key(2));
    writer.queue(0, 0, filled(1000, 5));
    while (writer.sending()) writer.pump(Clock::now() + 1ms, -1, [](auto) {});
    auto wire = drain(sniffer.release_left());
    ASSERT_EQ(wire.size(), net::kFrameHeaderBytes + 1000 + net::LinkCipher::kTagBytes);
    wire[net::kFrameHeaderBytes + 500] ^= 0x10;
    auto [in, out] = socket_pair();
    out.cipher = std::make_unique<net::LinkCipher>(test_key(2), net::LinkCipher::Role::open);
    ASSERT_EQ(::send(in.fd.get(), wire.data(), wire.size(), 0), static_cast<ssize_t>(wire.size()));
    net::DirectStream reader;
    reader.configure(1 << 20, "peer-left", "peer-right");
    reader.set_left(std::move(out));
    expect_rejected(reader);
  }
  {  // A writer with another key (nobody else can make a record the reader accepts).
    auto [writer, reader] = sealed_pair(test_key(3), test_key(4));
    writer.queue(0, 0, filled(64, 1));
    while (writer.sending()) writer.pump(Clock::now() + 1ms, -1, [](auto) {});
    expect_rejected(reader);
  }
}

TEST(DirectLinksTest, SealedLinksAdmitOnlyThePeerTheAllowlistKeyProves) {
  Swarmling a, b, stranger;
  std::vector<std::string> logged;
  std::mutex log_mutex;
  net::DirectLinks receiver(
      "127.0.0.1",
      [&](const std::string& l) {
        std::lock_guard lock(log_mutex);
        logged.push_back(l);
      },
      identity_of(b, {&a, &b}));
  net::DirectLinks sender(
      "127.0.0.1", [](const std::string&) {}, identity_of(a, {&a, &b}));
  const auto take = [&](uint64_t op) {
    const auto deadline = Clock::now() + 3s;
    while (Clock::now() < deadline) {
      if (auto conn = receiver.take(a.id, op)) return std::move(*conn);
      receiver.wait_for_arrival(Clock::now() + 50ms);
    }
    return net::DirectConnection();
  };
  const auto wait_for_log = [&](const std::string& text) {
    const auto deadline = Clock::now() + 5s;
    while (Clock::now() < deadline) {
      {
        std::lock_guard lock(log_mutex);
        for (const auto& l : logged)
          if (l.find(text) != std::string::npos) return true;
      }
      std::this_thread::sleep_for(10ms);
    }
    return false;
  };

  // Two operations on one sealed connection: the records' count carries across them.
  for (uint64_t op : {1, 2}) {
    net::DirectConnection out =
        sender.open(b.id, "127.0.0.1", receiver.port(), a.id, op, Clock::now() + 5s);
    ASSERT_TRUE(out.cipher);
    net::DirectConnection in = take(op);
    ASSERT_TRUE(in) << "operation " << op << " never arrived; log: "
                    << (logged.empty() ? std::string("(empty)") : logged.back());
    ASSERT_TRUE(in.cipher);
    net::DirectStream w, r;
    w.configure(1 << 20, "a", "b");
    r.configure(1 << 20, "a", "b");
    w.set_right(std::move(out));
    r.set_left(std::move(in));
    w.queue(0, 0, filled(5000, static_cast<uint8_t>(op)));
    const auto got = move_frames(w, r, 1);
    ASSERT_EQ(got.size(), 1u);
    const auto want = filled(5000, static_cast<uint8_t>(op));
    EXPECT_EQ(std::memcmp(got[0].payload.data(), want.data(), 5000), 0);
    w.queue_end();
    while (w.sending()) w.pump(Clock::now() + 10ms, -1, [](auto) {});
    sender.keep_outgoing(b.id, w.release_right());
    receiver.keep_incoming(r.release_left(), r.left_ended());
  }

  // A peer with its own valid key that claims to be `a`: its records fail authentication.
  {
    net::DirectLinks impostor(
        "127.0.0.1", [](const std::string&) {},
        [&] {
          net::LinkIdentity id = identity_of(stranger, {&b});
          id.self = a.id;
          return id;
        }());
    auto conn = impostor.open(b.id, "127.0.0.1", receiver.port(), a.id, 3, Clock::now() + 5s);
    EXPECT_TRUE(wait_for_log("failed authentication"));
    EXPECT_FALSE(take(3));
  }
  // A peer that is not on the allowlist gets no handshake reply.
  {
    net::DirectLinks outsider(
        "127.0.0.1", [](const std::string&) {}, identity_of(stranger, {&b}));
    try {
      outsider.open(b.id, "127.0.0.1", receiver.port(), stranger.id, 4, Clock::now() + 3s);
      FAIL() << "no error";
    } catch (const starling::NetError& e) {
      EXPECT_NE(std::string(e.what()).find("no handshake reply"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(wait_for_log("is not on the allowlist"));
  }
}
