// AdaTopK's choice of k (FusionLLM): compress only where a link bounds the pipeline, and only as
// much as it needs. A stage keeps the fraction of its outgoing entries that lets what it sends per
// micro-batch cross its slowest outgoing link within the pipeline's slowest stage's compute time
// per micro-batch. Then the link is no slower than the slowest stage, and a faster link keeps its
// tensors whole. Torch-free.
#pragma once

#include <string>

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

// What one stage of a pipeline sends in a step under AdaTopK.
// For planning a pipeline (sched/): the fraction of a cut's whole bytes that crosses a link per
// micro-batch in the heavier direction under a pipeline.compression setting: "none" 1; "int8"
// int8's (about 0.254); "int4" int4's (about 0.141); "topk" the larger of the activations' (int8's,
// 2 x topk_ratio with compress_activations = "topk", else 1) and the gradients' (2 x topk_ratio, at
// most 1); "adatopk" int4's with quantized activations (the most it compresses before it drops
// entries), else 1. std::invalid_argument on an unknown setting.
double planned_wire_fraction(const std::string& compression,
                             const std::string& compress_activations, double topk_ratio);

struct StageCompression {
  bool int8_activations = false;
  bool int8_gradients = false;
  // int4 (int4_codec.h) in place of int8 or whole tensors.
  bool int4_activations = false;
  bool int4_gradients = false;
  double keep_ratio = 1;  // of the activation gradients' entries (1 = all)
};

// The least compression that lets a stage's `activations` and `gradients` entries per
// micro-batch cross a link of `mbit_per_s` within `seconds`, in tiers, each tried only when the
// one before does not fit: whole tensors; int8 activations (when `quantize_activations`); int8
// gradients too; int4 gradients; int4 activations too (quantized tiers drop no entry: far less
// loss than top-k), also where they take up to `topk_beyond` times `seconds`; beyond that, the
// top entries of the whole gradients beside the activations, at least `floor` (int4 gradients
// instead when the floor keeps more bytes than they cost). Whole tensors
// when anything is unknown. int8 costs encoded_bytes(int8, n) for n entries (wire_codec.h), int4
// int4_encoded_bytes(n) (int4_codec.h).
StageCompression adaptive_compression(double seconds, double mbit_per_s, double activations,
                                      double gradients, bool quantize_activations, double floor,
                                      double topk_beyond = 1);

}  // namespace starling::compress
