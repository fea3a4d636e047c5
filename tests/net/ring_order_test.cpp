// Ring order: the slowest link of the chosen ring is as fast as possible; without complete
// measurements, or when asked, peers go by id.
#include "starling/net/ring_order.h"

#include <gtest/gtest.h>

#include <map>

namespace net = starling::net;

namespace {

double bottleneck(const std::vector<net::PeerId>& ring,
                  const std::function<double(net::PeerId, net::PeerId)>& bw) {
  double worst = 1e18;
  for (size_t i = 0; i < ring.size(); ++i)
    worst = std::min(worst, bw(ring[i], ring[(i + 1) % ring.size()]));
  return worst;
}

}  // namespace

TEST(RingOrderTest, AvoidsSlowLinks) {
  // Two sites of two peers: links inside a site are fast, between sites slow, except one
  // fast cross link each way (3->4 and 2->1). The id order 1,2,3,4 would cross twice through
  // slow links; the best ring crosses through the fast ones.
  std::map<std::pair<net::PeerId, net::PeerId>, double> bw;
  for (net::PeerId a = 1; a <= 4; ++a)
    for (net::PeerId b = 1; b <= 4; ++b) bw[{a, b}] = 10;
  bw[{1, 3}] = bw[{3, 1}] = bw[{2, 4}] = bw[{4, 2}] = 1000;  // same site
  bw[{3, 2}] = bw[{4, 1}] = 1000;                            // fast cross links
  const auto f = [&](net::PeerId a, net::PeerId b) { return bw.at({a, b}); };
  const auto ring = net::choose_ring({4, 3, 2, 1}, net::RingOrder::measured, f);
  ASSERT_EQ(ring.size(), 4u);
  EXPECT_EQ(bottleneck(ring, f), 1000);
  EXPECT_EQ(bottleneck({1, 2, 3, 4}, f), 10);
  EXPECT_EQ(ring.front(), 1u);  // starts from the smallest id, like every ring it picks
}

TEST(RingOrderTest, ById_WhenAskedOrWhenMeasurementsAreMissing) {
  const auto unknown = [](net::PeerId a, net::PeerId b) { return a == 2 && b == 3 ? -1.0 : 5.0; };
  EXPECT_EQ(net::choose_ring({9, 3, 2, 5}, net::RingOrder::measured, unknown),
            (std::vector<net::PeerId>{2, 3, 5, 9}));
  const auto slow = [](net::PeerId a, net::PeerId b) { return a == 2 && b == 3 ? 1.0 : 5.0; };
  EXPECT_EQ(net::choose_ring({9, 3, 2, 5}, net::RingOrder::by_id, slow),
            (std::vector<net::PeerId>{2, 3, 5, 9}));
  EXPECT_NE(net::choose_ring({9, 3, 2, 5}, net::RingOrder::measured, slow),
            (std::vector<net::PeerId>{2, 3, 5, 9}));
}

TEST(RingOrderTest, GreedyBeyondEightPeers) {
  // 12 peers where only links i -> i+5 (mod 12) are fast: the greedy walk finds that cycle.
  const auto f = [](net::PeerId a, net::PeerId b) { return (a + 5) % 12 == b ? 100.0 : 1.0; };
  std::vector<net::PeerId> peers;
  for (net::PeerId i = 0; i < 12; ++i) peers.push_back(i);
  const auto ring = net::choose_ring(peers, net::RingOrder::measured, f);
  EXPECT_EQ(bottleneck(ring, f), 100.0);
}
