// Keeps the heap's freed blocks for reuse by the process instead of handing them back to the OS.
//
// A peer streams chunks of hundreds of KiB through ZeroMQ (and through CURVE's encryption
// buffers): each is allocated, filled and freed within milliseconds. glibc's malloc serves
// blocks above its mmap threshold (128 KiB at first) with fresh mappings, and trims the heap's
// top once more than twice that is free, so such a stream faults every page of every chunk in
// anew; on loopback that was a seventh of a peer's CPU time. With the threshold at 32 MiB and
// trimming above 1 GiB, freed chunks are reused warm. The cost is that up to the in-flight
// working set of chunks stays mapped after a burst.
#pragma once

namespace starling::net {

// Sets glibc's M_MMAP_THRESHOLD and M_TRIM_THRESHOLD as above, once per process (later calls do
// nothing). Nodes call it when they start; a no-op off glibc.
void keep_freed_heap_for_reuse();

}  // namespace starling::net
