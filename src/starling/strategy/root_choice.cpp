#include "starling/strategy/root_choice.h"

#include <algorithm>
#include <map>
#include <optional>
#include <stdexcept>
#include <tuple>

namespace starling::strategy {

void put_int(float* at, int64_t v) {
  at[0] = static_cast<float>(v >> 20);
  at[1] = static_cast<float>(v & ((1 << 20) - 1));
}
int64_t get_int(const float* at) {
  return (static_cast<int64_t>(at[0]) << 20) + static_cast<int64_t>(at[1]);
}
void put_lineage(float* at, uint32_t v) {
  at[0] = static_cast<float>(v >> 16);
  at[1] = static_cast<float>(v & 0xFFFFu);
}
uint32_t get_lineage(const float* at) {
  return (static_cast<uint32_t>(at[0]) << 16) | static_cast<uint32_t>(at[1]);
}

void put_root_row(const RootRow& row, float* at) {
  at[0] = row.needs_state ? 1.f : 0.f;
  put_int(at + 1, row.round);
  put_int(at + 3, row.step);
  put_int(at + 5, row.work);
  put_lineage(at + 7, row.lineage);
  at[9] = row.holds_state ? 1.f : 0.f;
  put_int(at + 10, row.updates);
  put_int(at + 12, row.piece_numel);
  at[14] = static_cast<float>(std::clamp<int64_t>(row.failed_sends, 0, 1 << 20));
  put_int(at + 15, std::max<int64_t>(0, row.joined_at_ms));
  put_lineage(at + 17, row.history);
}

RootRow get_root_row(const float* at) {
  return {.needs_state = at[0] != 0.f,
          .round = get_int(at + 1),
          .step = get_int(at + 3),
          .work = get_int(at + 5),
          .lineage = get_lineage(at + 7),
          .history = get_lineage(at + 17),
          .holds_state = at[9] != 0.f,
          .updates = get_int(at + 10),
          .piece_numel = get_int(at + 12),
          .failed_sends = static_cast<int64_t>(at[14]),
          .joined_at_ms = get_int(at + 15)};
}

RootChoice choose_root_from_rows(std::span<const RootRow> rows, std::span<const net::PeerId> ring,
                                 net::PeerId self, bool keep_allowed) {
  if (rows.empty() || rows.size() != ring.size())
    throw std::logic_error("choose_root_from_rows: one row per participant is needed");
  std::map<uint32_t, int64_t> votes, exact;
  for (const RootRow& row : rows)
    if (row.holds_state) {
      ++votes[row.history];
      ++exact[row.lineage];
    }
  // Greater is better; the last three fields are negated so that fewer, earlier and smaller win.
  using Key =
      std::tuple<int64_t, int64_t, int64_t, int64_t, int, int64_t, int64_t, int64_t, int64_t>;
  std::optional<Key> best;
  size_t root = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    const RootRow& row = rows[i];
    const auto held = votes.find(row.history);
    const auto same = exact.find(row.lineage);
    const Key key{row.holds_state && held != votes.end() ? held->second : 0,
                  row.work,
                  row.round,
                  row.step,
                  row.needs_state ? 0 : 1,
                  row.holds_state && same != exact.end() ? same->second : 0,
                  -row.failed_sends,
                  -row.joined_at_ms,
                  -static_cast<int64_t>(i)};  // the ring is sorted: the smallest id
    if (!best || key > *best) {
      best = key;
      root = i;
    }
  }
  RootChoice choice;
  choice.root = ring[root];
  const RootRow& at_root = rows[root];
  choice.piece_numel = std::max<int64_t>(1, at_root.piece_numel);
  for (size_t i = 0; i < rows.size(); ++i) {
    const RootRow& row = rows[i];
    // The header would change nothing either: same history, round, step, work and AdamW count.
    const bool same = !row.needs_state && row.holds_state && row.lineage == at_root.lineage &&
                      row.round == at_root.round && row.step == at_root.step &&
                      row.work == at_root.work && row.updates == at_root.updates;
    if (i == root || !same || !keep_allowed)
      choice.ring.push_back(ring[i]);
    else if (ring[i] == self)
      choice.keeps = true;
  }
  return choice;
}

}  // namespace starling::strategy
