// Collectives over a group of peers (a subset of the swarm) and several collectives in flight at
// once on different tags: what pipelines need from the swarm's network.
#include <gtest/gtest.h>

#include <thread>

#include "starling/common/error.h"
#include "starling/net/node.h"
#include "test_swarm.h"

namespace net = starling::net;
using namespace std::chrono_literals;
using starling::net::testing::Swarm;

namespace {

net::CollectiveOptions on(std::vector<net::PeerId> group, uint64_t tag = 0) {
  net::CollectiveOptions o;
  o.group = std::move(group);
  o.tag = tag;
  o.order = net::RingOrder::by_id;
  return o;
}

}  // namespace

TEST(NodeGroupTest, CollectivesOverTwoPairsInsideAFourPeerSwarm) {
  Swarm swarm(4);
  auto nodes = swarm.start(4);
  const std::vector<net::PeerId> first = {nodes[0]->id(), nodes[1]->id()};
  const std::vector<net::PeerId> second = {nodes[3]->id(), nodes[2]->id()};  // any order
  std::vector<std::vector<float>> data;
  for (int i = 0; i < 4; ++i) data.push_back(std::vector<float>(30011, 1.0f + i));
  std::vector<net::Work> works;
  for (int i = 0; i < 4; ++i)
    works.push_back(nodes[i]->all_reduce(data[i], on(i < 2 ? first : second)));
  for (auto& w : works) EXPECT_EQ(w.wait().ring.size(), 2u);
  EXPECT_EQ(data[0], std::vector<float>(30011, 1.0f + 2.0f));
  EXPECT_EQ(data[1], data[0]);
  EXPECT_EQ(data[2], std::vector<float>(30011, 3.0f + 4.0f));
  EXPECT_EQ(data[3], data[2]);

  // A broadcast inside one pair, while the other pair reduce-scatters.
  std::vector<float> root(1000, 7.0f), copy(1000, 0.0f), c(1000, 1.0f), d(1000, 2.0f);
  auto bcast = on(first);
  bcast.root = nodes[1]->id();
  auto w0 = nodes[0]->broadcast(copy, bcast);
  auto w1 = nodes[1]->broadcast(root, bcast);
  auto w2 = nodes[2]->reduce_scatter(c, on(second));
  auto w3 = nodes[3]->reduce_scatter(d, on(second));
  w0.wait();
  w1.wait();
  const auto r2 = w2.wait();
  w3.wait();
  EXPECT_EQ(copy, root);
  for (size_t k = r2.shard.begin; k < r2.shard.end; ++k) ASSERT_EQ(c[k], 3.0f);
}

TEST(NodeGroupTest, PeerOutsideTheGroupIsRefused) {
  Swarm swarm(3);
  auto nodes = swarm.start(3);
  std::vector<float> data(10, 1.0f);
  try {
    nodes[2]->all_reduce(data, on({nodes[0]->id(), nodes[1]->id()})).wait();
    ADD_FAILURE() << "a peer ran a collective over a group it is not in";
  } catch (const starling::NetError& e) {
    EXPECT_NE(std::string(e.what()).find("not in the group"), std::string::npos) << e.what();
  }
}

TEST(NodeGroupTest, GroupGoesOnWithoutAMemberThatLeft) {
  Swarm swarm(4);
  auto nodes = swarm.start(4);
  const std::vector<net::PeerId> group = {nodes[1]->id(), nodes[2]->id(), nodes[3]->id()};
  nodes[3]->leave();
  std::this_thread::sleep_for(200ms);
  std::vector<float> a(500, 1.0f), b(500, 2.0f);
  auto wa = nodes[1]->all_reduce(a, on(group));
  auto wb = nodes[2]->all_reduce(b, on(group));
  EXPECT_EQ(wa.wait().ring.size(), 2u);
  wb.wait();
  EXPECT_EQ(a, std::vector<float>(500, 3.0f));
}

// A member that joined inactive (a pipeline stage waiting for a replacement) is in the group but
// holds no one up, and everyone learns its role from gossip alone; once it calls a collective of
// the group it takes part.
TEST(NodeGroupTest, AnInactiveMemberHoldsNoCollectiveUpUntilItCallsOne) {
  Swarm swarm(3);
  auto nodes = swarm.start(2);
  net::NodeOptions o = swarm.options(2, nodes[0]->endpoint());
  o.active = false;
  o.role = "waiting";
  nodes.push_back(std::make_unique<net::Node>(o));
  ASSERT_TRUE(nodes[0]->wait_for_members(3, 10s));
  for (int tries = 0; tries < 100; ++tries) {
    bool seen = false;
    for (const auto& m : nodes[1]->members()) seen |= m.info.role == "waiting" && !m.info.active;
    if (seen) break;
    std::this_thread::sleep_for(50ms);
  }
  const std::vector<net::PeerId> group = {nodes[0]->id(), nodes[1]->id(), nodes[2]->id()};
  std::vector<float> a(100, 1.0f), b(100, 2.0f), c(100, 4.0f);
  auto wa = nodes[0]->all_reduce(a, on(group));
  auto wb = nodes[1]->all_reduce(b, on(group));
  ASSERT_TRUE(wa.wait_for(10s)) << "the group waited for a member that is not active";
  EXPECT_EQ(wa.wait().ring.size(), 2u);
  wb.wait();
  EXPECT_EQ(a, std::vector<float>(100, 3.0f));
  bool role_known = false;
  for (const auto& m : nodes[1]->members())
    role_known |= m.info.id == nodes[2]->id() && m.info.role == "waiting";
  EXPECT_TRUE(role_known);

  // Its first call makes it active: the next round of the group waits for it and counts it.
  a.assign(100, 1.0f);
  b.assign(100, 2.0f);
  auto wc = nodes[2]->all_reduce(c, on(group));
  std::this_thread::sleep_for(1500ms);  // its active flag reaches the others by gossip
  wa = nodes[0]->all_reduce(a, on(group));
  wb = nodes[1]->all_reduce(b, on(group));
  EXPECT_EQ(wa.wait().ring.size(), 3u);
  wb.wait();
  wc.wait();
  EXPECT_EQ(a, std::vector<float>(100, 7.0f));
  EXPECT_EQ(c, a);
}

// Admitting an inactive member counts it at once in the collectives the admitting peer
// coordinates; a peer that comes back under a key the swarm knew is told so when it joins.
TEST(NodeGroupTest, AnAdmittedMemberIsWaitedForAtOnceAndAReturningOneKnowsIt) {
  Swarm swarm(3);
  auto nodes = swarm.start(2);
  net::NodeOptions o = swarm.options(2, nodes[0]->endpoint());
  o.active = false;
  nodes.push_back(std::make_unique<net::Node>(o));
  ASSERT_TRUE(nodes[0]->wait_for_members(3, 10s));
  EXPECT_FALSE(nodes[2]->returning());
  uint64_t incarnation = 0;
  for (const auto& m : nodes[0]->members())
    if (m.info.id == nodes[2]->id()) incarnation = m.info.incarnation;
  EXPECT_FALSE(nodes[0]->admit(nodes[2]->id(), incarnation + 1));  // not the one it sees
  ASSERT_TRUE(nodes[0]->admit(nodes[2]->id(), incarnation));

  // Node 0, the oldest, coordinates: the group's collective waits for the admitted member.
  const std::vector<net::PeerId> group = {nodes[0]->id(), nodes[1]->id(), nodes[2]->id()};
  std::vector<float> a(100, 1.0f), b(100, 2.0f), c(100, 4.0f);
  auto wa = nodes[0]->all_reduce(a, on(group));
  auto wb = nodes[1]->all_reduce(b, on(group));
  EXPECT_FALSE(wa.wait_for(1500ms)) << "the collective ran without the admitted member";
  auto wc = nodes[2]->all_reduce(c, on(group));
  EXPECT_EQ(wa.wait().ring.size(), 3u);
  wb.wait();
  wc.wait();
  EXPECT_EQ(a, std::vector<float>(100, 7.0f));

  // The same key in a new process.
  nodes[2]->leave();
  nodes[2].reset();
  nodes[2] = std::make_unique<net::Node>(swarm.options(2, nodes[0]->endpoint()));
  ASSERT_TRUE(nodes[2]->wait_for_members(3, 10s));
  EXPECT_TRUE(nodes[2]->returning());
}

TEST(NodeGroupTest, TwoCollectivesInFlightOnDifferentTags) {
  Swarm swarm(3);
  auto nodes = swarm.start(3);
  // Peer 0 launches tag 1 before tag 2; the others launch them the other way round. On one
  // queue this would deadlock; on two tags both run.
  std::vector<std::vector<float>> one, two;
  for (int i = 0; i < 3; ++i) {
    one.push_back(std::vector<float>(20000, 1.0f + i));
    two.push_back(std::vector<float>(20000, 10.0f * (i + 1)));
  }
  std::vector<net::Work> works;
  works.push_back(nodes[0]->all_reduce(one[0], on({}, 1)));
  works.push_back(nodes[0]->all_reduce(two[0], on({}, 2)));
  for (int i = 1; i < 3; ++i) {
    works.push_back(nodes[i]->all_reduce(two[i], on({}, 2)));
    works.push_back(nodes[i]->all_reduce(one[i], on({}, 1)));
  }
  for (auto& w : works) ASSERT_TRUE(w.wait_for(10s)) << "collectives on two tags blocked";
  for (auto& w : works) w.wait();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(one[i], std::vector<float>(20000, 6.0f));
    EXPECT_EQ(two[i], std::vector<float>(20000, 60.0f));
  }
}

TEST(NodeGroupTest, OneTagRunsItsOperationsInLaunchOrder) {
  Swarm swarm(2);
  auto nodes = swarm.start(2);
  // Three operations on one tag, launched back to back: each sees the previous one's result.
  std::vector<float> a(1000, 1.0f), b(1000, 1.0f);
  std::vector<net::Work> works;
  for (int k = 0; k < 3; ++k) {
    works.push_back(nodes[0]->all_reduce(a, on({}, 5)));
    works.push_back(nodes[1]->all_reduce(b, on({}, 5)));
  }
  // The same buffer is reduced three times in a row: 1 -> 2 -> 4 -> 8.
  for (auto& w : works) w.wait();
  EXPECT_EQ(a, std::vector<float>(1000, 8.0f));
  EXPECT_EQ(b, a);
}

// A round's exchange runs over the round's participants (strategy/swarm_strategy.h): a peer that
// joins between the round's agreement and its exchange calls its opening agreement (over the
// whole swarm, on the same tag) meanwhile. The exchange does not wait for it nor fail, and its
// agreement runs with the others' next one.
TEST(NodeGroupTest, ANewcomerWaitsWhileARoundsGroupRunsOnItsTag) {
  Swarm swarm(3);
  auto nodes = swarm.start(2);
  std::vector<float> a(100, 1.0f), b(100, 2.0f);
  {
    auto wa = nodes[0]->all_reduce(a, on({}));
    auto wb = nodes[1]->all_reduce(b, on({}));
    wa.wait();
    wb.wait();
  }
  const std::vector<net::PeerId> round = {nodes[0]->id(), nodes[1]->id()};
  nodes.push_back(std::make_unique<net::Node>(swarm.options(2, nodes[0]->endpoint())));
  ASSERT_TRUE(nodes[0]->wait_for_members(3, 10s));
  std::vector<float> joiner(7, 4.0f), x(7, 1.0f), y(7, 2.0f);
  auto wj = nodes[2]->all_reduce(joiner, on({}));  // its opening agreement
  std::this_thread::sleep_for(500ms);              // its readiness reaches the coordinator
  std::vector<float> ga(30011, 1.0f), gb(30011, 2.0f);
  auto wa = nodes[0]->all_reduce(ga, on(round));
  auto wb = nodes[1]->all_reduce(gb, on(round));
  ASSERT_TRUE(wa.wait_for(5s)) << "the round's exchange waited for the newcomer";
  EXPECT_EQ(wa.wait().ring.size(), 2u);
  wb.wait();
  EXPECT_EQ(ga, std::vector<float>(30011, 3.0f));
  EXPECT_FALSE(wj.test()) << "the newcomer's agreement ran without the others";
  auto wx = nodes[0]->all_reduce(x, on({}));
  auto wy = nodes[1]->all_reduce(y, on({}));
  EXPECT_EQ(wj.wait().ring.size(), 3u);
  wx.wait();
  wy.wait();
  EXPECT_EQ(joiner, std::vector<float>(7, 7.0f));
  EXPECT_EQ(x, joiner);
}

// A member of the round's group that calls a collective over the whole swarm on the same tag
// instead (a peer restarted under its key between the round's agreement and its exchange): each
// would wait for the other until the collective timeout, so the coordinator refuses the
// narrower one at once, and the wider one runs when the others call it.
TEST(NodeGroupTest, AGroupWaitingForAPeerBusyOnAWiderCollectiveGivesWay) {
  Swarm swarm(3);
  auto nodes = swarm.start(3);
  const std::vector<net::PeerId> round = {nodes[0]->id(), nodes[1]->id(), nodes[2]->id()};
  std::vector<float> wide(7, 4.0f), x(7, 1.0f), y(7, 2.0f);
  auto wc = nodes[2]->all_reduce(wide, on({}));
  std::this_thread::sleep_for(500ms);
  std::vector<float> ga(100, 1.0f), gb(100, 2.0f);
  const auto t0 = std::chrono::steady_clock::now();
  auto wa = nodes[0]->all_reduce(ga, on(round));
  auto wb = nodes[1]->all_reduce(gb, on(round));
  for (auto* w : {&wa, &wb}) {
    try {
      w->wait();
      ADD_FAILURE() << "the group's collective ran without a member";
    } catch (const starling::NetError& e) {
      EXPECT_NE(std::string(e.what()).find("waits on this tag for"), std::string::npos) << e.what();
    }
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s) << "refused only at the timeout";
  auto wx = nodes[0]->all_reduce(x, on({}));
  auto wy = nodes[1]->all_reduce(y, on({}));
  EXPECT_EQ(wc.wait().ring.size(), 3u);
  wx.wait();
  wy.wait();
  EXPECT_EQ(wide, std::vector<float>(7, 7.0f));
}
