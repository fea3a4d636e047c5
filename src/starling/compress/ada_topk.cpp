#include "starling/compress/ada_topk.h"

#include <algorithm>
#include <stdexcept>

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
  const double sparse = std::min(1.0, 2 * topk_ratio);  // 8 bytes per kept entry against 4
  if (compression == "none") return 1;
  if (compression == "int8") return int8;
  if (compression == "topk") {
    const double activations = compress_activations == "int8"   ? int8
                               : compress_activations == "topk" ? sparse
                                                                : 1.0;
    return std::max(activations, sparse);
  }
  if (compression == "adatopk") return compress_activations == "int8" ? int8 : 1.0;
  throw std::invalid_argument("unknown pipeline.compression \"" + compression + "\"");
}

StageCompression adaptive_compression(double seconds, double mbit_per_s, double activations,
                                      double gradients, bool quantize_activations, double floor) {
  StageCompression c;
  if (!(seconds > 0) || !(mbit_per_s > 0)) return c;
  const double budget = seconds * mbit_per_s * 1e6 / 8;
  const auto int8 = [](double entries) {
    return static_cast<double>(
        encoded_bytes(WirePrecision::int8, static_cast<size_t>(std::max(entries, 0.0))));
  };
  if (4 * (activations + gradients) <= budget) return c;
  c.int8_activations = quantize_activations;
  const double activation_bytes = quantize_activations ? int8(activations) : 4 * activations;
  if (activation_bytes + 4 * gradients <= budget) return c;
  if (activation_bytes + int8(gradients) <= budget) {
    c.int8_gradients = true;
    return c;
  }
  c.keep_ratio = adaptive_keep_ratio({.seconds = seconds,
                                      .mbit_per_s = mbit_per_s,
                                      .elements = gradients,
                                      .fixed_bytes = activation_bytes},
                                     floor);
  // A high floor can keep more sparse bytes than int8 sends for every entry: then int8.
  if (8 * c.keep_ratio * gradients >= int8(gradients)) {
    c.keep_ratio = 1;
    c.int8_gradients = true;
  }
  return c;
}

}  // namespace starling::compress
