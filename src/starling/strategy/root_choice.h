// Which participant sends the swarm's state when a round agreement finds peers apart, and which
// participants take it. Every participant adds a row about itself to an all-gather; each then
// decides from the same rows alone, so every participant decides alike (nothing from a local
// view, such as its own membership list, enters the choice). Torch-free.
//
// Integers travel through the float collectives exactly: a step, round or count as two 20-bit
// halves (exact below 2^44), a lineage as two 16-bit halves.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "starling/net/peer_id.h"

namespace starling::strategy {

void put_int(float* at, int64_t v);
int64_t get_int(const float* at);
void put_lineage(float* at, uint32_t v);
uint32_t get_lineage(const float* at);

// One participant's row in the root choice's all-gather.
struct RootRow {
  bool needs_state = false;  // it asked for the swarm's state (a joiner, a peer that missed some)
  int64_t round = 0;
  int64_t step = 0;
  int64_t work = 0;  // contributors summed over its rounds
  uint32_t lineage = 0;
  // The history it votes for: its lineage before a round that broke off part way marked it
  // (SwarmStrategy::broke_off_after); its lineage otherwise.
  uint32_t history = 0;
  bool holds_state = false;  // false: a fresh joiner, or a peer whose transfer broke off
  int64_t updates = 0;       // AdamW's count
  int64_t piece_numel = 1;   // the elements of its transfer pieces (strategy.transfer_piece)
  int64_t failed_sends = 0;  // its transfers that failed since its last whole one
  // When it joined the swarm, as its membership entry says (net::Collectives::joined_at_ms); 0
  // on a fixed group, where ranks stand for seniority.
  int64_t joined_at_ms = 0;
};

inline constexpr int64_t kRootRowFloats = 19;
void put_root_row(const RootRow& row, float* at);  // kRootRowFloats floats
RootRow get_root_row(const float* at);

struct RootChoice {
  net::PeerId root = 0;
  // The transfer's participants, sorted: the root and every participant whose state is not the
  // root's already. Every participant when keeping is not allowed.
  std::vector<net::PeerId> ring;
  // This peer holds the root's state (same history, round, step, work and AdamW count, and the
  // strategy keeps its own): it takes no part, and waits for the others in the next collective.
  bool keeps = false;
  int64_t piece_numel = 1;  // the elements of the root's pieces
};

// The choice from the gathered rows: rows[i] is ring[i]'s, the ring sorted by id, `self` in it.
//
// The history most participants hold wins: each participant that holds a state votes for its
// history. After a partition heals, the larger side's state wins however many rounds the smaller
// one counted alone, and a straggler back from a pause, or a peer restarted from an old
// checkpoint, is outvoted by the peers that went on. Among the holders of that history: the most
// work, then the highest round, then step (a peer whose round went through is sent rather than
// one whose round broke off part way); among equals one that does not need the state (a peer
// whose last exchange failed holds its round's state plus a local step taken without the
// average), then the lineage most participants hold exactly (peers whose rounds broke off at
// different places: the fewest take the state), then the one whose last transfers failed the
// fewest times (a sender that cannot reach a taker, or whose header a taker refuses, leaves the
// next try to another holder), then the one that joined first, then the smallest id. Equal
// votes (a 2 + 2 split) fall to the same order.
//
// `keep_allowed`: a participant whose state is the root's in every part the transfer carries
// stays out of it (the strategy keeps its own state, on an elastic group; a fixed group runs its
// whole group only).
RootChoice choose_root_from_rows(std::span<const RootRow> rows, std::span<const net::PeerId> ring,
                                 net::PeerId self, bool keep_allowed);

}  // namespace starling::strategy
