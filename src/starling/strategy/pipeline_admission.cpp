#include "starling/strategy/pipeline_admission.h"

#include <algorithm>
#include <iostream>
#include <map>
#include <thread>

#include "starling/common/error.h"

namespace starling::strategy {
namespace {

using std::chrono::milliseconds;
using std::chrono::steady_clock;

const net::MemberView* find(const std::vector<net::MemberView>& members, net::PeerId id) {
  const auto it = std::find_if(members.begin(), members.end(),
                               [&](const net::MemberView& m) { return m.info.id == id; });
  return it == members.end() ? nullptr : &*it;
}

}  // namespace

bool can_admit(const std::vector<net::MemberView>& members, const PipelineGrid& grid) {
  bool waiting = false;
  for (const auto& replica : grid) {
    int active = 0;
    for (const net::PeerId id : replica) {
      const net::MemberView* m = find(members, id);
      if (m == nullptr || m->state != net::MemberState::alive) return false;
      active += m->info.active ? 1 : 0;
    }
    if (active != 0 && active != static_cast<int>(replica.size())) return false;
    waiting = waiting || active == 0;
  }
  return waiting;
}

PipelineAdmission::PipelineAdmission(net::Node& node, PipelineGrid grid, int stage)
    : node_(node), grid_(std::move(grid)), stage_(stage) {}

bool PipelineAdmission::vote() const { return can_admit(node_.members(), grid_); }

int PipelineAdmission::admit() {
  const auto members = node_.members();
  int admitted = 0;
  for (size_t r = 0; r < grid_.size(); ++r) {
    const net::MemberView* m = find(members, grid_[r].at(static_cast<size_t>(stage_)));
    if (m == nullptr || m->state != net::MemberState::alive || m->info.active) continue;
    if (!node_.admit(m->info.id, m->info.incarnation)) continue;
    node_.send(m->info.id, kTag, {1});
    std::cerr << "pipeline stage " << stage_ << ": admitting peer "
              << net::short_peer_id(m->info.id)
              << (m->info.name.empty() ? std::string() : " (" + m->info.name + ")") << " as stage "
              << stage_ << " of replica " << r
              << "; it takes this stage's state at the next agreement\n";
    ++admitted;
  }
  return admitted;
}

void wait_for_admission(net::Node& node, const PipelineGrid& grid, const PipelinePlace& place,
                        milliseconds timeout) {
  const auto deadline = steady_clock::now() + timeout;
  // Any healthy counterpart may send it (each one that admits does): listen to all of them, and
  // listen again to one whose receive failed (not yet a member, or gone and back).
  std::map<net::PeerId, net::Transfer> listening;
  for (;;) {
    for (size_t r = 0; r < grid.size(); ++r) {
      const net::PeerId id = grid[r].at(static_cast<size_t>(place.stage));
      if (static_cast<int>(r) == place.replica || id == node.id()) continue;
      auto it = listening.find(id);
      if (it == listening.end()) {
        listening.emplace(id, node.recv(id, PipelineAdmission::kTag));
        continue;
      }
      if (!it->second.test()) continue;
      try {
        it->second.wait();
        return;
      } catch (const NetError&) {
        it->second = node.recv(id, PipelineAdmission::kTag);
      }
    }
    if (steady_clock::now() > deadline) {
      std::string why;
      const auto members = node.members();
      for (size_t r = 0; r < grid.size(); ++r)
        for (size_t s = 0; s < grid[r].size(); ++s) {
          const net::MemberView* m = find(members, grid[r][s]);
          if (m == nullptr || m->state != net::MemberState::alive)
            why += (why.empty() ? "" : ", ") + std::string("stage ") + std::to_string(s) +
                   " of replica " + std::to_string(r) + " has no live peer";
        }
      throw NetError("pipeline: no whole replica admitted stage " + std::to_string(place.stage) +
                     " of replica " + std::to_string(place.replica) + " within " +
                     std::to_string(timeout.count() / 1000) + " s" +
                     (why.empty() ? std::string(" (every place is held: is every other stage of "
                                                "this replica waiting too?)")
                                  : " (" + why + ")"));
    }
    std::this_thread::sleep_for(milliseconds(100));
  }
}

}  // namespace starling::strategy
