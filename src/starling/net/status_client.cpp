#include "starling/net/status_client.h"

#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <zmq.hpp>

#include "starling/common/error.h"
#include "starling/net/endpoint.h"
#include "starling/net/log.h"
#include "starling/net/wire.h"

namespace starling::net {

StatusReport query_status(const StatusQuery& q) {
  const EntryPoint entry = parse_entry_point(q.entry, "status entry point");
  // Every allowlisted key, this one's too: an operator asks the peer that runs with the same key.
  const auto server_keys = candidate_server_keys(entry, q.insecure, "", q.allowlist);
  const PeerId self =
      q.insecure ? std::random_device{}() : peer_id_from_public_key(q.keys.public_key);
  zmq::context_t context(1);
  std::vector<zmq::socket_t> sockets;
  for (const auto& key : server_keys) {
    zmq::socket_t s(context, zmq::socket_type::dealer);
    s.set(zmq::sockopt::linger, 0);
    if (!q.insecure) {
      s.set(zmq::sockopt::curve_serverkey, key);
      s.set(zmq::sockopt::curve_publickey, q.keys.public_key);
      s.set(zmq::sockopt::curve_secretkey, q.keys.secret_key);
    }
    s.connect(entry.endpoint);
    Header h;
    h.type = MsgType::status_request;
    h.sender = self;
    std::byte raw[kHeaderBytes];
    seal_header(h, {}, raw, carries_checksum(h.type, q.insecure));
    s.send(zmq::const_buffer(raw, kHeaderBytes), zmq::send_flags::sndmore);
    s.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::none);
    sockets.push_back(std::move(s));
  }
  std::vector<zmq::pollitem_t> items;
  for (auto& s : sockets) items.push_back({s.handle(), 0, ZMQ_POLLIN, 0});
  if (zmq::poll(items.data(), items.size(), q.timeout) <= 0)
    throw NetError("no status reply from " + entry.endpoint + " within " + seconds_text(q.timeout) +
                   " (is a peer running there, and is this key on its allowlist?)");
  for (size_t i = 0; i < items.size(); ++i) {
    if (!(items[i].revents & ZMQ_POLLIN)) continue;
    zmq::message_t header, payload;
    (void)sockets[i].recv(header);
    if (!header.more()) throw NetError("status reply from " + entry.endpoint + " has one frame");
    (void)sockets[i].recv(payload);
    auto decoded =
        decode_header({static_cast<const std::byte*>(header.data()), header.size()}, 64ull << 20);
    if (!decoded.ok())
      throw NetError("bad status reply from " + entry.endpoint + ": " + decoded.error);
    if (auto bad = check_payload(decoded.header,
                                 {static_cast<const std::byte*>(payload.data()), payload.size()},
                                 carries_checksum(decoded.header.type, q.insecure));
        !bad.empty())
      throw NetError("bad status reply from " + entry.endpoint + ": " + bad);
    StatusReport report;
    try {
      const char* p = static_cast<const char*>(payload.data());
      const auto j = nlohmann::json::parse(p, p + payload.size());
      report.answered_by = decoded.header.sender;
      for (const auto& m : j.at("members")) {
        StatusMember sm;
        sm.info = member_from_json(m);
        sm.state = m.at("state").get<std::string>();
        sm.seconds_since_heard = m.at("heard_s").get<double>();
        report.members.push_back(sm);
      }
      for (const auto& l : j.at("links")) {
        StatusLink sl;
        const auto from = parse_peer_id(l.at("from").get<std::string>());
        const auto to = parse_peer_id(l.at("to").get<std::string>());
        if (!from || !to) throw NetError("a link names no 16-digit hex peer id");
        sl.from = *from;
        sl.to = *to;
        sl.stats = {l.at("rtt_ms").get<double>(), l.at("mbps").get<double>()};
        report.links.push_back(sl);
      }
    } catch (const std::exception& e) {
      throw NetError("malformed status reply from " + entry.endpoint + ": " + e.what());
    }
    return report;
  }
  throw NetError("no status reply from " + entry.endpoint);
}

std::string format_status(const StatusReport& r) {
  std::string out;
  char line[512];
  std::snprintf(line, sizeof line, "%zu members (as seen by %s)\n", r.members.size(),
                short_peer_id(r.answered_by).c_str());
  out += line;
  std::snprintf(line, sizeof line, "  %-8s  %-12s  %-6s  %-8s  %-7s  %7s  %8s  %9s  %s\n", "id",
                "name", "state", "active", "heard", "step", "loss", "tokens/s", "endpoint");
  out += line;
  for (const auto& m : r.members) {
    // What the member says of its training ('-' where it says nothing: not training, or not yet).
    const auto said = nlohmann::json::parse(m.info.progress.empty() ? "{}" : m.info.progress,
                                            nullptr, /*allow_exceptions=*/false);
    const auto figure = [&](const char* key, const char* format) {
      if (!said.is_object() || !said.contains(key) || !said[key].is_number())
        return std::string("-");
      char f[32];
      std::snprintf(f, sizeof f, format, said[key].get<double>());
      return std::string(f);
    };
    std::snprintf(line, sizeof line, "  %-8s  %-12s  %-6s  %-8s  %5.1fs  %7s  %8s  %9s  %s\n",
                  short_peer_id(m.info.id).c_str(), m.info.name.c_str(), m.state.c_str(),
                  m.info.active ? "yes" : "no", m.seconds_since_heard,
                  figure("step", "%.0f").c_str(), figure("loss", "%.4f").c_str(),
                  figure("tokens_per_s", "%.0f").c_str(), m.info.endpoint.c_str());
    out += line;
  }
  std::map<std::pair<PeerId, PeerId>, LinkStats> links;
  for (const auto& l : r.links) links[{l.from, l.to}] = l.stats;
  out += "\nlinks (row -> column): bandwidth Mbit/s / round trip ms; '-' = not measured yet\n";
  std::snprintf(line, sizeof line, "  %-8s", "");
  out += line;
  for (const auto& m : r.members) {
    std::snprintf(line, sizeof line, "  %-16s", short_peer_id(m.info.id).c_str());
    out += line;
  }
  out += "\n";
  for (const auto& a : r.members) {
    std::snprintf(line, sizeof line, "  %-8s", short_peer_id(a.info.id).c_str());
    out += line;
    for (const auto& b : r.members) {
      std::string cell = "self";
      if (a.info.id != b.info.id) {
        // Bandwidth is measured by the receiver, latency by the sender of the ping.
        const auto bw =
            links.count({a.info.id, b.info.id}) ? links[{a.info.id, b.info.id}] : LinkStats{};
        char c[64];
        std::snprintf(
            c, sizeof c, "%s / %s",
            bw.mbit_per_s < 0 ? "-" : std::to_string(static_cast<long>(bw.mbit_per_s)).c_str(),
            bw.rtt_ms < 0 ? "-" : (std::to_string(bw.rtt_ms).substr(0, 5)).c_str());
        cell = c;
      }
      std::snprintf(line, sizeof line, "  %-16s", cell.c_str());
      out += line;
    }
    out += "\n";
  }
  return out;
}

}  // namespace starling::net
