// Swarms of real processes (tests/support/net_worker.cpp) on loopback and in network namespaces
// with shaped links: collectives of several sizes and peer counts agree bit for bit, a peer
// killed with SIGKILL in the middle of an all-reduce costs the survivors one timeout (then they
// go on without it), and SIGTERM makes a peer announce its departure.
#include <gtest/gtest.h>
#include <signal.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "starling/common/process.h"
#include "starling/net/keys.h"
#include "starling/net/netlab.h"

namespace fs = std::filesystem;
namespace net = starling::net;
using json = nlohmann::json;
using starling::Process;
using starling::net::NetLab;
using namespace std::chrono_literals;

namespace {

class SwarmDir {
 public:
  explicit SwarmDir(int peers) {
    dir_ = fs::temp_directory_path() /
           ("starling_swarm_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ofstream allow(dir_ / "swarm.allow");
    for (int i = 0; i < peers; ++i) {
      const auto keys = net::generate_keypair();
      net::save_keypair(keys, key(i), name(i));
      allow << keys.public_key << " " << name(i) << "\n";
    }
  }
  ~SwarmDir() { fs::remove_all(dir_); }

  static std::string name(int i) { return std::string(1, static_cast<char>('a' + i)); }
  std::string key(int i) const { return (dir_ / (name(i) + ".key")).string(); }
  std::string allow() const { return (dir_ / "swarm.allow").string(); }
  std::string log(int i) const { return (dir_ / (name(i) + ".log")).string(); }

  // argv of a worker; `prefix` runs it in a namespace.
  std::vector<std::string> worker(int i, const std::string& listen, const std::string& join,
                                  const std::vector<std::string>& extra,
                                  std::vector<std::string> prefix = {}) const {
    std::vector<std::string> argv = std::move(prefix);
    argv.insert(argv.end(), {STARLING_NET_WORKER, "--name", name(i), "--listen", listen, "--key",
                             key(i), "--allow", allow()});
    if (!join.empty()) argv.insert(argv.end(), {"--join", join});
    argv.insert(argv.end(), extra.begin(), extra.end());
    return argv;
  }

 private:
  fs::path dir_;
  static inline int counter_ = 0;
};

std::string endpoint_of(Process& p) {
  const auto line = p.read_line(10s);
  if (!line) return {};
  const auto j = json::parse(*line, nullptr, false);
  if (j.is_discarded() || j.value("event", "") != "listening") {
    ADD_FAILURE() << "worker said: " << *line;
    return {};
  }
  return j["endpoint"].get<std::string>();
}

std::vector<json> op_lines(const std::vector<std::string>& lines) {
  std::vector<json> out;
  for (const auto& l : lines) {
    const auto j = json::parse(l, nullptr, false);
    if (!j.is_discarded() && j.value("event", "") == "op") out.push_back(j);
  }
  return out;
}

// Starts `n` workers (the first founds the swarm) running `ops`, returns their op lines.
// `flags` go to every worker (e.g. --insecure: plain direct links; --zmq-data: chunks through
// ZeroMQ).
std::vector<std::vector<json>> run_swarm(int n, const std::string& ops, int rounds,
                                         const NetLab* lab = nullptr,
                                         const std::vector<std::string>& flags = {}) {
  SwarmDir dir(n);
  std::vector<Process> procs;
  std::string first;
  for (int i = 0; i < n; ++i) {
    const std::string host = lab ? lab->ip(i) : "127.0.0.1";
    std::vector<std::string> extra{"--expect", std::to_string(n), "--ops",
                                   ops,        "--rounds",        std::to_string(rounds)};
    extra.insert(extra.end(), flags.begin(), flags.end());
    procs.emplace_back(dir.worker(i, "tcp://" + host + ":0", first, extra,
                                  lab ? lab->exec_prefix(i) : std::vector<std::string>{}),
                       dir.log(i));
    const std::string ep = endpoint_of(procs.back());
    EXPECT_FALSE(ep.empty()) << "peer " << i << " did not start";
    if (i == 0) first = ep;
  }
  std::vector<std::vector<json>> out;
  for (auto& p : procs) {
    out.push_back(op_lines(p.read_all(120s)));
    EXPECT_EQ(p.wait(10s), 0);
  }
  return out;
}

void expect_agreement(const std::vector<std::vector<json>>& results, size_t ops_per_peer) {
  for (size_t i = 0; i < results.size(); ++i) {
    ASSERT_EQ(results[i].size(), ops_per_peer) << "peer " << i;
    for (const auto& op : results[i]) {
      EXPECT_TRUE(op.value("ok", false)) << op.dump();
      EXPECT_TRUE(op.value("correct", false)) << op.dump();
    }
  }
  for (size_t k = 0; k < ops_per_peer; ++k) {
    if (results[0][k]["kind"] == "reduce_scatter") continue;  // each peer holds its own shard
    std::set<std::string> hashes;
    for (const auto& r : results) hashes.insert(r[k]["hash"].get<std::string>());
    EXPECT_EQ(hashes.size(), 1u) << "op " << k << " differs between peers";
  }
}

}  // namespace

TEST(SwarmTest, CollectivesAgreeBitForBitAcrossProcesses) {
  const std::string ops =
      "all_reduce:1:fp32,all_reduce:4099:fp32:mean,all_reduce:300000:fp16,"
      "all_reduce:70001:int8,all_reduce:5000:bf16,reduce_scatter:9999:fp32,"
      "all_gather:12345:fp32,broadcast:65536:fp32:b";
  // CURVE swarms carry the chunks on sealed direct links (two rounds: kept connections reused).
  for (int n : {2, 3, 4}) {
    SCOPED_TRACE("peers: " + std::to_string(n));
    expect_agreement(run_swarm(n, ops, 2), 16);
  }
  {
    SCOPED_TRACE("CURVE, chunks through ZeroMQ");
    expect_agreement(run_swarm(4, ops, 2, nullptr, {"--zmq-data"}), 16);
  }
  SCOPED_TRACE("insecure, plain direct links");
  expect_agreement(run_swarm(4, ops, 2, nullptr, {"--insecure"}), 16);
}

// A kill mid-operation on each data path: CURVE on sealed direct links, CURVE through ZeroMQ, and
// insecure on plain direct links (where the survivors also see the dead peer's connections close).
class KilledPeerTest : public ::testing::TestWithParam<std::string> {};

TEST_P(KilledPeerTest, CostsOneTimeoutThenSurvivorsContinue) {
  const std::string path = GetParam();
  SwarmDir dir(4);
  std::vector<Process> procs;
  std::string first;
  // Large all-reduces back to back with small chunks, so a kill lands mid-operation.
  for (int i = 0; i < 4; ++i) {
    std::vector<std::string> flags{"--expect", "4",
                                   "--ops",    "all_reduce:4000000:fp32",
                                   "--rounds", "40",
                                   "--retry",  "--timeout-ms",
                                   "1500",     "--chunk-bytes",
                                   "65536"};
    if (path == "Insecure") flags.push_back("--insecure");
    if (path == "CurveZmq") flags.push_back("--zmq-data");
    procs.emplace_back(dir.worker(i, "tcp://127.0.0.1:0", first, flags), dir.log(i));
    const std::string ep = endpoint_of(procs.back());
    ASSERT_FALSE(ep.empty());
    if (i == 0) first = ep;
  }
  // Let a couple of rounds complete, then kill peer d without warning.
  for (int i = 0; i < 4; ++i) ASSERT_TRUE(procs[i].read_line(30s));  // "members"
  ASSERT_TRUE(procs[0].read_line(30s));                              // first op done
  procs[3].signal(SIGKILL);
  const auto killed_at = std::chrono::steady_clock::now();
  for (int i = 0; i < 3; ++i) {
    bool failed = false, recovered = false;
    while (auto line = procs[i].read_line(60s)) {
      const auto j = json::parse(*line, nullptr, false);
      if (j.value("event", "") != "op") continue;
      if (!j.value("ok", true)) {
        failed = true;
        EXPECT_LT(std::chrono::steady_clock::now() - killed_at, 4s) << "error came too late";
        EXPECT_NE(j["error"].get<std::string>().find("d"), std::string::npos) << j.dump();
      } else if (failed || j["ring"].size() == 3) {
        EXPECT_EQ(j["ring"].size(), 3u) << j.dump();
        EXPECT_TRUE(j.value("correct", false)) << j.dump();
        recovered = true;
        break;
      }
    }
    EXPECT_TRUE(recovered) << "peer " << i << " never ran an all-reduce among the survivors";
  }
}

INSTANTIATE_TEST_SUITE_P(SwarmTest, KilledPeerTest,
                         ::testing::Values("Curve", "CurveZmq", "Insecure"),
                         [](const auto& info) { return info.param; });

TEST(SwarmTest, TerminatedPeerAnnouncesItsDeparture) {
  SwarmDir dir(3);
  std::vector<Process> procs;
  std::string first;
  for (int i = 0; i < 3; ++i) {
    procs.emplace_back(dir.worker(i, "tcp://127.0.0.1:0", first,
                                  {"--expect", "3", "--linger-ms", "60000", "--timeout-ms", "20000",
                                   "--heartbeat-ms", "100"}),
                       dir.log(i));
    const std::string ep = endpoint_of(procs.back());
    ASSERT_FALSE(ep.empty());
    if (i == 0) first = ep;
  }
  for (auto& p : procs) ASSERT_TRUE(p.read_line(30s));  // "members"
  procs[2].signal(SIGTERM);
  EXPECT_EQ(procs[2].wait(5s), 0);
  // With a 20 s timeout only the announcement can explain a quick "left".
  std::this_thread::sleep_for(300ms);
  std::ifstream log(dir.log(0));
  std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("left the swarm"), std::string::npos) << text;
}

TEST(SwarmTest, FourPeersOnShapedLinksInNamespaces) {
  if (auto why = NetLab::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  NetLab lab(4, "100mbit");
  expect_agreement(run_swarm(4,
                             "all_reduce:1000000:fp32,all_reduce:1000000:int8,"
                             "broadcast:100000:fp32:c",
                             1, &lab),
                   3);
  // Direct links bind to the lab addresses and run through the shaped links too.
  expect_agreement(
      run_swarm(4, "all_reduce:1000000:fp32,broadcast:100000:fp32:c", 1, &lab, {"--insecure"}), 2);
}

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A peer whose loop is busy when a newcomer's bandwidth probe comes (held 300 ms after each
// hello, as CPUs taken by the peers' start-up hold it) finds the probe's marker and payload queued
// together. Timing the two read microseconds, and a 20 Mbit link read tens of Gbit/s; the peer now
// asks for another probe and reads the link's own rate.
TEST(SwarmTest, APeerBusyWhenAProbeComesStillReadsTheLinksRate) {
  if (auto why = NetLab::unavailable_reason(); !why.empty()) GTEST_SKIP() << why;
  NetLab lab(2, "20mbit");
  SwarmDir dir(2);
  std::vector<Process> procs;
  std::string first;
  for (int i = 0; i < 2; ++i) {
    procs.emplace_back(dir.worker(i, "tcp://" + lab.ip(i) + ":0", first,
                                  {"--expect", "2", "--linger-ms", "3000", "--probe-bytes", "65536",
                                   "--hold-after-hello-ms", "300"},
                                  lab.exec_prefix(i)),
                       dir.log(i));
    const std::string ep = endpoint_of(procs.back());
    ASSERT_FALSE(ep.empty()) << "peer " << i << " did not start";
    if (i == 0) first = ep;
  }
  for (int i = 0; i < 2; ++i) {
    json done;
    for (const auto& line : procs[static_cast<size_t>(i)].read_all(30s)) {
      const auto j = json::parse(line, nullptr, false);
      if (!j.is_discarded() && j.value("event", "") == "done") done = j;
    }
    EXPECT_EQ(procs[static_cast<size_t>(i)].wait(10s), 0);
    ASSERT_TRUE(done.contains("incoming_mbit_per_s")) << "peer " << i << " ended without a report";
    const std::string other = SwarmDir::name(1 - i);
    ASSERT_TRUE(done["incoming_mbit_per_s"].contains(other))
        << "peer " << i << " never measured the link from " << other << ": " << done.dump() << "\n"
        << read_text(dir.log(i));
    const double mbit = done["incoming_mbit_per_s"][other].get<double>();
    std::printf("peer %d reads the 20 Mbit link from %s at %.1f Mbit/s\n", i, other.c_str(), mbit);
    EXPECT_GE(mbit, 10) << "peer " << i;
    EXPECT_LE(mbit, 30) << "peer " << i << ":\n" << read_text(dir.log(i));
  }
}
