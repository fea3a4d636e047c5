// The wire format and its decoder: every header field is validated, and a seeded fuzzer feeds
// well over 100k corrupted messages to the decoder and to a live peer, which must reject them with
// a reason, never crash, and still serve collectives afterwards.
#include "starling/net/wire.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "../support/wire_fuzz.h"
#include "starling/net/crc32c.h"
#include "starling/net/node.h"
#include "test_swarm.h"

namespace net = starling::net;
using namespace std::chrono_literals;

namespace {

std::vector<std::byte> header_bytes(net::Header h, std::span<const std::byte> payload) {
  std::vector<std::byte> out(net::kHeaderBytes);
  net::seal_header(h, payload, out.data());
  return out;
}

net::Header sample_header() {
  net::Header h;
  h.type = net::MsgType::data;
  h.precision = 3;
  h.sender = 0x0123456789abcdefull;
  h.op = 42;
  h.step = 7;
  h.chunk = 9;
  return h;
}

}  // namespace

TEST(WireTest, Crc32cMatchesTheStandardCheckValue) {
  const char* text = "123456789";
  EXPECT_EQ(net::crc32c(text, 9), 0xE3069283u);
  // Unaligned starts and odd lengths take the byte-wise tail path; chaining matches one pass.
  std::vector<unsigned char> data(1000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i * 31 + 7);
  const uint32_t whole = net::crc32c(data.data() + 3, 997);
  EXPECT_EQ(net::crc32c(data.data() + 3 + 500, 497, net::crc32c(data.data() + 3, 500)), whole);
}

TEST(WireTest, Crc32cOfLongBuffersEqualsTheChainOfShortPieces) {
  // Long buffers take the three-stream path (blocks joined by table shifts); pieces of 1000 bytes
  // take the one-stream path. Lengths around the 12 KiB step, and a megabyte.
  std::vector<unsigned char> data((1 << 20) + 77);
  for (size_t i = 0; i < data.size(); ++i)
    data[i] = static_cast<unsigned char>((i * 2654435761u) >> 13);
  for (size_t n : {size_t{12287}, size_t{12288}, size_t{12289}, size_t{40000}, data.size() - 5}) {
    uint32_t chained = 0;
    for (size_t at = 0; at < n; at += 1000)
      chained = net::crc32c(data.data() + 5 + at, std::min<size_t>(1000, n - at), chained);
    EXPECT_EQ(net::crc32c(data.data() + 5, n), chained) << n << " bytes";
  }
}

// Peer ids in text (member lists, plans, link names) read back as written, and nothing else does.
TEST(WireTest, PeerIdsRoundTripThroughTheirHexForm) {
  for (const net::PeerId id : {net::PeerId{0}, net::PeerId{0x0123456789abcdefULL}, ~net::PeerId{0}})
    EXPECT_EQ(net::parse_peer_id(net::format_peer_id(id)), id);
  for (const char* bad : {"", "0123456789abcde", "0123456789abcdef0", "0123456789ABCDEF",
                          "0123456789abcdeg", " 123456789abcdef", "-123456789abcdef"})
    EXPECT_FALSE(net::parse_peer_id(bad).has_value()) << bad;
}

TEST(WireTest, HeaderRoundTrips) {
  std::vector<std::byte> payload(100, std::byte{0x33});
  auto h = sample_header();
  const auto raw = header_bytes(h, payload);
  const auto r = net::decode_header(raw, 1 << 20);
  ASSERT_TRUE(r.ok()) << r.error;
  EXPECT_EQ(r.header.type, net::MsgType::data);
  EXPECT_EQ(r.header.precision, 3);
  EXPECT_EQ(r.header.sender, h.sender);
  EXPECT_EQ(r.header.op, 42u);
  EXPECT_EQ(r.header.step, 7u);
  EXPECT_EQ(r.header.chunk, 9u);
  EXPECT_EQ(r.header.payload_bytes, 100u);
  EXPECT_TRUE(net::check_payload(r.header, payload).empty());
}

TEST(WireTest, EveryFieldIsValidated) {
  std::vector<std::byte> payload(64, std::byte{1});
  const auto good = header_bytes(sample_header(), payload);
  const auto expect_error = [&](std::vector<std::byte> raw, const std::string& needle) {
    const auto r = net::decode_header(raw, 1 << 20);
    EXPECT_FALSE(r.ok());
    EXPECT_NE(r.error.find(needle), std::string::npos) << r.error;
  };
  auto raw = good;
  raw[0] = std::byte{0};
  expect_error(raw, "magic");
  raw = good;
  raw[4] = std::byte{net::kWireVersion + 1};
  expect_error(raw, "wire version " + std::to_string(net::kWireVersion + 1) +
                        ", this peer speaks version " + std::to_string(net::kWireVersion));
  raw = good;
  raw[5] = std::byte{0};
  expect_error(raw, "unknown message type 0");
  raw[5] = std::byte{net::kMaxMsgType + 1};
  expect_error(raw, "unknown message type");
  raw = good;
  raw[6] = std::byte{4};
  expect_error(raw, "precision");
  raw = good;
  raw[7] = std::byte{1};
  expect_error(raw, "reserved");
  raw = good;
  raw[45] = std::byte{1};
  expect_error(raw, "reserved");
  expect_error(std::vector<std::byte>(good.begin(), good.end() - 1), "47 bytes");
  auto longer = good;
  longer.push_back(std::byte{0});
  expect_error(longer, "49 bytes");
  // Oversized payloads are refused from the header alone, before anything is allocated.
  auto big = sample_header();
  big.payload_bytes = 1ull << 40;
  std::vector<std::byte> big_raw(net::kHeaderBytes);
  net::encode_header(big, big_raw.data());
  expect_error(big_raw, "exceeds the limit");
  // Payload: wrong length, flipped bit.
  const auto decoded = net::decode_header(good, 1 << 20).header;
  EXPECT_NE(net::check_payload(decoded, std::span(payload).first(63)).find("63 bytes"),
            std::string::npos);
  auto flipped = payload;
  flipped[17] ^= std::byte{0x10};
  EXPECT_NE(net::check_payload(decoded, flipped).find("checksum"), std::string::npos);
}

// Plain TCP: control messages carry a CRC, collective data chunks do not (TCP's checksum covers
// them, as in Gloo); CURVE: nothing does (Poly1305 authenticates every byte).
TEST(WireTest, OnlyPlainTcpControlMessagesCarryAChecksum) {
  for (int t = 1; t <= net::kMaxMsgType; ++t) {
    const auto type = static_cast<net::MsgType>(t);
    EXPECT_EQ(net::carries_checksum(type, /*insecure=*/true), type != net::MsgType::data) << t;
    EXPECT_FALSE(net::carries_checksum(type, /*insecure=*/false)) << t;
  }
}

// 200k messages: valid ones mutated by bit flips, byte overwrites, truncation and extension of
// either frame. Every mutation of a validated field must be caught; nothing may crash.
TEST(WireTest, FuzzedDecoderRejectsCorruptionWithoutCrashing) {
  std::mt19937_64 rng(20261122);
  size_t rejected = 0, accepted = 0;
  const int kMessages = 200000;
  for (int i = 0; i < kMessages; ++i) {
    net::Header h;
    h.type = static_cast<net::MsgType>(1 + rng() % net::kMaxMsgType);
    h.precision = static_cast<uint8_t>(rng() % 4);
    h.sender = rng();
    h.op = rng();
    h.step = static_cast<uint32_t>(rng());
    h.chunk = static_cast<uint32_t>(rng());
    std::vector<std::byte> payload(rng() % 300);
    for (auto& b : payload) b = static_cast<std::byte>(rng());
    auto raw = header_bytes(h, payload);
    bool must_reject = false;
    switch (rng() % 6) {
      case 0: {  // flip one bit in a validated header byte (magic, version, type, precision,
                 // flags, length, checksum, reserved)
        static const int kValidated[] = {0, 1, 2, 3, 4, 5, 6, 7, 32, 33, 34, 40, 41, 42, 43, 44};
        const int at = kValidated[rng() % 16];
        const int bit = static_cast<int>(rng() % 8);
        raw[at] ^= std::byte(1 << bit);
        // A type or precision flip may land on another valid value; the length or checksum
        // flip is then caught by check_payload.
        must_reject = !(at == 5 || at == 6);
        break;
      }
      case 1:  // flip one bit of the payload: CRC-32C catches every single-bit error
        if (payload.empty()) continue;
        payload[rng() % payload.size()] ^= std::byte(1 << (rng() % 8));
        must_reject = true;
        break;
      case 2:  // truncate or extend the header frame
        raw.resize(rng() % 96);
        must_reject = raw.size() != net::kHeaderBytes;
        break;
      case 3:  // truncate the payload frame
        if (payload.empty()) continue;
        payload.resize(rng() % payload.size());
        must_reject = true;
        break;
      case 4:  // random garbage of header size
        for (auto& b : raw) b = static_cast<std::byte>(rng());
        must_reject = true;  // magic survives with probability 2^-32
        break;
      case 5:  // unmodified: must pass
        break;
    }
    const auto r = net::decode_header(raw, 1 << 20);
    const bool ok = r.ok() && net::check_payload(r.header, payload).empty();
    if (ok) {
      ++accepted;
      ASSERT_FALSE(must_reject) << "message " << i << " was corrupted but accepted";
    } else {
      ++rejected;
    }
  }
  EXPECT_GE(accepted + rejected, 100000u);
  EXPECT_GT(rejected, (accepted + rejected) / 2);
}

// A target peer and its partner on plain TCP (so a raw socket can pass for a member), and a raw
// DEALER socket connected to the target.
struct PlainPair {
  explicit PlainPair(net::NodeOptions o) {
    o.insecure = true;  // lets the fuzzer connect; authentication is tested elsewhere
    o.heartbeat_interval = 100ms;
    o.probe_bytes = 0;
    o.name = "target";
    target = std::make_unique<net::Node>(o);
    o.name = "partner";
    o.join = {target->endpoint()};
    partner = std::make_unique<net::Node>(o);
    socket.set(zmq::sockopt::linger, 0);
    socket.set(zmq::sockopt::sndhwm, 0);
    socket.connect(target->endpoint());
  }
  // The target still serves collectives: an all-reduce with its partner gives the right sum.
  void expect_all_reduce() {
    std::vector<float> a(5000, 1.0f), b(5000, 2.0f);
    auto wa = target->all_reduce(a, {});
    auto wb = partner->all_reduce(b, {});
    ASSERT_TRUE(wa.wait_for(20s));
    wa.wait();
    wb.wait();
    EXPECT_EQ(a, std::vector<float>(5000, 3.0f));
  }
  std::unique_ptr<net::Node> target, partner;
  zmq::context_t ctx;
  zmq::socket_t socket{ctx, zmq::socket_type::dealer};
};

// A live peer under a stream of garbage: wrong frame counts, random bytes, valid headers with
// corrupt payloads, valid control headers carrying malformed JSON. It must log and drop all of
// it, and then still run a collective.
TEST(WireTest, LivePeerSurvivesFuzzedMessages) {
  std::mutex mutex;
  size_t log_lines = 0;
  const auto quiet = [&](const std::string&) {
    std::lock_guard lock(mutex);
    ++log_lines;
  };
  net::NodeOptions o;
  o.peer_timeout = 2000ms;
  o.log = quiet;
  PlainPair pair(o);
  net::Node &target = *pair.target, &partner = *pair.partner;
  ASSERT_TRUE(target.wait_for_members(2, 5s));
  zmq::socket_t& s = pair.socket;
  const auto send = [&](const std::vector<std::vector<std::byte>>& frames) {
    for (size_t i = 0; i < frames.size(); ++i)
      s.send(zmq::const_buffer(frames[i].data(), frames[i].size()),
             i + 1 < frames.size() ? zmq::send_flags::sndmore : zmq::send_flags::none);
  };
  starling::testing::WireFuzzer fuzz(7, partner.id());
  const int kMessages = 20000;
  for (int i = 0; i < kMessages; ++i) send(fuzz.next());
  // Every message is refused: by framing, length, checksum, or its body (a few well-formed
  // ones, e.g. a status request, are served). Wait for the target to get through the flood.
  const auto until = std::chrono::steady_clock::now() + 30s;
  while (target.counters().rejected_messages < kMessages * 9 / 10 &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(20ms);
  EXPECT_GE(target.counters().rejected_messages, kMessages * 9u / 10);
  // The target keeps working: heartbeats flow and a collective completes.
  pair.expect_all_reduce();
  for (const auto& m : target.members()) EXPECT_NE(m.info.name, "");
}

// Bandwidth probe requests (link_probe.h) from a member: a malformed one is refused with a reason,
// and however many well-formed ones come, a peer answers 16 to one process of the member, each
// 16 MiB at most.
TEST(WireTest, ProbeRequestsAreCheckedAndAnsweredAFewTimesAMember) {
  starling::net::testing::LogSink sink;
  net::NodeOptions o;
  o.log = sink.fn();
  PlainPair pair(o);
  net::Node& target = *pair.target;
  ASSERT_TRUE(target.wait_for_members(2, 5s));
  const auto request = [&](uint32_t chunk, std::vector<std::byte> body) {
    net::Header h;
    h.type = net::MsgType::probe;
    h.sender = pair.partner->id();
    h.op = 77;
    h.chunk = chunk;
    const auto header = header_bytes(h, body);
    pair.socket.send(zmq::const_buffer(header.data(), header.size()), zmq::send_flags::sndmore);
    pair.socket.send(zmq::const_buffer(body.data(), body.size()), zmq::send_flags::none);
  };
  const auto size = [](uint64_t bytes) {
    std::vector<std::byte> b(8);
    for (int i = 0; i < 8; ++i) b[static_cast<size_t>(i)] = std::byte(bytes >> (8 * i) & 0xff);
    return b;
  };
  const auto rejected = target.counters().rejected_messages;
  request(2, std::vector<std::byte>(7));  // not 8 bytes
  request(2, size(0));
  request(2, size((16u << 20) + 1));
  request(3, {});  // no such chunk
  const auto until = std::chrono::steady_clock::now() + 10s;
  while (target.counters().rejected_messages < rejected + 4 &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(20ms);
  EXPECT_EQ(target.counters().rejected_messages, rejected + 4);
  EXPECT_TRUE(sink.contains("a probe request carries 8 bytes (the size wanted), not 7"));
  EXPECT_TRUE(sink.contains("a probe request asks for 16777217 bytes; 1 to 16777216"));
  EXPECT_TRUE(sink.contains("a probe's chunk is 0 (marker), 1 (payload) or 2 (request), not 3"));

  // Forty requests of 1 MiB: sixteen are answered.
  const auto sent = target.counters().bytes_sent;
  for (int i = 0; i < 40; ++i) request(2, size(1u << 20));
  while (!sink.contains("asked for more than 16 bandwidth probes") &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(20ms);
  std::this_thread::sleep_for(300ms);
  EXPECT_TRUE(sink.contains("asked for more than 16 bandwidth probes since it was met"));
  const auto answered = target.counters().bytes_sent - sent;
  EXPECT_GE(answered, 16u << 20);
  EXPECT_LT(answered, 17u << 20) << "more than 16 answers of 1 MiB";
  pair.expect_all_reduce();
}

// Chunks of a collective that has not started here are kept for when it does, but only up to
// NodeOptions::max_early_bytes: a member that floods chunks of collectives that never come is
// refused once the bound is reached, and the peer still runs a real collective afterwards.
TEST(WireTest, ChunksOfCollectivesNotStartedAreBounded) {
  net::NodeOptions o;
  o.log = [](const std::string&) {};
  o.max_early_bytes = 64 << 10;
  PlainPair pair(o);
  net::Node &target = *pair.target, &partner = *pair.partner;
  ASSERT_TRUE(target.wait_for_members(2, 5s));
  zmq::socket_t& s = pair.socket;
  const std::vector<std::byte> payload(1000, std::byte{7});
  const int kChunks = 2000;  // 2000 x (1000 + 1024 bytes counted) against a 64 KiB bound
  for (int i = 0; i < kChunks; ++i) {
    net::Header h;
    h.type = net::MsgType::data;
    h.sender = partner.id();  // plain TCP cannot tell
    h.op = 987654321;         // a collective that never starts
    h.step = 0;
    h.chunk = static_cast<uint32_t>(i);
    std::vector<std::byte> header(net::kHeaderBytes);
    net::seal_header(h, payload, header.data());
    s.send(zmq::const_buffer(header.data(), header.size()), zmq::send_flags::sndmore);
    s.send(zmq::const_buffer(payload.data(), payload.size()), zmq::send_flags::none);
  }
  const auto until = std::chrono::steady_clock::now() + 20s;
  while (target.counters().rejected_messages < kChunks - 40 &&
         std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(20ms);
  EXPECT_GE(target.counters().rejected_messages, static_cast<uint64_t>(kChunks - 40))
      << "chunks of a collective that never starts were kept without a bound";
  pair.expect_all_reduce();
}
