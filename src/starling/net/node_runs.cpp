// Node's running collectives: each agreed operation becomes a RingRun on its own thread, fed
// the chunks the communication thread receives for it; here they start, end, fail and abort.
#include <algorithm>

#include "starling/net/endpoint.h"
#include "starling/net/node_impl.h"

namespace starling::net {
namespace {

using json = nlohmann::json;

// Operations whose chunks may arrive before their start does (or after they ended here).
constexpr size_t kEarlyOps = 16, kFinishedOps = 64;

// What an early chunk costs to keep: its payload and the message around it (frames, routing id,
// address).
uint64_t early_cost(const Incoming& in) { return in.payload.size() + 1024; }

uint64_t early_cost(const std::deque<Incoming>& chunks) {
  uint64_t bytes = 0;
  for (const Incoming& in : chunks) bytes += early_cost(in);
  return bytes;
}

}  // namespace

void Node::Impl::start_run(Launched op, Start start) {
  std::string problem;
  RingRun::Env env;
  {
    std::lock_guard lock(table_.mutex);
    const int P = static_cast<int>(start.ring.size());
    const int pos = static_cast<int>(std::find(start.ring.begin(), start.ring.end(), self_id_) -
                                     start.ring.begin());
    for (PeerId id : {start.ring[(pos - 1 + P) % P], start.ring[(pos + 1) % P]}) {
      const Member* m = table_.members.find(id);
      if (!m)
        problem = "the ring names peer " + short_peer_id(id) + ", unknown here";
      else if (id != self_id_)
        transport_->connect(slot_of(id), m->info.endpoint, m->info.public_key);
    }
    // A link is direct when both of its ends have direct links.
    const Member* left = table_.members.find(start.ring[(pos - 1 + P) % P]);
    const Member* right = table_.members.find(start.ring[(pos + 1) % P]);
    if (direct_ && right && right->info.id != self_id_ && right->info.data_port != 0)
      env.right_host.emplace(endpoint_host(right->info.endpoint), right->info.data_port);
    env.left_direct = direct_ && left && left->info.id != self_id_ && left->info.data_port != 0;
    for (PeerId id : start.ring)
      if (const Member* m = table_.members.find(id); m && m->state == MemberState::dead)
        problem = "peer " + short_peer_id(id) + " died during the operation";
  }
  env.direct = direct_.get();
  env.direct_bytes_sent = &direct_bytes_sent_;
  env.self = self_id_;
  env.peer_timeout = options_.peer_timeout;
  env.send = [this](PeerId to, const Header& h, zmq::message_t payload) {
    bool wake = false;
    {
      std::lock_guard lock(out_mutex_);
      wake = outbox_.empty() && ended_.empty();
      outbox_.push_back({to, h, std::move(payload)});
      out_pending_ = true;
    }
    if (wake) transport_->wake();
  };
  env.done = [this](uint64_t op_id) {
    {
      std::lock_guard lock(out_mutex_);
      ended_.push_back(op_id);
    }
    transport_->wake();
  };
  env.who = [this](PeerId id) { return who(id); };
  const uint64_t op_id = start.op_id;
  std::deque<Incoming> early;
  if (auto it = early_.find(op_id); it != early_.end()) {
    early_bytes_ -= early_cost(it->second);
    early = std::move(it->second);
    early_.erase(it);
  }
  const bool fail_at_start = op.request.options.fail_at_start;
  auto run = std::make_unique<RingRun>(std::move(op), std::move(start), env, std::move(early));
  if (!problem.empty()) run->fail(problem);
  if (fail_at_start && problem.empty())
    run->fail("fault injection: peer " + short_peer_id(self_id_) +
              " fails this operation as it starts (STARLING_FAULT_ABORT_AGREEMENT)");
  if (auto a = aborted_.find(op_id); a != aborted_.end()) run->fail(a->second);
  runs_[op_id] = std::move(run);
}

void Node::Impl::collect_runs() {
  std::vector<uint64_t> ended;
  {
    std::lock_guard lock(out_mutex_);
    ended.swap(ended_);
  }
  if (!ended.empty()) flush_outbox();  // their last chunks leave before any abort
  for (uint64_t op_id : ended) {
    auto it = runs_.find(op_id);
    if (it == runs_.end()) continue;
    RingRun& run = *it->second;
    const RingRun::Outcome outcome = run.finish();
    if (!outcome.error.empty())
      for (PeerId id : run.start().ring)
        if (id != self_id_) send_control(id, MsgType::abort, {{"reason", outcome.reason}}, op_id);
    if (outcome.incoming_mbps) {
      std::lock_guard lock(table_.mutex);
      if (*outcome.incoming_mbps > table_.members.link(run.left(), self_id_).mbit_per_s)
        table_.members.set_link(run.left(), self_id_, {-1, *outcome.incoming_mbps});
    }
    const uint64_t tag = run.start().request.options.tag;
    runs_.erase(it);
    finished_ops_.push_back(op_id);
    if (finished_ops_.size() > kFinishedOps) finished_ops_.pop_front();
    agreement_->finished(tag);
  }
}

void Node::Impl::fail_runs(PeerId peer, const std::string& why, bool only_left_neighbour) {
  for (auto& [op_id, run] : runs_)
    if (only_left_neighbour ? run->left() == peer : run->involves(peer)) run->fail(why);
}

void Node::Impl::handle_data(Incoming& in) {
  const uint64_t op = in.header.op;
  if (auto it = runs_.find(op); it != runs_.end()) {
    it->second->deliver(std::move(in));
    return;
  }
  if (std::find(finished_ops_.begin(), finished_ops_.end(), op) != finished_ops_.end())
    return;  // late chunk of an operation that already ended here
  const uint64_t cost = early_cost(in);
  if (early_bytes_ + cost > options_.max_early_bytes) {
    // Counted as rejected: a member that floods chunks of collectives that never start here is
    // what this bound is for.
    ++malformed_;
    if (early_dropped_++ % 10000 == 0)
      log("dropped a chunk of collective " + std::to_string(op) + " from " +
          table_.who(in.header.sender) + ": " + std::to_string(early_bytes_ >> 20) +
          " MiB of chunks already wait for collectives that have not started here (" +
          std::to_string(early_dropped_) + " dropped so far)");
    return;
  }
  early_bytes_ += cost;
  early_[op].push_back(std::move(in));
  if (early_.size() > kEarlyOps) {  // stale ops never run here
    early_bytes_ -= early_cost(early_.begin()->second);
    early_.erase(early_.begin());
  }
}

void Node::Impl::handle_abort(const Header& h, const json& body) {
  const std::string reason = body.contains("reason") && body["reason"].is_string()
                                 ? body["reason"].get<std::string>()
                                 : "no reason given";
  if (h.op != 0) {
    const std::string why = "peer " + table_.who(h.sender) + " aborted it: " + reason;
    if (auto it = runs_.find(h.op); it != runs_.end()) {
      it->second->fail(why);
    } else {
      aborted_.insert_or_assign(h.op, why);
      if (aborted_.size() > kFinishedOps) aborted_.erase(aborted_.begin());
    }
  }
  agreement_->on_withdraw(h.sender, body);
}

}  // namespace starling::net
