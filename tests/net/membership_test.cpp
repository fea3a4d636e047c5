// What a member record carries and how a peer's table and mailbox treat it: the role and the
// incarnation travel in gossip and are checked on arrival, a member once active stays active
// whatever older gossip says, and a restart drops what was under way with the old incarnation.
#include "starling/net/membership.h"

#include <gtest/gtest.h>

#include <memory>
#include <nlohmann/json.hpp>

#include "starling/common/error.h"
#include "starling/net/mailbox.h"

namespace net = starling::net;

namespace {

net::MemberInfo member(net::PeerId id, int64_t joined_at, bool active) {
  net::MemberInfo m;
  m.id = id;
  m.name = "p" + std::to_string(id);
  m.endpoint = "tcp://127.0.0.1:" + std::to_string(4000 + id);
  m.joined_at_ms = joined_at;
  m.active = active;
  m.incarnation = 1000 + static_cast<uint64_t>(id);
  return m;
}

}  // namespace

TEST(MembershipTest, RoleAndIncarnationRoundTripAndAreChecked) {
  net::MemberInfo m = member(7, 100, false);
  m.role = "pipeline stage 1/2 replica 0/1";
  const net::MemberInfo back = net::member_from_json(net::to_json(m));
  EXPECT_EQ(back.role, m.role);
  EXPECT_EQ(back.incarnation, m.incarnation);
  EXPECT_FALSE(back.active);
  // Records of peers that predate both fields still read.
  auto j = net::to_json(m);
  j.erase("role");
  j.erase("incarnation");
  EXPECT_EQ(net::member_from_json(j).role, "");
  auto bad_role = net::to_json(m);
  bad_role["role"] = 5;
  EXPECT_THROW(net::member_from_json(bad_role), starling::NetError);
  bad_role["role"] = std::string(200, 'x');
  EXPECT_THROW(net::member_from_json(bad_role), starling::NetError);
  auto bad_incarnation = net::to_json(m);
  bad_incarnation["incarnation"] = -3;
  EXPECT_THROW(net::member_from_json(bad_incarnation), starling::NetError);
}

TEST(MembershipTest, AMemberOnceActiveStaysActiveUntilItRestarts) {
  net::Membership table(member(1, 100, true));
  const auto now = net::Clock::now();
  EXPECT_TRUE(table.merge(member(2, 200, false), now));
  EXPECT_EQ(table.participants({1, 2}), (std::vector<net::PeerId>{1}));
  // Its readiness for a collective arrived: it takes part from now on.
  table.mark_active(2);
  EXPECT_EQ(table.participants({1, 2}), (std::vector<net::PeerId>{1, 2}));
  // Gossip from a peer that saw it before it became active changes nothing.
  EXPECT_FALSE(table.merge(member(2, 200, false), now));
  EXPECT_EQ(table.participants({1, 2}), (std::vector<net::PeerId>{1, 2}));
  // A new incarnation starts over, inactive until it says otherwise.
  net::MemberInfo again = member(2, 300, false);
  again.incarnation = 99;
  EXPECT_TRUE(table.merge(again, now));
  EXPECT_EQ(table.participants({1, 2}), (std::vector<net::PeerId>{1}));
}

// A departure heard through gossip is kept in the member's record, which this peer's own
// heartbeats pass on: a third peer that did not know the member must learn that it left, not
// take it for an alive one.
TEST(MembershipTest, ADepartureHeardSecondHandIsPassedOnAsADeparture) {
  net::Membership table(member(1, 100, true));
  const auto now = net::Clock::now();
  EXPECT_TRUE(table.merge(member(2, 200, true), now));
  net::MemberInfo gone = member(2, 200, true);
  gone.left = true;
  EXPECT_FALSE(table.merge(gone, now));
  const net::Member* m = table.find(2);
  ASSERT_NE(m, nullptr);
  EXPECT_EQ(m->state, net::MemberState::left);
  EXPECT_TRUE(m->info.left);
  net::Membership third(member(3, 300, true));
  EXPECT_FALSE(third.merge(m->info, now));
  EXPECT_EQ(third.find(2), nullptr);
}

TEST(MembershipTest, ARoleChangeSpreadsAndOlderGossipCannotUndoIt) {
  net::Membership table(member(1, 100, true));
  const auto now = net::Clock::now();
  net::MemberInfo planning = member(2, 200, false);
  planning.role = "pipeline auto";
  EXPECT_TRUE(table.merge(planning, now));
  // The peer took its place: a higher version carries the new role.
  net::MemberInfo placed = planning;
  placed.role = "pipeline stage 1/2 replica 0/1";
  placed.role_version = 1;
  const net::MemberInfo back = net::member_from_json(net::to_json(placed));
  EXPECT_EQ(back.role_version, 1u);
  EXPECT_FALSE(table.merge(back, now));
  EXPECT_EQ(table.find(2)->info.role, placed.role);
  // Gossip from a peer that has not heard of the change yet leaves it.
  EXPECT_FALSE(table.merge(planning, now));
  EXPECT_EQ(table.find(2)->info.role, placed.role);
  auto bad = net::to_json(placed);
  bad["role_version"] = "1";
  EXPECT_THROW(net::member_from_json(bad), starling::NetError);
}

TEST(MembershipTest, ProgressTravelsAsNumbersAndTheNewestWins) {
  net::Membership table(member(1, 100, true));
  const auto now = net::Clock::now();
  net::MemberInfo m = member(2, 200, true);
  EXPECT_TRUE(table.merge(m, now));
  m.progress = R"({"loss":2.5,"step":40})";
  m.progress_version = 3;
  const net::MemberInfo back = net::member_from_json(net::to_json(m));
  EXPECT_EQ(back.progress, m.progress);
  EXPECT_FALSE(table.merge(back, now));
  EXPECT_EQ(table.find(2)->info.progress, m.progress);
  net::MemberInfo older = m;
  older.progress = R"({"step":20})";
  older.progress_version = 2;
  table.merge(older, now);
  EXPECT_EQ(table.find(2)->info.progress, m.progress);
  // Anything but an object of numbers is refused.
  for (const char* bad : {R"("x")", R"({"step":"40"})", R"({"a":{"b":1}})"}) {
    auto j = net::to_json(m);
    j["progress"] = nlohmann::json::parse(bad);
    EXPECT_THROW(net::member_from_json(j), starling::NetError) << bad;
  }
}

TEST(MailboxTest, ARestartFailsWaitingReceivesAndDropsTheOldIncarnationsMessages) {
  net::Mailbox box;
  const net::PeerId peer = 5;
  box.deliver(peer, 1, {1, 2, 3});  // sent by the old incarnation, never claimed
  auto waiting = std::make_shared<net::Transfer::State>();
  box.expect(peer, 2, waiting);
  EXPECT_EQ(box.unclaimed(), 1u);
  box.restarted(peer, "peer 5 restarted");
  net::Transfer failed(waiting);
  ASSERT_TRUE(failed.test());
  try {
    failed.wait();
    ADD_FAILURE() << "a receive from the old incarnation went on waiting";
  } catch (const starling::NetError& e) {
    EXPECT_STREQ(e.what(), "peer 5 restarted");
  }
  EXPECT_EQ(box.unclaimed(), 0u);
  // The new incarnation's messages are received as usual; the old one's are gone.
  auto first = std::make_shared<net::Transfer::State>();
  box.expect(peer, 1, first);
  EXPECT_FALSE(net::Transfer(first).test());
  box.deliver(peer, 1, {9});
  EXPECT_EQ(net::Transfer(first).wait(), (std::vector<uint8_t>{9}));
}

// A tag whose messages each replace the last (a status: atom's progress announcements) keeps the
// latest of each sender while nobody receives it, and that one always has room; receives posted
// before their messages still take every one, in order.
TEST(MailboxTest, AKeepLatestTagKeepsEachSendersLatestUnclaimedMessage) {
  net::Mailbox box;
  constexpr uint64_t kStatus = 7, kOther = 8;
  box.keep_latest(kStatus);
  auto early = std::make_shared<net::Transfer::State>();
  box.expect(1, kStatus, early);
  for (uint8_t i = 1; i <= 3; ++i) box.deliver(1, kStatus, {i});
  for (uint8_t i = 10; i <= 11; ++i) box.deliver(2, kStatus, {i});
  box.deliver(1, kOther, {20});
  box.deliver(1, kOther, {21});
  EXPECT_EQ(net::Transfer(early).wait(), (std::vector<uint8_t>{1})) << "the posted receive's";
  EXPECT_EQ(box.unclaimed(), 4u) << "the latest of each sender on the status tag, every other";
  const auto receive = [&](net::PeerId peer, uint64_t tag) {
    auto r = std::make_shared<net::Transfer::State>();
    box.expect(peer, tag, r);
    return net::Transfer(r).wait();
  };
  EXPECT_EQ(receive(1, kStatus), (std::vector<uint8_t>{3}));
  EXPECT_EQ(receive(2, kStatus), (std::vector<uint8_t>{11}));
  EXPECT_EQ(receive(1, kOther), (std::vector<uint8_t>{20}));
  EXPECT_EQ(receive(1, kOther), (std::vector<uint8_t>{21}));
  EXPECT_EQ(box.unclaimed(), 0u);
}

// The bound on unclaimed messages drops arrivals nobody asked for, but not one a posted receive
// waits for, nor a status tag's latest (one a sender).
TEST(MailboxTest, TheBoundSparesAWaitingReceiveAndAStatusTagsLatest) {
  net::Mailbox box;
  constexpr uint64_t kStatus = 7, kFlood = 8, kAwaited = 9;
  box.keep_latest(kStatus);
  box.deliver(1, kStatus, {1});
  auto waiting = std::make_shared<net::Transfer::State>();
  box.expect(2, kAwaited, waiting);
  for (size_t i = 1; i < net::Mailbox::kMaxUnclaimed; ++i) {
    ASSERT_TRUE(box.has_room_for(3, kFlood));
    box.deliver(3, kFlood, {0});
  }
  EXPECT_EQ(box.unclaimed(), net::Mailbox::kMaxUnclaimed);
  EXPECT_FALSE(box.has_room_for(3, kFlood));
  EXPECT_TRUE(box.has_room_for(1, kStatus));
  EXPECT_TRUE(box.has_room_for(2, kStatus)) << "a status sender with nothing waiting adds one";
  EXPECT_TRUE(box.has_room_for(2, kAwaited));
  box.deliver(1, kStatus, {2});
  box.deliver(2, kStatus, {3});
  box.deliver(2, kAwaited, {5});
  EXPECT_EQ(net::Transfer(waiting).wait(), (std::vector<uint8_t>{5}));
  EXPECT_EQ(box.unclaimed(), net::Mailbox::kMaxUnclaimed + 1);
  for (net::PeerId sender : {1, 2}) {
    auto status = std::make_shared<net::Transfer::State>();
    box.expect(sender, kStatus, status);
    EXPECT_EQ(net::Transfer(status).wait(),
              (std::vector<uint8_t>{static_cast<uint8_t>(sender + 1)}));
  }
}

// A tag registered after its messages began to wait keeps the latest of those too.
TEST(MailboxTest, AKeepLatestTagCollapsesWhatAlreadyWaits) {
  net::Mailbox box;
  for (uint8_t i = 1; i <= 5; ++i) box.deliver(1, 7, {i});
  box.deliver(1, 8, {9});
  EXPECT_EQ(box.unclaimed(), 6u);
  box.keep_latest(7);
  EXPECT_EQ(box.unclaimed(), 2u);
  auto status = std::make_shared<net::Transfer::State>();
  box.expect(1, 7, status);
  EXPECT_EQ(net::Transfer(status).wait(), (std::vector<uint8_t>{5}));
}
