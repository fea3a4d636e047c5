// A peer for multi-process network tests: joins a swarm, runs a script of collectives on
// deterministic data, checks each result against the value it must have, and prints one JSON
// line per operation. Tests start several of these (on loopback or in network namespaces),
// kill some, and compare what the survivors print.
//
//   starling_net_worker --name a --listen tcp://127.0.0.1:0 --key a.key --allow swarm.allow
//       [--join tcp://127.0.0.1:PORT] --expect 4 --ops all_reduce:1000:fp32:sum,broadcast:10:fp32:a
//       --rounds 3 [--retry]
//
// Output lines: {"event":"listening","endpoint":...,"id":...}, then per operation
// {"event":"op","round":r,"kind":...,"ok":true,"correct":true,"hash":...,"ring":[names],...}
// or {"event":"op","ok":false,"error":...}, then {"event":"done"}.
#include <CLI/CLI.hpp>
#include <atomic>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "starling/common/error.h"
#include "starling/net/node.h"

namespace net = starling::net;
using json = nlohmann::json;

namespace {

std::atomic<bool> g_stop{false};

uint64_t name_hash(const std::string& s) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : s) h = (h ^ c) * 1099511628211ull;
  return h;
}

// Integer-valued floats: any summation order gives the exact same fp32 sum. The same in every
// round, so a peer that joins late checks its results just like the others.
float value(const std::string& name, int /*round*/, size_t i) {
  return static_cast<float>(static_cast<int>((name_hash(name) % 1000 + i * 7) % 17) - 8);
}

std::string fnv_hex(const float* p, size_t n) {
  uint64_t h = 1469598103934665603ull;
  const auto* b = reinterpret_cast<const unsigned char*>(p);
  for (size_t i = 0; i < n * sizeof(float); ++i) h = (h ^ b[i]) * 1099511628211ull;
  return net::format_peer_id(h);
}

struct OpSpec {
  net::CollectiveKind kind;
  size_t count;
  net::CollectiveOptions options;
  std::string root_name;
};

OpSpec parse_op(const std::string& text) {
  std::vector<std::string> f;
  std::stringstream ss(text);
  for (std::string part; std::getline(ss, part, ':');) f.push_back(part);
  if (f.size() < 3)
    throw starling::ConfigError("--ops: '" + text + "' is not kind:count:precision");
  OpSpec op;
  if (f[0] == "all_reduce")
    op.kind = net::CollectiveKind::all_reduce;
  else if (f[0] == "reduce_scatter")
    op.kind = net::CollectiveKind::reduce_scatter;
  else if (f[0] == "all_gather")
    op.kind = net::CollectiveKind::all_gather;
  else if (f[0] == "broadcast")
    op.kind = net::CollectiveKind::broadcast;
  else
    throw starling::ConfigError("--ops: unknown collective '" + f[0] + "'");
  op.count = std::stoull(f[1]);
  auto p = starling::compress::parse_wire_precision(f[2]);
  if (!p) throw starling::ConfigError("--ops: unknown precision '" + f[2] + "'");
  op.options.precision = *p;
  op.options.order = net::RingOrder::by_id;
  if (f.size() > 3) {
    if (op.kind == net::CollectiveKind::broadcast)
      op.root_name = f[3];
    else if (f[3] == "mean")
      op.options.op = net::ReduceOp::mean;
  }
  return op;
}

void emit(const json& j) {
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Starling network test peer"};
  std::string name, listen = "tcp://127.0.0.1:0", advertise, key, allow, ops_text;
  std::vector<std::string> join;
  bool insecure = false, retry = false, zmq_data = false;
  size_t expect = 1, chunk_bytes = 64 * 1024;
  int rounds = 1, timeout_ms = 2000, heartbeat_ms = 200, pause_ms = 0, linger_ms = 500;
  int hold_after_hello_ms = 0;
  size_t probe_bytes = 16 * 1024;
  app.add_option("--name", name)->required();
  app.add_option("--listen", listen);
  app.add_option("--advertise", advertise);
  app.add_option("--key", key);
  app.add_option("--allow", allow);
  app.add_flag("--insecure", insecure);
  app.add_flag("--zmq-data", zmq_data);  // collective chunks through ZeroMQ, not direct links
  app.add_option("--join", join);
  app.add_option("--expect", expect);
  app.add_option("--ops", ops_text);
  app.add_option("--rounds", rounds);
  app.add_flag("--retry", retry);
  app.add_option("--timeout-ms", timeout_ms);
  app.add_option("--heartbeat-ms", heartbeat_ms);
  app.add_option("--chunk-bytes", chunk_bytes);
  app.add_option("--pause-ms", pause_ms);
  app.add_option("--linger-ms", linger_ms);
  app.add_option("--probe-bytes", probe_bytes);
  // NodeOptions::hold_after_hello: the loop is busy when a newcomer's probe comes.
  app.add_option("--hold-after-hello-ms", hold_after_hello_ms);
  CLI11_PARSE(app, argc, argv);

  std::signal(SIGTERM, [](int) { g_stop = true; });
  std::signal(SIGINT, [](int) { g_stop = true; });
  try {
    net::NodeOptions o;
    o.name = name;
    o.listen = listen;
    o.advertise = advertise;
    o.insecure = insecure;
    o.direct_data = !zmq_data;
    if (!insecure) {
      o.keys = net::load_keypair(key);
      o.allowlist = net::load_allowlist(allow);
    }
    o.join = join;
    o.peer_timeout = std::chrono::milliseconds(timeout_ms);
    o.heartbeat_interval = std::chrono::milliseconds(heartbeat_ms);
    o.chunk_bytes = chunk_bytes;
    o.collective_timeout = std::chrono::milliseconds(30000);
    o.probe_bytes = probe_bytes;
    o.hold_after_hello = std::chrono::milliseconds(hold_after_hello_ms);
    net::Node node(o);
    emit({{"event", "listening"},
          {"endpoint", node.endpoint()},
          {"id", net::format_peer_id(node.id())}});
    if (!node.wait_for_members(expect, std::chrono::seconds(30))) {
      emit({{"event", "error"}, {"error", "fewer than " + std::to_string(expect) + " members"}});
      return 1;
    }
    emit({{"event", "members"}, {"count", node.members().size()}});

    std::vector<OpSpec> ops;
    std::stringstream ss(ops_text);
    for (std::string part; std::getline(ss, part, ',');)
      if (!part.empty()) ops.push_back(parse_op(part));

    for (int round = 0; round < rounds && !g_stop; ++round) {
      for (const OpSpec& spec : ops) {
        for (int attempt = 0; attempt < (retry ? 4 : 1) && !g_stop; ++attempt) {
          std::map<net::PeerId, std::string> names;
          for (const auto& m : node.members()) names[m.info.id] = m.info.name;
          net::CollectiveOptions options = spec.options;
          if (spec.kind == net::CollectiveKind::broadcast)
            for (const auto& [id, n] : names)
              if (n == spec.root_name) options.root = id;
          std::vector<float> data(spec.count);
          for (size_t i = 0; i < data.size(); ++i) data[i] = value(name, round, i);
          net::Work work;
          switch (spec.kind) {
            case net::CollectiveKind::all_reduce:
              work = node.all_reduce(data, options);
              break;
            case net::CollectiveKind::reduce_scatter:
              work = node.reduce_scatter(data, options);
              break;
            case net::CollectiveKind::all_gather:
              work = node.all_gather(data, options);
              break;
            case net::CollectiveKind::broadcast:
              work = node.broadcast(data, options);
              break;
          }
          json line = {{"event", "op"},
                       {"round", round},
                       {"attempt", attempt},
                       {"kind", net::to_string(spec.kind)}};
          try {
            const net::CollectiveResult r = work.wait();
            std::vector<std::string> ring;
            for (auto id : r.ring) ring.push_back(names.count(id) ? names[id] : "?");
            // What the result must be, from the participants' names.
            size_t lo = 0, hi = spec.count;
            if (spec.kind == net::CollectiveKind::reduce_scatter) {
              lo = r.shard.begin;
              hi = r.shard.end;
            }
            double max_err = 0;
            for (size_t i = lo; i < hi; ++i) {
              double want = 0;
              if (spec.kind == net::CollectiveKind::broadcast) {
                want = value(names[options.root], round, i);
              } else if (spec.kind == net::CollectiveKind::all_gather) {
                // Element i comes from the ring position whose shard holds it.
                for (int p = 0; p < static_cast<int>(r.ring.size()); ++p) {
                  const auto sh = net::shard_of(spec.count, static_cast<int>(r.ring.size()), p);
                  if (i >= sh.begin && i < sh.end) want = value(ring[p], round, i);
                }
              } else {
                for (const auto& n : ring) want += value(n, round, i);
                if (options.op == net::ReduceOp::mean) want /= static_cast<double>(ring.size());
              }
              max_err = std::max(max_err, std::abs(want - static_cast<double>(data[i])));
            }
            // Sums of integers are exact in fp32; a mean divides once (one rounding); lossy
            // precisions round on every hop.
            const bool fp32 = options.precision == net::WirePrecision::fp32;
            const double tolerance = fp32 ? (options.op == net::ReduceOp::mean ? 1e-5 : 0.0) : 0.6;
            line.update({{"ok", true},
                         {"ring", ring},
                         {"position", r.position},
                         {"shard", {lo, hi}},
                         {"max_err", max_err},
                         {"correct", max_err <= tolerance},
                         {"hash", fnv_hex(data.data() + lo, hi - lo)},
                         {"seconds", r.seconds}});
            emit(line);
            break;
          } catch (const starling::NetError& e) {
            line.update({{"ok", false}, {"error", e.what()}});
            emit(line);
          }
        }
      }
      if (pause_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
    }
    const auto linger_until =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(linger_ms);
    while (!g_stop && std::chrono::steady_clock::now() < linger_until)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const auto c = node.counters();
    // The incoming links' bandwidth as this peer measured it, by sender name.
    json incoming = json::object();
    for (const auto& l : node.links())
      if (l.to == node.id() && l.stats.mbit_per_s >= 0)
        for (const auto& m : node.members())
          if (m.info.id == l.from) incoming[m.info.name] = l.stats.mbit_per_s;
    emit({{"event", "done"},
          {"rejected", c.rejected_messages},
          {"refused", c.refused_connections},
          {"members", node.members().size()},
          {"incoming_mbit_per_s", incoming}});
    node.leave();
  } catch (const starling::Error& e) {
    emit({{"event", "error"}, {"error", e.what()}});
    return 2;
  }
  return 0;
}
