// CPU threading for libtorch and the BLAS under it (OpenBLAS's OpenMP build shares libtorch's
// OpenMP pool, so one setting governs both).
#pragma once

namespace starling {

// Physical cores this process may run on (affinity mask, hyperthread siblings counted once).
int physical_cores();

// Sets intra-op threads to `requested`, or to physical_cores() when it is 0; inter-op threads to
// 1 (one executor runs nodes in order). Returns the number set. Safe to call more than once.
int configure_threads(int requested);

}  // namespace starling
