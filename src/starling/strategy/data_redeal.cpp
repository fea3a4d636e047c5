#include "starling/strategy/data_redeal.h"

#include <cmath>

namespace starling::strategy {
namespace {

enum Note { kOne, kFollows, kWorld, kWorld2, kRank, kRank2, kHigh, kLow };
constexpr uint64_t kRadix = 4096;

}  // namespace

std::array<float, kRedealNotes> redeal_notes(const ShareNote& note) {
  std::array<float, kRedealNotes> n{};
  const auto world = static_cast<float>(note.world);
  const auto rank = static_cast<float>(note.rank);
  n[kOne] = 1.f;
  n[kFollows] = note.follows ? 1.f : 0.f;
  n[kWorld] = world;
  n[kWorld2] = world * world;
  n[kRank] = rank;
  n[kRank2] = rank * rank;
  if (note.follows) {
    n[kHigh] = static_cast<float>(note.position / kRadix);
    n[kLow] = static_cast<float>(note.position % kRadix);
  }
  return n;
}

std::optional<uint64_t> plan_redeal(const std::array<double, kRedealNotes>& sums) {
  const double n = sums[kOne];
  const double following = sums[kFollows];
  // Every world equals n exactly when sum(w) = n*n and sum(w^2) = n*n*n (their variance is 0);
  // ranks 0..n-1 once each give sum(r) = n(n-1)/2 and sum(r^2) = (n-1)n(2n-1)/6.
  const bool worlds = sums[kWorld] == n * n && sums[kWorld2] == n * n * n;
  const bool ranks =
      sums[kRank] == n * (n - 1) / 2 && sums[kRank2] == (n - 1) * n * (2 * n - 1) / 6;
  const bool together = following == 0 || following == n;
  if (n < 1 || (worlds && ranks && together)) return std::nullopt;
  if (following == 0) return 0;
  const double total = sums[kHigh] * static_cast<double>(kRadix) + sums[kLow];
  return static_cast<uint64_t>(std::floor(total / following));
}

}  // namespace starling::strategy
