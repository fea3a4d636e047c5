// Direct data links (direct_links.h, direct_stream.h) on their own: frames cross a socket pair
// whole and in order however the socket splits them, the end marker stops the reader before
// the next operation's hello, a closed link and an oversized announcement are errors naming the
// neighbour, and a connection is filed by (sender, operation) and reused for the next operation.
#include "starling/net/direct_links.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <thread>
#include <vector>

#include "starling/common/error.h"
#include "starling/net/direct_stream.h"

namespace net = starling::net;
using namespace std::chrono_literals;
using net::Clock;

namespace {

std::pair<net::Fd, net::Fd> socket_pair() {
  int fds[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds), 0);
  return {net::Fd(fds[0]), net::Fd(fds[1])};
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
  EXPECT_EQ(::recv(rest.get(), header, sizeof header, 0), static_cast<ssize_t>(sizeof header));
  EXPECT_EQ(header[0], 7);
}

TEST(DirectStreamTest, ClosedLinkAndOversizedFrameAreErrorsNamingTheNeighbour) {
  {
    auto [a, b] = socket_pair();
    net::DirectStream reader;
    reader.configure(1024, "peer-left", "peer-right");
    reader.set_left(std::move(b));
    a.reset();
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
      if (auto fd = receiver.take(self, op)) return std::move(*fd);
      receiver.wait_for_arrival(Clock::now() + 50ms);
    }
    ADD_FAILURE() << "operation " << op << " never arrived";
    return net::Fd();
  };
  const auto local_port = [](const net::Fd& fd) {
    sockaddr_storage addr{};
    socklen_t len = sizeof addr;
    ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len);
    return reinterpret_cast<sockaddr_in*>(&addr)->sin_port;
  };

  // Operation 1 on a new connection; one frame and the end marker.
  net::Fd out = sender.open(to, "127.0.0.1", receiver.port(), self, 1, Clock::now() + 5s);
  const auto first_port = local_port(out);
  net::Fd in = take(1);
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
  net::Fd again = sender.open(to, "127.0.0.1", receiver.port(), self, 2, Clock::now() + 5s);
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
