// A seeded generator of malformed messages for a live peer: wrong frame counts, random bytes,
// valid headers with corrupt or mis-sized payloads, and valid control headers carrying JSON of
// the wrong shape. Shared by the quick CI test (tests/net/wire_test.cpp) and the run at scale
// (bench/fuzz/wire_fuzz.cpp), so both throw the same kinds of garbage.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "starling/net/peer_id.h"
#include "starling/net/wire.h"

namespace starling::testing {

class WireFuzzer {
 public:
  // Half the messages claim to come from `partner` (a member the target knows, or the fuzzer's
  // own key on a CURVE connection), the others from random ids. `checksum`: the headers carry the
  // payload's CRC-32C, as plain TCP requires (CURVE connections carry 0).
  WireFuzzer(uint64_t seed, net::PeerId partner, bool checksum = true)
      : rng_(seed), partner_(partner), checksum_(checksum) {}
  // Only messages of this type (0: every type), to find which one a problem comes from.
  void only(uint8_t type) { only_ = type; }

  // The frames of the next message, as they go on the socket.
  std::vector<std::vector<std::byte>> next() {
    net::Header h;
    h.type = static_cast<net::MsgType>(1 + rng_() % net::kMaxMsgType);
    if (only_ != 0) h.type = static_cast<net::MsgType>(only_);
    // A "leave" from the partner would be a valid message rather than a malformed one.
    h.sender = rng_() % 2 && h.type != net::MsgType::leave ? partner_ : rng_();
    h.op = rng_() % 4;
    std::vector<std::byte> payload(rng_() % 200);
    for (auto& b : payload) b = static_cast<std::byte>(rng_());
    if (rng_() % 3 == 0) {  // JSON-shaped but wrong
      static const char* kBodies[] = {"{}",
                                      "[]",
                                      "{\"member\":5}",
                                      "{\"members\":[{\"id\":1}]}",
                                      "{\"attempt\":-1}",
                                      "{\"ring\":[\"zz\"],\"attempt\":1}",
                                      "{\"ping\":\"x\"}",
                                      "nul",
                                      "{\"members\":[]"};
      const std::string body = kBodies[rng_() % 9];
      payload.assign(reinterpret_cast<const std::byte*>(body.data()),
                     reinterpret_cast<const std::byte*>(body.data()) + body.size());
    }
    std::vector<std::byte> header(net::kHeaderBytes);
    net::seal_header(h, payload, header.data(), checksum_);
    switch (rng_() % 4) {
      case 0:
        return {header};  // missing payload frame
      case 1:
        return {header, payload, payload};  // one frame too many
      case 2:
        payload.push_back(std::byte{1});  // length mismatch
        return {header, payload};
      default:
        return {header, payload};
    }
  }

 private:
  std::mt19937_64 rng_;
  net::PeerId partner_;
  bool checksum_;
  uint8_t only_ = 0;
};

}  // namespace starling::testing
