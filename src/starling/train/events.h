// The events a peer prints on stdout with --json: one JSON object per line, each with an "event"
// key. cli/local_swarm.cpp reads them to supervise its peers and write swarm.json; the swarm tests
// read them too. Every event is built here, so writer and readers agree on one definition.
//
//   listening  {endpoint}                          first line: where the others join (or meet)
//   dashboard  {url}                               with [net] dashboard: where its page is
//   step       {step, steps, loss, lr, tokens, tokens_per_s, net, elapsed_s}   every log_every
//   eval       {step, val_loss, tokens, elapsed_s}
//   done       {step, loss, val_loss, tokens_per_s, net, peak_rss_mb, sample}  last line
//
// `net` is a StrategyReport (strategy_report.h), or null for a replica training alone.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "starling/train/strategy_report.h"

namespace starling::train::events {

inline nlohmann::json net_json(const std::optional<StrategyReport>& net) {
  return net ? nlohmann::json(*net) : nlohmann::json();
}

inline nlohmann::json listening(const std::string& endpoint) {
  return {{"event", "listening"}, {"endpoint", endpoint}};
}

inline nlohmann::json dashboard(const std::string& url) {
  return {{"event", "dashboard"}, {"url", url}};
}

struct StepFigures {
  int64_t step = 0, steps = 0;
  double loss = 0, lr = 0;
  uint64_t tokens = 0;
  double tokens_per_s = 0, elapsed_s = 0;
};

inline nlohmann::json step(const StepFigures& s, const std::optional<StrategyReport>& net) {
  return {{"event", "step"},
          {"step", s.step},
          {"steps", s.steps},
          {"loss", s.loss},
          {"lr", s.lr},
          {"tokens", s.tokens},
          {"tokens_per_s", s.tokens_per_s},
          {"net", net_json(net)},
          {"elapsed_s", s.elapsed_s}};
}

inline nlohmann::json eval(int64_t step, double val_loss, uint64_t tokens, double elapsed_s) {
  return {{"event", "eval"},
          {"step", step},
          {"val_loss", val_loss},
          {"tokens", tokens},
          {"elapsed_s", elapsed_s}};
}

struct DoneFigures {
  int64_t step = 0;
  double loss = 0, val_loss = -1, tokens_per_s = 0, peak_rss_mb = 0;
  std::string sample;
};

inline nlohmann::json done(const DoneFigures& d, const std::optional<StrategyReport>& net) {
  return {{"event", "done"},
          {"peak_rss_mb", d.peak_rss_mb},
          {"net", net_json(net)},
          {"step", d.step},
          {"loss", d.loss},
          {"val_loss", d.val_loss},
          {"tokens_per_s", d.tokens_per_s},
          {"sample", d.sample}};
}

}  // namespace starling::train::events
