// The receiving side of the bandwidth probes between members (gossip.h). A member sends a marker
// and right behind it a payload; the receiver reads the link's rate from the time between the two.
//
// That time is only true where the receiver took the marker as it came. A receiver whose loop was
// busy (CPUs taken by the peers' start-up) found marker and payload both queued, and read
// microseconds for a payload the link had carried in milliseconds: a 1 Gbit link read hundreds of
// Gbit/s, and the link table kept it, since long transfers only ever raise a reading. So the
// marker's time is known only within the while it may have waited queued (Incoming::not_before to
// ::arrived), and the reading takes the transfer from its earliest moment: it may be low, not
// high (but see the end).
// - A marker whose doubt exceeds a quarter of that time (its reading could be under 0.75 of the
//   rate, or arbitrarily low) gives no reading, and the receiver asks the sender, at its next
//   heartbeat, for another probe: one `growth` times larger where the time read was too short to
//   trust (min_seconds), whose longer transfer dwarfs such a doubt; else (or at max_bytes) one of
//   the same size, up to max_retries times. Past those, this meeting records nothing more (an
//   earlier reading in no doubt stands; else long collective transfers measure the link).
// - So does a reading beyond max_mbit_per_s, faster than any link: bytes that sat in a buffer and
//   came out at memory speed. That is what a process stopped as a whole (its ZeroMQ I/O thread
//   too) while a probe came in shows, once it goes on: the kernel hands over marker and payload
//   together while the loop looks on, and the queue seemed empty just before.
// - A payload that waited queued reads a longer time than the link took, so its reading is low;
//   it stands (long collective transfers raise it later).
// - A reading over a time too short to trust against the loop's wake-ups (min_seconds) stands,
//   and a larger probe is asked for likewise: at max_bytes the link is simply fast.
// - A request whose marker has not come after `patience` is asked again (up to max_lost times):
//   the request or its answer was lost.
// So a meeting (a member's unasked probe: its introduction) takes a few probes at most.
//
// What this cannot see: a process stopped while a probe came in, whose marker still looked on time
// (the loop was waiting when the kernel handed it over, the payload right behind it). The reading
// is then high but below max_mbit_per_s; a larger probe replaces it, except at max_bytes. The
// loop's own wake-ups shift either end by little beside min_seconds.
//
// Pure bookkeeping, on the communication thread: the gossip sends and records.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <random>
#include <utility>
#include <vector>

#include "starling/net/wire.h"

namespace starling::net {

class LinkProbe {
 public:
  using Clock = std::chrono::steady_clock;

  struct Options {
    uint64_t first_bytes = 256 * 1024;  // the introduction's probe (NodeOptions::probe_bytes)
    double min_seconds = 0.02;          // a shorter reading asks for a larger probe
    double max_doubt = 0.25;            // of the time read, for the marker's moment (above)
    uint64_t growth = 4;
    uint64_t max_bytes = 4ull << 20;
    int max_retries = 2;              // same-size probes asked for a meeting (above)
    double max_mbit_per_s = 100'000;  // beyond this a reading is a buffer's, not a link's
    Clock::duration patience = std::chrono::seconds(2);  // for a request's marker
    int max_lost = 2;                                    // requests asked again a meeting
  };
  explicit LinkProbe(Options options);

  // A probe's marker (chunk 0) came from `from`, after `not_before`, found at `arrived`.
  void marker(PeerId from, uint64_t id, Clock::time_point not_before, Clock::time_point arrived);

  struct Reading {
    std::optional<double> mbit_per_s;  // what to record for the link from -> this peer
    bool doubtful = false;             // no reading: the time read was in doubt (above)
    bool given_up = false;             // ... and this meeting asks for no more probes
  };
  // Its payload (chunk 1) of `bytes` was found at `arrived` (queued or not: see above). Queues
  // the next request where one is needed.
  Reading payload(PeerId from, uint64_t id, uint64_t bytes, Clock::time_point arrived);

  struct Request {
    PeerId peer = 0;
    uint64_t id = 0;     // the probe id the sender answers with (Header::op)
    uint64_t bytes = 0;  // the payload asked for
  };
  // The requests queued since the last call, and the ones whose marker has not come within
  // `patience` of `now` (one a peer at most), each with a fresh id.
  std::vector<Request> take_requests(Clock::time_point now, std::mt19937_64& random);
  // The peers whose last request went unanswered after it was asked again max_lost times, found
  // by take_requests since the last call: their meeting asks for nothing more.
  std::vector<PeerId> take_given_up();

 private:
  struct Mark {
    Clock::time_point not_before, arrived;
  };
  struct Waiting {
    Clock::time_point since;
    uint64_t bytes = 0, id = 0;
  };
  struct Link {
    // The ids of the probes this peer asked for (the latest few, over meetings: a late answer to
    // an earlier meeting's request is an answer, not an introduction).
    std::deque<uint64_t> asked;
    std::optional<uint64_t> ask_bytes;  // a request to send at the next take_requests
    std::optional<Waiting> waiting;     // the last request sent, while its marker has not come
    int retries = 0;                    // same-size probes asked for in this meeting
    int lost = 0;                       // requests asked again in this meeting
    bool asked_for(uint64_t id) const;
  };

  Options options_;
  std::map<std::pair<PeerId, uint64_t>, Mark> marks_;
  std::map<PeerId, Link> links_;
  std::vector<PeerId> given_up_;  // take_given_up
};

}  // namespace starling::net
