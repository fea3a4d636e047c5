#include "starling/net/link_probe.h"

#include <algorithm>
#include <utility>

namespace starling::net {

namespace {
// Markers whose payload never came (a sender that died between the two) are forgotten wholesale
// beyond this many.
constexpr size_t kMaxMarks = 256;
// The ids of a link's requests remembered (a meeting asks a few).
constexpr size_t kMaxAsked = 32;
}  // namespace

LinkProbe::LinkProbe(Options options) : options_(options) {
  options_.first_bytes = std::max<uint64_t>(options_.first_bytes, 1);
  options_.max_bytes = std::max(options_.max_bytes, options_.first_bytes);
  options_.growth = std::max<uint64_t>(options_.growth, 2);
}

void LinkProbe::marker(PeerId from, uint64_t id, Clock::time_point not_before,
                       Clock::time_point arrived) {
  if (marks_.size() >= kMaxMarks) marks_.clear();
  marks_[{from, id}] = {std::min(not_before, arrived), arrived};
  if (auto it = links_.find(from);
      it != links_.end() && it->second.waiting && it->second.waiting->id == id)
    it->second.waiting.reset();  // the answer is under way
}

bool LinkProbe::Link::asked_for(uint64_t id) const {
  return std::find(asked.begin(), asked.end(), id) != asked.end();
}

LinkProbe::Reading LinkProbe::payload(PeerId from, uint64_t id, uint64_t bytes,
                                      Clock::time_point arrived) {
  Reading r;
  const auto it = marks_.find({from, id});
  if (it == marks_.end() || bytes == 0) return r;
  const Mark mark = it->second;
  marks_.erase(it);
  Link& link = links_[from];
  // A probe this peer did not ask for is a member's introduction: a new meeting.
  if (!link.asked_for(id)) {
    auto asked = std::move(link.asked);
    link = Link{};
    link.asked = std::move(asked);
  }
  link.ask_bytes.reset();
  const bool larger = bytes < options_.max_bytes;
  const double secs = std::chrono::duration<double>(arrived - mark.not_before).count();
  const double doubt = std::chrono::duration<double>(mark.arrived - mark.not_before).count();
  if (!(secs > 0)) return r;
  const bool quick = secs < options_.min_seconds;
  const double rate = static_cast<double>(bytes) * 8 / secs / 1e6;
  r.doubtful = doubt > options_.max_doubt * secs || rate > options_.max_mbit_per_s;
  if (r.doubtful) {
    if (quick && larger) {
      link.ask_bytes = std::min(bytes * options_.growth, options_.max_bytes);
    } else if (link.retries < options_.max_retries) {
      ++link.retries;
      link.ask_bytes = bytes;
    } else {
      r.given_up = true;
    }
    return r;
  }
  r.mbit_per_s = rate;
  if (quick && larger) link.ask_bytes = std::min(bytes * options_.growth, options_.max_bytes);
  return r;
}

std::vector<LinkProbe::Request> LinkProbe::take_requests(Clock::time_point now,
                                                         std::mt19937_64& random) {
  std::vector<Request> out;
  for (auto& [peer, link] : links_) {
    if (!link.ask_bytes && link.waiting && now - link.waiting->since > options_.patience) {
      if (link.lost < options_.max_lost) {
        ++link.lost;
        link.ask_bytes = link.waiting->bytes;
      } else {
        given_up_.push_back(peer);
      }
      link.waiting.reset();
    }
    if (!link.ask_bytes) continue;
    Request q{peer, random(), *link.ask_bytes};
    link.asked.push_back(q.id);
    if (link.asked.size() > kMaxAsked) link.asked.pop_front();
    link.waiting = Waiting{now, q.bytes, q.id};
    link.ask_bytes.reset();
    out.push_back(q);
  }
  return out;
}

std::vector<PeerId> LinkProbe::take_given_up() { return std::exchange(given_up_, {}); }

}  // namespace starling::net
