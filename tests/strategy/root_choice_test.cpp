#include "starling/strategy/root_choice.h"

#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

namespace starling::strategy {
namespace {

// A participant that holds the swarm's state at round 10, step 40.
RootRow holder(int64_t joined_at_ms = 1'700'000'000'000) {
  return {.needs_state = false,
          .round = 10,
          .step = 40,
          .work = 30,
          .lineage = 0xCAFE1234u,
          .history = 0xCAFE1234u,
          .holds_state = true,
          .updates = 40,
          .piece_numel = 1 << 20,
          .failed_sends = 0,
          .joined_at_ms = joined_at_ms};
}

RootRow joiner() {
  RootRow r;
  r.needs_state = true;
  r.joined_at_ms = 1'800'000'000'000;
  return r;
}

const std::vector<net::PeerId> kRing{11, 22, 33, 44};

// Every participant's choice (each with itself as `self`) names the same root and ring.
RootChoice choose_everywhere(const std::vector<RootRow>& rows, bool keep_allowed = true) {
  const std::vector<net::PeerId> ring(kRing.begin(), kRing.begin() + rows.size());
  const RootChoice first = choose_root_from_rows(rows, ring, ring.front(), keep_allowed);
  for (net::PeerId self : ring) {
    const RootChoice c = choose_root_from_rows(rows, ring, self, keep_allowed);
    EXPECT_EQ(c.root, first.root) << "self " << self;
    EXPECT_EQ(c.ring, first.ring) << "self " << self;
    EXPECT_EQ(c.piece_numel, first.piece_numel);
  }
  return first;
}

TEST(RootChoiceTest, ARowComesBackExactlyThroughFloats) {
  const RootRow sent{.needs_state = true,
                     .round = (int64_t{1} << 43) + 7,
                     .step = 123'456'789,
                     .work = (int64_t{1} << 40) - 1,
                     .lineage = 0xFFFFFFFFu,
                     .history = 0xFFFF0001u,
                     .holds_state = true,
                     .updates = 987'654'321,
                     .piece_numel = 16'777'216,
                     .failed_sends = 3,
                     .joined_at_ms = 1'764'900'000'123};  // a wall clock of 2025, to the ms
  std::vector<float> floats(kRootRowFloats, -1.f);
  put_root_row(sent, floats.data());
  const RootRow got = get_root_row(floats.data());
  EXPECT_EQ(got.needs_state, sent.needs_state);
  EXPECT_EQ(got.round, sent.round);
  EXPECT_EQ(got.step, sent.step);
  EXPECT_EQ(got.work, sent.work);
  EXPECT_EQ(got.lineage, sent.lineage);
  EXPECT_EQ(got.history, sent.history);
  EXPECT_EQ(got.holds_state, sent.holds_state);
  EXPECT_EQ(got.updates, sent.updates);
  EXPECT_EQ(got.piece_numel, sent.piece_numel);
  EXPECT_EQ(got.failed_sends, sent.failed_sends);
  EXPECT_EQ(got.joined_at_ms, sent.joined_at_ms);
  // A participant's slot that nothing was written to reads back as no state at all.
  std::vector<float> zeros(kRootRowFloats, 0.f);
  const RootRow none = get_root_row(zeros.data());
  EXPECT_FALSE(none.holds_state);
  EXPECT_EQ(none.joined_at_ms, 0);
}

TEST(RootChoiceTest, AmongEqualHoldersTheOneThatJoinedFirstSends) {
  // Peer 33 joined first; the smallest id (11) does not decide while the join times differ.
  const RootChoice c = choose_everywhere(
      {holder(1'700'000'000'500), holder(1'700'000'000'200), holder(1'700'000'000'100), joiner()});
  EXPECT_EQ(c.root, 33u);
  // The holders of the root's state keep it; the transfer runs between the root and the joiner.
  EXPECT_EQ(c.ring, (std::vector<net::PeerId>{33, 44}));
}

TEST(RootChoiceTest, EqualJoinTimesFallToTheSmallestId) {
  EXPECT_EQ(choose_everywhere({joiner(), holder(5), holder(5)}).root, 22u);
  // A fixed group's rows all say 0: the smallest rank sends, as its rank order stands for
  // seniority.
  EXPECT_EQ(choose_everywhere({holder(0), holder(0), joiner()}).root, 11u);
}

TEST(RootChoiceTest, TheHistoryMostParticipantsHoldWinsOverMoreWork) {
  RootRow apart = holder(1);  // the oldest, and far ahead, alone in its history
  apart.lineage = apart.history = 0x1111u;
  apart.work = 900;
  apart.round = 300;
  const RootChoice c = choose_everywhere({apart, holder(8), holder(9), joiner()});
  EXPECT_EQ(c.root, 22u);
  // The peer apart takes the state with the joiner.
  EXPECT_EQ(c.ring, (std::vector<net::PeerId>{11, 22, 44}));
}

TEST(RootChoiceTest, MoreWorkThenRoundThenStepWinsWithinAHistory) {
  RootRow more_work = holder(9), later_round = holder(9), later_step = holder(9);
  more_work.work = 31;
  later_round.round = 11;
  later_step.step = 41;
  EXPECT_EQ(choose_everywhere({later_step, later_round, more_work, holder(1)}).root, 33u);
  EXPECT_EQ(choose_everywhere({later_step, later_round, holder(1)}).root, 22u);
  EXPECT_EQ(choose_everywhere({holder(1), later_step}).root, 22u);
}

TEST(RootChoiceTest, AHolderThatNeedsTheStateSendsOnlyWhereNoOtherCan) {
  RootRow missed = holder(1);  // its last exchange failed: its state has a local step in it
  missed.needs_state = true;
  const RootChoice c = choose_everywhere({missed, holder(9), joiner()});
  EXPECT_EQ(c.root, 22u);
  EXPECT_EQ(c.ring, (std::vector<net::PeerId>{11, 22, 33}));
  EXPECT_EQ(choose_everywhere({missed, joiner()}).root, 11u);
}

TEST(RootChoiceTest, ASenderWhoseTransfersFailedLeavesTheNextTryToAnotherHolder) {
  RootRow failing = holder(1);
  failing.failed_sends = 1;
  RootRow failing_more = holder(2);
  failing_more.failed_sends = 2;
  const RootChoice c = choose_everywhere({failing, failing_more, holder(9), joiner()});
  EXPECT_EQ(c.root, 33u);
  // The old senders hold the new root's state: they stay out of the transfer.
  EXPECT_EQ(c.ring, (std::vector<net::PeerId>{33, 44}));
  // A holder that is the only one sends again however often it failed.
  EXPECT_EQ(choose_everywhere({failing_more, joiner()}).root, 11u);
}

TEST(RootChoiceTest, KeepersAreOnlyThoseWithTheRootsWholeState) {
  RootRow other_updates = holder(5);  // an fp16 overflow skipped one of its AdamW updates
  other_updates.updates = 39;
  const std::vector<RootRow> rows{holder(1), other_updates, holder(7), joiner()};
  const RootChoice c = choose_everywhere(rows);
  EXPECT_EQ(c.root, 11u);
  EXPECT_EQ(c.ring, (std::vector<net::PeerId>{11, 22, 44}));
  EXPECT_EQ(c.piece_numel, 1 << 20);
  EXPECT_TRUE(choose_root_from_rows(rows, kRing, 33, true).keeps);
  for (net::PeerId self : {11, 22, 44})
    EXPECT_FALSE(choose_root_from_rows(rows, kRing, self, true).keeps) << self;
  // Where the strategy cannot keep its own (or the group is fixed), everyone takes part.
  const RootChoice all = choose_everywhere(rows, false);
  EXPECT_EQ(all.ring, kRing);
  EXPECT_FALSE(choose_root_from_rows(rows, kRing, 33, false).keeps);
}

TEST(RootChoiceTest, AStartWithoutAnyStateStillNamesOneRoot) {
  // A swarm whose peers all start fresh: each one's state is its own seed's; one is sent.
  RootRow fresh = joiner();
  fresh.piece_numel = 0;  // a malformed row cannot make the pieces empty
  const RootChoice c = choose_everywhere({fresh, fresh, fresh});
  EXPECT_EQ(c.root, 11u);
  EXPECT_EQ(c.ring, (std::vector<net::PeerId>{11, 22, 33}));
  EXPECT_EQ(c.piece_numel, 1);
}

// A round that broke off part way marks the lineage of the peers it broke off on (by where it
// broke off), but not the history they vote for.
RootRow broke_off(uint32_t mark, int64_t joined_at_ms = 3) {
  RootRow r = holder(joined_at_ms);
  r.lineage = mark;
  return r;
}

TEST(RootChoiceTest, APeerWhoseRoundWentThroughIsSentOverPeersWhoseRoundBrokeOff) {
  RootRow through = holder(9);  // the youngest, alone in its exact lineage, one round further
  through.round = 11;
  const RootChoice c = choose_everywhere({broke_off(0x5EED), broke_off(0x5EED), through});
  EXPECT_EQ(c.root, 33u);
  EXPECT_EQ(c.ring, (std::vector<net::PeerId>{11, 22, 33}));
}

TEST(RootChoiceTest, PeersThatBrokeOffElsewhereTakeTheStateTheMostOfThemHold) {
  // One round for all, broken off at two places: the pair that broke off alike keeps its state,
  // whoever joined first.
  const RootChoice c =
      choose_everywhere({broke_off(0x0A, 1), broke_off(0x0B, 5), broke_off(0x0B, 6), joiner()});
  EXPECT_EQ(c.root, 22u);
  EXPECT_EQ(c.ring, (std::vector<net::PeerId>{11, 22, 44}));
  EXPECT_TRUE(choose_root_from_rows(std::vector<RootRow>{broke_off(0x0A, 1), broke_off(0x0B, 5),
                                                         broke_off(0x0B, 6), joiner()},
                                    kRing, 33, true)
                  .keeps);
  // A peer whose round did not break off holds the history's lineage itself.
  EXPECT_EQ(choose_everywhere({broke_off(0x0A, 1), holder(7), holder(8)}).root, 22u);
}

TEST(RootChoiceTest, RowsThatDoNotMatchTheRingAreRefused) {
  EXPECT_THROW(choose_root_from_rows({}, {}, 1, true), std::logic_error);
  const std::vector<RootRow> rows{holder(), holder()};
  EXPECT_THROW(choose_root_from_rows(rows, kRing, 11, true), std::logic_error);
}

}  // namespace
}  // namespace starling::strategy
