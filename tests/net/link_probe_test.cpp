// The bandwidth probe's receiving side (link_probe.h): a marker that waited queued too long, or a
// reading faster than any link, gives no reading and asks for another probe; a probe too quick to
// time asks for a larger one, up to a limit where a reading stands; lost requests are asked again;
// and the transport tells a message it waited for from one already queued.
#include "starling/net/link_probe.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "starling/net/transport.h"

namespace net = starling::net;
using namespace std::chrono_literals;
using Clock = net::LinkProbe::Clock;

namespace {

constexpr net::PeerId kPeer = 7;

net::LinkProbe probe() {
  return net::LinkProbe({.first_bytes = 256 * 1024,
                         .min_seconds = 0.02,
                         .max_doubt = 0.25,
                         .growth = 4,
                         .max_bytes = 4u << 20,
                         .max_retries = 2,
                         .max_mbit_per_s = 100'000,
                         .patience = 2s,
                         .max_lost = 2});
}

Clock::duration seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

// One probe: its marker found at t0, after waiting queued for up to `doubt` seconds, and its
// payload `secs` later.
net::LinkProbe::Reading one(net::LinkProbe& p, uint64_t id, uint64_t bytes, double secs,
                            double doubt = 0) {
  const auto t0 = Clock::now();
  p.marker(kPeer, id, t0 - seconds(doubt), t0);
  return p.payload(kPeer, id, bytes, t0 + seconds(secs));
}

// The id of the one request queued, which asks `kPeer` for `bytes`.
uint64_t the_request(net::LinkProbe& p, std::mt19937_64& random, uint64_t bytes) {
  const auto asked = p.take_requests(Clock::now(), random);
  EXPECT_EQ(asked.size(), 1u);
  if (asked.size() != 1) return 0;
  EXPECT_EQ(asked[0].peer, kPeer);
  EXPECT_EQ(asked[0].bytes, bytes);
  return asked[0].id;
}

}  // namespace

// A marker found as it came reads the rate; one found a little after something else was handled
// reads a little low, never high: the transfer is taken from the earliest moment the marker can
// have come. Neither asks for more.
TEST(LinkProbe, ATimedProbeReadsItsRateOrALittleLessAndAsksNothingMore) {
  for (const double doubt : {0.0, 0.01}) {
    auto p = probe();
    std::mt19937_64 random(1);
    const auto r = one(p, 11, 256 * 1024, 0.2, doubt);  // 256 KiB in 200 ms: about 10.5 Mbit/s
    ASSERT_TRUE(r.mbit_per_s) << doubt;
    EXPECT_NEAR(*r.mbit_per_s, 256 * 1024 * 8 / (0.2 + doubt) / 1e6, 1e-6) << doubt;
    EXPECT_TRUE(p.take_requests(Clock::now(), random).empty()) << doubt;
  }
}

// The misreading this guards against: marker and payload both queued behind other work, read
// microseconds apart.
TEST(LinkProbe, AMarkerQueuedTooLongGivesNoReadingAndAsksForAnotherProbe) {
  auto p = probe();
  std::mt19937_64 random(1);
  // Held 300 ms right before the marker came; the payload followed 20 us later in the queue.
  const auto r = one(p, 11, 256 * 1024, 20e-6, /*doubt=*/0.3);
  EXPECT_FALSE(r.mbit_per_s) << "read " << *r.mbit_per_s << " Mbit/s";
  EXPECT_TRUE(r.doubtful);
  // 300 ms is long enough to time: the same size.
  const uint64_t id = the_request(p, random, 256 * 1024);
  EXPECT_TRUE(p.take_requests(Clock::now(), random).empty()) << "a request is sent once";
  // The answer, under the id asked for, timed properly: the reading, and nothing more to ask.
  const auto again = one(p, id, 256 * 1024, 0.2);
  ASSERT_TRUE(again.mbit_per_s);
  EXPECT_FALSE(again.doubtful);
  EXPECT_NEAR(*again.mbit_per_s, 10.49, 0.01);
  EXPECT_TRUE(p.take_requests(Clock::now(), random).empty());
}

// A doubt small in itself but large beside a quick transfer (a marker found behind a heartbeat on
// a fast link): a larger probe.
TEST(LinkProbe, ADoubtBesideAQuickTransferAsksForALargerProbe) {
  auto p = probe();
  std::mt19937_64 random(1);
  EXPECT_FALSE(one(p, 11, 256 * 1024, 1e-4, /*doubt=*/1e-4).mbit_per_s);
  the_request(p, random, 1 << 20);
}

// The line between a doubt that stands and one that asks again: a quarter of the time read (the
// transfer and the doubt together), so a reading taken is at least 0.75 of the rate.
TEST(LinkProbe, ADoubtOverAQuarterOfTheTimeReadAsksAgain) {
  for (const double doubt : {0.09, 0.11}) {  // a quarter of 0.3 + doubt: 0.1 at doubt 0.1
    auto p = probe();
    std::mt19937_64 random(1);
    const auto r = one(p, 1, 256 * 1024, 0.3, doubt);
    EXPECT_EQ(r.mbit_per_s.has_value(), doubt < 0.1) << doubt;
    EXPECT_EQ(p.take_requests(Clock::now(), random).size(), doubt < 0.1 ? 0u : 1u) << doubt;
  }
}

// A request whose answer never comes (lost, or refused) is asked again after the patience, twice
// at most; one whose marker came is not.
TEST(LinkProbe, ARequestWithoutAnAnswerIsAskedAgainTwiceAtMost) {
  auto p = probe();
  std::mt19937_64 random(1);
  EXPECT_FALSE(one(p, 1, 256 * 1024, 0.05, /*doubt=*/0.5).mbit_per_s);
  auto t = Clock::now();
  auto asked = p.take_requests(t, random);
  ASSERT_EQ(asked.size(), 1u);
  EXPECT_TRUE(p.take_requests(t + 1s, random).empty()) << "within the patience";
  for (int lost = 1; lost <= 2; ++lost) {
    t += 3s;
    const auto again = p.take_requests(t, random);
    ASSERT_EQ(again.size(), 1u) << lost;
    EXPECT_EQ(again[0].bytes, 256u * 1024);
    EXPECT_NE(again[0].id, asked[0].id);
    asked = again;
    EXPECT_TRUE(p.take_given_up().empty()) << lost;
  }
  EXPECT_TRUE(p.take_requests(t + 3s, random).empty()) << "asked again twice already";
  // Said once, so that the peer can log it.
  EXPECT_EQ(p.take_given_up(), std::vector<net::PeerId>{kPeer});
  EXPECT_TRUE(p.take_requests(t + 6s, random).empty());
  EXPECT_TRUE(p.take_given_up().empty());

  // A marker that came stops the clock: its payload is on the way.
  auto q = probe();
  EXPECT_FALSE(one(q, 1, 256 * 1024, 0.05, /*doubt=*/0.5).mbit_per_s);
  t = Clock::now();
  asked = q.take_requests(t, random);
  ASSERT_EQ(asked.size(), 1u);
  q.marker(kPeer, asked[0].id, t, t);
  EXPECT_TRUE(q.take_requests(t + 10s, random).empty());
}

// The answer to a request asked again can still come late: its marker does not stop the clock of
// the newer request, which is asked again in turn if its own marker does not come.
TEST(LinkProbe, ALateAnswerLeavesTheNewestRequestsClockRunning) {
  auto p = probe();
  std::mt19937_64 random(1);
  EXPECT_FALSE(one(p, 1, 256 * 1024, 0.05, /*doubt=*/0.5).mbit_per_s);
  auto t = Clock::now();
  const auto first = p.take_requests(t, random);
  ASSERT_EQ(first.size(), 1u);
  t += 3s;
  ASSERT_EQ(p.take_requests(t, random).size(), 1u);  // lost: asked again
  p.marker(kPeer, first[0].id, t, t);                // the first answer, late
  EXPECT_EQ(p.take_requests(t + 3s, random).size(), 1u);
}

TEST(LinkProbe, AProbeTooQuickToTimeStandsAndAsksForLargerOnesUpToTheLimit) {
  auto p = probe();
  std::mt19937_64 random(1);
  auto r = one(p, 1, 256 * 1024, 0.001);  // 2 Gbit/s, over 1 ms
  ASSERT_TRUE(r.mbit_per_s);
  EXPECT_NEAR(*r.mbit_per_s, 2097, 1);
  r = one(p, the_request(p, random, 1 << 20), 1 << 20, 0.004);
  ASSERT_TRUE(r.mbit_per_s);
  // At the limit a quick reading stands: the link is simply fast.
  r = one(p, the_request(p, random, 4 << 20), 4 << 20, 0.016);
  ASSERT_TRUE(r.mbit_per_s);
  EXPECT_NEAR(*r.mbit_per_s, 2097, 1);
  EXPECT_TRUE(p.take_requests(Clock::now(), random).empty());
}

// A receiver that stays busy: the same-size probes are bounded, and then the link stays
// unmeasured in this meeting (long transfers measure it); the next meeting starts over, and its
// quick doubtful readings grow the probe to the limit, where the same-size ones follow.
TEST(LinkProbe, ADoubtfulMeetingEndsUnmeasuredAndAnIntroductionStartsOver) {
  auto p = probe();
  std::mt19937_64 random(1);
  uint64_t id = 1;
  for (int retry = 0; retry < 2; ++retry) {
    EXPECT_FALSE(one(p, id, 256 * 1024, 0.05, /*doubt=*/0.5).given_up) << retry;
    id = the_request(p, random, 256 * 1024);
  }
  auto r = one(p, id, 256 * 1024, 0.05, /*doubt=*/0.5);
  EXPECT_FALSE(r.mbit_per_s);
  EXPECT_TRUE(r.doubtful);
  EXPECT_TRUE(r.given_up);
  EXPECT_TRUE(p.take_requests(Clock::now(), random).empty());

  // A probe nobody asked for (the member met again, say restarted) is a new meeting.
  id = 999;
  uint64_t bytes = 256 * 1024;
  for (const uint64_t next : {1u << 20, 4u << 20, 4u << 20, 4u << 20}) {
    r = one(p, id, bytes, 0.001, /*doubt=*/0.001);
    EXPECT_FALSE(r.mbit_per_s) << bytes;
    EXPECT_FALSE(r.given_up) << bytes;
    id = the_request(p, random, next);
    bytes = next;
  }
  r = one(p, id, bytes, 0.001, /*doubt=*/0.001);
  EXPECT_FALSE(r.mbit_per_s);
  EXPECT_TRUE(r.given_up);
}

// Bytes that sat in a buffer (a process stopped while the probe came in, then let go) come out at
// memory speed, with no doubt on the marker: no link is that fast, so it is no reading.
TEST(LinkProbe, AReadingFasterThanAnyLinkIsNoReading) {
  auto p = probe();
  std::mt19937_64 random(1);
  const auto r = one(p, 1, 4 << 20, 40e-6);  // 4 MiB in 40 us: 839 Gbit/s
  EXPECT_FALSE(r.mbit_per_s) << *r.mbit_per_s;
  EXPECT_TRUE(r.doubtful);
  the_request(p, random, 4 << 20);  // at the limit already: the same size again
}

TEST(LinkProbe, APayloadWithoutItsMarkerGivesNothing) {
  auto p = probe();
  std::mt19937_64 random(1);
  EXPECT_FALSE(p.payload(kPeer, 5, 4096, Clock::now()).mbit_per_s);
  p.marker(kPeer, 5, Clock::now(), Clock::now());
  EXPECT_FALSE(p.payload(kPeer + 1, 5, 4096, Clock::now()).mbit_per_s) << "another sender's";
  EXPECT_TRUE(p.take_requests(Clock::now(), random).empty());
}

// Incoming::waited and ::not_before: a message sent before receive() began waited queued, since
// after the last moment the receiver found nothing; one sent while it waited was waited for, and
// its arrival is when it came.
TEST(TransportTest, AMessageTheReceiverWaitedForIsToldFromAQueuedOne) {
  net::TransportOptions to;
  to.insecure = true;
  to.log = [](const std::string&) {};
  const auto made = Clock::now();
  net::Transport receiver(to), sender(to);
  sender.connect("r", receiver.endpoint(), "");
  net::Header h;
  h.type = net::MsgType::probe;
  h.sender = 1;
  // The first message (queued, unless connecting took over 100 ms): it came after the receiver
  // was made, not since the clock's start.
  ASSERT_TRUE(sender.send("r", h, zmq::message_t()));
  std::this_thread::sleep_for(100ms);
  auto first = receiver.receive(5000ms);
  ASSERT_TRUE(first);
  EXPECT_GE(first->not_before, made);

  // Once the receiver has found its queue empty, a queued message came after that.
  ASSERT_FALSE(receiver.receive(0ms));
  const auto looked = Clock::now();
  ASSERT_TRUE(sender.send("r", h, zmq::message_t()));
  std::this_thread::sleep_for(100ms);
  auto queued = receiver.receive(5000ms);
  ASSERT_TRUE(queued);
  EXPECT_FALSE(queued->waited);
  EXPECT_LE(queued->not_before, looked);
  EXPECT_GT(queued->not_before, first->arrived);
  EXPECT_GE(queued->arrived - queued->not_before, 90ms);

  std::thread late([&] {
    std::this_thread::sleep_for(100ms);
    sender.send("r", h, zmq::message_t());
  });
  const auto before = Clock::now();
  auto waited = receiver.receive(5000ms);
  late.join();
  ASSERT_TRUE(waited);
  EXPECT_TRUE(waited->waited);
  EXPECT_EQ(waited->not_before, waited->arrived);
  EXPECT_GE(waited->arrived - before, 90ms);
  EXPECT_LE(waited->arrived, Clock::now());
}
