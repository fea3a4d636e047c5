// The delays of a network lab's links. The kernels these labs run on have no sch_netem (nor
// sch_fq, which would honour a departure time set by a tc program), so no qdisc can hold a frame
// back for a while. Instead the lab's hub stops bridging (netlab.sh unbridge) and this relay
// carries the frames: a thread in the hub's namespace reads each port p<i> through a packet
// socket, holds every frame for the delay of its link and writes it to the destination's port.
// Rates stay with tc: a peer's upload is shaped on its eth0 before the frame reaches the hub (and
// a download, where a lab shapes one, on p<j> after the relay), so a link is shaped first and
// delayed after, as a real one serialises a frame and then carries it.
//
// The relay is a learning switch: it learns each port's MAC addresses from the frames that port
// sends, forwards a frame to the port of its destination address, and floods broadcasts,
// multicasts and unknown destinations to every other port (each copy with its own link's delay).
// Frames keep their offload metadata (PACKET_VNET_HDR), so TCP's 64 KB super-frames cross whole
// and a 1 Gbit link costs the relay a few thousand frames a second, not a hundred thousand.
// The frames of one source and destination leave in the order they arrived (a pair's delay is
// constant). A link holding more than kMaxQueuedBytes, or the relay more than kMaxTotalBytes,
// drops what comes next, as a router's full buffer does; so does a frame larger than 64 KB. If
// the relay fails while running (ppoll refused, out of memory), it says so on stderr and stops:
// the lab's links carry nothing from then on.
//
// Torch-free: it links into the plain networking test binary.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace starling::net {

class LabDelayRelay {
 public:
  static constexpr int64_t kMaxQueuedBytes = 64 << 20;  // per ordered pair of ports
  static constexpr int64_t kMaxTotalBytes = 512 << 20;  // over all of them

  // Starts the relay in the namespace `hub_ns` (a name under /run/netns) between the ports
  // p0 .. p<N-1> there, N = delays_s.size(); delays_s[a][b] is the one-way delay in seconds of
  // frames from port a to port b (the diagonal is ignored). Returns once every port is open.
  // Throws std::runtime_error naming the namespace or port and the system error when it cannot
  // (no namespace, no port, packet sockets refused); std::invalid_argument unless delays_s is
  // square with finite delays in [0, 60] s.
  LabDelayRelay(const std::string& hub_ns, std::vector<std::vector<double>> delays_s);
  // Stops the thread; frames still held are dropped.
  ~LabDelayRelay();

  LabDelayRelay(const LabDelayRelay&) = delete;
  LabDelayRelay& operator=(const LabDelayRelay&) = delete;

  struct Stats {
    int64_t frames = 0;   // forwarded (each flooded copy counts)
    int64_t dropped = 0;  // a full link's queue, or the port refused the write
  };
  Stats stats() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace starling::net
