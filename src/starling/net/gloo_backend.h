// c10d's Gloo process group behind Starling's Collectives interface: the second collective
// backend, and the yardstick Starling's own ring collectives are measured against
// (bench/allreduce). Unlike net::Node it has a fixed membership: `world_size` ranks that all
// exist before the first collective, rendezvous through a c10d::TCPStore hosted by rank 0, and
// no tolerance of a peer that dies (every survivor's operation fails after `timeout`).
//
// Differences from net::Node a caller must know:
//   - elastic() is false: after a failed operation the group is unusable, and a strategy ends
//     the run rather than retrying (see SwarmStrategy).
//   - Peer ids are ranks: CollectiveResult::ring is {0, 1, ..., world_size-1}, position is this
//     rank, and CollectiveOptions::root of a broadcast is the root's rank.
//   - Gloo puts float32 on the wire and nothing else: a WirePrecision other than fp32 throws
//     NetError at the call (it cannot be emulated without changing what is measured).
//   - CollectiveOptions::order is ignored: Gloo's rings always follow rank order.
//   - ReduceOp::mean is a sum followed by a division by world_size on every rank (Gloo 1.13 has
//     no average); the same fp32 division everywhere, so results stay bit-identical.
//   - reduce_scatter: ProcessGroupGloo in libtorch 1.13 does not implement reduce_scatter, so it
//     runs a full all_reduce and keeps this rank's shard. It sends twice the bytes a real
//     reduce-scatter would ((n-1)/n of the buffer more), which matters when benchmarking it.
//     Outside the shard the buffer holds the full reduction (allowed: "unspecified").
//   - all_gather: Gloo's allgather needs equal-sized pieces; when shard_of() gives shards of
//     unequal size (count not a multiple of world_size) the pieces go through padded buffers,
//     costing one extra copy of the buffer.
//   - Every rank must launch the same collectives in the same order (Gloo matches operations by
//     a sequence number, not by agreement as Node does). Launching is thread-safe, but two
//     threads launching concurrently on one rank is only correct if every rank serialises them
//     the same way.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "starling/net/collective.h"
#include "starling/net/group_options.h"

namespace starling::net {

struct GlooOptions : GroupOptions {
  // The local address (IP or host name) Gloo binds its connections to, and which the other ranks
  // use to reach this one; on a multi-homed host it picks the network the collectives use.
  std::string interface = "127.0.0.1";
};

class GlooBackend : public Collectives {
 public:
  // Hosts (rank 0) or reaches the store, then connects to every other rank; blocks until all
  // world_size ranks have done the same. Throws ConfigError for bad options and NetError when
  // the store or a rank cannot be reached within the timeout.
  explicit GlooBackend(GlooOptions options);
  // Waits for launched collectives to finish, then closes the connections.
  ~GlooBackend() override;
  GlooBackend(const GlooBackend&) = delete;
  GlooBackend& operator=(const GlooBackend&) = delete;

  int rank() const;
  int world_size() const;

  std::string backend_name() const override { return "gloo"; }
  PeerId self() const override { return static_cast<PeerId>(rank()); }
  bool elastic() const override { return false; }
  uint64_t bytes_sent() const override;

  class Impl;

 protected:
  // The collectives throw NetError for a precision other than fp32 or a broadcast root that is
  // not a rank; failures during the operation (a rank died, timeout) are reported by
  // Work::wait().
  Work launch(CollectiveKind kind, std::span<float> data,
              const CollectiveOptions& options) override;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace starling::net
