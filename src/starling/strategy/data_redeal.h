// Re-dealing the training data when a swarm's peers change: the numbers each participant adds to
// a round agreement, and the decision every participant takes alike from their sums. A peer that
// died leaves its share of the epoch unread unless the others take it over; a peer that joined
// reads windows others read already unless it gets a share of its own. So when the participants
// of a round differ from the peers the current shares were dealt among, the rest of the epoch is
// dealt again among the participants (data::TokenLoader::redeal), from how far the swarm has read.
//
// Each participant adds: 1, whether its reading position follows the swarm's (it holds the
// swarm's state: a fresh joiner's position means nothing), its share's world and world^2, its
// rank and rank^2, and, if it follows, its swarm position in two 12-bit-radix halves. The shares
// are kept when every participant holds a share of a deal among exactly this many peers with
// distinct ranks (as far as the sums of ranks and their squares tell) and either all or none of
// the participants follow; otherwise the new deal starts at the mean position of those that follow
// (0 when none does: a swarm that starts together), and each participant takes the rank of its
// place in the round's ring. Torch-free.
#pragma once

#include <array>
#include <cstdint>
#include <optional>

namespace starling::strategy {

inline constexpr int kRedealNotes = 8;

struct ShareNote {
  bool follows = false;  // the position is the swarm's (the peer holds the swarm's state)
  int rank = 0, world = 1;
  uint64_t position = 0;  // data::TokenLoader::swarm_position()
};

// This participant's numbers for the agreement; exact in the fp32 sums below 2^24 / peers for
// each half of the position (positions below 2^36 with 256 peers).
std::array<float, kRedealNotes> redeal_notes(const ShareNote& note);

// From the sums of every participant's redeal_notes(): nullopt when the shares stand, otherwise
// the swarm position the new deal starts at. Every participant computes the same answer.
std::optional<uint64_t> plan_redeal(const std::array<double, kRedealNotes>& sums);

}  // namespace starling::strategy
