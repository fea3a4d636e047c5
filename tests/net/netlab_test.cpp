// Tests of the network lab itself: shaped links deliver the configured bandwidth, and labs never
// outlive their owner (normal teardown, teardown on exceptions, garbage collection after a crash).
#include "starling/net/netlab.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <future>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace starling::net {
namespace {

using Clock = std::chrono::steady_clock;

bool netns_exists(const std::string& ns) { return std::filesystem::exists("/run/netns/" + ns); }

// Where netlab.sh keeps per-lab state (its NETLAB_STATE_DIR).
std::filesystem::path state_dir(const std::string& lab) {
  const char* dir = std::getenv("NETLAB_STATE_DIR");
  return std::filesystem::path(dir != nullptr && *dir != '\0' ? dir : "/run/starling-netlab") / lab;
}

// Joins an argv into a shell command line; lab names and addresses contain no shell metachars.
std::string join(const std::vector<std::string>& argv) {
  std::string s;
  for (const auto& a : argv) s += (s.empty() ? "" : " ") + a;
  return s;
}

// Runs a shell command and returns its stdout (empty on failure).
std::string capture(const std::string& cmd) {
  std::string out;
  FILE* f = ::popen((cmd + " 2>&1").c_str(), "r");
  if (f == nullptr) return out;
  std::array<char, 512> buf;
  while (std::fgets(buf.data(), buf.size(), f) != nullptr) out += buf.data();
  ::pclose(f);
  return out;
}

// Moves the calling thread into network namespace `ns`. Network namespaces are per thread, and
// sockets keep the namespace they were created in, so each side of a transfer runs on its own
// thread that enters its peer's namespace first: no helper processes, nothing to kill on failure.
void enter_netns(const std::string& ns) {
  int fd = ::open(("/run/netns/" + ns).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error("open /run/netns/" + ns + ": " + std::strerror(errno));
  int rc = ::setns(fd, CLONE_NEWNET);
  int err = errno;
  ::close(fd);
  if (rc != 0) throw std::runtime_error("setns " + ns + ": " + std::strerror(err));
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

void set_timeouts(int fd, int seconds) {
  timeval tv{seconds, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
}

sockaddr_in address(const std::string& ip, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  if (::inet_pton(AF_INET, ip.c_str(), &a.sin_addr) != 1) throw std::runtime_error("bad ip " + ip);
  return a;
}

// Sends `bytes` over TCP from namespace `from_ns` to `to_ip` in `to_ns` and returns the goodput
// the receiver saw, in bit/s (payload bytes over the time from the first byte to EOF). Every
// blocking call has a timeout and the whole transfer a deadline, so a broken lab fails the test
// instead of hanging it.
double measure_tcp_bps(const std::string& from_ns, const std::string& to_ns,
                       const std::string& to_ip, size_t bytes, std::chrono::seconds deadline) {
  std::promise<uint16_t> port_promise;
  auto port_future = port_promise.get_future();
  const auto give_up = Clock::now() + deadline;

  auto server = std::async(std::launch::async, [&]() -> double {
    std::optional<Fd> listener;
    try {
      enter_netns(to_ns);
      listener.emplace(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
      sockaddr_in a = address(to_ip, 0);
      socklen_t len = sizeof a;
      if (listener->get() < 0 || ::bind(listener->get(), (sockaddr*)&a, sizeof a) != 0 ||
          ::listen(listener->get(), 1) != 0 ||
          ::getsockname(listener->get(), (sockaddr*)&a, &len)) {
        throw std::runtime_error(std::string("server socket: ") + std::strerror(errno));
      }
      port_promise.set_value(ntohs(a.sin_port));
    } catch (...) {
      port_promise.set_exception(std::current_exception());
      throw;
    }
    pollfd p{listener->get(), POLLIN, 0};
    if (::poll(&p, 1, 5000) != 1) throw std::runtime_error("no connection within 5 s");
    Fd conn(::accept4(listener->get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (conn.get() < 0) throw std::runtime_error(std::string("accept: ") + std::strerror(errno));
    set_timeouts(conn.get(), 5);
    std::vector<char> buf(1 << 20);
    size_t received = 0;
    Clock::time_point first{}, last{};
    for (;;) {
      ssize_t k = ::recv(conn.get(), buf.data(), buf.size(), 0);
      if (k < 0 && errno == EINTR) continue;
      if (k < 0) throw std::runtime_error(std::string("recv: ") + std::strerror(errno));
      if (k == 0) break;
      if (received == 0) first = Clock::now();
      received += static_cast<size_t>(k);
      if (Clock::now() > give_up) throw std::runtime_error("transfer missed its deadline");
    }
    last = Clock::now();
    if (received != bytes) {
      throw std::runtime_error("received " + std::to_string(received) + " of " +
                               std::to_string(bytes) + " bytes");
    }
    return static_cast<double>(received) * 8.0 /
           std::chrono::duration<double>(last - first).count();
  });

  auto client = std::async(std::launch::async, [&] {
    enter_netns(from_ns);
    if (port_future.wait_for(std::chrono::seconds(5)) != std::future_status::ready) {
      throw std::runtime_error("server did not start within 5 s");
    }
    sockaddr_in a = address(to_ip, port_future.get());
    Fd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    set_timeouts(s.get(), 5);
    // Bounded, so a stalled link shows up as a send timeout, not as data parked in a huge buffer.
    int sndbuf = 256 << 10;
    ::setsockopt(s.get(), SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof sndbuf);
    if (::connect(s.get(), (sockaddr*)&a, sizeof a) != 0) {
      throw std::runtime_error(std::string("connect: ") + std::strerror(errno));
    }
    std::vector<char> chunk(64 << 10, 'x');
    size_t sent = 0;
    while (sent < bytes) {
      ssize_t k = ::send(s.get(), chunk.data(), std::min(chunk.size(), bytes - sent), MSG_NOSIGNAL);
      if (k < 0 && errno == EINTR) continue;
      if (k <= 0) throw std::runtime_error(std::string("send: ") + std::strerror(errno));
      sent += static_cast<size_t>(k);
      if (Clock::now() > give_up) throw std::runtime_error("transfer missed its deadline");
    }
    ::shutdown(s.get(), SHUT_WR);
  });

  client.get();  // rethrows the client's error, if any
  return server.get();
}

// The median round trip of a 1-byte TCP ping-pong from `from_ns` to `to_ip` in `to_ns`, in
// seconds, over `rounds` exchanges on one connection (TCP_NODELAY, so no exchange waits for
// Nagle). Every call has a timeout, so a broken lab fails instead of hanging.
double measure_rtt_s(const std::string& from_ns, const std::string& to_ns, const std::string& to_ip,
                     int rounds) {
  std::promise<uint16_t> port_promise;
  auto port_future = port_promise.get_future();
  auto server = std::async(std::launch::async, [&] {
    enter_netns(to_ns);
    Fd l(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in a = address(to_ip, 0);
    if (::bind(l.get(), (sockaddr*)&a, sizeof a) != 0 || ::listen(l.get(), 1) != 0)
      throw std::runtime_error(std::string("bind/listen: ") + std::strerror(errno));
    socklen_t len = sizeof a;
    ::getsockname(l.get(), (sockaddr*)&a, &len);
    port_promise.set_value(ntohs(a.sin_port));
    pollfd p{l.get(), POLLIN, 0};
    if (::poll(&p, 1, 5000) != 1) throw std::runtime_error("no connection within 5 s");
    Fd c(::accept(l.get(), nullptr, nullptr));
    set_timeouts(c.get(), 5);
    const int one = 1;
    ::setsockopt(c.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    char byte = 0;
    for (int i = 0; i < rounds; ++i)
      if (::recv(c.get(), &byte, 1, MSG_WAITALL) != 1 || ::send(c.get(), &byte, 1, 0) != 1)
        throw std::runtime_error("echo failed");
  });
  std::vector<double> rtts;
  auto client = std::async(std::launch::async, [&] {
    enter_netns(from_ns);
    if (port_future.wait_for(std::chrono::seconds(5)) != std::future_status::ready)
      throw std::runtime_error("server did not start within 5 s");
    sockaddr_in a = address(to_ip, port_future.get());
    Fd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    set_timeouts(s.get(), 5);
    const int one = 1;
    ::setsockopt(s.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (::connect(s.get(), (sockaddr*)&a, sizeof a) != 0)
      throw std::runtime_error(std::string("connect: ") + std::strerror(errno));
    char byte = 'x';
    for (int i = 0; i < rounds; ++i) {
      const auto t0 = Clock::now();
      if (::send(s.get(), &byte, 1, 0) != 1 || ::recv(s.get(), &byte, 1, MSG_WAITALL) != 1)
        throw std::runtime_error("ping failed");
      rtts.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
    }
  });
  client.get();
  server.get();
  std::sort(rtts.begin(), rtts.end());
  return rtts[rtts.size() / 2];
}

#define SKIP_IF_UNAVAILABLE()                                           \
  do {                                                                  \
    if (std::string why = NetLab::unavailable_reason(); !why.empty()) { \
      GTEST_SKIP() << why;                                              \
    }                                                                   \
  } while (0)

TEST(NetLabTest, ShapedLinkDeliversItsRate) {
  SKIP_IF_UNAVAILABLE();
  NetLab lab(2, "10mbit");
  constexpr double kRate = 10e6;
  // 3 s of traffic: long enough that the initial bucket (a few frames) and TCP's start-up are
  // noise, short enough for the suite. The ideal TCP goodput is 1448/1514 = 0.956 of the rate
  // (tbf counts Ethernet, IP and TCP headers).
  const size_t bytes = static_cast<size_t>(kRate / 8 * 3);
  double bps = 0;
  ASSERT_NO_THROW(
      bps = measure_tcp_bps(lab.ns(0), lab.ns(1), lab.ip(1), bytes, std::chrono::seconds(8)));
  RecordProperty("goodput_mbit", std::to_string(bps / 1e6));
  std::printf("10mbit link: TCP goodput %.2f Mbit/s\n", bps / 1e6);
  EXPECT_GE(bps, 0.85 * kRate) << "goodput " << bps / 1e6 << " Mbit/s";
  EXPECT_LE(bps, 1.10 * kRate) << "goodput " << bps / 1e6 << " Mbit/s";
}

TEST(NetLabTest, EachPairOfPeersHasALinkOfItsOwn) {
  SKIP_IF_UNAVAILABLE();
  // Peer 0 reaches peer 1 at 10mbit and peer 2 unshaped; nothing else is shaped.
  NetLab lab({{"", "10mbit", "unlimited"}, {"", "", ""}, {"", "", ""}});
  const size_t bytes = static_cast<size_t>(10e6 / 8 * 2);
  double slow = 0, fast = 0, back = 0;
  ASSERT_NO_THROW(
      slow = measure_tcp_bps(lab.ns(0), lab.ns(1), lab.ip(1), bytes, std::chrono::seconds(8)));
  ASSERT_NO_THROW(
      fast = measure_tcp_bps(lab.ns(0), lab.ns(2), lab.ip(2), bytes, std::chrono::seconds(8)));
  ASSERT_NO_THROW(
      back = measure_tcp_bps(lab.ns(1), lab.ns(0), lab.ip(0), bytes, std::chrono::seconds(8)));
  std::printf("0->1 %.2f Mbit/s, 0->2 %.2f Mbit/s, 1->0 %.2f Mbit/s\n", slow / 1e6, fast / 1e6,
              back / 1e6);
  EXPECT_GE(slow, 0.85 * 10e6);
  EXPECT_LE(slow, 1.10 * 10e6);
  // The other destinations of the same upload, and the other direction, are not held back.
  EXPECT_GT(fast, 5 * slow);
  EXPECT_GT(back, 5 * slow);
  EXPECT_THROW(NetLab({{"", "1mbit"}, {""}}), std::invalid_argument);
}

TEST(NetLabTest, ARateChangeReshapesOnePeersLinkBothWays) {
  SKIP_IF_UNAVAILABLE();
  NetLab lab(3, "100mbit");
  lab.set_rate(1, "10mbit");
  const size_t bytes = static_cast<size_t>(10e6 / 8 * 2);
  double to = 0, from = 0, others = 0;
  ASSERT_NO_THROW(
      to = measure_tcp_bps(lab.ns(0), lab.ns(1), lab.ip(1), bytes, std::chrono::seconds(8)));
  ASSERT_NO_THROW(
      from = measure_tcp_bps(lab.ns(1), lab.ns(2), lab.ip(2), bytes, std::chrono::seconds(8)));
  ASSERT_NO_THROW(others = measure_tcp_bps(lab.ns(0), lab.ns(2), lab.ip(2), 5 * bytes,
                                           std::chrono::seconds(8)));
  std::printf("0->1 %.2f Mbit/s, 1->2 %.2f Mbit/s, 0->2 %.2f Mbit/s\n", to / 1e6, from / 1e6,
              others / 1e6);
  // Peer 1's download and upload run at the new rate; the link between the others keeps its own.
  for (const double bps : {to, from}) {
    EXPECT_GE(bps, 0.85 * 10e6);
    EXPECT_LE(bps, 1.10 * 10e6);
  }
  EXPECT_GT(others, 5 * to);
  lab.set_rate(1, "unlimited");
  ASSERT_NO_THROW(
      from = measure_tcp_bps(lab.ns(1), lab.ns(2), lab.ip(2), 5 * bytes, std::chrono::seconds(8)));
  EXPECT_GT(from, 5 * to) << "unlimited should remove peer 1's shaping";
  EXPECT_THROW(lab.set_rate(1, "fast"), std::runtime_error);
}

TEST(NetLabTest, LinksCarryTheirDelays) {
  SKIP_IF_UNAVAILABLE();
  // 0 <-> 1: 20 ms each way at 10mbit; 0 <-> 2: no delay, unshaped; 1 -> 2: 5 ms, 2 -> 1: 15 ms.
  NetLab lab({{"", "10mbit", ""}, {"10mbit", "", ""}, {"", "", ""}},
             {{0, 0.020, 0}, {0.020, 0, 0.005}, {0, 0.015, 0}});
  double slow = 0, fast = 0, skew = 0, bps = 0;
  ASSERT_NO_THROW(slow = measure_rtt_s(lab.ns(0), lab.ns(1), lab.ip(1), 20));
  ASSERT_NO_THROW(fast = measure_rtt_s(lab.ns(0), lab.ns(2), lab.ip(2), 20));
  ASSERT_NO_THROW(skew = measure_rtt_s(lab.ns(1), lab.ns(2), lab.ip(2), 20));
  // The rate still holds on a delayed link (10 Mbit/s over a 40 ms round trip: a 50 KB window).
  ASSERT_NO_THROW(bps =
                      measure_tcp_bps(lab.ns(0), lab.ns(1), lab.ip(1),
                                      static_cast<size_t>(10e6 / 8 * 3), std::chrono::seconds(10)));
  std::printf("round trips: 0-1 %.1f ms, 0-2 %.2f ms, 1-2 %.1f ms; 0->1 %.2f Mbit/s\n", slow * 1e3,
              fast * 1e3, skew * 1e3, bps / 1e6);
  EXPECT_GE(slow, 0.040);
  EXPECT_LE(slow, 0.050);
  EXPECT_LE(fast, 0.005);
  EXPECT_GE(skew, 0.020);
  EXPECT_LE(skew, 0.030);
  EXPECT_GE(bps, 0.85 * 10e6);
  EXPECT_LE(bps, 1.10 * 10e6);
  EXPECT_THROW(NetLab({{"", ""}, {"", ""}}, {{0, 0.01}}), std::invalid_argument);
}

TEST(NetLabTest, PeersAreAddressableAndTeardownRemovesEverything) {
  SKIP_IF_UNAVAILABLE();
  std::string name;
  std::vector<std::string> namespaces;
  {
    NetLab lab(3, "unlimited");
    name = lab.name();
    namespaces = {lab.ns(0), lab.ns(1), lab.ns(2), name + "-hub"};
    for (const auto& ns : namespaces) EXPECT_TRUE(netns_exists(ns)) << ns;
    EXPECT_NE(lab.ip(0), lab.ip(1));
    // exec_prefix really runs inside the peer's namespace: eth0 there carries ip(1).
    auto argv = lab.exec_prefix(1);
    argv.insert(argv.end(), {"ip", "-4", "-o", "addr", "show", "dev", "eth0"});
    EXPECT_NE(capture(join(argv)).find(lab.ip(1) + "/24"), std::string::npos);
    EXPECT_THROW(lab.ip(3), std::out_of_range);
  }
  for (const auto& ns : namespaces) EXPECT_FALSE(netns_exists(ns)) << ns;
  EXPECT_FALSE(std::filesystem::exists(state_dir(name)));
}

// The fastest rate `train --link-rate` takes (100tbit) builds a lab: tc keeps a qdisc's burst and
// queue in 32 bits, and from about 700gbit up their sizes used to overflow ("illegal value for
// limit").
TEST(NetLabTest, TheFastestRateAcceptedBuildsALab) {
  SKIP_IF_UNAVAILABLE();
  for (const char* rate : {"1tbit", "100tbit"}) {
    std::string name;
    EXPECT_NO_THROW({
      NetLab lab(2, rate);
      name = lab.name();
    }) << rate;
    EXPECT_FALSE(name.empty()) << rate;
  }
}

TEST(NetLabTest, TornDownWhenTestBodyThrows) {
  SKIP_IF_UNAVAILABLE();
  std::string name;
  EXPECT_THROW(
      {
        NetLab lab(2, "100mbit");
        name = lab.name();
        EXPECT_TRUE(netns_exists(name + "-0"));
        throw std::runtime_error("test body failed");
      },
      std::runtime_error);
  ASSERT_FALSE(name.empty());
  EXPECT_FALSE(netns_exists(name + "-0"));
  EXPECT_FALSE(netns_exists(name + "-1"));
  EXPECT_FALSE(netns_exists(name + "-hub"));
}

TEST(NetLabTest, CollectsLabsOfDeadOwners) {
  SKIP_IF_UNAVAILABLE();
  // A lab whose owner dies after building it, as a crashed test run would leave it. The owner
  // dies only once the lab is complete, so a concurrent test process's gc cannot race the build.
  pid_t owner = ::fork();
  if (owner == 0) {
    ::sleep(30);
    ::_exit(0);
  }
  ASSERT_GT(owner, 0);
  const std::string stale = "nlstale" + std::to_string(::getpid());
  const std::string cmd = "NETLAB_OWNER_PID=" + std::to_string(owner) + " bash " +
                          NetLab::script_path() + " up " + stale + " 1 unlimited";
  int rc = std::system(cmd.c_str());
  ::kill(owner, SIGKILL);
  ::waitpid(owner, nullptr, 0);
  ASSERT_EQ(rc, 0) << cmd;

  NetLab lab(1, "unlimited");  // garbage-collects on construction
  EXPECT_FALSE(netns_exists(stale + "-0"));
  EXPECT_FALSE(netns_exists(stale + "-hub"));
  EXPECT_FALSE(std::filesystem::exists(state_dir(stale)));
  EXPECT_TRUE(netns_exists(lab.ns(0)));
  rc = std::system(("bash " + NetLab::script_path() + " down " + stale).c_str());  // if it failed
}

}  // namespace
}  // namespace starling::net
