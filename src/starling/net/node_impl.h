// Node's inside, shared by the files that implement it (node.cpp: set-up, the communication
// thread's loop, messages, requests; node_runs.cpp: the collectives running on their threads).
// Not a public header.
#pragma once

#include <atomic>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "starling/net/agreement.h"
#include "starling/net/control_message.h"
#include "starling/net/direct_links.h"
#include "starling/net/gossip.h"
#include "starling/net/mailbox.h"
#include "starling/net/member_table.h"
#include "starling/net/node.h"
#include "starling/net/ring_run.h"
#include "starling/net/transport.h"

namespace starling::net {

// The communication thread and what it owns: the transport, the gossip, the agreement, the
// mailbox and the running collectives. Callers' threads hand it requests through queues guarded
// by mutex_; running collectives hand it chunks through the outbox.
class Node::Impl {
 public:
  explicit Impl(NodeOptions options);
  ~Impl() { stop(false); }

  void stop(bool announce);
  Work launch(CollectiveKind kind, std::span<float> data, const CollectiveOptions& options);
  Transfer post(bool send, PeerId peer, uint64_t tag, std::vector<uint8_t> bytes);
  void keep_latest_unclaimed(uint64_t tag);

  std::vector<MemberView> members() const;
  std::vector<LinkView> links() const;
  bool wait_for_members(size_t count, std::chrono::milliseconds timeout) const;
  void activate();
  bool admit(PeerId peer, uint64_t incarnation);
  bool returning() const;
  void note_link_rate(PeerId from, double mbit_per_s);
  void set_role(const std::string& role);
  void set_progress(const std::string& progress);
  Node::Counters counters() const;

  PeerId id() const { return self_id_; }
  // A member as logs name it; this peer too, which is not in its own member table.
  std::string who(PeerId id) const {
    if (id == self_id_ && !options_.name.empty())
      return short_peer_id(id) + " (" + options_.name + ")";
    return table_.who(id);
  }
  const std::string& endpoint() const { return endpoint_; }

 private:
  struct TransferRequest {
    bool send = false;
    PeerId peer = 0;
    uint64_t tag = 0;
    std::vector<uint8_t> bytes;
    std::shared_ptr<Transfer::State> state;
  };
  struct Outgoing {
    PeerId to = 0;
    Header header;
    zmq::message_t payload;
  };

  void run();
  void take_requests();
  void run_transfer(TransferRequest& r);
  void flush_outbox();
  void collect_runs();
  void handle(Incoming& in);
  void handle_data(Incoming& in);
  void handle_abort(const Header& h, const nlohmann::json& body);
  void start_run(Launched op, Start start);
  void fail_runs(PeerId peer, const std::string& why, bool only_left_neighbour);
  void send_control(PeerId to, MsgType type, const nlohmann::json& body, uint64_t op);
  void shut_down();
  void log(const std::string& line) { options_.log(line); }

  NodeOptions options_;
  PeerId self_id_ = 0;
  std::string endpoint_;
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<DirectLinks> direct_;  // with direct_data only
  std::atomic<uint64_t> direct_bytes_sent_{0};
  MemberTable table_;
  std::unique_ptr<Gossip> gossip_;
  std::unique_ptr<Agreement> agreement_;
  bool joining_ = false;

  // Requests from callers' threads.
  mutable std::mutex mutex_;
  std::deque<Launched> launches_;
  std::deque<TransferRequest> transfers_;
  std::vector<uint64_t> keep_latest_;  // tags for the mailbox's keep_latest, not passed on yet
  bool activate_ = false;              // guarded by mutex_: activate() was called
  bool stopping_ = false;
  bool announce_leave_ = false;

  // Chunks from running collectives, and the ones that ended.
  std::mutex out_mutex_;
  std::vector<Outgoing> outbox_;
  std::vector<uint64_t> ended_;
  std::atomic<bool> out_pending_{false};

  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> malformed_{0};  // well-framed messages with an invalid body

  // Communication-thread state.
  Clock::time_point next_tick_{};
  Clock::time_point last_loop_{};   // the event loop's previous turn (pause detection)
  Mailbox p2p_;                     // point-to-point messages, by (peer, tag)
  uint64_t dropped_unclaimed_ = 0;  // messages dropped because too many waited for a receive
  std::map<uint64_t, std::unique_ptr<RingRun>> runs_;  // by operation id
  std::map<uint64_t, std::deque<Incoming>> early_;     // chunks of operations not started here
  uint64_t early_bytes_ = 0;  // what early_ holds, counted as early_cost() of each chunk
  uint64_t early_dropped_ = 0;
  std::map<uint64_t, std::string> aborted_;  // aborts of operations not started here
  std::deque<uint64_t> finished_ops_;
};

}  // namespace starling::net
