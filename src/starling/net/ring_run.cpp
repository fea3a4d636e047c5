#include "starling/net/ring_run.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <thread>

#include "starling/common/error.h"
#include "starling/net/quiet_thread.h"

namespace starling::net {
namespace {

// The largest frame a left neighbour may announce on a direct link: a full fp32 chunk, and room
// for a lossy precision's scale.
size_t max_frame_bytes(size_t chunk_elements) { return chunk_elements * sizeof(float) + 64; }

}  // namespace

RingRun::RingRun(Launched op, Start start, Env env, std::deque<Incoming> early)
    : op_(std::move(op)), start_(std::move(start)), env_(std::move(env)), inbox_(std::move(early)) {
  const auto& ring = start_.ring;
  const int P = static_cast<int>(ring.size());
  position_ = static_cast<int>(std::find(ring.begin(), ring.end(), env_.self) - ring.begin());
  left_ = ring[(position_ - 1 + P) % P];
  right_ = ring[(position_ + 1) % P];
  if (uses_direct()) {
    wake_ = Fd(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
    if (!wake_) fail_ = "eventfd failed";
    direct_.configure(max_frame_bytes(start_.chunk_elements), env_.who(left_), env_.who(right_));
  }
  thread_ = quiet_thread([this] { run(); });
}

RingRun::~RingRun() {
  fail("the peer is stopping");
  if (thread_.joinable()) thread_.join();
}

bool RingRun::involves(PeerId peer) const {
  return std::find(start_.ring.begin(), start_.ring.end(), peer) != start_.ring.end();
}

void RingRun::deliver(Incoming chunk) {
  {
    std::lock_guard lock(mutex_);
    inbox_.push_back(std::move(chunk));
  }
  signal();
}

void RingRun::fail(std::string reason) {
  {
    std::lock_guard lock(mutex_);
    if (!fail_) fail_ = std::move(reason);
  }
  signal();
}

std::optional<std::string> RingRun::abort_reason_within(std::chrono::milliseconds wait) {
  const auto deadline = Clock::now() + wait;
  while (true) {
    {
      std::lock_guard lock(mutex_);
      if (fail_) return fail_;
    }
    if (Clock::now() >= deadline) return std::nullopt;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

void RingRun::signal() {
  arrived_.notify_one();
  if (wake_) {
    const uint64_t one = 1;
    [[maybe_unused]] const ssize_t w = ::write(wake_.get(), &one, sizeof one);
  }
}

void RingRun::take_frame(DirectStream::Frame f) {
  Incoming in;
  in.header.type = MsgType::data;
  in.header.sender = left_;
  in.header.op = start_.op_id;
  in.header.step = f.step;
  in.header.chunk = f.chunk;
  in.header.payload_bytes = f.payload.size();
  in.payload = std::move(f.payload);
  std::lock_guard lock(mutex_);
  inbox_.push_back(std::move(in));
}

void RingRun::pump_direct(Clock::time_point until) {
  direct_.pump(until, wake_.get(), [this](DirectStream::Frame f) { take_frame(std::move(f)); });
}

void RingRun::wait_for_progress(Clock::time_point deadline) {
  using namespace std::chrono_literals;
  if (env_.left_direct && !left_taken_) {
    if (auto fd = env_.direct->take(left_, start_.op_id)) {
      direct_.set_left(std::move(*fd));
      left_taken_ = true;
    } else {
      // The left neighbour's connection has not come yet: keep our own sends moving meanwhile,
      // and look again soon (a failure shows within one slice).
      const auto until = std::min(deadline, Clock::now() + 20ms);
      if (direct_.sending())
        pump_direct(until);
      else
        env_.direct->wait_for_arrival(until);
      return;
    }
  }
  pump_direct(deadline);
}

void RingRun::finish_direct() {
  if (direct_.has_right()) {
    direct_.queue_end();
    auto stalled_since = Clock::now();
    uint64_t written = direct_.bytes_written();
    while (direct_.sending()) {
      {
        std::lock_guard lock(mutex_);
        if (fail_) throw NetError(*fail_);
      }
      const auto now = Clock::now();
      if (direct_.bytes_written() != written) {
        written = direct_.bytes_written();
        stalled_since = now;
      } else if (now - stalled_since > env_.peer_timeout) {
        throw NetError(env_.who(right_) + " took none of this peer's data for " +
                       seconds_text(env_.peer_timeout));
      }
      pump_direct(now + env_.peer_timeout);
    }
    env_.direct->keep_outgoing(right_, direct_.release_right());
  }
  if (direct_.has_left() && direct_.between_frames())
    env_.direct->keep_incoming(direct_.release_left(), direct_.left_ended());
}

void RingRun::run() {
  const Request& req = op_.request;
  RingSpec spec;
  spec.position = position_;
  spec.size = static_cast<int>(start_.ring.size());
  spec.chunk_elements = start_.chunk_elements;
  spec.precision = req.options.precision;
  spec.op = req.options.op;
  spec.reject_non_finite = req.options.reject_non_finite;
  last_progress_ = Clock::now();
  try {
    switch (req.kind) {
      case CollectiveKind::all_reduce:
        ring_all_reduce(op_.data, spec, *this);
        break;
      case CollectiveKind::reduce_scatter:
        ring_reduce_scatter(op_.data, spec, *this);
        break;
      case CollectiveKind::all_gather:
        ring_all_gather(op_.data, spec, *this);
        break;
      case CollectiveKind::broadcast: {
        const auto& ring = start_.ring;
        const int root =
            static_cast<int>(std::find(ring.begin(), ring.end(), req.options.root) - ring.begin());
        chain_broadcast(op_.data, spec, root, *this);
        break;
      }
    }
    if (uses_direct()) finish_direct();
  } catch (const NonFiniteValues& e) {
    // The reason goes to every participant: name the peer from nobody's point of view.
    reason_ = e.own ? "peer " + env_.who(env_.self) +
                          "'s own contribution holds non-finite values; it is rejected"
                    : "non-finite values arrived from peer " + env_.who(left_) +
                          " (its own contribution, or one it passed on unchecked); rejected";
    error_ = to_string(req.kind) + " failed: " + reason_;
  } catch (const LinkClosed& e) {
    // The neighbour most often closed its link because the operation failed there first; its
    // abort, with the reason (a peer named for non-finite values, a dead member), travels the
    // control channel and can land a moment after the closed link. Wait that moment for it.
    reason_ = abort_reason_within(std::chrono::milliseconds(200)).value_or(e.what());
    error_ = to_string(req.kind) + " failed: " + reason_;
  } catch (const NetError& e) {
    reason_ = e.what();
    error_ = to_string(req.kind) + " failed: " + reason_;
  }
  if (env_.direct_bytes_sent) *env_.direct_bytes_sent += direct_.bytes_written();
  direct_ = DirectStream();  // a failed run's connections close here
  env_.done(start_.op_id);
}

RingRun::Outcome RingRun::finish() {
  if (thread_.joinable()) thread_.join();
  Outcome out;
  out.error = error_;
  out.reason = reason_;
  const int P = static_cast<int>(start_.ring.size());
  if (error_.empty() && received_bytes_ > first_chunk_bytes_ && P > 1) {
    const double secs = std::chrono::duration<double>(last_progress_ - first_chunk_at_).count();
    if (secs > 0.05) out.incoming_mbps = (received_bytes_ - first_chunk_bytes_) * 8 / secs / 1e6;
  }
  CollectiveResult result;
  result.ring = start_.ring;
  result.position = position_;
  result.shard = shard_of(op_.data.size(), P, position_);
  result.op_id = start_.op_id;
  result.seconds = std::chrono::duration<double>(Clock::now() - op_.launched).count();
  op_.state->finish(result, error_);
  return out;
}

void RingRun::send_right(uint32_t step, uint32_t chunk, zmq::message_t payload) {
  {
    std::lock_guard lock(mutex_);
    if (fail_) throw NetError(*fail_);
  }
  if (env_.right_host) {
    if (!direct_.has_right()) {
      const auto& [host, port] = *env_.right_host;
      try {
        direct_.set_right(env_.direct->open(right_, host, port, env_.self, start_.op_id,
                                            Clock::now() + env_.peer_timeout));
      } catch (const NetError& e) {
        throw NetError("cannot reach " + env_.who(right_) + ": " + e.what());
      }
    }
    direct_.queue(step, chunk, std::move(payload));
    pump_direct(Clock::now());  // writes what the socket takes now, reads what has come
    return;
  }
  Header h;
  h.type = MsgType::data;
  h.sender = env_.self;
  h.op = start_.op_id;
  h.step = step;
  h.chunk = chunk;
  env_.send(right_, h, std::move(payload));
}

zmq::message_t RingRun::receive_left(uint32_t step, uint32_t chunk, size_t expected_bytes) {
  // The left neighbour's chunks arrive in the order it sent them, which need not be the order
  // they are asked for (its step-0 chunks run a window ahead of its step-1 chunks); anything
  // from another peer, or a chunk already taken, is an error.
  const auto already_taken = [&](const Header& h) {
    return h.step < step || (h.step == step && h.chunk < chunk);
  };
  Incoming in;
  for (;;) {
    {
      std::unique_lock lock(mutex_);
      const auto it = std::find_if(inbox_.begin(), inbox_.end(), [&](const Incoming& m) {
        return m.header.sender != left_ || already_taken(m.header) ||
               (m.header.step == step && m.header.chunk == chunk);
      });
      if (it != inbox_.end()) {
        in = std::move(*it);
        inbox_.erase(it);
        break;
      }
      if (fail_) throw NetError(*fail_);
      if (direct_.left_ended())
        throw NetError(env_.who(left_) + " ended the operation without sending step " +
                       std::to_string(step) + " chunk " + std::to_string(chunk));
      const auto deadline = last_progress_ + env_.peer_timeout;
      if (Clock::now() >= deadline)
        throw NetError("no data from " + env_.who(left_) + " for " +
                       seconds_text(env_.peer_timeout) + " (waiting for step " +
                       std::to_string(step) + " chunk " + std::to_string(chunk) + ")");
      if (!uses_direct()) {
        arrived_.wait_until(lock, deadline);
        continue;
      }
    }
    wait_for_progress(last_progress_ + env_.peer_timeout);
  }
  const Header& h = in.header;
  if (h.sender != left_)
    throw NetError("peer " + env_.who(h.sender) + " sent a chunk out of turn (expected one from " +
                   env_.who(left_) + ")");
  if (already_taken(h))
    throw NetError("peer " + env_.who(h.sender) + " sent step " + std::to_string(h.step) +
                   " chunk " + std::to_string(h.chunk) + " again or out of order (now at step " +
                   std::to_string(step) + " chunk " + std::to_string(chunk) + ")");
  if (in.payload.size() != expected_bytes)
    throw NetError("peer " + env_.who(h.sender) + " sent a chunk of " +
                   std::to_string(in.payload.size()) + " bytes, expected " +
                   std::to_string(expected_bytes) + " (do all peers pass the same size?)");
  last_progress_ = Clock::now();
  if (received_bytes_ == 0) {
    first_chunk_at_ = last_progress_;
    first_chunk_bytes_ = in.payload.size();
  }
  received_bytes_ += in.payload.size();
  return std::move(in.payload);
}

}  // namespace starling::net
