#include "starling/net/wire.h"

#include <cstdio>
#include <cstring>

#include "starling/compress/wire_codec.h"
#include "starling/net/crc32c.h"

namespace starling::net {
namespace {

template <typename T>
void put(std::byte* out, size_t offset, T value) {
  for (size_t i = 0; i < sizeof(T); ++i)
    out[offset + i] = static_cast<std::byte>((static_cast<uint64_t>(value) >> (8 * i)) & 0xFF);
}

template <typename T>
T get(const std::byte* in, size_t offset) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i)
    v |= static_cast<uint64_t>(std::to_integer<uint8_t>(in[offset + i])) << (8 * i);
  return static_cast<T>(v);
}

}  // namespace

std::string format_peer_id(PeerId id) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(id));
  return buf;
}

std::optional<PeerId> parse_peer_id(std::string_view text) {
  if (text.size() != 16 || text.find_first_not_of("0123456789abcdef") != std::string_view::npos)
    return std::nullopt;
  PeerId id = 0;
  for (const char c : text) id = (id << 4) | static_cast<PeerId>(c <= '9' ? c - '0' : c - 'a' + 10);
  return id;
}

std::string short_peer_id(PeerId id) { return format_peer_id(id).substr(0, 8); }

std::string to_string(MsgType type) {
  switch (type) {
    case MsgType::hello:
      return "hello";
    case MsgType::welcome:
      return "welcome";
    case MsgType::heartbeat:
      return "heartbeat";
    case MsgType::pong:
      return "pong";
    case MsgType::leave:
      return "leave";
    case MsgType::status_request:
      return "status_request";
    case MsgType::status_reply:
      return "status_reply";
    case MsgType::probe:
      return "probe";
    case MsgType::ready:
      return "ready";
    case MsgType::start:
      return "start";
    case MsgType::abort:
      return "abort";
    case MsgType::data:
      return "data";
    case MsgType::other_version:
      return "other_version";
    case MsgType::p2p:
      return "p2p";
  }
  return "type " + std::to_string(static_cast<int>(type));
}

void encode_header(const Header& h, std::byte* out) {
  put<uint32_t>(out, 0, kWireMagic);
  put<uint8_t>(out, 4, kWireVersion);
  put<uint8_t>(out, 5, static_cast<uint8_t>(h.type));
  put<uint8_t>(out, 6, h.precision);
  put<uint8_t>(out, 7, 0);
  put<uint64_t>(out, 8, h.sender);
  put<uint64_t>(out, 16, h.op);
  put<uint32_t>(out, 24, h.step);
  put<uint32_t>(out, 28, h.chunk);
  put<uint64_t>(out, 32, h.payload_bytes);
  put<uint32_t>(out, 40, h.checksum);
  put<uint32_t>(out, 44, 0);
}

void seal_header(Header& h, std::span<const std::byte> payload, std::byte* out, bool checksum) {
  h.payload_bytes = payload.size();
  h.checksum = checksum ? crc32c(payload.data(), payload.size()) : 0;
  encode_header(h, out);
}

std::optional<uint8_t> other_wire_version(std::span<const std::byte> header_frame) {
  if (header_frame.size() < 5 || get<uint32_t>(header_frame.data(), 0) != kWireMagic)
    return std::nullopt;
  const auto v = get<uint8_t>(header_frame.data(), 4);
  if (v == kWireVersion) return std::nullopt;
  return v;
}

std::string other_wire_version_error(uint8_t version) {
  return "wire version " + std::to_string(version) + ", this peer speaks version " +
         std::to_string(kWireVersion) + " (another Starling release)";
}

HeaderResult decode_header(std::span<const std::byte> bytes, uint64_t max_payload_bytes) {
  HeaderResult r;
  if (bytes.size() != kHeaderBytes) {
    r.error = "header frame is " + std::to_string(bytes.size()) + " bytes, expected " +
              std::to_string(kHeaderBytes);
    return r;
  }
  const std::byte* b = bytes.data();
  if (get<uint32_t>(b, 0) != kWireMagic) {
    r.error = "bad magic (not a Starling message)";
    return r;
  }
  if (const auto v = get<uint8_t>(b, 4); v != kWireVersion) {
    r.error = other_wire_version_error(v);
    return r;
  }
  const auto type = get<uint8_t>(b, 5);
  if (type == 0 || type > kMaxMsgType) {
    r.error = "unknown message type " + std::to_string(type);
    return r;
  }
  const auto precision = get<uint8_t>(b, 6);
  if (precision > static_cast<uint8_t>(compress::WirePrecision::int8)) {
    r.error = "unknown wire precision " + std::to_string(precision);
    return r;
  }
  if (get<uint8_t>(b, 7) != 0 || get<uint32_t>(b, 44) != 0) {
    r.error = "reserved header fields are not zero";
    return r;
  }
  Header& h = r.header;
  h.type = static_cast<MsgType>(type);
  h.precision = precision;
  h.sender = get<uint64_t>(b, 8);
  h.op = get<uint64_t>(b, 16);
  h.step = get<uint32_t>(b, 24);
  h.chunk = get<uint32_t>(b, 28);
  h.payload_bytes = get<uint64_t>(b, 32);
  h.checksum = get<uint32_t>(b, 40);
  if (h.payload_bytes > max_payload_bytes) {
    r.error = "payload of " + std::to_string(h.payload_bytes) + " bytes exceeds the limit of " +
              std::to_string(max_payload_bytes);
    return r;
  }
  return r;
}

std::string check_payload(const Header& header, std::span<const std::byte> payload, bool checksum) {
  if (payload.size() != header.payload_bytes)
    return "payload is " + std::to_string(payload.size()) + " bytes, header says " +
           std::to_string(header.payload_bytes);
  if (checksum && crc32c(payload.data(), payload.size()) != header.checksum)
    return "payload checksum mismatch";
  return {};
}

}  // namespace starling::net
