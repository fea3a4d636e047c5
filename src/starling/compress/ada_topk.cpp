#include "starling/compress/ada_topk.h"

#include <algorithm>
#include <stdexcept>

#include "starling/compress/int4_codec.h"
#include "starling/compress/wire_codec.h"

namespace starling::compress {

double adaptive_keep_ratio(const LinkBudget& b, double floor) {
  if (!(b.seconds > 0) || !(b.mbit_per_s > 0) || !(b.elements > 0) || !(b.dense_bytes > 0) ||
      !(b.sparse_bytes > 0))
    return 1.0;
  const double budget_bytes = b.seconds * b.mbit_per_s * 1e6 / 8 - std::max(b.fixed_bytes, 0.0);
  if (b.elements * b.dense_bytes <= budget_bytes) return 1.0;
  const double fit = std::max(budget_bytes, 0.0) / (b.elements * b.sparse_bytes);
  return std::clamp(std::max(fit, floor), 0.0, 1.0);
}

double planned_wire_fraction(const std::string& compression,
                             const std::string& compress_activations, double topk_ratio) {
  // Per 4-byte entry: int8 sends one byte and a 4-byte scale per group.
  const double int8 = static_cast<double>(encoded_bytes(WirePrecision::int8, kInt8Group)) /
                      (4.0 * static_cast<double>(kInt8Group));
  const double int4 =
      static_cast<double>(int4_encoded_bytes(kInt4Group)) / (4.0 * static_cast<double>(kInt4Group));
  const double sparse = std::min(1.0, 2 * topk_ratio);  // 8 bytes per kept entry against 4
  if (compression == "none") return 1;
  if (compression == "int8") return int8;
  if (compression == "int4") return int4;
  if (compression == "topk") {
    const double activations = compress_activations == "int8"   ? int8
                               : compress_activations == "topk" ? sparse
                                                                : 1.0;
    return std::max(activations, sparse);
  }
  if (compression == "adatopk") return compress_activations == "int8" ? int4 : 1.0;
  throw std::invalid_argument("unknown pipeline.compression \"" + compression + "\"");
}

StageCompression adaptive_compression(double seconds, double mbit_per_s, double activations,
                                      double gradients, bool quantize_activations, double floor,
                                      double topk_beyond) {
  StageCompression c;
  if (!(seconds > 0) || !(mbit_per_s > 0)) return c;
  const double budget = seconds * mbit_per_s * 1e6 / 8;
  const auto count = [](double entries) { return static_cast<size_t>(std::max(entries, 0.0)); };
  const auto int8 = [&](double entries) {
    return static_cast<double>(encoded_bytes(WirePrecision::int8, count(entries)));
  };
  const auto int4 = [&](double entries) {
    return static_cast<double>(int4_encoded_bytes(count(entries)));
  };
  if (4 * (activations + gradients) <= budget) return c;
  c.int8_activations = quantize_activations;
  double activation_bytes = quantize_activations ? int8(activations) : 4 * activations;
  if (activation_bytes + 4 * gradients <= budget) return c;
  // Quantized gradients drop nothing: int8, then int4, before activations go to int4.
  if (activation_bytes + int8(gradients) <= budget) {
    c.int8_gradients = true;
    return c;
  }
  if (activation_bytes + int4(gradients) <= budget) {
    c.int4_gradients = true;
    return c;
  }
  if (quantize_activations) {
    c.int8_activations = false;
    c.int4_activations = true;
    activation_bytes = int4(activations);
    if (activation_bytes + int4(gradients) <= budget) {
      c.int4_gradients = true;
      return c;
    }
  }
  // Top-k costs far more loss than a link a little slower than the slowest stage: only where
  // int4 would be more than `topk_beyond` times too slow.
  if (activation_bytes + int4(gradients) <= budget * std::max(topk_beyond, 1.0)) {
    c.int4_gradients = true;
    return c;
  }
  c.keep_ratio = adaptive_keep_ratio({.seconds = seconds,
                                      .mbit_per_s = mbit_per_s,
                                      .elements = gradients,
                                      .fixed_bytes = activation_bytes},
                                     floor);
  // A high floor can keep more sparse bytes than int4 sends for every entry: then int4.
  if (8 * c.keep_ratio * gradients >= int4(gradients)) {
    c.keep_ratio = 1;
    c.int4_gradients = true;
  }
  return c;
}

}  // namespace starling::compress
