// Chooses the order of peers in a ring. A ring all-reduce runs at the speed of its slowest link,
// so with measured bandwidths we pick the order whose slowest link is fastest (exhaustively up to
// 8 peers, greedily beyond). Without a full set of measurements, or when asked, peers go by id.
#pragma once

#include <functional>
#include <vector>

#include "starling/net/collective.h"

namespace starling::net {

// `mbit_per_s(from, to)` returns a measured bandwidth or a negative value when unknown.
std::vector<PeerId> choose_ring(std::vector<PeerId> participants, RingOrder order,
                                const std::function<double(PeerId, PeerId)>& mbit_per_s);

}  // namespace starling::net
