#include "starling/strategy/data_redeal.h"

#include <gtest/gtest.h>

#include <vector>

namespace starling::strategy {
namespace {

// The sums an agreement among these participants gives.
std::array<double, kRedealNotes> sums(const std::vector<ShareNote>& peers) {
  std::array<double, kRedealNotes> s{};
  for (const ShareNote& p : peers) {
    const auto n = redeal_notes(p);
    for (int i = 0; i < kRedealNotes; ++i) s[i] += n[i];
  }
  return s;
}

std::vector<ShareNote> deal(int world, bool follows, uint64_t position) {
  std::vector<ShareNote> peers;
  for (int r = 0; r < world; ++r) peers.push_back({follows, r, world, position});
  return peers;
}

TEST(DataRedealTest, AWholeDealStands) {
  EXPECT_FALSE(plan_redeal(sums(deal(4, false, 0))));         // a swarm starting together
  EXPECT_FALSE(plan_redeal(sums(deal(4, true, 123456789))));  // a swarm going on
  EXPECT_FALSE(plan_redeal(sums(deal(1, true, 7))));
  EXPECT_FALSE(plan_redeal(sums({})));
}

TEST(DataRedealTest, APeerThatLeftIsCoveredFromTheSwarmsPosition) {
  std::vector<ShareNote> peers = deal(4, true, 5000);
  peers.erase(peers.begin() + 1);
  EXPECT_EQ(plan_redeal(sums(peers)), 5000u);
  // Positions beyond fp32's exact integers still come back exactly (12-bit halves).
  peers = deal(4, true, (uint64_t{1} << 33) + 12345);
  peers.pop_back();
  EXPECT_EQ(plan_redeal(sums(peers)), (uint64_t{1} << 33) + 12345);
}

TEST(DataRedealTest, AJoinerGetsAShareFromTheOthersPosition) {
  // The joiner was started as rank 3 of 4, like the peer it replaces, but it does not follow:
  // its position (0) does not count.
  std::vector<ShareNote> peers = deal(4, true, 999);
  peers[3] = {false, 3, 4, 0};
  EXPECT_EQ(plan_redeal(sums(peers)), 999u);
  // One more peer than the deal had.
  peers = deal(3, true, 4096);
  peers.push_back({false, 0, 1, 0});
  EXPECT_EQ(plan_redeal(sums(peers)), 4096u);
}

TEST(DataRedealTest, SharesOfDifferentDealsAreDealtAgain) {
  // Worlds 3 and 5 average to 4, and ranks collide: neither passes for a deal of four.
  std::vector<ShareNote> peers = {
      {true, 0, 3, 10}, {true, 1, 5, 10}, {true, 2, 4, 10}, {true, 3, 4, 10}};
  EXPECT_EQ(plan_redeal(sums(peers)), 10u);
  peers = deal(4, true, 10);
  peers[1].rank = 0;
  peers[2].rank = 3;  // ranks 0, 0, 3, 3: the same sum as 0..3 but not the same squares
  EXPECT_EQ(plan_redeal(sums(peers)), 10u);
  // A swarm that started apart (no one follows yet) starts its new deal at the beginning.
  peers = deal(2, false, 0);
  peers.push_back({false, 0, 1, 0});
  EXPECT_EQ(plan_redeal(sums(peers)), 0u);
}

TEST(DataRedealTest, FollowersOfSlightlyDifferentPositionsMeetAtTheirMean) {
  std::vector<ShareNote> peers = {{true, 0, 4, 100}, {true, 1, 4, 103}, {true, 2, 4, 101}};
  EXPECT_EQ(plan_redeal(sums(peers)), 101u);
}

}  // namespace
}  // namespace starling::strategy
