// The collective operations every backend offers (Starling's own ring over ZeroMQ, and c10d's
// Gloo and NCCL), with asynchronous handles so a training loop can overlap them with computation.
//
// Buffers are float32 spans owned by the caller, in the memory buffers() names; they must stay
// alive and untouched from launch until wait() returns. Results are bit-identical on every
// participant.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "starling/compress/wire_codec.h"
#include "starling/net/handle.h"
#include "starling/net/peer_id.h"

namespace starling::net {

using compress::WirePrecision;

enum class CollectiveKind : uint8_t { all_reduce, reduce_scatter, all_gather, broadcast };
enum class ReduceOp : uint8_t { sum, mean };
// How participants are arranged in the ring: by measured link bandwidth (the slowest link in the
// ring as fast as possible), or by peer id (stable, so shards stay with the same peer).
enum class RingOrder : uint8_t { measured, by_id };
// Where a backend's buffers live: host memory, or the memory of the compute device the backend
// was made for (NCCL: the span points into a CUDA tensor and the operation runs on the GPU).
enum class BufferPlace : uint8_t { host, device };

std::string to_string(CollectiveKind kind);

struct CollectiveOptions {
  WirePrecision precision = WirePrecision::fp32;  // on the wire; accumulation is always fp32
  ReduceOp op = ReduceOp::sum;                    // all_reduce and reduce_scatter
  PeerId root = 0;                                // broadcast: the peer whose data everyone gets
  RingOrder order = RingOrder::measured;
  // Who takes part: empty = the whole swarm (every active member); otherwise these peers, this
  // one among them (a pipeline stage's counterparts, say). On Starling's swarm the alive members
  // of the group take part; a c10d backend accepts only its whole group.
  std::vector<PeerId> group;
  // Operations on one tag run one after another, in launch order; operations on different tags
  // may be in flight at once (each participant launches an operation with the same tag). c10d
  // backends run everything in launch order, so there every rank must launch in the same order.
  uint64_t tag = 0;
  // all_reduce and reduce_scatter on Starling's swarm: every participant checks that its own
  // contribution and every partial sum it receives are finite, and the operation fails, naming
  // the peer, at the first that is not (a poisoned update is rejected instead of spreading). An
  // honest peer's left neighbour sent it a non-finite partial sum only if that neighbour added
  // one itself, or passed one on unchecked. c10d backends ignore it.
  bool reject_non_finite = false;
  // How long this peer waits for every participant to call the operation before it fails it;
  // zero: the node's collective timeout. Local to this peer: not sent, not compared. A peer that
  // knows the others are busy with a long piece of work first (a state transfer it takes no part
  // in) waits as long as that work may take. Starling's swarm only; c10d backends ignore it.
  std::chrono::milliseconds wait_limit{0};
  // Fault injection (STARLING_FAULT_ABORT_AGREEMENT, strategy/fault_injection.h): this peer fails
  // the operation as it starts (its first chunk may be on its way already), and every other
  // participant's copy fails with it (they are told it aborted), as when a participant dies in
  // the middle of a ring. Not on a ring of one, which may be through first. Local, like
  // wait_limit. Starling's swarm only; c10d backends ignore it.
  bool fail_at_start = false;
};

// The half-open element range [begin, end) that ring position `position` of `size` owns in a
// buffer of `count` elements (reduce_scatter output, all_gather input).
struct Shard {
  size_t begin = 0, end = 0;
};
Shard shard_of(size_t count, int size, int position);

struct CollectiveResult {
  std::vector<PeerId> ring;  // the participants, in ring order
  int position = 0;          // this peer's place in `ring`
  Shard shard;               // reduce_scatter / all_gather: the elements this peer owns
  uint64_t op_id = 0;
  double seconds = 0;  // from launch to completion
};

// A handle to a launched collective (handle.h): test(), wait() -> CollectiveResult, wait_for().
class Work : public Handle<CollectiveResult> {
 public:
  using Handle::Handle;
};

class Collectives {
 public:
  virtual ~Collectives() = default;

  // data = reduction of everyone's data.
  Work all_reduce(std::span<float> data, const CollectiveOptions& options) {
    return launch(CollectiveKind::all_reduce, data, options);
  }
  // This peer's shard of `data` (see CollectiveResult::shard) = reduction of everyone's shard;
  // the rest of `data` is left in an unspecified state.
  Work reduce_scatter(std::span<float> data, const CollectiveOptions& options) {
    return launch(CollectiveKind::reduce_scatter, data, options);
  }
  // Everyone contributes its shard of `data`; afterwards every peer holds all shards.
  Work all_gather(std::span<float> data, const CollectiveOptions& options) {
    return launch(CollectiveKind::all_gather, data, options);
  }
  // data = the root's data.
  Work broadcast(std::span<float> data, const CollectiveOptions& options) {
    return launch(CollectiveKind::broadcast, data, options);
  }

  virtual std::string backend_name() const = 0;

  // This participant's id, as CollectiveResult::ring names it (a peer id, or a rank).
  virtual PeerId self() const = 0;
  // A participant as logs name it: its short id, and its name where the backend knows one.
  virtual std::string describe(PeerId id) const { return short_peer_id(id); }
  // When this participant joined, in milliseconds of the wall clock as its membership entry
  // says (the others' lists hold the same value; earlier is more senior). 0 on a fixed group of
  // ranks, where the rank order stands for seniority.
  virtual int64_t joined_at_ms() const { return 0; }
  // Whether the participants may change: true when a failed operation can be retried among the
  // survivors and newcomers join later (Starling's swarm). False for a fixed group, where a
  // failed operation means a rank is gone and the run cannot go on (the torchrun model: the
  // launcher restarts the job from its checkpoint).
  virtual bool elastic() const = 0;
  // Where the spans handed to the operations must live.
  virtual BufferPlace buffers() const { return BufferPlace::host; }
  // Bytes this participant has put on the network so far. Backends that do not report their
  // traffic (c10d's) count what a ring algorithm sends for the operations launched.
  virtual uint64_t bytes_sent() const = 0;

 protected:
  // Each backend implements one entry point for all four operations.
  virtual Work launch(CollectiveKind kind, std::span<float> data,
                      const CollectiveOptions& options) = 0;
};

}  // namespace starling::net
