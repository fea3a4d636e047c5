// AdaTopK's choice of k (FusionLLM): compress only where a link bounds the pipeline, and only as
// much as it needs. A stage keeps the fraction of its outgoing entries that lets what it sends per
// micro-batch cross its slowest outgoing link within the pipeline's slowest stage's compute time
// per micro-batch. Then the link is no slower than the slowest stage, and a faster link keeps its
// tensors whole. Torch-free.
#pragma once

namespace starling::compress {

struct LinkBudget {
  double seconds = 0;       // the slowest stage's forward and backward time per micro-batch
  double mbit_per_s = 0;    // the slowest of this stage's outgoing links, as measured
  double elements = 0;      // entries this stage sends per micro-batch, over every link
  double dense_bytes = 4;   // bytes per entry sent whole
  double sparse_bytes = 8;  // bytes per kept entry: its 32-bit index and its value
  double fixed_bytes = 0;   // what else crosses in the same time, whatever k is
};

// The fraction of entries to keep: 1 (send whole) when the whole tensors fit the budget, or when
// any input is unknown (not positive); otherwise the fraction whose kept entries fit beside
// fixed_bytes, but at least `floor`. A fraction below 1 always sends fewer bytes than the whole
// tensor would, since the whole tensor did not fit.
double adaptive_keep_ratio(const LinkBudget& b, double floor);

}  // namespace starling::compress
