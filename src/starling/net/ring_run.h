// One agreed collective, running on a thread of its own: the ring algorithm (ring_channel.h)
// talks to this object only. On ZeroMQ links it queues outgoing chunks for the communication
// thread and waits for incoming ones that thread delivers; on direct links (direct_links.h) it
// writes and reads the sockets itself. The communication thread never blocks on a collective,
// and several collectives (different tags) run side by side.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "starling/net/agreement.h"
#include "starling/net/direct_stream.h"
#include "starling/net/ring_channel.h"
#include "starling/net/transport.h"

namespace starling::net {

class RingRun final : public RingChannel {
 public:
  struct Env {
    PeerId self = 0;
    std::chrono::milliseconds peer_timeout{5000};
    // Queues a chunk for the communication thread to send (any thread).
    std::function<void(PeerId to, const Header& header, zmq::message_t payload)> send;
    // Called once, on the run's thread, when it has ended (the node collects it then).
    std::function<void(uint64_t op_id)> done;
    std::function<std::string(PeerId)> who;
    // Direct links, when this peer has them (nullptr: every chunk goes through ZeroMQ). The
    // right neighbour's link is direct when `right_host` is set, the left's when `left_direct`.
    DirectLinks* direct = nullptr;
    std::optional<std::pair<std::string, uint16_t>> right_host;  // host, port
    bool left_direct = false;
    std::atomic<uint64_t>* direct_bytes_sent = nullptr;  // added to as chunks leave directly
  };

  // Starts the thread. `early` holds chunks that arrived before the start did.
  RingRun(Launched op, Start start, Env env, std::deque<Incoming> early);
  ~RingRun() override;  // joins
  RingRun(const RingRun&) = delete;
  RingRun& operator=(const RingRun&) = delete;

  // From the communication thread (any thread is fine):
  void deliver(Incoming chunk);   // a chunk of this operation arrived
  void fail(std::string reason);  // abort, a dead or departed member, the peer stopping

  const Start& start() const { return start_; }
  PeerId left() const { return left_; }
  bool involves(PeerId peer) const;

  // After done: joins the thread, completes the caller's handle, and returns the error (empty on
  // success) and the measured bandwidth of the incoming link (Mbit/s) when the transfer was long
  // enough to mean it.
  struct Outcome {
    std::string error;   // "all_reduce failed: <reason>", for the caller
    std::string reason;  // the reason alone, for the other participants' abort
    std::optional<double> incoming_mbps;
  };
  Outcome finish();

  // RingChannel, on the run's thread.
  void send_right(uint32_t step, uint32_t chunk, zmq::message_t payload) override;
  zmq::message_t receive_left(uint32_t step, uint32_t chunk, size_t expected_bytes) override;

 private:
  void run();
  bool uses_direct() const { return env_.right_host.has_value() || env_.left_direct; }
  // Waits until `deadline` for anything to move: pumps the direct links, or waits for a
  // delivery from the communication thread.
  void wait_for_progress(Clock::time_point deadline);
  // Writes out what is still queued for the right neighbour, then keeps clean connections.
  void finish_direct();
  void pump_direct(Clock::time_point until);
  void take_frame(DirectStream::Frame frame);  // a chunk read from the left's direct link
  void signal();                               // wakes the run's thread
  // The reason fail() was given, waiting up to `wait` for one; nullopt if none came.
  std::optional<std::string> abort_reason_within(std::chrono::milliseconds wait);

  Launched op_;
  Start start_;
  Env env_;
  int position_ = 0;
  PeerId left_ = 0, right_ = 0;

  std::mutex mutex_;
  std::condition_variable arrived_;
  std::deque<Incoming> inbox_;       // guarded by mutex_
  std::optional<std::string> fail_;  // guarded by mutex_
  Fd wake_;                          // eventfd that deliver() and fail() signal (direct only)

  // Direct links, on the run's thread only.
  DirectStream direct_;
  bool left_taken_ = false;

  // The run's thread only.
  Clock::time_point last_progress_{};
  Clock::time_point first_chunk_at_{};
  uint64_t first_chunk_bytes_ = 0, received_bytes_ = 0;
  std::string error_, reason_;
  std::thread thread_;
};

}  // namespace starling::net
