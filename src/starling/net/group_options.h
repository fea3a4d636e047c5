// What every fixed-membership backend (c10d's Gloo and NCCL process groups) needs to form its
// group: this process's rank, how many ranks there are, and the rendezvous store they meet at.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

namespace starling::net {

struct GroupOptions {
  int rank = 0;
  int world_size = 1;
  // "HOST:PORT" of the rendezvous store. Rank 0 hosts it on PORT (all interfaces; 0 picks a free
  // port, reported through on_store_listening) unless `store_hosted_elsewhere`; the other ranks
  // connect to HOST:PORT, retrying until `timeout`.
  std::string store = "127.0.0.1:0";
  // Set when a launcher already hosts the store at HOST:PORT (torchrun's agent does, and says so
  // with TORCHELASTIC_USE_AGENT_STORE=True): rank 0 then connects like every other rank.
  bool store_hosted_elsewhere = false;
  // Rendezvous, connection set-up and each collective must finish within this.
  std::chrono::milliseconds timeout{300000};
  // Rank 0 hosting the store only: called once it listens, with the port, before the constructor
  // waits for the other ranks (so a test can hand port 0's pick to them without racing).
  std::function<void(uint16_t port)> on_store_listening;
};

}  // namespace starling::net
