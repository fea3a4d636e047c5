// c10d's NCCL process group behind Starling's Collectives interface: the backend for peers inside
// one datacenter (GPUs joined by NVLink or InfiniBand, launched by torchrun or srun), where a fixed
// group and NVIDIA's collectives are worth more than a swarm's tolerance of failures.
//
// Buffers live in GPU memory (buffers() is BufferPlace::device): a strategy hands over the device
// vector it computes on, with no host staging. An operation is queued on NCCL's stream behind the
// work already queued on the caller's current stream, and never makes that stream wait: training
// kernels queued after the launch run alongside it. Work::test() and wait() report when the GPU
// has finished it; after wait() the buffer may be read on any stream.
//
// Like GlooBackend (same rendezvous, same rules): peer ids are ranks, the group is fixed
// (elastic() is false: a rank that fails makes the run stop, and the launcher restarts it from
// its checkpoint), every rank must launch the same operations in the same order, only fp32 goes on
// the wire, and CollectiveOptions::order is ignored. reduce_scatter and all_gather are NCCL's own
// (not an all-reduce); shards of unequal size (a count that is not a multiple of world_size) go
// through a padded buffer, costing one extra device copy of the buffer.
//
// Available when the libtorch Starling was built against has c10d's ProcessGroupNCCL (pip's CUDA
// torch, the CUDA libtorch archive); nccl_available() says so.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "starling/net/collective.h"
#include "starling/net/group_options.h"

namespace starling::net {

struct NcclOptions : GroupOptions {
  int device_index = 0;  // the CUDA device this rank's buffers live on
};

// Whether this build can make an NcclBackend.
bool nccl_available();

// Joins the group (blocking until every rank reached the store; NCCL's own connections open at
// the first operation). Throws ConfigError for bad options or a build without NCCL, NetError
// when the store cannot be reached within the timeout.
std::unique_ptr<Collectives> make_nccl_backend(NcclOptions options);

}  // namespace starling::net
