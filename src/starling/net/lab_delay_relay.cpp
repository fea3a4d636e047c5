#include "starling/net/lab_delay_relay.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/if_ether.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <deque>
#include <future>
#include <iostream>
#include <map>
#include <stdexcept>
#include <thread>

namespace starling::net {
namespace {

// PACKET_VNET_HDR's prefix on every frame read or written: struct virtio_net_hdr.
constexpr size_t kVnetHeader = 10;
constexpr size_t kMaxFrame = kVnetHeader + 65536;

int64_t now_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

std::string sys_error(const std::string& what) { return what + ": " + std::strerror(errno); }

struct Held {
  int64_t due_ns;
  std::string bytes;  // virtio header + Ethernet frame
};

using Mac = std::array<unsigned char, 6>;

}  // namespace

struct LabDelayRelay::State {
  std::vector<std::vector<int64_t>> delay_ns;
  std::vector<int> sockets;
  int wake = -1;  // eventfd: the destructor's stop signal
  std::thread thread;
  std::atomic<int64_t> frames{0}, dropped{0};

  // Per ordered pair (from * n + to): the frames in flight and their bytes.
  std::vector<std::deque<Held>> queues;
  std::vector<int64_t> queued_bytes;
  int64_t total_bytes = 0;
  std::map<Mac, int> port_of;

  int n() const { return static_cast<int>(delay_ns.size()); }

  void open_ports(const std::string& hub_ns) {
    const std::string path = "/run/netns/" + hub_ns;
    const int ns = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (ns < 0) throw std::runtime_error(sys_error("lab delay relay: cannot open " + path));
    // This thread alone enters the hub; the process stays where it is.
    const int rc = ::setns(ns, CLONE_NEWNET);
    ::close(ns);
    if (rc != 0) throw std::runtime_error(sys_error("lab delay relay: setns into " + hub_ns));
    for (int i = 0; i < n(); ++i) {
      std::string port = "p";  // (one append: GCC 12 misreads "p" + to_string as overlapping)
      port += std::to_string(i);
      const unsigned index = ::if_nametoindex(port.c_str());
      if (index == 0)
        throw std::runtime_error(sys_error("lab delay relay: no port " + port + " in " + hub_ns));
      const int s = ::socket(AF_PACKET, SOCK_RAW | SOCK_NONBLOCK | SOCK_CLOEXEC, htons(ETH_P_ALL));
      if (s < 0) throw std::runtime_error(sys_error("lab delay relay: packet socket on " + port));
      sockets.push_back(s);
      const int one = 1;
      if (::setsockopt(s, SOL_PACKET, PACKET_VNET_HDR, &one, sizeof one) != 0)
        throw std::runtime_error(sys_error("lab delay relay: PACKET_VNET_HDR on " + port));
      // Our own writes to a port would otherwise come back as frames it sent (older kernels
      // lack the option: those frames are told apart by their packet type below).
      ::setsockopt(s, SOL_PACKET, PACKET_IGNORE_OUTGOING, &one, sizeof one);
      // Room for a burst of 64 KB frames while this thread is off the CPU: past rmem_max with
      // the FORCE options (the lab runs as root), the plain ones where they are refused.
      const int buffer = 8 << 20;
      if (::setsockopt(s, SOL_SOCKET, SO_RCVBUFFORCE, &buffer, sizeof buffer) != 0)
        ::setsockopt(s, SOL_SOCKET, SO_RCVBUF, &buffer, sizeof buffer);
      if (::setsockopt(s, SOL_SOCKET, SO_SNDBUFFORCE, &buffer, sizeof buffer) != 0)
        ::setsockopt(s, SOL_SOCKET, SO_SNDBUF, &buffer, sizeof buffer);
      sockaddr_ll at{};
      at.sll_family = AF_PACKET;
      at.sll_protocol = htons(ETH_P_ALL);
      at.sll_ifindex = static_cast<int>(index);
      if (::bind(s, reinterpret_cast<sockaddr*>(&at), sizeof at) != 0)
        throw std::runtime_error(sys_error("lab delay relay: bind to " + port));
    }
  }

  void hold(int from, int to, const std::string& bytes, int64_t now) {
    const size_t q = static_cast<size_t>(from * n() + to);
    const auto size = static_cast<int64_t>(bytes.size());
    if (queued_bytes[q] + size > kMaxQueuedBytes || total_bytes + size > kMaxTotalBytes) {
      dropped.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    queued_bytes[q] += size;
    total_bytes += size;
    queues[q].push_back({now + delay_ns[from][to], bytes});
  }

  void receive(int from, std::string& buffer) {
    for (int burst = 0; burst < 64; ++burst) {
      sockaddr_ll src{};
      socklen_t len = sizeof src;
      // MSG_TRUNC: the frame's whole length, so one larger than the buffer is dropped, not cut.
      const ssize_t k = ::recvfrom(sockets[from], buffer.data(), buffer.size(), MSG_TRUNC,
                                   reinterpret_cast<sockaddr*>(&src), &len);
      if (k < 0) return;  // EAGAIN: drained (any other error: the next poll tells again)
      if (src.sll_pkttype == PACKET_OUTGOING) continue;
      if (static_cast<size_t>(k) > buffer.size()) {
        dropped.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      if (static_cast<size_t>(k) < kVnetHeader + ETH_HLEN) continue;
      const auto* eth = reinterpret_cast<const unsigned char*>(buffer.data()) + kVnetHeader;
      Mac dst, source;
      std::memcpy(dst.data(), eth, 6);
      std::memcpy(source.data(), eth + 6, 6);
      port_of[source] = from;
      const std::string frame(buffer.data(), static_cast<size_t>(k));
      const int64_t now = now_ns();
      auto known = port_of.find(dst);
      if ((dst[0] & 1) == 0 && known != port_of.end()) {
        if (known->second != from) hold(from, known->second, frame, now);
      } else {
        for (int to = 0; to < n(); ++to)
          if (to != from) hold(from, to, frame, now);
      }
    }
  }

  // Writes every frame that is due; returns the earliest due time still held (or -1).
  int64_t release(int64_t now) {
    int64_t next = -1;
    for (int from = 0; from < n(); ++from)
      for (int to = 0; to < n(); ++to) {
        const size_t q = static_cast<size_t>(from * n() + to);
        auto& queue = queues[q];
        while (!queue.empty() && queue.front().due_ns <= now) {
          const std::string& bytes = queue.front().bytes;
          if (::send(sockets[to], bytes.data(), bytes.size(), MSG_DONTWAIT) < 0)
            dropped.fetch_add(1, std::memory_order_relaxed);  // the port's queue is full
          else
            frames.fetch_add(1, std::memory_order_relaxed);
          queued_bytes[q] -= static_cast<int64_t>(bytes.size());
          total_bytes -= static_cast<int64_t>(bytes.size());
          queue.pop_front();
        }
        if (!queue.empty() && (next < 0 || queue.front().due_ns < next))
          next = queue.front().due_ns;
      }
    return next;
  }

  void run() {
    std::vector<pollfd> fds;
    for (int s : sockets) fds.push_back({s, POLLIN, 0});
    fds.push_back({wake, POLLIN, 0});
    std::string buffer(kMaxFrame, '\0');
    for (;;) {
      const int64_t next = release(now_ns());
      timespec wait{};
      timespec* timeout = nullptr;
      if (next >= 0) {
        const int64_t left = std::max<int64_t>(0, next - now_ns());
        wait.tv_sec = static_cast<time_t>(left / 1'000'000'000);
        wait.tv_nsec = static_cast<long>(left % 1'000'000'000);
        timeout = &wait;
      }
      const int k = ::ppoll(fds.data(), fds.size(), timeout, nullptr);
      if (k < 0 && errno != EINTR) throw std::runtime_error(sys_error("ppoll"));
      if (fds.back().revents != 0) return;
      for (int i = 0; i < n(); ++i) {
        pollfd& fd = fds[static_cast<size_t>(i)];
        if (fd.revents & POLLIN) receive(i, buffer);
        if (fd.revents & POLLERR) {  // a port going down: read the error so poll stops saying so
          int error = 0;
          socklen_t len = sizeof error;
          ::getsockopt(fd.fd, SOL_SOCKET, SO_ERROR, &error, &len);
        }
        if (fd.revents & POLLNVAL) fd.fd = -1;  // poll ignores it from now on
      }
    }
  }
};

LabDelayRelay::LabDelayRelay(const std::string& hub_ns, std::vector<std::vector<double>> delays_s)
    : state_(std::make_unique<State>()) {
  const size_t n = delays_s.size();
  if (n < 2) throw std::invalid_argument("LabDelayRelay: needs at least 2 ports");
  for (size_t a = 0; a < n; ++a) {
    if (delays_s[a].size() != n)
      throw std::invalid_argument("LabDelayRelay: the delay matrix must be square");
    std::vector<int64_t> row;
    for (size_t b = 0; b < n; ++b) {
      const double d = a == b ? 0.0 : delays_s[a][b];
      if (!std::isfinite(d) || d < 0 || d > 60)
        throw std::invalid_argument("LabDelayRelay: delay " + std::to_string(d) + " s from " +
                                    std::to_string(a) + " to " + std::to_string(b) +
                                    " is outside [0, 60] s");
      row.push_back(static_cast<int64_t>(std::llround(d * 1e9)));
    }
    state_->delay_ns.push_back(std::move(row));
  }
  state_->queues.resize(n * n);
  state_->queued_bytes.assign(n * n, 0);
  state_->wake = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (state_->wake < 0) throw std::runtime_error(sys_error("lab delay relay: eventfd"));
  std::promise<void> opened;
  auto ready = opened.get_future();
  State* s = state_.get();
  try {
    s->thread = std::thread([s, hub_ns, opened = std::move(opened)]() mutable {
      try {
        s->open_ports(hub_ns);
      } catch (...) {
        opened.set_exception(std::current_exception());
        return;
      }
      opened.set_value();
      try {
        s->run();
      } catch (const std::exception& e) {
        // The lab's links are dead from here on: say so where the swarm's output goes, rather
        // than end the launcher.
        std::cerr << "lab delay relay in " << hub_ns << " stopped: " << e.what() << "\n";
      }
    });
    ready.get();
  } catch (...) {
    if (s->thread.joinable()) s->thread.join();
    for (int fd : s->sockets) ::close(fd);
    ::close(s->wake);
    throw;
  }
}

LabDelayRelay::~LabDelayRelay() {
  const uint64_t one = 1;
  (void)!::write(state_->wake, &one, sizeof one);
  if (state_->thread.joinable()) state_->thread.join();
  for (int fd : state_->sockets) ::close(fd);
  ::close(state_->wake);
}

LabDelayRelay::Stats LabDelayRelay::stats() const {
  return {state_->frames.load(std::memory_order_relaxed),
          state_->dropped.load(std::memory_order_relaxed)};
}

}  // namespace starling::net
