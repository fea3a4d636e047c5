// The wire format of every message between peers. A message is two ZeroMQ frames: a fixed
// 48-byte header, then the payload (a JSON document for control messages, encoded tensor bytes
// for collective data). Tensor bytes travel in their own frame so they are never copied to be
// framed.
//
// Header, little-endian:
//   0  u32 magic "STRL"        4  u8 version   5 u8 type   6 u8 precision   7 u8 flags (0)
//   8  u64 sender peer id     16  u64 op (collective or probe id)
//  24  u32 step               28  u32 chunk
//  32  u64 payload bytes      40  u32 CRC-32C of the payload   44  u32 reserved (0)
//
// The CRC guards the control messages of plain-TCP (--insecure) swarms (carries_checksum()).
// Collective data chunks never carry one, as in Gloo and NCCL: TCP's checksum and the link's
// frame check cover them, their size is checked, and a CRC over every chunk twice (send and
// receive) cost a tenth of a peer's CPU on a fast link, more than adding the chunk in. On CURVE
// connections no message carries one: CURVE's Poly1305 tag authenticates every byte.
//
// decode_header() and check_payload() validate every field; anything malformed yields a reason
// (never an exception, never a crash), which the transport logs with the sender's address.
//
// The magic and the version keep their offsets (0 and 4) in every version: a peer of another
// release reads them to say whom it met. A peer answers a message whose only fault is its version
// with `other_version`, in its own version, so a joiner of another release stops at once with
// both versions named instead of waiting out its join timeout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "starling/net/peer_id.h"

namespace starling::net {

inline constexpr uint32_t kWireMagic = 0x4C525453;  // "STRL" read as little-endian u32
// Changes whenever peers of two releases could not train together: the framing, the control
// messages, or the shape of a collective the strategies run (version 2: the root choice's rows
// carry each participant's join time). A peer drops a message of another version and logs it, so
// a mixed swarm fails at the join instead of refusing every collective.
inline constexpr uint8_t kWireVersion = 2;
inline constexpr size_t kHeaderBytes = 48;

enum class MsgType : uint8_t {
  hello = 1,           // a peer introduces itself (join request, or first contact)
  welcome = 2,         // reply to hello: the member list
  heartbeat = 3,       // liveness + gossip (member list, link measurements, ping time)
  pong = 4,            // echo of a heartbeat's ping time, for round-trip latency
  leave = 5,           // the sender is leaving the swarm
  status_request = 6,  // from `starling status`: reply with members and links
  status_reply = 7,
  // Bandwidth probe: a marker (chunk 0) then a bulk payload (chunk 1); chunk 2 is the measuring
  // peer's request for one (payload: the bytes wanted, u64 little-endian; link_probe.h).
  probe = 8,
  ready = 9,   // participant -> coordinator: I am ready for my next collective
  start = 10,  // coordinator -> participants: run it with these peers in this order
  abort = 11,  // a collective failed; stop waiting for it
  data = 12,   // a chunk of a collective's tensor
  p2p = 13,    // a point-to-point message; Header::op carries its tag
  // Reply to a message of another wire version, once per connection: the header's version is
  // the news (the payload is empty, the sender 0 where the transport does not know its peer).
  other_version = 14,
};
inline constexpr uint8_t kMaxMsgType = 14;

std::string to_string(MsgType type);

struct Header {
  MsgType type = MsgType::heartbeat;
  uint8_t precision = 0;  // WirePrecision of a data payload; 0 otherwise
  PeerId sender = 0;
  uint64_t op = 0;
  uint32_t step = 0;
  uint32_t chunk = 0;
  uint64_t payload_bytes = 0;
  uint32_t checksum = 0;
};

// Whether a message of this type carries (and is checked against) a CRC-32C.
inline bool carries_checksum(MsgType type, bool insecure) {
  return insecure && type != MsgType::data;
}

// Serialises `header` (with payload_bytes and checksum as given) into exactly kHeaderBytes.
void encode_header(const Header& header, std::byte* out);

// Fills payload_bytes and checksum from `payload` (0 without `checksum`), then serialises.
void seal_header(Header& header, std::span<const std::byte> payload, std::byte* out,
                 bool checksum = true);

struct HeaderResult {
  Header header;
  std::string error;  // empty when the header is valid
  bool ok() const { return error.empty(); }
};

// The version of a Starling message of another wire version (the first frame starts with the
// magic and a version other than kWireVersion), whatever its length; nullopt otherwise.
std::optional<uint8_t> other_wire_version(std::span<const std::byte> header_frame);
// "wire version V, this peer speaks version K (another Starling release)".
std::string other_wire_version_error(uint8_t version);

// Validates magic, version, type, precision, reserved fields and the payload-size limit.
HeaderResult decode_header(std::span<const std::byte> bytes, uint64_t max_payload_bytes);

// Checks the payload frame against a decoded header: length and (with `checksum`) the CRC.
// Empty when it matches.
std::string check_payload(const Header& header, std::span<const std::byte> payload,
                          bool checksum = true);

}  // namespace starling::net
