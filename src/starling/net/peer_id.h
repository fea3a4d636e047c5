// Peer identity: a 64-bit id that names a peer in headers, member lists and logs. With CURVE it is
// derived from the peer's public key, so a key on the allowlist names exactly one peer.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace starling::net {

using PeerId = uint64_t;

// 16 lowercase hex digits.
std::string format_peer_id(PeerId id);
// format_peer_id's inverse: nullopt for anything but 16 lowercase hex digits.
std::optional<PeerId> parse_peer_id(std::string_view text);

// Short form for logs and tables: the first 8 hex digits.
std::string short_peer_id(PeerId id);

}  // namespace starling::net
