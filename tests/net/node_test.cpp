// Peers in one process (each with its own ZeroMQ context, as separate processes would have):
// joining, gossip, leaving, the collectives and their agreement round, CURVE authentication
// (an outsider can neither join, nor deliver, nor receive), and the status query.
#include "starling/net/node.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <future>
#include <iostream>
#include <memory>
#include <mutex>
#include <numeric>
#include <thread>
#include <zmq.hpp>

#include "starling/common/error.h"
#include "starling/net/status_client.h"
#include "starling/net/wire.h"
#include "test_swarm.h"

namespace net = starling::net;
using namespace std::chrono_literals;
using starling::net::testing::Swarm;

namespace {

std::vector<float> ramp(size_t n, float base) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = base + static_cast<float>(i % 101);
  return v;
}

}  // namespace

TEST(NodeTest, JoinGossipAndAllReduceAcrossThreePeers) {
  Swarm swarm(3);
  auto nodes = swarm.start(3);
  // Peer 2 joined through peer 0 only, yet knows peer 1: the member list spread.
  for (auto& n : nodes) EXPECT_EQ(n->members().size(), 3u);
  std::vector<std::vector<float>> data;
  for (int i = 0; i < 3; ++i) data.push_back(ramp(10007, static_cast<float>(i)));
  std::vector<net::Work> works;
  for (int i = 0; i < 3; ++i) works.push_back(nodes[i]->all_reduce(data[i], {}));
  for (auto& w : works) EXPECT_EQ(w.wait().ring.size(), 3u);
  for (size_t k = 0; k < 10007; ++k) ASSERT_EQ(data[0][k], 3 * static_cast<float>(k % 101) + 3);
  EXPECT_EQ(data[0], data[1]);
  EXPECT_EQ(data[0], data[2]);
}

TEST(NodeTest, LossyPrecisionsGiveBitIdenticalResults) {
  Swarm swarm(3);
  auto nodes = swarm.start(3);
  for (auto precision :
       {net::WirePrecision::fp16, net::WirePrecision::bf16, net::WirePrecision::int8}) {
    std::vector<std::vector<float>> data;
    for (int i = 0; i < 3; ++i) {
      data.push_back(ramp(5003, 0));
      for (size_t k = 0; k < data[i].size(); ++k) data[i][k] = std::sin(0.37f * k + i) * 3.1f;
    }
    net::CollectiveOptions o;
    o.precision = precision;
    o.op = net::ReduceOp::mean;
    std::vector<net::Work> works;
    for (int i = 0; i < 3; ++i) works.push_back(nodes[i]->all_reduce(data[i], o));
    for (auto& w : works) w.wait();
    EXPECT_EQ(0, std::memcmp(data[0].data(), data[1].data(), data[0].size() * 4));
    EXPECT_EQ(0, std::memcmp(data[0].data(), data[2].data(), data[0].size() * 4));
    double max_err = 0;
    for (size_t k = 0; k < data[0].size(); ++k) {
      double want = 0;
      for (int i = 0; i < 3; ++i) want += std::sin(0.37f * k + i) * 3.1f;
      max_err = std::max(max_err, std::abs(want / 3 - data[0][k]));
    }
    EXPECT_LT(max_err, precision == net::WirePrecision::fp16 ? 0.01 : 0.1);
  }
}

TEST(NodeTest, ReduceScatterAllGatherAndBroadcast) {
  Swarm swarm(4);
  auto nodes = swarm.start(4);
  const size_t n = 1001;
  std::vector<std::vector<float>> data(4);
  std::vector<net::Work> works;
  net::CollectiveOptions o;
  o.order = net::RingOrder::by_id;
  for (int i = 0; i < 4; ++i) {
    data[i] = ramp(n, static_cast<float>(i));
    works.push_back(nodes[i]->reduce_scatter(data[i], o));
  }
  std::vector<net::Shard> shards;
  for (int i = 0; i < 4; ++i) {
    const auto r = works[i].wait();
    shards.push_back(r.shard);
    for (size_t k = r.shard.begin; k < r.shard.end; ++k)
      ASSERT_EQ(data[i][k], 4 * static_cast<float>(k % 101) + 6);
  }
  // All-gather the reduced shards: everyone ends with the full reduced vector.
  works.clear();
  for (int i = 0; i < 4; ++i) works.push_back(nodes[i]->all_gather(data[i], o));
  for (auto& w : works) w.wait();
  for (int i = 0; i < 4; ++i)
    for (size_t k = 0; k < n; ++k) ASSERT_EQ(data[i][k], 4 * static_cast<float>(k % 101) + 6);
  // Broadcast from peer 2.
  works.clear();
  o.root = nodes[2]->id();
  for (int i = 0; i < 4; ++i) {
    data[i] = ramp(n, 100.0f * i);
    works.push_back(nodes[i]->broadcast(data[i], o));
  }
  for (auto& w : works) w.wait();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(data[i], ramp(n, 200.0f));
}

TEST(NodeTest, DisagreeingCallsFailEverywhereWithTheReason) {
  Swarm swarm(2);
  auto nodes = swarm.start(2);
  std::vector<float> a(100), b(200);
  auto wa = nodes[0]->all_reduce(a, {});
  auto wb = nodes[1]->all_reduce(b, {});
  for (auto* w : {&wa, &wb}) {
    try {
      w->wait();
      FAIL() << "expected a disagreement error";
    } catch (const starling::NetError& e) {
      EXPECT_NE(std::string(e.what()).find("disagree"), std::string::npos) << e.what();
    }
  }
  // The swarm is still usable afterwards.
  std::vector<float> c(50, 1.0f), d(50, 2.0f);
  auto wc = nodes[0]->all_reduce(c, {});
  auto wd = nodes[1]->all_reduce(d, {});
  wc.wait();
  wd.wait();
  EXPECT_EQ(c, std::vector<float>(50, 3.0f));
}

// A call waits for the others at most the node's collective timeout, unless it names a limit of
// its own (a peer that knows the others are busy first with a long transfer): then it outlasts
// the timeout and runs when the others come.
TEST(NodeTest, AWaitLimitOutlastsTheCollectiveTimeout) {
  Swarm swarm(2);
  std::vector<std::unique_ptr<net::Node>> nodes;
  for (int i = 0; i < 2; ++i) {
    net::NodeOptions o = swarm.options(i, i == 0 ? "" : nodes[0]->endpoint());
    o.collective_timeout = 1000ms;
    nodes.push_back(std::make_unique<net::Node>(o));
  }
  for (auto& node : nodes) ASSERT_TRUE(node->wait_for_members(2, 5s));
  std::vector<float> a(10, 1.0f), b(10, 2.0f);
  auto t0 = std::chrono::steady_clock::now();
  try {
    nodes[0]->all_reduce(a, {}).wait();
    FAIL() << "expected a timeout";
  } catch (const starling::NetError& e) {
    EXPECT_NE(std::string(e.what()).find("timed out after 1 s"), std::string::npos) << e.what();
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 1900ms);
  net::CollectiveOptions patient;
  patient.wait_limit = 5000ms;
  t0 = std::chrono::steady_clock::now();
  auto w0 = nodes[0]->all_reduce(a, patient);
  std::this_thread::sleep_for(2500ms);
  auto w1 = nodes[1]->all_reduce(b, {});
  w0.wait();
  w1.wait();
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 2500ms);
  EXPECT_EQ(a, std::vector<float>(10, 3.0f));
  EXPECT_EQ(b, std::vector<float>(10, 3.0f));
}

// A peer whose contribution holds a NaN, with reject_non_finite: the all-reduce fails on every
// participant, naming that peer, and nothing non-finite is left in anyone's result. An overflow
// to infinity while summing is caught where it arises, naming the neighbour it came from.
TEST(NodeTest, NonFiniteContributionsAreRejectedAndTheSenderNamed) {
  Swarm swarm(4);
  auto nodes = swarm.start(4);
  net::CollectiveOptions o;
  o.reject_non_finite = true;
  const auto run = [&](const std::vector<std::vector<float>>& in) {
    std::vector<std::vector<float>> data = in;
    std::vector<net::Work> works;
    for (int i = 0; i < 4; ++i) works.push_back(nodes[i]->all_reduce(data[i], o));
    std::vector<std::string> errors;
    for (auto& w : works) {
      try {
        w.wait();
        errors.emplace_back();
      } catch (const starling::NetError& e) {
        errors.emplace_back(e.what());
      }
    }
    return errors;
  };
  std::vector<std::vector<float>> data(4, ramp(20011, 1));
  data[2][12345] = std::nanf("");
  for (const auto& e : run(data)) {
    EXPECT_NE(e.find("(p2)'s own contribution holds non-finite values"), std::string::npos) << e;
  }
  // Every element finite, but two peers' 3e38 overflow when added: the peer that adds them
  // names the neighbour the partial sum came from. (The others fail too, with that reason or,
  // when the failed peer's direct link closes before its abort arrives, with the link's.)
  data[2][12345] = 3e38f;
  data[3][12345] = 3e38f;
  int named = 0;
  for (const auto& e : run(data)) {
    EXPECT_NE(e, "");
    named += e.find("non-finite values arrived from peer") != std::string::npos;
  }
  EXPECT_GE(named, 1);
  // Clean contributions go through, and without the check a NaN spreads as before.
  data[2][12345] = data[3][12345] = 1;
  for (const auto& e : run(data)) EXPECT_EQ(e, "");
  o.reject_non_finite = false;
  data[2][12345] = std::nanf("");
  std::vector<std::vector<float>> plain = data;
  std::vector<net::Work> works;
  for (int i = 0; i < 4; ++i) works.push_back(nodes[i]->all_reduce(plain[i], o));
  for (auto& w : works) w.wait();
  EXPECT_TRUE(std::isnan(plain[0][12345]));
}

TEST(NodeTest, LeavingPeerIsExcludedWithoutWaitingForATimeout) {
  Swarm swarm(3);
  auto nodes = swarm.start(3);
  nodes[2]->leave();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<float> a(1000, 1.0f), b(1000, 2.0f);
  auto wa = nodes[0]->all_reduce(a, {});
  auto wb = nodes[1]->all_reduce(b, {});
  EXPECT_EQ(wa.wait().ring.size(), 2u);
  wb.wait();
  EXPECT_EQ(a, std::vector<float>(1000, 3.0f));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 900ms);  // below the 1 s peer timeout
  bool saw_left = false;
  for (const auto& m : nodes[0]->members())
    if (m.info.id == nodes[2]->id()) saw_left = m.state == net::MemberState::left;
  EXPECT_TRUE(saw_left);
}

TEST(NodeTest, PeerJoiningBetweenRoundsTakesPartInTheNext) {
  Swarm swarm(3);
  auto nodes = swarm.start(2);
  std::vector<float> a(300, 1.0f), b(300, 2.0f);
  auto wa = nodes[0]->all_reduce(a, {});
  auto wb = nodes[1]->all_reduce(b, {});
  wa.wait();
  wb.wait();
  nodes.push_back(std::make_unique<net::Node>(swarm.options(2, nodes[1]->endpoint())));
  for (auto& n : nodes) ASSERT_TRUE(n->wait_for_members(3, 5s));
  std::vector<std::vector<float>> data{std::vector<float>(300, 1.0f), std::vector<float>(300, 2.0f),
                                       std::vector<float>(300, 4.0f)};
  std::vector<net::Work> works;
  for (int i = 0; i < 3; ++i) works.push_back(nodes[i]->all_reduce(data[i], {}));
  for (auto& w : works) EXPECT_EQ(w.wait().ring.size(), 3u);
  for (auto& d : data) EXPECT_EQ(d, std::vector<float>(300, 7.0f));
}

TEST(NodeTest, OutsiderWithUnknownKeyCannotJoin) {
  Swarm swarm(2);
  auto nodes = swarm.start(1);
  auto outsider = swarm.options(0, nodes[0]->endpoint());
  outsider.keys = net::generate_keypair();  // not on the allowlist
  outsider.allowlist.push_back({outsider.keys.public_key, ""});
  outsider.join_timeout = 1500ms;
  EXPECT_THROW(net::Node{outsider}, starling::NetError);
  EXPECT_GT(nodes[0]->counters().refused_connections, 0u);
  EXPECT_EQ(nodes[0]->members().size(), 1u);
  EXPECT_TRUE(swarm.sink.contains("not on the allowlist"));
}

TEST(NodeTest, OutsiderCannotDeliverAMessage) {
  Swarm swarm(2);
  auto nodes = swarm.start(2);
  // A raw socket with an unknown key, speaking the right protocol to the right server key.
  const auto key = net::generate_keypair();
  zmq::context_t ctx;
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::curve_serverkey, swarm.keys_[0].public_key);
  s.set(zmq::sockopt::curve_publickey, key.public_key);
  s.set(zmq::sockopt::curve_secretkey, key.secret_key);
  s.connect(nodes[0]->endpoint());
  // It even claims to be peer 1 and sends a "leave".
  net::Header h;
  h.type = net::MsgType::leave;
  h.sender = nodes[1]->id();
  std::byte raw[net::kHeaderBytes];
  net::seal_header(h, {}, raw);
  for (int i = 0; i < 5; ++i) {
    s.send(zmq::const_buffer(raw, sizeof raw),
           zmq::send_flags::sndmore | zmq::send_flags::dontwait);
    s.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::dontwait);
  }
  std::this_thread::sleep_for(500ms);
  for (const auto& m : nodes[0]->members()) EXPECT_EQ(m.state, net::MemberState::alive);
  EXPECT_GT(nodes[0]->counters().refused_connections, 0u);
}

TEST(NodeTest, OutsiderCannotReadFromTheSwarm) {
  // An impostor listens where a member is told to join; it does not hold an allowlisted secret
  // key, so the member's CURVE handshake fails and not a byte of a message reaches it.
  Swarm swarm(2);
  const auto key = net::generate_keypair();
  zmq::context_t ctx;
  zmq::socket_t impostor(ctx, zmq::socket_type::router);
  impostor.set(zmq::sockopt::curve_server, 1);
  impostor.set(zmq::sockopt::curve_secretkey, key.secret_key);
  impostor.bind("tcp://127.0.0.1:0");
  const std::string where = impostor.get(zmq::sockopt::last_endpoint);
  auto joiner = swarm.options(1, where);
  joiner.join_timeout = 1500ms;
  auto attempt = std::async(std::launch::async, [&] { net::Node node(joiner); });
  zmq::pollitem_t item{impostor.handle(), 0, ZMQ_POLLIN, 0};
  EXPECT_EQ(zmq::poll(&item, 1, 1200ms), 0);
  EXPECT_THROW(attempt.get(), starling::NetError);
}

TEST(NodeTest, InsecurePeerCannotJoinASecureSwarm) {
  Swarm swarm(2);
  auto nodes = swarm.start(1);
  auto o = swarm.options(1, nodes[0]->endpoint());
  o.insecure = true;
  o.join_timeout = 1500ms;
  EXPECT_THROW(net::Node{o}, starling::NetError);
  EXPECT_EQ(nodes[0]->members().size(), 1u);
}

// A message of another release (the magic right, the version not) from an allowlisted peer: the
// member drops it, logs both versions, and answers once per connection with other_version in
// its own version, however many such messages come.
TEST(NodeTest, AMemberAnswersAPeerOfAnotherReleaseOnceInItsOwnVersion) {
  Swarm swarm(2);
  auto nodes = swarm.start(1);
  zmq::context_t ctx;
  zmq::socket_t s(ctx, zmq::socket_type::dealer);
  s.set(zmq::sockopt::linger, 0);
  s.set(zmq::sockopt::curve_serverkey, swarm.keys_[0].public_key);
  s.set(zmq::sockopt::curve_publickey, swarm.keys_[1].public_key);
  s.set(zmq::sockopt::curve_secretkey, swarm.keys_[1].secret_key);
  s.connect(nodes[0]->endpoint());
  net::Header h;
  h.type = net::MsgType::hello;
  h.sender = net::peer_id_from_public_key(swarm.keys_[1].public_key);
  std::byte raw[net::kHeaderBytes];
  net::seal_header(h, {}, raw);
  raw[4] = std::byte{net::kWireVersion + 1};
  for (int i = 0; i < 3; ++i) {
    s.send(zmq::const_buffer(raw, sizeof raw), zmq::send_flags::sndmore);
    s.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::none);
  }
  zmq::pollitem_t item{s.handle(), 0, ZMQ_POLLIN, 0};
  ASSERT_EQ(zmq::poll(&item, 1, 3000ms), 1) << "no answer to a message of another version";
  zmq::message_t header, payload;
  ASSERT_TRUE(s.recv(header));
  ASSERT_TRUE(header.more());
  ASSERT_TRUE(s.recv(payload));
  const auto decoded =
      net::decode_header({static_cast<const std::byte*>(header.data()), header.size()}, 1 << 20);
  ASSERT_TRUE(decoded.ok()) << decoded.error;
  EXPECT_EQ(decoded.header.type, net::MsgType::other_version);
  EXPECT_EQ(decoded.header.sender, nodes[0]->id());
  EXPECT_EQ(payload.size(), 0u);
  // One answer for the three messages.
  EXPECT_EQ(zmq::poll(&item, 1, 500ms), 0);
  EXPECT_TRUE(swarm.sink.contains("wire version " + std::to_string(net::kWireVersion + 1) +
                                  ", this peer speaks version " +
                                  std::to_string(net::kWireVersion)));
  EXPECT_EQ(nodes[0]->members().size(), 1u);
}

// A joiner whose entry point runs another release hears so at once and stops with both versions
// named, instead of waiting out its join timeout. (The member of another release is a CURVE
// server holding an allowlisted key that answers anything in wire version kWireVersion + 1.) With
// a second entry point of its own release beside it, the joiner gets in through that one.
TEST(NodeTest, AJoinerOfAnotherReleaseStopsAtOnceNamingBothVersions) {
  Swarm swarm(3);
  zmq::context_t ctx;
  zmq::socket_t other(ctx, zmq::socket_type::router);
  other.set(zmq::sockopt::linger, 0);
  other.set(zmq::sockopt::curve_server, 1);
  other.set(zmq::sockopt::curve_secretkey, swarm.keys_[0].secret_key);
  other.bind("tcp://127.0.0.1:0");
  const std::string where = other.get(zmq::sockopt::last_endpoint);
  std::atomic<bool> done{false};
  std::thread member([&] {
    while (!done) {
      zmq::pollitem_t item{other.handle(), 0, ZMQ_POLLIN, 0};
      if (zmq::poll(&item, 1, 50ms) <= 0) continue;
      std::vector<zmq::message_t> frames;
      for (bool more = true; more;) {
        zmq::message_t f;
        if (!other.recv(f)) break;
        more = f.more();
        frames.push_back(std::move(f));
      }
      net::Header h;
      h.type = net::MsgType::other_version;
      std::byte raw[net::kHeaderBytes];
      net::seal_header(h, {}, raw);
      raw[4] = std::byte{net::kWireVersion + 1};
      other.send(frames[0], zmq::send_flags::sndmore);
      other.send(zmq::const_buffer(raw, sizeof raw), zmq::send_flags::sndmore);
      other.send(zmq::const_buffer(nullptr, 0), zmq::send_flags::none);
    }
  });
  // Stops the member however the test ends (a thread still joinable at its end would abort).
  struct Stop {
    std::atomic<bool>& done;
    std::thread& member;
    ~Stop() {
      done = true;
      member.join();
    }
  } stop{done, member};
  auto joiner = swarm.options(1, where);
  joiner.join_timeout = 30000ms;
  const auto t0 = std::chrono::steady_clock::now();
  std::string error;
  try {
    net::Node node(joiner);
  } catch (const starling::NetError& e) {
    error = e.what();
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(seconds, 10) << "waited for the join timeout";
  EXPECT_NE(error.find("could not join the swarm through " + where +
                       ": it runs another Starling release (wire version: " + where +
                       " speaks version " + std::to_string(net::kWireVersion + 1) +
                       "; this peer speaks version " + std::to_string(net::kWireVersion) + ")"),
            std::string::npos)
      << error;

  // Another entry point of this release beside it: the joiner gets in there.
  auto first = std::make_unique<net::Node>(swarm.options(2));
  joiner.join = {where, first->endpoint()};
  net::Node node(joiner);
  EXPECT_TRUE(node.wait_for_members(2, 5s));
}

TEST(NodeTest, StatusReportsMembersAndLinks) {
  Swarm swarm(3);
  auto nodes = swarm.start(3);
  net::StatusQuery q;
  q.entry = nodes[1]->endpoint();
  q.keys = swarm.keys_[0];
  q.allowlist = swarm.allow_;
  // A few heartbeats: pings measured and gossiped, and the probes each member sends a newcomer
  // read (a probe that waited queued is asked for again, larger, at the next heartbeat).
  net::StatusReport report;
  int rtts = 0, bandwidths = 0;
  for (const auto until = std::chrono::steady_clock::now() + 5s;
       std::chrono::steady_clock::now() < until && (rtts < 6 || bandwidths < 2);) {
    std::this_thread::sleep_for(200ms);
    report = net::query_status(q);
    rtts = bandwidths = 0;
    for (const auto& l : report.links) {
      rtts += l.stats.rtt_ms >= 0;
      bandwidths += l.stats.mbit_per_s > 0;
    }
  }
  EXPECT_EQ(report.answered_by, nodes[1]->id());
  ASSERT_EQ(report.members.size(), 3u);
  for (const auto& m : report.members) EXPECT_EQ(m.state, "alive");
  EXPECT_GE(rtts, 6);        // every ordered pair pinged
  EXPECT_GE(bandwidths, 2);  // probes at first contact
  const std::string table = net::format_status(report);
  EXPECT_NE(table.find("p2"), std::string::npos) << table;
  // An operator asks its own peer with that peer's key, at a plain address: the query tries
  // every allowlisted key, its own too.
  q.entry = nodes[0]->endpoint();
  EXPECT_EQ(net::query_status(q).answered_by, nodes[0]->id());
}

// A joiner that started before the member it joins finds that member older than itself and
// makes itself younger: its hello goes out again with the new age. The member meets it once all
// the same: one introduction, so one bandwidth probe of the link (it used to probe again, 2 x 256
// KiB by default on what may be a slow link).
TEST(NodeTest, AJoinerThatMakesItselfYoungerIsMetOnce) {
  // The member's address, known before it listens: the joiner connects once it does.
  const auto free_port = [] {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof addr;
    int port = 0;
    if (fd >= 0 && ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
        ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
      port = ntohs(addr.sin_port);
    if (fd >= 0) ::close(fd);
    return port;
  };
  // The joiner takes its age in its own thread: where that thread started so late that the
  // member is older after all, nothing moves, and the swarm is started again.
  for (int attempt = 1; attempt <= 3; ++attempt) {
    Swarm swarm(2);
    const int port = free_port();
    ASSERT_GT(port, 0);
    const std::string entry = "tcp://127.0.0.1:" + std::to_string(port);
    auto joining = std::async(std::launch::async,
                              [&] { return std::make_unique<net::Node>(swarm.options(1, entry)); });
    std::this_thread::sleep_for(300ms);  // the joiner's age is taken: older than the member's
    starling::net::testing::LogSink member_log;
    net::NodeOptions o = swarm.options(0);
    o.listen = entry;
    o.log = member_log.fn();
    net::Node member(o);
    const auto joiner = joining.get();
    ASSERT_TRUE(joiner->wait_for_members(2, 5s));
    if (joiner->joined_at_ms() != member.joined_at_ms() + 1) {
      std::cout << "attempt " << attempt << ": the joiner was younger from the start\n";
      continue;
    }
    // Until the member holds the joiner's new age: its second hello (or a heartbeat) has come.
    const auto knows_new_age = [&] {
      for (const auto& m : member.members())
        if (m.info.id == joiner->id()) return m.info.joined_at_ms == joiner->joined_at_ms();
      return false;
    };
    for (const auto until = std::chrono::steady_clock::now() + 5s;
         !knows_new_age() && std::chrono::steady_clock::now() < until;)
      std::this_thread::sleep_for(20ms);
    ASSERT_TRUE(knows_new_age());
    std::this_thread::sleep_for(200ms);  // an introduction it caused is logged by now
    int met = 0;
    {
      std::lock_guard lock(member_log.mutex);
      for (const auto& line : member_log.lines)
        met += line.find(" is a member") != std::string::npos;
    }
    EXPECT_EQ(met, 1);
    return;
  }
  ADD_FAILURE() << "in three attempts the joiner never started older than the member";
}

TEST(NodeTest, AsyncHandleOverlapsWithTheCaller) {
  Swarm swarm(2);
  auto nodes = swarm.start(2);
  std::vector<float> a(1 << 20, 1.0f), b(1 << 20, 1.0f);
  auto wa = nodes[0]->all_reduce(a, {});
  // Peer 1 launches later: peer 0's handle is pending meanwhile, and the caller is free.
  std::this_thread::sleep_for(100ms);
  EXPECT_FALSE(wa.test());
  auto wb = nodes[1]->all_reduce(b, {});
  EXPECT_TRUE(wa.wait_for(10s));
  wb.wait();
  EXPECT_EQ(a[12345], 2.0f);
}

TEST(NodeTest, EveryCollectiveForManySizesWithFivePeers) {
  // Sizes around the segment and chunk boundaries (chunk = 1024 floats here), and sizes smaller
  // than the number of peers, where some segments are empty.
  Swarm swarm(5);
  auto nodes = swarm.start(5);
  net::CollectiveOptions o;
  o.order = net::RingOrder::by_id;
  for (size_t n : {0ul, 1ul, 4ul, 5ul, 6ul, 1024ul, 5119ul, 5120ul, 5121ul, 100003ul}) {
    SCOPED_TRACE("size " + std::to_string(n));
    std::vector<std::vector<float>> data(5);
    std::vector<net::Work> works;
    for (int i = 0; i < 5; ++i) {
      data[i] = ramp(n, static_cast<float>(i));
      works.push_back(nodes[i]->all_reduce(data[i], o));
    }
    for (auto& w : works) w.wait();
    for (int i = 0; i < 5; ++i)
      for (size_t k = 0; k < n; ++k) ASSERT_EQ(data[i][k], 5 * static_cast<float>(k % 101) + 10);
    works.clear();
    for (int i = 0; i < 5; ++i) {
      data[i] = ramp(n, static_cast<float>(i));
      works.push_back(nodes[i]->reduce_scatter(data[i], o));
    }
    size_t covered = 0;
    for (int i = 0; i < 5; ++i) {
      const auto r = works[i].wait();
      covered += r.shard.end - r.shard.begin;
      for (size_t k = r.shard.begin; k < r.shard.end; ++k)
        ASSERT_EQ(data[i][k], 5 * static_cast<float>(k % 101) + 10);
    }
    EXPECT_EQ(covered, n);
    works.clear();
    o.root = nodes[4]->id();
    for (int i = 0; i < 5; ++i) {
      data[i] = ramp(n, static_cast<float>(i));
      works.push_back(nodes[i]->broadcast(data[i], o));
    }
    for (auto& w : works) w.wait();
    for (int i = 0; i < 5; ++i) ASSERT_EQ(data[i], ramp(n, 4.0f));
  }
}

namespace {

// Fills data[i] with ramp(n, i) and runs `op(node, data)` on every node at once.
template <typename Op>
void on_every_node(std::vector<std::unique_ptr<net::Node>>& nodes,
                   std::vector<std::vector<float>>& data, size_t n, Op op) {
  std::vector<net::Work> works;
  for (size_t i = 0; i < nodes.size(); ++i) {
    data[i] = ramp(n, static_cast<float>(i));
    works.push_back(op(*nodes[i], data[i]));
  }
  for (auto& w : works) w.wait();
}

}  // namespace

// Four peers, one of which keeps its chunks on ZeroMQ: its two links fall back, the others are
// direct (sealed with CURVE, plain when insecure). Every collective and a lossy precision, twice
// (kept connections reused).
class DirectLinksNodeTest : public ::testing::TestWithParam<bool> {};

TEST_P(DirectLinksNodeTest, PeersCarryChunksOnDirectLinksWhereBothEndsHaveThem) {
  Swarm swarm(4);
  std::vector<std::unique_ptr<net::Node>> nodes;
  for (int i = 0; i < 4; ++i) {
    auto o = swarm.options(i, i == 0 ? "" : nodes[0]->endpoint());
    o.insecure = GetParam();
    o.direct_data = i != 2;
    nodes.push_back(std::make_unique<net::Node>(o));
  }
  for (auto& n : nodes) ASSERT_TRUE(n->wait_for_members(4, 5s));
  for (const auto& m : nodes[0]->members())
    EXPECT_EQ(m.info.data_port != 0, m.info.id != nodes[2]->id()) << m.info.name;
  net::CollectiveOptions o;
  o.order = net::RingOrder::by_id;
  o.root = nodes[1]->id();
  net::CollectiveOptions lossy = o;
  lossy.precision = net::WirePrecision::int8;
  std::vector<std::vector<float>> data(4);
  for (int round = 0; round < 2; ++round) {
    for (size_t n : {3ul, 5121ul, 100003ul}) {
      SCOPED_TRACE("round " + std::to_string(round) + ", size " + std::to_string(n));
      on_every_node(nodes, data, n, [&](net::Node& p, auto& d) { return p.all_reduce(d, o); });
      for (int i = 0; i < 4; ++i)
        for (size_t k = 0; k < n; ++k) ASSERT_EQ(data[i][k], 4 * static_cast<float>(k % 101) + 6);
      on_every_node(nodes, data, n, [&](net::Node& p, auto& d) { return p.all_reduce(d, lossy); });
      for (int i = 1; i < 4; ++i) ASSERT_EQ(data[i], data[0]);
      on_every_node(nodes, data, n, [&](net::Node& p, auto& d) { return p.all_gather(d, o); });
      for (int i = 1; i < 4; ++i) ASSERT_EQ(data[i], data[0]);
      on_every_node(nodes, data, n, [&](net::Node& p, auto& d) { return p.broadcast(d, o); });
      for (int i = 0; i < 4; ++i) ASSERT_EQ(data[i], ramp(n, 1.0f));
    }
  }
  // By id the ring is some order of the four; whoever sends to peer 2, or is peer 2, sends
  // through ZeroMQ. The others' chunks went direct.
  int direct_senders = 0;
  for (int i = 0; i < 4; ++i)
    if (nodes[i]->counters().direct_bytes_sent > 0) ++direct_senders;
  EXPECT_EQ(nodes[2]->counters().direct_bytes_sent, 0u);
  EXPECT_EQ(direct_senders, 2);
}

INSTANTIATE_TEST_SUITE_P(NodeTest, DirectLinksNodeTest, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "Insecure" : "Curve"; });

namespace {

std::vector<uint8_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }
std::string text_of(const std::vector<uint8_t>& b) { return {b.begin(), b.end()}; }

}  // namespace

TEST(NodeTest, PointToPointMessagesMatchByPeerAndTag) {
  Swarm swarm(3);
  auto nodes = swarm.start(3);
  const net::PeerId p0 = nodes[0]->id(), p2 = nodes[2]->id();
  auto early = nodes[1]->recv(p0, 11);  // posted before its message exists
  std::vector<net::Transfer> sends = {nodes[0]->send(nodes[1]->id(), 7, bytes_of("a")),
                                      nodes[0]->send(nodes[1]->id(), 7, bytes_of("b")),
                                      nodes[0]->send(nodes[1]->id(), 9, bytes_of("c")),
                                      nodes[2]->send(nodes[1]->id(), 7, bytes_of("z")),
                                      nodes[0]->send(nodes[1]->id(), 11, bytes_of("early"))};
  for (auto& s : sends) EXPECT_TRUE(s.wait().empty());
  // Out of order across tags and senders; in order within one (sender, tag).
  EXPECT_EQ(text_of(nodes[1]->recv(p0, 9).wait()), "c");
  EXPECT_EQ(text_of(nodes[1]->recv(p2, 7).wait()), "z");
  EXPECT_EQ(text_of(nodes[1]->recv(p0, 7).wait()), "a");
  EXPECT_EQ(text_of(nodes[1]->recv(p0, 7).wait()), "b");
  EXPECT_EQ(text_of(early.wait()), "early");
  // To itself: delivered locally.
  nodes[0]->send(p0, 3, bytes_of("self")).wait();
  EXPECT_EQ(text_of(nodes[0]->recv(p0, 3).wait()), "self");
  // A receive whose message never comes stays pending.
  EXPECT_FALSE(nodes[1]->recv(p0, 12).wait_for(200ms));
}

// Messages nobody receives pile up to a bound (4096), then are dropped: the first 4096 stay,
// and the drops are logged at the 1st, 2nd, 4th, ... one, not each (a peer that keeps sending
// to one that does not read yet would flood it).
TEST(NodeTest, UnclaimedMessagesAreBoundedAndTheirDropsLoggedSparingly) {
  Swarm swarm(2);
  auto nodes = swarm.start(2);
  const net::PeerId from = nodes[0]->id(), to = nodes[1]->id();
  constexpr int kKept = 4096, kDropped = 128;
  // Neither a message that a posted receive waits for nor a keep-latest tag's is dropped.
  auto awaited = nodes[1]->recv(from, 6);
  nodes[1]->keep_latest_unclaimed(8);
  nodes[1]->send(to, 99, {}).wait();  // the node's thread takes requests in order: once this
  nodes[1]->recv(to, 99).wait();      // arrived, the tag is registered and the receive posted
  for (int i = 0; i < kKept + kDropped; ++i) nodes[0]->send(to, 5, bytes_of(std::to_string(i)));
  const std::string last = "(" + std::to_string(kDropped) + " dropped so far)";
  for (int i = 0; i < 500 && !swarm.sink.contains(last); ++i) std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(swarm.sink.contains(last));
  int lines = 0;
  {
    std::lock_guard lock(swarm.sink.mutex);
    for (const auto& l : swarm.sink.lines)
      lines += l.find("dropped a message from") != std::string::npos ? 1 : 0;
  }
  EXPECT_EQ(lines, 8) << "drops 1, 2, 4, ..., 128";
  // The bound is still full.
  for (const char* status : {"x", "y", "z"}) nodes[0]->send(to, 8, bytes_of(status));
  nodes[0]->send(to, 6, bytes_of("awaited"));
  ASSERT_TRUE(awaited.wait_for(10s)) << "a message a receive waited for was dropped at the bound";
  EXPECT_EQ(text_of(awaited.wait()), "awaited");
  // Sent before it on the same connection, the statuses are here: the latest was kept.
  EXPECT_EQ(text_of(nodes[1]->recv(from, 8).wait()), "z");
  EXPECT_EQ(text_of(nodes[1]->recv(from, 5).wait()), "0");
  EXPECT_EQ(text_of(nodes[1]->recv(from, 5).wait()), "1");
}

TEST(NodeTest, PointToPointMovesWhileACollectiveWaits) {
  Swarm swarm(3);
  auto nodes = swarm.start(3);
  // Peers 0 and 1 enter an all-reduce that cannot start before peer 2 joins it.
  std::vector<float> a(100, 1.0f), b(100, 2.0f), c(100, 3.0f);
  auto wa = nodes[0]->all_reduce(a, {});
  auto wb = nodes[1]->all_reduce(b, {});
  std::this_thread::sleep_for(100ms);
  nodes[0]->send(nodes[1]->id(), 1, bytes_of("meanwhile"));
  auto got = nodes[1]->recv(nodes[0]->id(), 1);
  ASSERT_TRUE(got.wait_for(2s)) << "a message waited for the collective";
  EXPECT_EQ(text_of(got.wait()), "meanwhile");
  EXPECT_FALSE(wa.test());
  auto wc = nodes[2]->all_reduce(c, {});
  wa.wait();
  wb.wait();
  wc.wait();
  EXPECT_EQ(a, std::vector<float>(100, 6.0f));
}

TEST(NodeTest, PointToPointFailsWhenThePeerIsGone) {
  Swarm swarm(3);
  auto nodes = swarm.start(3);
  const net::PeerId gone = nodes[2]->id();
  nodes[2]->send(nodes[1]->id(), 5, bytes_of("last words")).wait();
  auto pending = nodes[1]->recv(gone, 6);
  std::this_thread::sleep_for(100ms);
  nodes[2]->leave();
  ASSERT_TRUE(pending.wait_for(900ms)) << "not failed before the 1 s peer timeout";
  try {
    pending.wait();
    ADD_FAILURE() << "a receive from a peer that left succeeded";
  } catch (const starling::NetError& e) {
    EXPECT_NE(std::string(e.what()).find("left"), std::string::npos) << e.what();
  }
  // What it sent before leaving still arrives; anything more fails at once.
  EXPECT_EQ(text_of(nodes[1]->recv(gone, 5).wait()), "last words");
  EXPECT_THROW(nodes[1]->recv(gone, 5).wait(), starling::NetError);
  // Peer 0 learns of the departure from its own copy of the announcement, maybe a moment later.
  const auto has_left = [&] {
    for (const auto& m : nodes[0]->members())
      if (m.info.id == gone) return m.state == net::MemberState::left;
    return false;
  };
  for (int i = 0; i < 90 && !has_left(); ++i) std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(has_left()) << "peer 0 did not learn of the departure before the 1 s peer timeout";
  EXPECT_THROW(nodes[0]->send(gone, 1, bytes_of("x")).wait(), starling::NetError);
  // Too big for the connection's message limit: refused, not sent.
  net::NodeOptions o = swarm.options(0);
  EXPECT_THROW(
      nodes[0]->send(nodes[1]->id(), 1, std::vector<uint8_t>(o.max_message_bytes + 1)).wait(),
      starling::NetError);
}
