#include "starling/strategy/swarm_strategy.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <iostream>
#include <thread>

#include "starling/common/cpu_runtime.h"
#include "starling/common/error.h"
#include "starling/common/finite.h"
#include "starling/data/loader.h"
#include "starling/net/crc32c.h"
#include "starling/net/node.h"
#include "starling/strategy/data_redeal.h"
#include "starling/strategy/robust_aggregate.h"
#include "starling/strategy/state_stream.h"
#include "starling/swap/swap_config.h"
#include "starling/train/metrics.h"
#include "starling/train/step_runner.h"

namespace starling::strategy {
namespace {

using train::fmt;
using train::now_s;

// The agreement's fields before the lineage's bytes, and the lineage's share of it.
constexpr int64_t kControl = 8;
constexpr int64_t kLineage = 8;  // 4 bytes, each as b and b*b

}  // namespace

net::WirePrecision parse_precision(const std::string& name) {
  if (name == "fp32") return net::WirePrecision::fp32;
  if (name == "fp16") return net::WirePrecision::fp16;
  if (name == "bf16") return net::WirePrecision::bf16;
  if (name == "int8") return net::WirePrecision::int8;
  throw ConfigError("strategy.precision: expected fp32, fp16, bf16 or int8, got \"" + name + "\"");
}

SwarmStrategy::SwarmStrategy(const train::RunConfig& config, net::Collectives& net)
    : config_(config),
      net_(net),
      precision_(parse_precision(config.strategy.precision)),
      poison_(UpdatePoison::from_env()),
      die_in_transfer_(die_in_transfer_from_env()),
      slow_transfer_ms_(slow_transfer_from_env()),
      refuse_state_(refuse_state_from_env()),
      stop_at_start_(stop_at_start_from_env()),
      abort_agreement_(abort_agreement_from_env()) {
  if (poison_)
    log("fault injection: every round update this peer sends is " + poison_->describe() +
        " (STARLING_FAULT_POISON)");
  if (die_in_transfer_)
    log("fault injection: this peer dies after sending " +
        std::to_string(die_in_transfer_->pieces) + " piece(s) of state transfer " +
        std::to_string(die_in_transfer_->transfer) + " (STARLING_FAULT_DIE_IN_TRANSFER)");
  if (slow_transfer_ms_)
    log("fault injection: this peer pauses " + std::to_string(*slow_transfer_ms_) +
        " ms before each piece of a state transfer it sends (STARLING_FAULT_SLOW_TRANSFER)");
  if (refuse_state_)
    log("fault injection: this peer refuses the header of state transfer " +
        std::to_string(*refuse_state_) + " it takes (STARLING_FAULT_REFUSE_STATE)");
  if (stop_at_start_)
    log("fault injection: this peer stops itself before its opening agreement "
        "(STARLING_FAULT_STOP_AT_START)");
  if (abort_agreement_)
    log("fault injection: this peer fails its round agreement " +
        std::to_string(*abort_agreement_) + " (STARLING_FAULT_ABORT_AGREEMENT)");
}

c10::Device SwarmStrategy::net_device() const {
  return through_host() ? c10::Device(c10::kCPU) : flat_->device();
}

net::CollectiveOptions SwarmStrategy::options(net::WirePrecision precision) const {
  net::CollectiveOptions o;
  o.precision = precision;
  o.op = net::ReduceOp::sum;
  o.order = net::RingOrder::by_id;  // shards stay with the same peer from round to round
  o.group = group_;
  return o;
}

net::CollectiveOptions SwarmStrategy::options(net::WirePrecision precision,
                                              const std::vector<net::PeerId>& ring) const {
  net::CollectiveOptions o = options(precision);
  if (net_.elastic()) o.group = ring;  // a c10d group takes its whole group only
  return o;
}

at::Tensor SwarmStrategy::counted(const at::Tensor& part, int64_t begin) const {
  return part.narrow(0, 0, std::clamp<int64_t>(counted_numel_ - begin, 0, part.numel()));
}

at::Tensor SwarmStrategy::sum_over_model(const at::Tensor& t) const {
  if (!model_part_) return t;
  at::Tensor v = t.detach().to(at::kFloat).reshape({-1}).contiguous().clone();
  runner_->sum_over_model(v);
  return v.reshape(t.sizes()).to(t.device(), t.scalar_type());
}

at::Tensor SwarmStrategy::read_state(const at::Tensor& t) const {
  return runner_ != nullptr ? runner_->read_state(t) : t;
}

void SwarmStrategy::write_state(const at::Tensor& t, const at::Tensor& values) const {
  if (runner_ != nullptr)
    runner_->write_state(t, values);
  else
    train::copy_state(t, values);
}

void SwarmStrategy::release_pass_blocks() const {
  if (config_.swap.enabled()) release_cached_cpu_blocks();
}

void SwarmStrategy::log(const std::string& line) const {
  std::cerr << "[" << config_.strategy.kind << "] " << line << std::endl;
}

bool SwarmStrategy::wait(const net::Work& work, const char* what,
                         const std::vector<net::PeerId>* ring) {
  return wait_result(work, what, ring).has_value();
}

std::optional<net::CollectiveResult> SwarmStrategy::wait_result(
    const net::Work& work, const char* what, const std::vector<net::PeerId>* ring) {
  const double t0 = now_s();
  try {
    net::CollectiveResult result = work.wait();
    net_wait_s_ += now_s() - t0;
    if (ring != nullptr) {
      std::vector<net::PeerId> ran = result.ring;
      std::sort(ran.begin(), ran.end());
      if (ran != *ring) {
        log(std::string(what) + ": ran among " + std::to_string(ran.size()) + " of the round's " +
            std::to_string(ring->size()) +
            " participants (the membership changed since the round's agreement); not used");
        return std::nullopt;
      }
    }
    return result;
  } catch (const std::exception& e) {
    net_wait_s_ += now_s() - t0;
    if (!net_.elastic())
      throw NetError(std::string(what) + " failed on the " + net_.backend_name() +
                     " group, which cannot go on without a rank: " + e.what());
    log(std::string(what) + " failed: " + e.what());
    return std::nullopt;
  }
}

bool SwarmStrategy::all_reduce(at::Tensor& flat, net::WirePrecision precision, const char* what,
                               const std::vector<net::PeerId>* ring) {
  return wait(net_.all_reduce(as_span(flat),
                              ring != nullptr ? options(precision, *ring) : options(precision)),
              what, ring);
}

bool SwarmStrategy::all_reduce(Staging& staged, net::WirePrecision precision, const char* what) {
  return all_reduce(staged, -1, precision, what);
}

bool SwarmStrategy::all_reduce(Staging& staged, int64_t n, net::WirePrecision precision,
                               const char* what) {
  if (n < 0) n = staged.numel();
  staged.download(0, n);
  staged.wait_download();
  at::Tensor host = staged.host().narrow(0, 0, n);
  if (!all_reduce(host, precision, what)) return false;
  staged.upload(0, n);
  staged.use_upload();
  return true;
}

bool SwarmStrategy::aggregate(Staging& staged, int64_t n, const Agreement& a,
                              net::WirePrecision precision, const char* what) {
  if (n < 0) n = staged.numel();
  staged.download(0, n);
  staged.wait_download();
  at::Tensor host = staged.host().narrow(0, 0, n);
  // A fault in this peer's own computation (STARLING_FAULT_POISON=nan:own) comes before its check.
  if (poison_ && poison_->own && a.contribute) poison_->apply(host);
  // This peer checks its own update before it leaves: a non-finite one (a failing GPU, a bad
  // batch) is withheld, zeros in its place, so the round goes on with the others' updates instead
  // of failing everywhere (the mean's ring would reject it). Not with fp16, whose loss scaling
  // needs every peer to see an overflow to skip the step together.
  bool sending = a.contribute;
  if (sending && config_.train.dtype != "fp16" &&
      !all_finite(host.data_ptr<float>(), static_cast<size_t>(host.numel()))) {
    host.zero_();
    sending = false;
    if (withheld_round_ != rounds_) {  // once a round, though a round in pieces may withhold more
      withheld_round_ = rounds_;
      ++withheld_updates_;
      if ((withheld_updates_ & (withheld_updates_ - 1)) == 0)  // the 1st, 2nd, 4th, 8th, ...
        log("this peer's own " + std::string(what) +
            " holds non-finite values (a fault here: its hardware, its data, its learning rate); "
            "withheld, the round goes on with the others' (" +
            std::to_string(withheld_updates_) + " round(s) withheld so far)");
    }
  }
  if (poison_ && !poison_->own && sending) poison_->apply(host);
  bool ok = false;
  if (config_.strategy.aggregation == "trimmed_mean") {
    ok = trimmed_mean_all_reduce(host, a, sending, precision, what);
  } else {
    // fp16's loss scaling finds an overflow by the non-finite sum every peer sees, and skips
    // the step everywhere; elsewhere a non-finite update is a fault, rejected where it enters.
    net::CollectiveOptions o = options(precision, a.ring);
    o.reject_non_finite = config_.train.dtype != "fp16";
    ok = wait(net_.all_reduce(as_span(host), o), what, &a.ring);
  }
  if (!ok) return false;
  staged.upload(0, n);
  staged.use_upload();
  return true;
}

bool SwarmStrategy::trimmed_mean_all_reduce(at::Tensor& host, const Agreement& a, bool sending,
                                            net::WirePrecision precision, const char* what) {
  // Row i of the gathered matrix is the update of the i-th participant by id, which is the
  // all-gather's shard of ring position i (the ring is ordered by id), then its flag.
  const auto self = std::find(a.ring.begin(), a.ring.end(), net_.self());
  if (self == a.ring.end()) throw std::logic_error("trimmed_mean: this peer is not in the round");
  const int64_t peers = static_cast<int64_t>(a.ring.size()), n = host.numel(), m = n + 1;
  const int64_t position = self - a.ring.begin();
  // A round in pieces gathers pieces of two sizes (the last is shorter): the buffer keeps the
  // largest, and a smaller matrix is its front.
  if (!gathered_.defined() || gathered_.numel() < peers * m)
    gathered_ = at::empty({peers * m}, at::kFloat);
  at::Tensor gathered = gathered_.narrow(0, 0, peers * m);
  at::Tensor mine = gathered.narrow(0, position * m, m);
  mine.narrow(0, 0, n).copy_(host);
  mine[n] = sending ? 1.f : 0.f;
  if (!wait(net_.all_gather(as_span(gathered), options(precision, a.ring)), what, &a.ring))
    return false;  // no average this round
  const TrimmedMeanOutcome out =
      trimmed_mean(gathered.view({peers, m}), config_.strategy.trim, host);
  for (int i : out.non_finite) {
    ++rejected_updates_;
    log("rejected a non-finite " + std::string(what) + " contribution from peer " +
        net_.describe(a.ring[static_cast<size_t>(i)]));
  }
  if (out.used == 0) {
    log(std::string(what) + ": no finite update to average this round");
    return false;
  }
  host.mul_(static_cast<double>(a.contributors));  // the callers divide by the contributors
  return true;
}

void SwarmStrategy::note_round(const at::Tensor& shared) {
  if (!config_.strategy.fingerprint || need_state_) return;
  note_round_crc(chain_crc(shared, 0));
}

uint32_t SwarmStrategy::chain_crc(const at::Tensor& part, uint32_t crc) {
  const at::Tensor host = part.to(at::kCPU).contiguous();
  return net::crc32c(host.data_ptr(), static_cast<size_t>(host.numel()) * host.element_size(), crc);
}

void SwarmStrategy::note_round_crc(uint32_t crc) {
  if (!config_.strategy.fingerprint || need_state_) return;
  fingerprint_ = crc;
  fingerprint_round_ = version_;
  fingerprint_lineage_ = lineage_;
}

void SwarmStrategy::broke_off_after(int64_t tensors) {
  constexpr uint64_t kBrokeOff = 0x62726f6b656e6f66ULL;  // "brokenof": no ring's id, in practice
  const uint64_t words[] = {lineage_, kBrokeOff, static_cast<uint64_t>(tensors)};
  lineage_ = net::crc32c(words, sizeof words);
}

Agreement SwarmStrategy::close_run(train::Replica& r, bool round_through) {
  const Agreement a = agree(r, false, false, round_through);
  // A peer stopped for longer than the peer timeout while the others ended the run finds them
  // gone: it ends on its own model. Say so, for whoever compares the peers' checkpoints.
  if (a.ring.size() == 1 && most_participants_ > 1 && !said_alone_) {
    said_alone_ = true;
    log("this peer closes the run alone, after rounds of up to " +
        std::to_string(most_participants_) +
        " peers: the others finished without it (it was out of reach for longer than "
        "net.peer_timeout_ms as they ended the run) or left, so its final model is its own");
  }
  return a;
}

bool SwarmStrategy::met_the_last_round(const train::Replica& r, const Agreement& a) const {
  return r.step >= config_.train.steps && a.exchange_voters == a.peers;
}

void SwarmStrategy::last_round(train::Replica& r,
                               const std::function<void(const Agreement&)>& round) {
  const Agreement a = agree(r, true);
  const int64_t agreed_version = version_;  // after any state the agreement brought
  round(a);
  settle_last_round(r, round, agreed_version);
}

void SwarmStrategy::boundary_round(train::Replica& r, bool last,
                                   const std::function<void(const Agreement&)>& round) {
  if (last) {
    last_round(r, round);
    return;
  }
  const Agreement a = agree(r, true);
  const int64_t agreed_version = version_;  // after any state the agreement brought
  round(a);
  // A straggler whose agreement met the others' last round adopted their state at the run's
  // last step: no step follows, so it settles and closes the run with them.
  if (met_the_last_round(r, a)) settle_last_round(r, round, agreed_version);
}

void SwarmStrategy::settle_last_round(train::Replica& r,
                                      const std::function<void(const Agreement&)>& round,
                                      int64_t agreed_version) {
  for (int settle = 0;; ++settle) {
    // Every participant holds the same state after the closing agreement: the round's, if it
    // went through on any of them. Whether it did comes from the agreement's sums, so all of them
    // decide alike here, whatever round each had reached before.
    const Agreement closing = close_run(r, version_ > agreed_version);
    if (closing.notes[kClosingNote] > 0 || settle == kSettleRounds) return;
    log("the last round went through on no peer; one more round without local steps, so that "
        "the peers end on one model (" +
        std::to_string(settle + 1) + " of " + std::to_string(kSettleRounds) + ")");
    const Agreement a = agree(r, true);
    agreed_version = version_;
    round(a);
  }
}

void SwarmStrategy::agreed(const Agreement& a) {
  most_participants_ = std::max(most_participants_, a.ring.size());
  work_ += a.contributors;
  contributors_ = a.contributors;
  // CRC-32C over the old lineage and the ring's ids (sorted, the same on every participant).
  std::vector<uint64_t> words{lineage_};
  words.insert(words.end(), a.ring.begin(), a.ring.end());
  lineage_ = net::crc32c(words.data(), words.size() * sizeof(uint64_t));
  history_ = lineage_;
}

int64_t SwarmStrategy::round_piece_numel(const Agreement& a) {
  const double units = std::round(a.notes[0] / std::max(1, a.peers));
  return std::max<int64_t>(1000, static_cast<int64_t>(units) * 250);
}

nlohmann::json SwarmStrategy::round_state(const char* kind) const {
  nlohmann::json state = {
      {"kind", kind}, {"version", version_}, {"work", work_}, {"lineage", lineage_}};
  if (history_ != lineage_) state["history"] = history_;  // a round broke off (broke_off_after)
  return state;
}

std::optional<RootChoice> SwarmStrategy::choose_root(const train::Replica& r, const Agreement& a) {
  const int64_t peers = static_cast<int64_t>(a.ring.size());
  const auto self = std::find(a.ring.begin(), a.ring.end(), net_.self());
  if (self == a.ring.end()) throw std::logic_error("choose_root: this peer is not in the round");
  at::Tensor gathered = at::zeros({peers * kRootRowFloats}, at::kFloat);
  put_root_row({.needs_state = need_state_,
                .round = version_,
                .step = r.step,
                .work = work_,
                .lineage = lineage_,
                .history = history_,
                .holds_state = holds_state_,
                .updates = r.optimizer.steps(),
                .piece_numel = std::max<int64_t>(1, transfer_piece_bytes(config_.strategy) /
                                                        static_cast<int64_t>(sizeof(float))),
                .failed_sends = failed_sends_,
                .joined_at_ms = net_.joined_at_ms()},
               gathered.data_ptr<float>() + (self - a.ring.begin()) * kRootRowFloats);
  at::Tensor sent = gathered.to(net_device());
  const auto result =
      wait_result(net_.all_gather(as_span(sent), options(net::WirePrecision::fp32, a.ring)),
                  "root choice", &a.ring);
  if (!result) return std::nullopt;  // the next agreement tries again
  if (!sent.is_same(gathered)) gathered.copy_(sent);
  std::vector<RootRow> rows;
  rows.reserve(static_cast<size_t>(peers));
  for (int64_t i = 0; i < peers; ++i)
    rows.push_back(get_root_row(gathered.data_ptr<float>() + i * kRootRowFloats));
  // A c10d group runs its whole group only, so there everyone takes part (and keeps its own).
  return choose_root_from_rows(rows, a.ring, net_.self(), keeps_own_state() && net_.elastic());
}

net::CollectiveOptions SwarmStrategy::transfer_options(const std::vector<net::PeerId>& ring,
                                                       net::PeerId root) const {
  net::CollectiveOptions o = options(net::WirePrecision::fp32, ring);
  o.root = root;
  if (net_.elastic()) o.tag = kTransferTag;  // a c10d group runs one sequence of calls
  return o;
}

bool SwarmStrategy::transfer_state(train::Replica& r, const std::vector<net::PeerId>& ring,
                                   net::PeerId root, int64_t piece_numel, bool keep_own) {
  const bool sending = root == net_.self();
  // A peer alone in the round (one that starts first, or the last left) sends to no one: reading
  // its whole state (from its tier, when swapped) would be for nothing.
  if (sending && ring.size() == 1) return true;
  const net::CollectiveOptions o = transfer_options(ring, root);
  StateStream stream(state_tensors(r), piece_numel);
  at::Tensor buffer = at::empty({std::min(stream.piece_numel(), stream.numel())},
                                at::TensorOptions().dtype(at::kFloat).device(net_device()));
  const auto read = [this](const at::Tensor& t) { return read_state(t); };
  bool wrote = false;  // some of this peer's own state is the root's now
  const auto write = [this, &wrote](const at::Tensor& t, const at::Tensor& values) {
    wrote = true;
    write_state(t, values);
  };
  const bool writing = !sending && !keep_own;
  if (sending) ++transfers_sent_;
  const double total = static_cast<double>(stream.numel()) * sizeof(float);
  const double t0 = now_s();
  double reported = t0;
  int64_t done = 0;  // pieces through
  // A long transfer (a large model, a slow link) says how far it got every half minute.
  const auto progress = [&](const char* verb) {
    const double moved =
        std::min(total, static_cast<double>(done) * static_cast<double>(stream.piece_numel()) *
                            sizeof(float));
    const double s = now_s() - t0;
    return std::string("state transfer: ") + verb + " " + swap::format_bytes(moved) + " of " +
           swap::format_bytes(total) + " in " + std::to_string(done) + " of " +
           std::to_string(stream.pieces()) + " piece(s), " + fmt("%.2f", s) + " s (" +
           swap::format_bytes(s > 0 ? moved / s : 0) + "/s)";
  };
  const char* verb = sending ? "sent" : writing ? "adopted" : "received (this peer's own kept)";
  for (int64_t k = 0; k < stream.pieces(); ++k) {
    at::Tensor part = buffer.narrow(0, 0, stream.numel_of(k));
    if (sending && die_in_transfer_ && die_in_transfer_->transfer == transfers_sent_ &&
        die_in_transfer_->pieces == k) {
      log("fault injection: dying after " + std::to_string(k) + " piece(s) of the transfer");
      std::raise(SIGKILL);
    }
    if (sending && slow_transfer_ms_)
      std::this_thread::sleep_for(std::chrono::milliseconds(*slow_transfer_ms_));
    if (sending) stream.read_next(part, read);
    if (!wait(net_.broadcast(as_span(part), o), "state transfer", &ring)) {
      if (wrote)
        torn_ = std::to_string(k) + " of " + std::to_string(stream.pieces()) + " pieces of peer " +
                net_.describe(root) + "'s state";
      if (wrote && holds_state_) {
        // Part of this peer's own state is now the root's: it holds neither, so it no longer
        // votes for its history nor may be chosen to send it.
        holds_state_ = false;
        log("the state transfer broke off after " + std::to_string(k) + " of " +
            std::to_string(stream.pieces()) +
            " pieces: this peer's state is partly the root's, so it counts as holding none "
            "until a transfer completes");
      }
      return false;
    }
    if (writing) stream.write_next(part, write);
    ++done;
    if (now_s() - reported >= 30 && k + 1 < stream.pieces()) {
      reported = now_s();
      log(progress(verb));
    }
  }
  log(progress(verb));
  if (writing) state_adopted(r);
  return true;
}

data::TokenLoader* SwarmStrategy::dealt_loader(train::Replica& r) const {
  if (!config_.strategy.redeal_data || !lockstep_data() || r.runner == nullptr) return nullptr;
  return r.runner->dealt_loader();
}

void SwarmStrategy::redeal(data::TokenLoader& loader, const Agreement& a,
                           const std::array<double, kRedealNotes>& shares) {
  // Every participant must have added its share, or the ranks below would not be a deal.
  if (shares[0] != static_cast<double>(a.peers)) return;
  const std::optional<uint64_t> from = plan_redeal(shares);
  if (!from) return;
  const auto self = std::find(a.ring.begin(), a.ring.end(), net_.self());
  if (self == a.ring.end()) return;
  const int rank = static_cast<int>(self - a.ring.begin());
  const data::TokenLoader::Share before = loader.share();
  loader.redeal(*from, rank, a.peers);
  ++redeals_;
  const uint64_t total = loader.total_windows();
  log("the rest of epoch " + std::to_string(*from / total) + "'s data (from window " +
      std::to_string(*from % total) + " of " + std::to_string(total) +
      " in its order) is dealt again among the " + std::to_string(a.peers) +
      " peer(s) of this round: this peer reads share " + std::to_string(rank) + " of " +
      std::to_string(a.peers) + " (it read " + std::to_string(before.rank) + " of " +
      std::to_string(before.world) + ")");
}

bool SwarmStrategy::take_state(train::Replica& r, Agreement& a, const RootChoice& choice,
                               bool opening) {
  const net::PeerId root = choice.root;
  // The root only reads its state: a failure leaves it whole, and the root holds it still (it
  // needs nothing from the next transfer, which another holder of the same state sends where
  // there is one: choose_root ranks holders by their failed transfers).
  const bool sending = root == net_.self();
  at::Tensor header = at::zeros({kHeader}, at::kFloat);
  const int64_t piece_numel = std::max<int64_t>(
      1, transfer_piece_bytes(config_.strategy) / static_cast<int64_t>(sizeof(float)));
  if (sending) {
    float* h = header.data_ptr<float>();
    put_int(h, r.step);
    put_int(h + 2, version_);
    put_int(h + 4, work_);
    put_lineage(h + 6, lineage_);
    put_int(h + 8, piece_numel);
    put_int(h + 10, r.optimizer.steps());
  }
  at::Tensor sent = header.to(net_device());
  if (!wait(net_.broadcast(as_span(sent), transfer_options(choice.ring, root)), "state transfer",
            &choice.ring)) {
    need_state_ = need_state_ || !sending;
    return sending;
  }
  if (!sent.is_same(header)) header.copy_(sent);
  const float* h = header.data_ptr<float>();
  const int64_t root_step = get_int(h);
  const int64_t root_version = get_int(h + 2);
  const int64_t root_work = get_int(h + 4);
  const uint32_t root_lineage = get_lineage(h + 6);
  const int64_t root_piece = get_int(h + 8);
  // AdamW's count, which lags the step by the updates skipped (fp16 overflows, ddp and atom
  // steps without an average): the moments it sends were made with it.
  const int64_t root_updates = get_int(h + 10);
  if (!sending) ++transfers_taken_;
  if (!sending && refuse_state_ && *refuse_state_ == transfers_taken_) {
    log("fault injection: refusing the header of state transfer " +
        std::to_string(transfers_taken_) + " from peer " + net_.describe(root));
    need_state_ = true;
    return false;
  }
  if (root_piece < 1000) {  // strategy.transfer_piece is at least 4 KB
    log("the state transfer's header from peer " + net_.describe(root) + " names pieces of " +
        std::to_string(root_piece) + " elements (at least 1000 expected); this peer ignores it");
    need_state_ = true;
    return false;
  }
  if (root_updates < 0 || root_updates > root_step) {
    log("the state transfer's header from peer " + net_.describe(root) + " counts " +
        std::to_string(root_updates) + " optimizer updates at step " + std::to_string(root_step) +
        " (0 to the step expected); this peer ignores it");
    need_state_ = true;
    return false;
  }
  // Progress counts only if it was made from the same shared state the root holds.
  const bool same_history = lineage_ == root_lineage;
  a.contribute = !need_state_ && same_history && version_ == root_version && r.step == root_step;
  // A peer that trained rounds of another history than the root's (a side of a split swarm,
  // a peer restarted from an old checkpoint) loses that progress: say so, with what it held.
  const bool other_history = !same_history && version_ > 0;
  // The root keeps its own state (its "state transfer: sent" line says so when others take
  // it).
  if (!sending && (need_state_ || r.step != root_step || !same_history))
    log("adopting the swarm's state from peer " + net_.describe(root) + " (step " +
        std::to_string(root_step) + ", round " + std::to_string(root_version) + ", work " +
        std::to_string(root_work) + ")" +
        (other_history ? "; this peer held another history (round " + std::to_string(version_) +
                             ", work " + std::to_string(work_) +
                             ": a split swarm, an old state, or a round that broke off at another "
                             "tensor); the history held by more "
                             "participants, then with more training, wins, so this peer's "
                             "own progress apart from it is dropped"
                       : ""));
  // The root's state is this peer's exactly when it has the same history, round and step
  // (collectives give every peer the same bits), so such a peer keeps its own.
  if (sending && !torn_.empty())
    log("no participant holds a whole state: every peer that held it has left since this "
        "peer's transfer broke off (it had received " +
        torn_ +
        "), so the swarm goes on from this peer's state, those pieces and its own values "
        "for the rest, at its own step " +
        std::to_string(r.step) +
        "; restart the swarm from a checkpoint (--resume) to go on "
        "from a whole one");
  if (!transfer_state(r, choice.ring, root, root_piece, a.contribute && keeps_own_state())) {
    need_state_ = need_state_ || !sending;
    return sending;
  }
  torn_.clear();
  // A peer in its opening agreement trains from here on the state it now holds: where its
  // share of the exchange that follows is computed after this (ddp's gradients of the step
  // the others are about to sum), that share is as good as theirs.
  if (opening && a.exchange_follows && counts_from_opening()) a.contribute = true;
  const bool moved = r.step != root_step;
  r.step = root_step;
  r.optimizer.set_steps(root_updates);
  version_ = root_version;
  work_ = root_work;
  lineage_ = root_lineage;
  history_ = root_lineage;  // till the next agreed round: the header carries one lineage
  holds_state_ = true;
  if (r.runner != nullptr && moved) r.runner->align(root_step);
  need_state_ = false;
  return true;
}

void SwarmStrategy::refuse_to_start_alone() const {
  // A peer that joined through another holds no state of the swarm's until its opening
  // agreement brings one. Alone there because every member it was let in by has left (announced
  // its departure: the swarm finished its run), it would train a fresh run from step 0 on its
  // own under the swarm's name. Members that went silent instead (dead, or cut off from it) may
  // come back: it trains meanwhile as a peer alone does, and meets them again when they do
  // (choose_root: the history more participants hold, then more work, wins). A peer that wrote part
  // of a transfer before its sender died holds some of the swarm's state and goes on from it
  // (take_state says so). A pipeline stage's group (restrict_to) is its counterparts only, one peer
  // where the stage has one replica.
  if (!net_.elastic() || !group_.empty() || config_.net.join.empty() || holds_state_ ||
      !torn_.empty())
    return;
  const auto* node = dynamic_cast<const net::Node*>(&net_);
  if (node == nullptr) return;
  int left = 0;
  for (const net::MemberView& m : node->members()) {
    if (m.info.id == net_.self()) continue;
    if (m.state != net::MemberState::left) return;
    ++left;
  }
  if (left == 0) return;
  std::string where;
  for (const std::string& e : config_.net.join) where += (where.empty() ? "" : ", ") + e;
  throw NetError("could not join the swarm through " + where + ": its " + std::to_string(left) +
                 " member(s) left the swarm before this peer took its state (the swarm finished "
                 "its run, or its peers were stopped), and alone this peer holds no state of the "
                 "swarm to train on. Join a running swarm, or start this peer without net.join "
                 "(--join) to train a run of its own");
}

Agreement SwarmStrategy::agree(train::Replica& r, bool exchange_follows, bool opening,
                               std::optional<bool> closing) {
  ++agreements_;
  for (int attempt = 0;; ++attempt) {
    constexpr int64_t kNotes = kControl + kLineage;  // where the strategy's notes start
    constexpr int64_t kShares = kNotes + kAgreementNotes;
    at::Tensor control = at::zeros({kShares + kRedealNotes}, at::kFloat);
    float* c = control.data_ptr<float>();
    c[0] = need_state_ ? 1.f : 0.f;
    c[1] = 1.f;
    c[2] = static_cast<float>(version_ % (1 << 20));  // compared as a sum: exact below 2^24/peers
    c[3] = has_previous() ? 1.f : 0.f;
    c[4] = !closing && r.runner != nullptr && r.runner->admission_ready() ? 1.f : 0.f;
    c[5] = exchange_follows ? 1.f : 0.f;
    // The round's low byte as b and b*b: equal everywhere exactly when n * sum(b*b) == sum(b)^2,
    // which catches rounds apart whose sum happens to be n times one of them (v-1, v, v+1).
    const float low = static_cast<float>(version_ & 0xFF);
    c[6] = low;
    c[7] = low * low;
    for (int b = 0; b < 4; ++b) {
      const float byte = static_cast<float>((lineage_ >> (8 * b)) & 0xFFu);
      c[kControl + 2 * b] = byte;
      c[kControl + 2 * b + 1] = byte * byte;
    }
    const std::array<float, kAgreementNotes> notes = round_notes();
    std::copy(notes.begin(), notes.end(), c + kNotes);
    c[kNotes + kClosingNote] = closing.value_or(false) ? 1.f : 0.f;
    data::TokenLoader* loader = dealt_loader(r);
    if (loader != nullptr) {
      const data::TokenLoader::Share share = loader->share();
      const std::array<float, kRedealNotes> mine =
          redeal_notes({.follows = !need_state_,
                        .rank = share.rank,
                        .world = share.world,
                        .position = loader->swarm_position()});
      std::copy(mine.begin(), mine.end(), c + kShares);
    }
    const double t0 = now_s();
    net::CollectiveResult result;
    try {
      at::Tensor sent = control.to(net_device());
      net::CollectiveOptions o = options(net::WirePrecision::fp32);
      if (attempt == 0 && abort_agreement_ && *abort_agreement_ == agreements_) {
        log("fault injection: failing round agreement " + std::to_string(agreements_));
        o.fail_at_start = true;
      }
      result = net_.all_reduce(as_span(sent), o).wait();
      if (!sent.is_same(control)) control.copy_(sent);
    } catch (const std::exception& e) {
      net_wait_s_ += now_s() - t0;
      if (!net_.elastic())
        throw NetError("the round agreement failed on the " + net_.backend_name() +
                       " group, which cannot go on without a rank: " + e.what());
      if (attempt % 10 == 0) log(std::string("round agreement failed, retrying: ") + e.what());
      // This peer's state is as it was: a failed attempt changes nothing here. Where it went
      // through on others, they mixed the round into their lineage (agreed()), which the next
      // attempt's sums tell apart, and its root choice hands out the history most peers hold. A
      // peer that asked for the state after every failed attempt took a transfer of the state it
      // held and dropped its progress: when a peer died in an agreement, every survivor did so
      // (atom then stepped on a joiner's one micro-batch, the others' samples unused).
      continue;
    }
    net_wait_s_ += now_s() - t0;
    Agreement a;
    a.peers = static_cast<int>(c[1]);
    a.exchange_follows = c[5] > 0;
    a.exchange_voters = static_cast<int>(c[5]);
    for (int i = 0; i < kAgreementNotes; ++i) a.notes[i] = c[kNotes + i];
    std::array<double, kRedealNotes> shares{};
    for (int i = 0; i < kRedealNotes; ++i) shares[i] = c[kShares + i];
    a.ring = result.ring;
    std::sort(a.ring.begin(), a.ring.end());
    if (opening && a.ring.size() == 1) refuse_to_start_alone();
    const int needing = static_cast<int>(c[0]);
    const bool versions_agree =
        c[2] == static_cast<float>(a.peers) * (version_ % (1 << 20)) &&
        static_cast<double>(a.peers) * c[7] == static_cast<double>(c[6]) * c[6];
    // Every byte's values are equal exactly when n * sum(b*b) == sum(b)^2 (their variance is 0);
    // the sums are exact below 2^24 / 255^2 = 258 peers, and the same on every peer, so every
    // peer decides alike.
    bool lineages_agree = true;
    for (int b = 0; b < 4; ++b)
      lineages_agree =
          lineages_agree && static_cast<double>(a.peers) * c[kControl + 2 * b + 1] ==
                                static_cast<double>(c[kControl + 2 * b]) * c[kControl + 2 * b];
    const int with_previous = static_cast<int>(c[3]);
    a.previous_on_all = with_previous == a.peers;
    peers_ = a.peers;
    // Every participant sees waiting peers it can admit: all admit them before the next
    // collective (after this agreement's own), so every group counts them from the same step.
    const bool admit = static_cast<int>(c[4]) == a.peers && r.runner != nullptr;
    if (needing == 0 && versions_agree && lineages_agree) {
      a.contributors = a.peers;
      a.contribute = true;
      agreed(a);
      if (admit) r.runner->admit_waiting();
      if (loader != nullptr) redeal(*loader, a, shares);
      return a;
    }
    // Someone lacks the shared state, or the states differ: the newest one is sent, to the
    // participants whose state is not the same already.
    const std::optional<RootChoice> choice = choose_root(r, a);
    if (!choice) {
      need_state_ = true;
      continue;
    }
    net::CollectiveOptions counting = options(net::WirePrecision::fp32, a.ring);
    if (choice->root != net_.self()) {
      // The root comes to the contributor count below once its transfer ends. Every other
      // participant may come long before: a peer outside the transfer at once, a taker whose
      // transfer failed early (its header refused, say) while the root still waits on its
      // pieces. Each piece may wait up to a collective timeout before the transfer fails, so
      // they wait that long for each.
      int64_t numel = 0;  // the state's size, the same on every peer
      for (const at::Tensor& t : state_tensors(r)) numel += t.numel();
      const int64_t pieces = (numel + choice->piece_numel - 1) / choice->piece_numel;
      // At most a year: a clock's time point a few hundred years ahead overflows.
      constexpr int64_t kYear = 365LL * 24 * 3600;
      counting.wait_limit = std::chrono::seconds(std::min<int64_t>(
          kYear, config_.net.collective_timeout_s * std::min<int64_t>(kYear, pieces + 2)));
    }
    // Whether this peer holds the root's state now (a keeper all along).
    bool holds_root_state = true;
    if (choice->keeps) {
      // This peer holds the state the root sends (its round, step, work and count are the
      // root's, so the header would change nothing either): it neither receives it nor passes
      // it on, and waits for the transfer's end in the contributor count below.
      a.contribute = true;
      log("state transfer: not needed here (this peer holds the state peer " +
          net_.describe(choice->root) + " sends, at step " + std::to_string(r.step) + ", round " +
          std::to_string(version_) + "); it goes to " + std::to_string(choice->ring.size() - 1) +
          " peer(s)");
    } else {
      holds_root_state = take_state(r, a, *choice, opening);
    }
    // Agree on who contributes, whether every participant holds the previous round's average
    // (a peer that kept its own state keeps its own answer), and whether every transfer went
    // through: one more tiny sum. A taker whose transfer failed comes here too, so the peers
    // that waited outside the transfer learn of it at once.
    at::Tensor count = at::tensor({a.contribute ? 1.f : 0.f, has_previous() ? 1.f : 0.f,
                                   holds_root_state ? 0.f : 1.f})
                           .to(net_device());
    // A peer that holds the root's state (it kept out of the transfer, or took all of it) keeps
    // it when the agreement starts again: no one ran agreed(), and the next agreement finds
    // any peer apart. The others need the state.
    const bool sent = choice->root == net_.self();
    if (!wait(net_.all_reduce(as_span(count), counting), "contributor count", &a.ring)) {
      if (!holds_root_state) need_state_ = true;
      if (sent) ++failed_sends_;
      continue;
    }
    const at::Tensor sums = count.cpu();
    const int failed = static_cast<int>(sums[2].item<float>());
    if (sent) failed_sends_ = failed > 0 ? failed_sends_ + 1 : 0;
    if (failed > 0) {
      log("the state transfer failed for " + std::to_string(failed) +
          " peer(s); the agreement starts again");
      continue;
    }
    a.synced = true;
    a.contributors = static_cast<int>(sums[0].item<float>());
    a.previous_on_all = static_cast<int>(sums[1].item<float>()) == a.peers;
    agreed(a);
    if (admit) r.runner->admit_waiting();
    if (loader != nullptr) redeal(*loader, a, shares);
    return a;
  }
}

void SwarmStrategy::start(train::Replica& r, const nlohmann::json& state,
                          const SafetensorsFile* tensors) {
  // A peer restored from its checkpoint keeps its state if the swarm's agreement finds every
  // other peer at the same step and round (a whole swarm resumed together); any other peer, and
  // any disagreement, takes the root's state, so replicas always start identical.
  runner_ = r.runner;
  const auto part = r.runner != nullptr ? r.runner->trained_params() : std::nullopt;
  model_part_ = part.has_value();
  if (part) {
    flat_.emplace(r.params, part->params);
    counted_numel_ = flat_->numel(std::span<const int>(part->params).first(part->counted));
  } else {
    flat_.emplace(r.params);
    counted_numel_ = flat_->numel();
  }
  allocate(r);
  need_state_ = true;
  // A checkpoint of another strategy (co2 resumed as ddp, say) holds state this one cannot use
  // (co2's outer momentum and anchor, its round counts): the peer starts as one whose checkpoint
  // had none, with the checkpoint's parameters, moments and step, and the agreement makes the
  // replicas identical as at any start.
  const std::string saved_kind =
      state.is_object() ? state.value("kind", std::string()) : std::string();
  const bool other_kind = !saved_kind.empty() && saved_kind != config_.strategy.kind;
  if (tensors != nullptr && other_kind)
    log("note: " + kind_change_note(saved_kind, config_.strategy.kind));
  if (tensors != nullptr && state.is_object() && !other_kind) {
    version_ = state.value("version", int64_t{0});
    work_ = state.value("work", int64_t{0});
    lineage_ = state.value("lineage", uint32_t{0});
    history_ = state.value("history", lineage_);
    holds_state_ = true;
    restore(r, state, *tensors);
    need_state_ = false;
  }
  if (stop_at_start_) {
    log("fault injection: stopping (SIGSTOP) before the opening agreement");
    std::raise(SIGSTOP);
  }
  const Agreement a = agree(r, false, true);
  const int64_t agreed_version = version_;  // after any state the agreement brought
  started(a);
  // Joined in the others' last round: the adopted step is the run's last, and no step_done()
  // follows to end that round.
  if (a.exchange_follows && r.step >= config_.train.steps) {
    end_in_last_round(r, agreed_version);
    ended_in_start_ = true;
  }
  log("training with " + std::to_string(a.peers) + " peer" + (a.peers == 1 ? "" : "s") +
      " from step " + std::to_string(r.step));
}

void SwarmStrategy::finish(train::Replica&) {}

train::StrategyReport SwarmStrategy::report() const {
  train::StrategyReport rep{.peers = peers_,
                            .bytes_sent = static_cast<double>(net_.bytes_sent()),
                            .net_wait_s = net_wait_s_,
                            .round = version_};
  if (fingerprint_round_ >= 0) {
    rep.figures["fingerprint"] = static_cast<double>(fingerprint_);
    rep.figures["fingerprint_round"] = static_cast<double>(fingerprint_round_);
    rep.figures["fingerprint_lineage"] = static_cast<double>(fingerprint_lineage_);
  }
  if (rejected_updates_ > 0)
    rep.figures["rejected_updates"] = static_cast<double>(rejected_updates_);
  if (withheld_updates_ > 0)
    rep.figures["withheld_updates"] = static_cast<double>(withheld_updates_);
  if (redeals_ > 0) rep.figures["data_redeals"] = static_cast<double>(redeals_);
  rep.figures["contributors"] = static_cast<double>(contributors_);
  return rep;
}

}  // namespace starling::strategy
