#include "starling/net/ring_order.h"

#include <algorithm>
#include <limits>

namespace starling::net {
namespace {

double bottleneck(const std::vector<PeerId>& ring,
                  const std::function<double(PeerId, PeerId)>& bw) {
  double worst = std::numeric_limits<double>::infinity();
  for (size_t i = 0; i < ring.size(); ++i)
    worst = std::min(worst, bw(ring[i], ring[(i + 1) % ring.size()]));
  return worst;
}

}  // namespace

std::vector<PeerId> choose_ring(std::vector<PeerId> peers, RingOrder order,
                                const std::function<double(PeerId, PeerId)>& bw) {
  std::sort(peers.begin(), peers.end());
  if (order == RingOrder::by_id || peers.size() <= 3) return peers;  // 3: every ring is the same
  for (PeerId a : peers)
    for (PeerId b : peers)
      if (a != b && bw(a, b) < 0) return peers;
  if (peers.size() <= 8) {
    std::vector<PeerId> best = peers, ring = peers;
    double best_bw = bottleneck(peers, bw);
    while (std::next_permutation(ring.begin() + 1, ring.end())) {
      const double b = bottleneck(ring, bw);
      if (b > best_bw * 1.1) {  // only a clear gain beats the stable order
        best_bw = b;
        best = ring;
      }
    }
    return best;
  }
  std::vector<PeerId> ring{peers.front()}, rest(peers.begin() + 1, peers.end());
  while (!rest.empty()) {
    auto next = std::max_element(rest.begin(), rest.end(), [&](PeerId x, PeerId y) {
      return bw(ring.back(), x) < bw(ring.back(), y);
    });
    ring.push_back(*next);
    rest.erase(next);
  }
  return ring;
}

}  // namespace starling::net
