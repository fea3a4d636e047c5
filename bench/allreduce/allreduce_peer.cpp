// One peer of the all-reduce bandwidth benchmark (bench/allreduce/run.py starts N of them, on
// loopback or each in its own network namespace of a netlab). Both backends run the same loop
// through the Collectives interface, so the only difference measured is the backend.
//
//   starling_allreduce_peer --keygen DIR --world N
//       writes DIR/peer<i>.key (+ .pub) for i < N and the allowlist DIR/swarm.allow
//   starling_allreduce_peer --backend starling|gloo --rank R --world N --ip IP
//       --root-ip IP0 --root-port P [--keys DIR | --insecure] [--precision fp32|fp16|bf16|int8]
//       [--sizes 1,16,64] [--reps 3] [--warmup 1] [--chunk-bytes B]
//
// Rank 0 is the rendezvous: for starling it listens on tcp://IP0:P and the others join through
// it; for gloo it hosts the c10d TCPStore on P. Every other rank listens on IP (a free port).
//
// Per size and repetition, every peer refills its buffer, passes a barrier (a one-float
// all-reduce), then times one all-reduce of the buffer from launch to wait() returning. After
// the barrier all peers start within a round trip of each other; run.py takes, per repetition,
// the slowest peer's time (the collective is done when the last peer is done).
//
// Prints one JSON line on stdout: backend, rank, precision, and per size the fp32 payload bytes,
// every timed repetition's seconds, median/min, algbw = bytes/t and busbw = bytes*2(n-1)/n/t
// (MB/s, 1 MB = 1e6 bytes; for a compressed precision these are *effective* bandwidths: fp32
// bytes over time), the largest error against the exact sum, and (starling) bytes this peer sent.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "starling/common/error.h"
#include "starling/net/gloo_backend.h"
#include "starling/net/node.h"

namespace net = starling::net;
namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  std::string backend = "starling";
  int rank = 0, world = 4;
  std::string ip = "127.0.0.1", root_ip = "127.0.0.1";
  int root_port = 29650;
  std::string keys_dir, keygen_dir;
  bool insecure = false;
  bool zmq_data = false;  // chunks through ZeroMQ rather than direct links
  std::string precision = "fp32";
  std::vector<double> sizes_mb{1, 16};
  int reps = 3, warmup = 1;
  size_t chunk_bytes = 0;  // 0: the Node's default
  int timeout_s = 600;
};

// A small integer per element and rank: sums are exact in fp32 in any order, and int8's
// per-group scale has something to quantise.
float value(int rank, size_t i) {
  return static_cast<float>(static_cast<int>((i * 7 + static_cast<size_t>(rank) * 5) % 19) - 9);
}

// save_keypair's .pub line is "KEY name"; the allowlist is those lines together.
void keygen(const fs::path& dir, int world) {
  fs::create_directories(dir);
  std::ofstream allow(dir / "swarm.allow");
  for (int i = 0; i < world; ++i) {
    net::KeyPair keys = net::generate_keypair();
    // '#' is a Z85 digit, and an allowlist line that begins with '#' is a comment: a key that
    // starts with one (1 in 85) would silently drop out of the swarm. Draw again.
    while (keys.public_key.front() == '#') keys = net::generate_keypair();
    const std::string name = "peer" + std::to_string(i);
    net::save_keypair(keys, dir / (name + ".key"), name);
    allow << keys.public_key << " " << name << "\n";
  }
  if (!allow.flush())
    throw starling::ConfigError((dir / "swarm.allow").string() + ": write failed");
}

std::unique_ptr<net::Collectives> connect(const Args& a) {
  if (a.backend == "gloo") {
    net::GlooOptions o;
    o.rank = a.rank;
    o.world_size = a.world;
    o.store = a.root_ip + ":" + std::to_string(a.root_port);
    o.interface = a.ip;
    o.timeout = std::chrono::seconds(a.timeout_s);
    return std::make_unique<net::GlooBackend>(o);
  }
  net::NodeOptions o;
  o.name = "peer" + std::to_string(a.rank);
  o.listen = "tcp://" + (a.rank == 0 ? a.root_ip + ":" + std::to_string(a.root_port) : a.ip + ":0");
  o.insecure = a.insecure;
  o.direct_data = !a.zmq_data;
  if (!a.insecure) {
    if (a.keys_dir.empty()) throw starling::ConfigError("--keys DIR is required unless --insecure");
    o.keys = net::load_keypair(fs::path(a.keys_dir) / (o.name + ".key"));
    o.allowlist = net::load_allowlist(fs::path(a.keys_dir) / "swarm.allow");
  }
  if (a.rank != 0) o.join = {"tcp://" + a.root_ip + ":" + std::to_string(a.root_port)};
  if (a.chunk_bytes > 0) o.chunk_bytes = a.chunk_bytes;
  o.join_timeout = std::chrono::seconds(60);
  o.collective_timeout = std::chrono::seconds(a.timeout_s);
  // A saturated 10 Mbit link delays heartbeats behind seconds of queued data; the benchmark
  // measures bandwidth, not failure detection.
  o.peer_timeout = std::chrono::seconds(30);
  auto node = std::make_unique<net::Node>(o);
  if (!node->wait_for_members(static_cast<size_t>(a.world), std::chrono::seconds(60)))
    throw starling::NetError("fewer than " + std::to_string(a.world) + " peers joined within 60 s");
  return node;
}

void barrier(net::Collectives& c) {
  float one = 1.0f;
  net::CollectiveOptions o;
  o.order = net::RingOrder::by_id;
  c.all_reduce(std::span<float>(&one, 1), o).wait();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n == 0 ? 0 : (n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2);
}

json run(const Args& a) {
  const auto p = starling::compress::parse_wire_precision(a.precision);
  if (!p)
    throw starling::ConfigError("--precision: '" + a.precision +
                                "' is not fp32, fp16, bf16 or int8");
  std::unique_ptr<net::Collectives> backend = connect(a);
  auto* node = dynamic_cast<net::Node*>(backend.get());
  net::CollectiveOptions options;
  options.precision = *p;
  // Stable rings: this measures bandwidth, not how well rings are ordered.
  options.order = net::RingOrder::by_id;
  const int n = a.world;

  json results = json::array();
  for (double mb : a.sizes_mb) {
    const size_t count = static_cast<size_t>(std::llround(mb * 1e6 / sizeof(float)));
    const double bytes = static_cast<double>(count) * sizeof(float);
    std::vector<float> data(count);
    std::vector<double> seconds;
    double max_err = 0;
    uint64_t sent = 0;
    for (int rep = 0; rep < a.warmup + a.reps; ++rep) {
      for (size_t i = 0; i < count; ++i) data[i] = value(a.rank, i);
      barrier(*backend);
      const uint64_t sent_before = node ? node->counters().bytes_sent : 0;
      const auto t0 = Clock::now();
      backend->all_reduce(data, options).wait();
      const double t = std::chrono::duration<double>(Clock::now() - t0).count();
      if (rep < a.warmup) continue;
      seconds.push_back(t);
      if (node) sent += node->counters().bytes_sent - sent_before;
      if (rep == a.warmup) {  // checked once: the check costs as much as a loopback all-reduce
        for (size_t i = 0; i < count; ++i) {
          double want = 0;
          for (int r = 0; r < n; ++r) want += value(r, i);
          max_err = std::max(max_err, std::abs(want - static_cast<double>(data[i])));
        }
      }
    }
    const double med = median(seconds);
    const double best = seconds.empty() ? 0 : *std::min_element(seconds.begin(), seconds.end());
    json r = {{"mb", mb},
              {"bytes", bytes},
              {"seconds", seconds},
              {"median_s", med},
              {"min_s", best},
              {"algbw_MBps", med > 0 ? bytes / med / 1e6 : 0},
              {"busbw_MBps", med > 0 ? bytes * 2 * (n - 1) / n / med / 1e6 : 0},
              {"max_err", max_err}};
    if (node) r["sent_bytes_per_rep"] = seconds.empty() ? 0 : sent / seconds.size();
    results.push_back(r);
    std::fprintf(stderr, "rank %d: %g MB median %.3f s\n", a.rank, mb, med);
  }
  barrier(*backend);  // nobody leaves while a neighbour may still need its last chunks
  // Node fails an operation when any ring member announces it left, even one that has done its
  // part: a peer quick to finish the barrier above and leave would fail it for the others.
  // Lingering lets everyone finish first.
  if (node) std::this_thread::sleep_for(std::chrono::seconds(2));
  return {{"backend", a.backend},
          {"rank", a.rank},
          {"world", n},
          {"precision", a.precision},
          {"secure", a.backend == "starling" && !a.insecure},
          {"results", results}};
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Starling all-reduce benchmark peer (see bench/allreduce/README.md)"};
  Args a;
  app.add_option("--keygen", a.keygen_dir,
                 "write N key pairs and an allowlist into DIR, then exit");
  app.add_option("--backend", a.backend)->check(CLI::IsMember({"starling", "gloo"}));
  app.add_option("--rank", a.rank);
  app.add_option("--world", a.world)->check(CLI::Range(1, 256));
  app.add_option("--ip", a.ip, "this peer's address");
  app.add_option("--root-ip", a.root_ip, "rank 0's address");
  app.add_option("--root-port", a.root_port, "rank 0's rendezvous port")
      ->check(CLI::Range(1, 65535));
  app.add_option("--keys", a.keys_dir, "directory written by --keygen (starling, secure)");
  app.add_flag("--insecure", a.insecure, "starling without CURVE (plain TCP)");
  app.add_flag("--zmq-data", a.zmq_data,
               "collective chunks through ZeroMQ, not direct links (net.direct_data)");
  app.add_option("--precision", a.precision, "wire precision (starling)");
  app.add_option("--sizes", a.sizes_mb, "payload sizes in MB (1e6 bytes of fp32)")->delimiter(',');
  app.add_option("--reps", a.reps, "timed repetitions per size")->check(CLI::Range(1, 1000));
  app.add_option("--warmup", a.warmup, "untimed repetitions first")->check(CLI::Range(0, 100));
  app.add_option("--chunk-bytes", a.chunk_bytes, "starling: fp32 bytes per pipelined chunk");
  app.add_option("--timeout-s", a.timeout_s, "per-collective timeout");
  CLI11_PARSE(app, argc, argv);
  try {
    if (!a.keygen_dir.empty()) {
      keygen(a.keygen_dir, a.world);
      return 0;
    }
    if (a.rank < 0 || a.rank >= a.world)
      throw starling::ConfigError("--rank must be in 0.." + std::to_string(a.world - 1));
    const json out = run(a);
    std::printf("%s\n", out.dump().c_str());
    std::fflush(stdout);
  } catch (const starling::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    std::printf("%s\n", json({{"error", e.what()}, {"rank", a.rank}}).dump().c_str());
    return 1;
  }
  return 0;
}
