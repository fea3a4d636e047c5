#include "starling/strategy/fault_injection.h"

#include <ATen/ATen.h>

#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>
#include <utility>

#include "starling/common/error.h"

namespace starling::strategy {

std::optional<UpdatePoison> UpdatePoison::from_env() {
  const char* v = std::getenv("STARLING_FAULT_POISON");
  if (v == nullptr || *v == '\0') return std::nullopt;
  return parse(v);
}

UpdatePoison UpdatePoison::parse(const std::string& value) {
  UpdatePoison p;
  if (value == "nan" || value == "nan:own") {
    p.nan = true;
    p.own = value == "nan:own";
    return p;
  }
  const std::string prefix = "scale:";
  if (value.rfind(prefix, 0) == 0) {
    const std::string k = value.substr(prefix.size());
    char* end = nullptr;
    p.scale = std::strtod(k.c_str(), &end);
    if (!k.empty() && end == k.c_str() + k.size() && std::isfinite(p.scale)) return p;
  }
  throw ConfigError("STARLING_FAULT_POISON = \"" + value +
                    "\": expected \"nan\", \"nan:own\" or \"scale:K\" with a finite number K");
}

std::string UpdatePoison::describe() const {
  if (nan) return own ? "NaN from its own computation" : "NaN";
  char buf[64];
  std::snprintf(buf, sizeof buf, "scaled by %g", scale);
  return buf;
}

void UpdatePoison::apply(at::Tensor& update) const {
  if (nan)
    update.fill_(std::numeric_limits<float>::quiet_NaN());
  else
    update.mul_(scale);
}

std::optional<TransferDeath> die_in_transfer_from_env() {
  const char* v = std::getenv("STARLING_FAULT_DIE_IN_TRANSFER");
  if (v == nullptr || *v == '\0') return std::nullopt;
  TransferDeath d;
  char* colon = nullptr;
  char* end = nullptr;
  d.transfer = std::strtoll(v, &colon, 10);
  if (colon != v && *colon == ':' && colon[1] != '\0') d.pieces = std::strtoll(colon + 1, &end, 10);
  if (end == nullptr || end != v + std::strlen(v) || d.transfer < 1 || d.pieces < 0)
    throw ConfigError(std::string("STARLING_FAULT_DIE_IN_TRANSFER = \"") + v +
                      "\": expected N:K, the N-th transfer this peer sends (from 1) and the "
                      "pieces it sends before it dies (0 or more)");
  return d;
}

namespace {

// A whole number written in digits alone (no sign, no blanks) that fits, or nullopt.
std::optional<long long> whole_number(const char* v) {
  if (!std::isdigit(static_cast<unsigned char>(*v))) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long n = std::strtoll(v, &end, 10);
  if (*end != '\0' || errno == ERANGE) return std::nullopt;
  return n;
}

// The variable `name` as a whole number from `low` to `high`; nullopt when it is unset or
// empty, a ConfigError naming it and saying what it means (`expected`) otherwise.
std::optional<long long> whole_number_from_env(const char* name, long long low, long long high,
                                               const char* expected) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  const std::optional<long long> n = whole_number(v);
  if (!n || *n < low || *n > high)
    throw ConfigError(std::string(name) + " = \"" + v + "\": expected " + expected);
  return n;
}

constexpr long long kNoLimit = std::numeric_limits<long long>::max();

}  // namespace

std::optional<long long> slow_transfer_from_env() {
  return whole_number_from_env("STARLING_FAULT_SLOW_TRANSFER", 1, 600000,
                               "MS, the milliseconds this peer pauses before each piece of a "
                               "state transfer it sends (1 to 600000)");
}

std::optional<long long> refuse_state_from_env() {
  return whole_number_from_env("STARLING_FAULT_REFUSE_STATE", 1, kNoLimit,
                               "N, the state transfer this peer takes (from 1) whose header it "
                               "refuses");
}

bool stop_at_start_from_env() {
  return whole_number_from_env("STARLING_FAULT_STOP_AT_START", 1, 1,
                               "1, to stop this peer (SIGSTOP) before its opening agreement")
      .has_value();
}

std::optional<long long> die_in_exchange_from_env() {
  return whole_number_from_env("STARLING_FAULT_DIE_IN_EXCHANGE", 1, kNoLimit,
                               "N, the exchange (from 1) in which this peer dies");
}

namespace {

// The variable `name` as "N:K", two whole numbers of at least 1; nullopt when it is unset or
// empty, a ConfigError naming it and saying what N and K mean (`expected`) otherwise.
std::optional<std::pair<long long, long long>> two_numbers_from_env(const char* name,
                                                                    const char* expected) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return std::nullopt;
  const std::string text = v;
  const size_t colon = text.find(':');
  std::optional<long long> n, k;
  if (colon != std::string::npos) {
    n = whole_number(text.substr(0, colon).c_str());
    k = whole_number(text.substr(colon + 1).c_str());
  }
  if (!n || !k || *n < 1 || *k < 1)
    throw ConfigError(std::string(name) + " = \"" + text + "\": expected N:K, " + expected);
  return std::pair{*n, *k};
}

}  // namespace

std::optional<PieceLoss> lose_piece_from_env() {
  const auto v = two_numbers_from_env("STARLING_FAULT_LOSE_PIECE",
                                      "the round (from 1) and its piece (from 1) whose "
                                      "collective this peer counts as failed");
  if (!v) return std::nullopt;
  return PieceLoss{.round = v->first, .piece = v->second};
}

std::optional<AccumulationDeath> die_accumulating_from_env() {
  const auto v = two_numbers_from_env("STARLING_FAULT_DIE_ACCUMULATING",
                                      "the step (from 1) and the micro-batches (from 1) this "
                                      "peer announces in it before it dies");
  if (!v) return std::nullopt;
  return AccumulationDeath{.step = v->first, .micro_batches = v->second};
}

std::optional<long long> abort_agreement_from_env() {
  return whole_number_from_env("STARLING_FAULT_ABORT_AGREEMENT", 1, kNoLimit,
                               "N, the round agreement of this peer (from 1) that it fails");
}

RoundFaults::RoundFaults(std::string what)
    : what_(std::move(what)),
      death_round_(die_in_exchange_from_env()),
      loss_(lose_piece_from_env()) {}

std::string RoundFaults::announcement() const {
  std::string out;
  if (death_round_)
    out = "fault injection: this peer dies in its " + what_ + " " + std::to_string(*death_round_) +
          " (STARLING_FAULT_DIE_IN_EXCHANGE)";
  if (loss_)
    out += std::string(out.empty() ? "fault injection: " : "; ") + "this peer counts piece " +
           std::to_string(loss_->piece) + " of its " + what_ + " " + std::to_string(loss_->round) +
           " as failed (STARLING_FAULT_LOSE_PIECE)";
  return out;
}

bool RoundFaults::loses_piece(int64_t k, const std::function<void(const std::string&)>& log) const {
  if (!loss_ || loss_->round != rounds_ || loss_->piece != k + 1) return false;
  log("fault injection: counting piece " + std::to_string(k + 1) + " of " + what_ + " " +
      std::to_string(rounds_) + " as failed, though its collective completed");
  return true;
}

void RoundFaults::maybe_die(int64_t pieces_sent,
                            const std::function<void(const std::string&)>& log) const {
  if (!death_round_ || *death_round_ != rounds_) return;
  log("fault injection: dying in " + what_ + " " + std::to_string(rounds_) + " after " +
      std::to_string(pieces_sent) + " piece(s)");
  if (pieces_sent > 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
  std::raise(SIGKILL);
}

}  // namespace starling::strategy
