// What a strategy reports about its communication, for the progress line, metrics.jsonl and a
// launcher watching its peers. Typed here; JSON only on the way out (events, metrics) and back in
// (cli/local_swarm.cpp), with the keys peers, bytes_sent, net_wait_s, round and the strategy's
// own figures beside them. Torch-free.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>

namespace starling::train {

struct StrategyReport {
  int peers = 1;                          // replicas taking part in the last round
  double bytes_sent = 0;                  // bytes this replica put on the network so far
  double net_wait_s = 0;                  // time the loop spent waiting for the network
  int64_t round = 0;                      // averages applied to the shared state
  std::map<std::string, double> figures;  // the strategy's own (co2: "gap", "state_bytes")
};

inline void to_json(nlohmann::json& j, const StrategyReport& r) {
  j = {{"peers", r.peers},
       {"bytes_sent", r.bytes_sent},
       {"net_wait_s", r.net_wait_s},
       {"round", r.round}};
  for (const auto& [name, value] : r.figures) j[name] = value;
}

// Reads what to_json wrote; missing keys keep their defaults, unknown numbers become figures.
inline void from_json(const nlohmann::json& j, StrategyReport& r) {
  r = StrategyReport{};
  if (!j.is_object()) return;
  for (const auto& [key, value] : j.items()) {
    if (!value.is_number()) continue;
    if (key == "peers")
      r.peers = value.get<int>();
    else if (key == "bytes_sent")
      r.bytes_sent = value.get<double>();
    else if (key == "net_wait_s")
      r.net_wait_s = value.get<double>();
    else if (key == "round")
      r.round = value.get<int64_t>();
    else
      r.figures[key] = value.get<double>();
  }
}

}  // namespace starling::train
