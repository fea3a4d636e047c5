#include "starling/net/mailbox.h"

namespace starling::net {

void Mailbox::keep_latest(uint64_t tag) {
  keep_latest_.insert(tag);
  for (auto& [key, queue] : arrived_) {
    if (key.second != tag) continue;
    unclaimed_ -= queue.size() - 1;  // never empty: an emptied queue is erased
    queue.erase(queue.begin(), queue.end() - 1);
  }
}

bool Mailbox::has_room_for(PeerId sender, uint64_t tag) const {
  return unclaimed_ < kMaxUnclaimed || keep_latest_.contains(tag) ||
         waiting_.contains({sender, tag});
}

void Mailbox::deliver(PeerId sender, uint64_t tag, std::vector<uint8_t> bytes) {
  const Key key{sender, tag};
  if (auto it = waiting_.find(key); it != waiting_.end()) {
    auto receive = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) waiting_.erase(it);
    receive->finish(std::move(bytes), "");
    return;
  }
  std::deque<Arrived>& queue = arrived_[key];
  Arrived message{std::move(bytes), std::chrono::steady_clock::now()};
  if (keep_latest_.contains(tag) && !queue.empty()) {
    queue.back() = std::move(message);  // the one that waited: nothing asked for it
    return;
  }
  queue.push_back(std::move(message));
  ++unclaimed_;
}

void Mailbox::expect(PeerId sender, uint64_t tag, std::shared_ptr<Transfer::State> receive) {
  const Key key{sender, tag};
  if (auto it = arrived_.find(key); it != arrived_.end()) {
    Arrived message = std::move(it->second.front());
    it->second.pop_front();
    if (it->second.empty()) arrived_.erase(it);
    --unclaimed_;
    receive->finish(std::move(message.bytes), "", message.at);
    return;
  }
  if (auto it = gone_.find(sender); it != gone_.end()) {
    receive->finish({}, it->second);
    return;
  }
  waiting_[key].push_back(std::move(receive));
}

void Mailbox::fail_peer(PeerId peer, const std::string& why) {
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (it->first.first != peer) {
      ++it;
      continue;
    }
    for (auto& receive : it->second) receive->finish({}, why);
    it = waiting_.erase(it);
  }
  gone_[peer] = why;
}

void Mailbox::restarted(PeerId peer, const std::string& why) {
  fail_peer(peer, why);
  gone_.erase(peer);
  for (auto it = arrived_.begin(); it != arrived_.end();) {
    if (it->first.first != peer) {
      ++it;
      continue;
    }
    unclaimed_ -= it->second.size();
    it = arrived_.erase(it);
  }
}

void Mailbox::fail_all(const std::string& why) {
  for (auto& [key, receives] : waiting_)
    for (auto& receive : receives) receive->finish({}, why);
  waiting_.clear();
}

}  // namespace starling::net
