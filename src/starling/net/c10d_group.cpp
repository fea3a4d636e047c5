#include "starling/net/c10d_group.h"

#include <algorithm>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "starling/common/error.h"

namespace starling::net {

c10::intrusive_ptr<c10d::Store> connect_store(const GroupOptions& options,
                                              const std::string& backend) {
  if (options.world_size < 1 || options.rank < 0 || options.rank >= options.world_size)
    throw ConfigError(backend + ": rank " + std::to_string(options.rank) + " is not in 0.." +
                      std::to_string(options.world_size - 1));
  const auto colon = options.store.rfind(':');
  const std::string port_text = colon == std::string::npos ? "" : options.store.substr(colon + 1);
  if (colon == 0 || port_text.empty() || port_text.size() > 5 ||
      port_text.find_first_not_of("0123456789") != std::string::npos ||
      std::stoul(port_text) > 65535)
    throw ConfigError(backend + ": store address '" + options.store + "' is not HOST:PORT");
  const std::string host = options.store.substr(0, colon);
  const auto port = static_cast<uint16_t>(std::stoul(port_text));
  const bool host_it = options.rank == 0 && !options.store_hosted_elsewhere;
  if (!host_it && port == 0)
    throw ConfigError(backend + ": rank " + std::to_string(options.rank) +
                      " needs the store's real port, not 0");
  try {
    c10d::TCPStoreOptions store_options;
    store_options.port = port;
    store_options.isServer = host_it;
    store_options.numWorkers = static_cast<size_t>(options.world_size);
    // The process group's own rendezvous waits for every rank; waiting here too would block
    // rank 0 before it can report the port it picked.
    store_options.waitWorkers = false;
    store_options.timeout = options.timeout;
    auto store = c10::make_intrusive<c10d::TCPStore>(host, store_options);
    if (host_it && options.on_store_listening) options.on_store_listening(store->getPort());
    return store;
  } catch (const std::exception& e) {
    throw NetError(backend + ": rank " + std::to_string(options.rank) + " of " +
                   std::to_string(options.world_size) + " could not reach the store at " +
                   options.store + ": " + message_of(e));
  }
}

void check_launch(const std::string& what, CollectiveKind kind, const CollectiveOptions& options,
                  int world) {
  if (options.precision != WirePrecision::fp32)
    throw NetError(what + ": wire precision " +
                   std::string(compress::to_string(options.precision)) +
                   " is not available (c10d's backends send fp32 here; set strategy.precision = "
                   "\"fp32\")");
  if (kind == CollectiveKind::broadcast && options.root >= static_cast<PeerId>(world))
    throw NetError(what + ": root " + std::to_string(options.root) +
                   " is not a rank (the group has " + std::to_string(world) + ")");
  // A subset of the ranks would need a process group of its own, made by every rank alike.
  if (!options.group.empty()) {
    std::vector<PeerId> ranks = options.group;
    std::sort(ranks.begin(), ranks.end());
    ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
    bool whole = static_cast<int>(ranks.size()) == world;
    for (size_t i = 0; whole && i < ranks.size(); ++i) whole = ranks[i] == i;
    if (!whole)
      throw NetError(what +
                     ": a collective over a subset of the ranks needs the starling "
                     "backend (net.backend = \"starling\")");
  }
}

std::string message_of(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e))
    return c10_error->what_without_backtrace();
  return e.what();
}

uint64_t ring_bytes(CollectiveKind kind, size_t count, int world) {
  if (world <= 1) return 0;
  const uint64_t bytes = count * sizeof(float);
  const uint64_t share = bytes * static_cast<uint64_t>(world - 1) / static_cast<uint64_t>(world);
  switch (kind) {
    case CollectiveKind::all_reduce:
      return 2 * share;
    case CollectiveKind::reduce_scatter:
    case CollectiveKind::all_gather:
      return share;
    case CollectiveKind::broadcast:
      return bytes;  // a pipelined chain: every rank but the last forwards the whole buffer
  }
  return 0;
}

}  // namespace starling::net
