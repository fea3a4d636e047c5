// Shared by the c10d backends (gloo_backend.cpp, nccl_backend.cpp): the rendezvous store, error
// text without c10's backtraces, and the traffic count a ring algorithm implies. Includes c10d's
// headers: keep it out of anything but those backends.
#pragma once

#include <cstdint>
#include <exception>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "starling/net/collective.h"
#include "starling/net/group_options.h"

namespace starling::net {

// Checks rank, world size and the store address (ConfigError naming `backend` and the value),
// then hosts or reaches the store (NetError if it cannot within options.timeout).
c10::intrusive_ptr<c10d::Store> connect_store(const GroupOptions& options,
                                              const std::string& backend);

// What neither c10d backend can do, refused before anything reaches c10d (NetError naming
// `what`): a wire precision other than fp32, a broadcast root that is not a rank, a group that
// is not every rank.
void check_launch(const std::string& what, CollectiveKind kind, const CollectiveOptions& options,
                  int world);

// c10::Error's what() carries a C++ backtrace; users need the message.
std::string message_of(const std::exception& e);

// The bytes one participant sends for `kind` over `count` floats among `world` participants
// with the bandwidth-optimal ring (what c10d's backends use for large buffers).
uint64_t ring_bytes(CollectiveKind kind, size_t count, int world);

}  // namespace starling::net
