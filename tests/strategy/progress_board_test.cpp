// atom's progress board between real swarm peers on loopback: announcements reach the other
// peers and count only for their round, a peer that has not announced in a round yet counts
// nothing, a started one is projected at its pace from when its announcement arrived, a ready peer
// is seen, one poll reads a whole backlog (longer than its posted receives too), and a malformed
// announcement is dropped and counted, never a crash.
#include "starling/strategy/progress_board.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <thread>

#include "../net/test_swarm.h"
#include "starling/train/metrics.h"

namespace starling::strategy {
namespace {

using namespace std::chrono_literals;

// Polls `board` until `done` holds for its view (announcements travel asynchronously).
template <typename Pred>
ProgressBoard::View wait_view(ProgressBoard& board, double horizon, Pred done) {
  ProgressBoard::View v;
  for (int i = 0; i < 300; ++i) {
    v = board.view(horizon);
    if (done(v)) break;
    std::this_thread::sleep_for(10ms);
  }
  return v;
}

// Waits until what nodes 1 and 2 sent node 0 so far has arrived there, unread by its board: each
// sender's messages arrive in order on its one connection, whatever their tags, so once a message
// each sends now is here, so is everything before it.
bool arrived_at_node_0(const std::vector<std::unique_ptr<net::Node>>& nodes) {
  constexpr uint64_t kAfter = 77;
  for (size_t sender : {1, 2}) {
    nodes[sender]->send(nodes[0]->id(), kAfter, {1});
    if (!nodes[0]->recv(nodes[sender]->id(), kAfter).wait_for(30s)) return false;
  }
  return true;
}

TEST(ProgressBoard, CountsTheOthersAnnouncementsOfTheRound) {
  net::testing::Swarm swarm(3);
  auto nodes = swarm.start(3);
  ProgressBoard a(*nodes[0]), b(*nodes[1]), c(*nodes[2]);
  for (ProgressBoard* board : {&a, &b, &c}) board->begin_round({5, 0});
  a.view(0);  // posts a's receives
  b.announce({5, 0}, 8, 0, false);
  c.announce({5, 0}, 4, 0, false);
  auto v = wait_view(a, 0, [](const auto& v) { return v.samples == 12; });
  EXPECT_EQ(v.samples, 12);
  EXPECT_EQ(v.ready, 0);
  EXPECT_DOUBLE_EQ(v.projected, 12);
  // A newer count replaces the older one. A sender's last announcement is its progress, even in
  // an earlier round (it adopted an older state): c no longer counts in round 5.
  b.announce({5, 0}, 16, 0, true);
  c.announce({4, 0}, 100, 0, false);
  v = wait_view(a, 0, [](const auto& v) { return v.ready == 1 && v.heard == 1; });
  EXPECT_EQ(v.ready, 1);
  EXPECT_EQ(v.samples, 16) << "c's last announcement is for round 4";
  EXPECT_EQ(a.rejected(), 0);
}

// A step whose exchange failed everywhere leaves the version as it was: the next step is the same
// version at the next step, and the failed attempt's announcements (b ready with 40) do not count
// in it; b's new start replaces them.
TEST(ProgressBoard, ARetriedStepDoesNotCountTheFailedAttempt) {
  net::testing::Swarm swarm(2);
  auto nodes = swarm.start(2);
  ProgressBoard a(*nodes[0]), b(*nodes[1]);
  a.begin_round({3, 7});
  a.view(0);
  b.announce({3, 7}, 40, 0, true);
  auto v = wait_view(a, 0, [](const auto& v) { return v.ready == 1; });
  EXPECT_EQ(v.samples, 40);
  a.begin_round({3, 8});
  v = a.view(0);
  EXPECT_EQ(v.heard, 0) << "the failed attempt's count is not the retry's";
  EXPECT_EQ(v.samples, 0);
  b.announce({3, 8}, 4, 0, false);
  v = wait_view(a, 0, [](const auto& v) { return v.heard == 1; });
  EXPECT_EQ(v.samples, 4);
  EXPECT_EQ(v.ready, 0);
}

// A peer a round behind at its step (it missed an average the others applied) hears nobody
// accumulating in its own round: it counts the peers at its step in a later round instead, never
// those in an earlier one, and (b and c hold another history than a's) only while nobody of its
// own round accumulates (a spectator, ready with no samples, does not count as such).
TEST(ProgressBoard, APeerARoundBehindCountsThePeersAhead) {
  net::testing::Swarm swarm(3);
  auto nodes = swarm.start(3);
  ProgressBoard a(*nodes[0]), b(*nodes[1]), c(*nodes[2]);
  // b at round 4 (a sees it while at that round)...
  a.begin_round({4, 9}, 1);
  a.view(0);
  b.announce({4, 9}, 100, 0, false);
  ASSERT_EQ(wait_view(a, 0, [](const auto& v) { return v.heard == 1; }).samples, 100);
  // ...counts nothing once a is at round 5, and c is a spectator there (ready, no samples).
  a.begin_round({5, 9}, 1);
  c.announce({5, 9}, 0, 0, true);
  auto v = wait_view(a, 0, [](const auto& v) { return v.ready == 1; });
  EXPECT_EQ(v.heard, 1);
  EXPECT_EQ(v.samples, 0) << "b, a round behind a, counts nothing";
  EXPECT_FALSE(v.apart);
  // b a round ahead at a's step: with nobody accumulating in its own round, a counts b's.
  b.announce({6, 9}, 8, 0, false);
  v = wait_view(a, 0, [](const auto& v) { return v.apart; });
  EXPECT_TRUE(v.apart);
  EXPECT_EQ(v.heard, 1);
  EXPECT_EQ(v.samples, 8);
  // Someone accumulating in a's own round: only its round counts.
  c.announce({5, 9}, 4, 1.0, false);
  v = wait_view(a, 0, [](const auto& v) { return !v.apart; });
  EXPECT_FALSE(v.apart);
  EXPECT_EQ(v.samples, 4);
  // The next step: b's round-6 announcement of step 9 is no longer at a's step.
  a.begin_round({5, 10}, 1);
  v = a.view(0);
  EXPECT_EQ(v.heard, 0);
  EXPECT_FALSE(v.apart);
}

// Two peers a round behind together (a and c missed an average that b applied) hear each other
// accumulate in their own round; a peer of their history a round ahead at their step still sets
// them apart (they will both take its state), one of another history does not while they are
// not alone in their round.
TEST(ProgressBoard, PeersARoundBehindTogetherCountThePeersAheadOfTheirHistory) {
  net::testing::Swarm swarm(3);
  auto nodes = swarm.start(3);
  ProgressBoard a(*nodes[0]), b(*nodes[1]), c(*nodes[2]);
  constexpr uint32_t kHistory = 0xC0FFEE, kOther = 0xBEEF;
  a.begin_round({5, 9}, kHistory);
  c.begin_round({5, 9}, kHistory);
  a.view(0);
  c.announce({5, 9}, 4, 1.0, false);
  auto v = wait_view(a, 0, [](const auto& v) { return v.heard == 1; });
  EXPECT_FALSE(v.apart);
  EXPECT_EQ(v.samples, 4);
  // b of another history ahead: a is not alone in its round, so its own round counts.
  b.begin_round({6, 9}, kOther);
  b.announce({6, 9}, 8, 1.0, false);
  std::this_thread::sleep_for(200ms);
  v = a.view(0);
  EXPECT_FALSE(v.apart) << "a peer ahead of another history set a and c apart";
  EXPECT_EQ(v.samples, 4);
  // b of a's history ahead: a is behind, c beside it or not.
  b.begin_round({6, 9}, kHistory);
  b.announce({6, 9}, 12, 1.0, false);
  v = wait_view(a, 0, [](const auto& v) { return v.apart; });
  EXPECT_TRUE(v.apart);
  EXPECT_EQ(v.heard, 1);
  EXPECT_EQ(v.samples, 12);
  // The same history at a's step in an earlier version: not ahead.
  a.begin_round({7, 9}, kHistory);
  c.announce({7, 9}, 2, 1.0, false);
  v = wait_view(a, 0, [](const auto& v) { return v.heard == 1 && !v.apart; });
  EXPECT_FALSE(v.apart);
  EXPECT_EQ(v.samples, 2);
}

TEST(ProgressBoard, ProjectsPeersAtTheirPace) {
  net::testing::Swarm swarm(2);
  auto nodes = swarm.start(2);
  ProgressBoard a(*nodes[0]), b(*nodes[1]);
  a.begin_round({1, 0});
  a.view(0);
  b.announce({1, 0}, 10, 100.0, false);  // 10 samples, 100 per second
  auto v = wait_view(a, 0, [](const auto& v) { return v.samples == 10; });
  ASSERT_EQ(v.samples, 10);
  // Half a second ahead, b will have about 50 more.
  v = a.view(0.5);
  EXPECT_NEAR(v.projected, 60, 5);
  EXPECT_DOUBLE_EQ(v.rate, 100);
  // A new round: until b says it has started (it may still be checkpointing), it counts nothing.
  a.begin_round({2, 0});
  v = a.view(1.0);
  EXPECT_EQ(v.samples, 0);
  EXPECT_DOUBLE_EQ(v.projected, 0);
  // Its start announcement: from then on it gains at its pace.
  b.announce({2, 0}, 0, 100.0, false);
  v = wait_view(a, 1.0, [](const auto& v) { return v.projected > 0; });
  EXPECT_NEAR(v.projected, 100, 5);
  // A ready peer gains nothing more.
  b.announce({2, 0}, 30, 100.0, true);
  v = wait_view(a, 10.0, [](const auto& v) { return v.ready == 1; });
  EXPECT_DOUBLE_EQ(v.projected, 30);
  EXPECT_DOUBLE_EQ(v.rate, 0);
}

// A peer reads announcements only between its micro-batches, but projects each from when it
// arrived: read half a second late, a peer gaining 100 samples a second is 50 further on. (Stamped
// at the read, equal peers saw each other a micro-batch behind and overshot most steps.)
TEST(ProgressBoard, ProjectsFromWhenAnAnnouncementArrivedNotWhenItWasRead) {
  net::testing::Swarm swarm(2);
  auto nodes = swarm.start(2);
  ProgressBoard a(*nodes[0]), b(*nodes[1]);
  a.begin_round({1, 0});
  a.view(0);  // posts a's receives
  const double sent = train::now_s();
  b.announce({1, 0}, 10, 100.0, false);
  std::this_thread::sleep_for(500ms);  // a computes; its node's thread takes the message in
  const auto v = a.view(0);
  const double read = train::now_s();
  ASSERT_EQ(v.samples, 10);
  // Stamped at the read it would be 10; at its arrival, at least a quarter second of gains
  // (loopback delivers in far less than the other quarter), and never more than since the send.
  EXPECT_GT(v.projected, 10 + 100 * 0.25) << "projected from when it was read, not when it arrived";
  EXPECT_LE(v.projected, 10 + 100 * (read - sent) + 1e-6);
}

// A peer that polls less often than another announces (a slower one: once per micro-batch of
// its own) reads everything that arrived in between at its next poll, not one announcement.
TEST(ProgressBoard, OnePollReadsEveryAnnouncementThatArrived) {
  net::testing::Swarm swarm(2);
  auto nodes = swarm.start(2);
  ProgressBoard a(*nodes[0]), b(*nodes[1]);
  a.begin_round({3, 0});
  a.view(0);
  for (int64_t samples = 1; samples <= 20; ++samples) b.announce({3, 0}, samples, 0, false);
  // Received while a computes (its node's thread takes them in); a looks once.
  std::this_thread::sleep_for(500ms);
  const auto v = a.view(0);
  EXPECT_EQ(v.samples, 20) << "one poll read only part of a backlog of 20 announcements";
}

// A backlog longer than the receives the board keeps posted (a joiner's: the others announce to
// it, one announcement a micro-batch each, while it builds and profiles its model) is read
// through at the next poll too: a board that took 64 a poll read stale rounds for as many
// micro-batches, in which the others seemed not to have started.
TEST(ProgressBoard, OnePollReadsABacklogLongerThanItsPostedReceives) {
  net::testing::Swarm swarm(3);
  auto nodes = swarm.start(3);
  ProgressBoard a(*nodes[0]), b(*nodes[1]), c(*nodes[2]);
  a.begin_round({9, 0});
  a.view(0);
  for (int64_t samples = 1; samples <= 1000; ++samples) b.announce({9, 0}, samples, 0, false);
  for (int64_t samples = 1; samples <= 300; ++samples) c.announce({9, 0}, samples, 0, false);
  ASSERT_TRUE(arrived_at_node_0(nodes));
  EXPECT_EQ(a.view(0).samples, 1300) << "one poll read only part of backlogs of 1000 and 300";
}

// A pause long enough for more announcements than the node keeps unclaimed (a long checkpoint or
// write-back beside fast peers): the node keeps each sender's latest beyond the posted receives,
// so the next look sees every sender as it is now. Dropped at the bound instead, the board kept
// the 4160th of 6096 announcements until the sender's next, and a peer waiting for the exchange
// sends none.
TEST(ProgressBoard, APauseLongerThanTheNodesBoundStillSeesTheLatest) {
  net::testing::Swarm swarm(3);
  auto nodes = swarm.start(3);
  ProgressBoard a(*nodes[0]), b(*nodes[1]), c(*nodes[2]);
  a.begin_round({9, 0});
  a.view(0);
  constexpr int64_t kAnnounced = static_cast<int64_t>(net::Mailbox::kMaxUnclaimed) + 2000;
  for (int64_t samples = 1; samples <= kAnnounced; ++samples) b.announce({9, 0}, samples, 0, false);
  c.announce({9, 0}, 1, 0, false);
  c.announce({9, 0}, 2, 0, true);
  ASSERT_TRUE(arrived_at_node_0(nodes));
  const auto v = a.view(0);
  EXPECT_EQ(v.samples, kAnnounced + 2) << "the latest of a backlog past the node's bound was lost";
  EXPECT_EQ(v.ready, 1);
}

// Who closes a round (atom.h): a peer sees how many peers heard in the round have a smaller id
// and still accumulate. Ready ones and those of another round do not count.
TEST(ProgressBoard, SeesWhichSmallerPeersStillAccumulate) {
  net::testing::Swarm swarm(3);
  auto nodes = swarm.start(3);
  std::vector<std::unique_ptr<ProgressBoard>> boards;
  for (auto& n : nodes) boards.push_back(std::make_unique<ProgressBoard>(*n));
  // Order the three by peer id: boards[low] has the smallest.
  std::vector<size_t> order = {0, 1, 2};
  std::sort(order.begin(), order.end(),
            [&](size_t x, size_t y) { return nodes[x]->id() < nodes[y]->id(); });
  ProgressBoard &low = *boards[order[0]], &mid = *boards[order[1]], &high = *boards[order[2]];
  for (auto& b : boards) b->begin_round({7, 0});
  for (auto& b : boards) b->view(0);
  low.announce({7, 0}, 4, 10.0, false);
  mid.announce({7, 0}, 4, 10.0, false);
  auto v = wait_view(high, 0, [](const auto& v) { return v.heard == 2; });
  EXPECT_EQ(v.heard, 2);
  EXPECT_EQ(v.smaller_accumulating, 2);
  v = wait_view(low, 0, [](const auto& v) { return v.heard == 1; });
  EXPECT_EQ(v.smaller_accumulating, 0) << "nobody's id is smaller than the smallest";
  EXPECT_EQ(wait_view(mid, 0, [](const auto& v) { return v.heard == 1; }).smaller_accumulating, 1);
  // The smallest stops: the middle one now has none below it still accumulating.
  low.announce({7, 0}, 8, 10.0, true);
  v = wait_view(mid, 0, [](const auto& v) { return v.ready == 1; });
  EXPECT_EQ(v.smaller_accumulating, 0);
  v = wait_view(high, 0, [](const auto& v) { return v.ready == 1; });
  EXPECT_EQ(v.smaller_accumulating, 1);
  EXPECT_EQ(v.heard, 2);
  // A peer of an older round is not heard in this one.
  high.begin_round({8, 0});
  mid.announce({8, 0}, 0, 10.0, false);
  v = wait_view(high, 0, [](const auto& v) { return v.heard == 1; });
  EXPECT_EQ(v.heard, 1);
  EXPECT_EQ(v.smaller_accumulating, 1);
}

TEST(ProgressBoard, MalformedAnnouncementsAreDropped) {
  net::testing::Swarm swarm(2);
  auto nodes = swarm.start(2);
  ProgressBoard a(*nodes[0]);
  a.begin_round({0, 0});
  a.view(0);
  // Too short, then a negative count: both dropped; a good one after them still counts.
  nodes[1]->send(nodes[0]->id(), ProgressBoard::kTag, {1, 2, 3});
  std::vector<uint8_t> bad(48, 0);
  const int64_t negative = -5;
  std::memcpy(bad.data() + 16, &negative, sizeof negative);
  nodes[1]->send(nodes[0]->id(), ProgressBoard::kTag, bad);
  ProgressBoard b(*nodes[1]);
  b.announce({0, 0}, 4, 0, false);
  const auto v = wait_view(a, 0, [](const auto& v) { return v.samples == 4; });
  EXPECT_EQ(v.samples, 4);
  EXPECT_EQ(a.rejected(), 2);
  // A peer of another build announces after every micro-batch in another size: its drops are
  // counted, and logged at the 1st, 2nd, 4th, 8th, ... only.
  testing::internal::CaptureStderr();
  for (int i = 0; i < 8; ++i)
    nodes[1]->send(nodes[0]->id(), ProgressBoard::kTag, std::vector<uint8_t>(40, 0));
  b.announce({0, 0}, 8, 0, false);
  wait_view(a, 0, [](const auto& v) { return v.samples == 8; });
  const std::string log = testing::internal::GetCapturedStderr();
  EXPECT_EQ(a.rejected(), 10);
  size_t lines = 0;
  for (size_t at = log.find("dropped a malformed"); at != std::string::npos;
       at = log.find("dropped a malformed", at + 1))
    ++lines;
  EXPECT_EQ(lines, 2u) << log;  // the 4th and 8th: the 1st and 2nd were before the capture
  EXPECT_NE(log.find("(40 bytes, 48 expected)"), std::string::npos) << log;
  EXPECT_NE(log.find("(8 dropped so far)"), std::string::npos) << log;
}

}  // namespace
}  // namespace starling::strategy
