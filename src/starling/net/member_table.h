// The member table of a peer, shared between its communication thread (which changes it) and the
// threads that ask about it (callers, running collectives): the table, its lock, and a condition
// signalled whenever membership changes.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>
#include <string>

#include "starling/net/membership.h"

namespace starling::net {

struct MemberTable {
  explicit MemberTable(MemberInfo self) : members(std::move(self)) {}

  // "1a2b3c4d (name)": a member as logs and errors name it.
  std::string who(PeerId id) const {
    std::lock_guard lock(mutex);
    const Member* m = members.find(id);
    std::string s = short_peer_id(id);
    if (m && !m->info.name.empty()) s += " (" + m->info.name + ")";
    return s;
  }

  mutable std::mutex mutex;
  mutable std::condition_variable changed;
  Membership members;     // guarded by mutex
  bool welcomed = false;  // guarded by mutex: an entry point has let this peer in
  // Guarded by mutex: the entry point that let this peer in knew its id from an earlier start (a
  // process that died or left, and this one took its key).
  bool returning = false;
  // Guarded by mutex: entry points (their endpoints) that answered the join request in another
  // wire version, with that version.
  std::map<std::string, int> other_versions;
};

}  // namespace starling::net
