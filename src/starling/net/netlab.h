// NetLab: peers on bandwidth-limited links, for tests and benchmarks that need a real network
// slower than loopback. A thin RAII owner of a lab built by scripts/netlab.sh (see its header for
// the topology): N network namespaces, each with one interface (eth0, address ip(i)) into a
// bridge, every link shaped in both directions with tc tbf at the given rate. Peers reach each
// other only through the lab, so tests on one machine see the bandwidth of a real slow network.
//
// Needs root (or CAP_NET_ADMIN + CAP_SYS_ADMIN), iproute2 and the sch_tbf qdisc; tests call
// unavailable_reason() first and GTEST_SKIP() with it, so the suite still passes elsewhere.
//
// Typical use:
//   if (auto why = NetLab::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
//   NetLab lab(2, "10mbit");
//   auto argv = lab.exec_prefix(1);  // {"ip", "netns", "exec", "<ns>"}: run a peer in ns 1
//   argv.insert(argv.end(), {"starling", "peer", "--listen", lab.ip(1) + ":7000"});
//
// Torch-free on purpose: it links into the plain networking test binary.
#pragma once

#include <memory>
#include <string>
#include <vector>

namespace starling::net {

class LabDelayRelay;

class NetLab {
 public:
  // Empty if labs can be built here (root, network namespaces, veth, bridge, tbf all work; the
  // probe builds and removes a throwaway namespace once per process and caches the answer),
  // otherwise a one-line reason suitable for GTEST_SKIP().
  static std::string unavailable_reason();

  // The scripts/netlab.sh this helper drives: $STARLING_NETLAB_SCRIPT if set, else
  // STARLING_SOURCE_DIR "/scripts/netlab.sh" (a compile definition).
  static std::string script_path();

  // Builds a lab of `peers` (1..254) namespaces whose links run at `rate`, a tc rate such as
  // "10mbit", "100mbit", "1gbit", or "unlimited" for no shaping. First removes stale labs left by
  // crashed earlier runs (any lab whose owner process is gone), so a killed test never leaks
  // namespaces for long. The name is unique per process and object ("nl<pid>x<k>"), so parallel
  // test processes (ctest -j) do not collide. Throws std::runtime_error with the script's output
  // if the lab cannot be built; nothing is left behind then.
  NetLab(int peers, std::string rate);

  // A lab where every ordered pair of peers has a link of its own: rates[a][b] is the tc rate from
  // peer a to peer b ("unlimited" = not shaped; the diagonal is ignored), shaped on a's upload per
  // destination (netlab.sh shape: an htb class per destination address). Downloads are not
  // shaped, so a peer receiving from several others at once is bounded only by their links. The
  // same cleanup and errors as above; std::invalid_argument unless `rates` is square.
  //
  // With `delays_s` (the same shape; delays_s[a][b] the one-way delay in seconds from a to b,
  // any of them above zero) the hub stops bridging and a LabDelayRelay thread of this process
  // carries every frame between the peers, holding each for its link's delay (net/
  // lab_delay_relay.h: the kernels here have no netem). The relay lives as long as this object.
  explicit NetLab(const std::vector<std::vector<std::string>>& rates,
                  const std::vector<std::vector<double>>& delays_s = {});

  // Removes every namespace of the lab. Runs during stack unwinding too, so a failing or throwing
  // test still cleans up; never throws (a failure to remove is reported on stderr and left to the
  // next run's garbage collection).
  ~NetLab();

  NetLab(const NetLab&) = delete;
  NetLab& operator=(const NetLab&) = delete;

  // Peer i's IPv4 address (dotted quad, no prefix length) on its lab interface.
  std::string ip(int i) const;
  // Peer i's network namespace name (as in /run/netns/).
  std::string ns(int i) const;
  // argv prefix that runs a command inside peer i's namespace: {"ip", "netns", "exec", ns(i)}.
  std::vector<std::string> exec_prefix(int i) const;

  // Reshapes peer i's link, both directions, to `rate` (netlab.sh rate; "unlimited" removes the
  // shaping), replacing what the constructor gave it: one peer of a running lab slows down while
  // the others keep their links. std::runtime_error with the script's output on failure.
  void set_rate(int i, const std::string& rate);

  const std::string& name() const { return name_; }
  int peers() const { return peers_; }
  // The rate the lab was built with ("per link" for a matrix of rates); set_rate leaves it.
  const std::string& rate() const { return rate_; }

 private:
  std::string name_;
  int peers_;
  std::string rate_;
  std::vector<std::string> ips_;
  std::unique_ptr<LabDelayRelay> relay_;  // only where links have delays

  void build();
};

}  // namespace starling::net
