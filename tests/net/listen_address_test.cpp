// What a peer or a dashboard is told to listen on: ZeroMQ answers a host it cannot bind with
// "No such device" and HTTP has no scheme, so each mistake gets words of its own.
#include <gtest/gtest.h>

#include <string>

#include "starling/common/error.h"
#include "starling/net/dashboard.h"
#include "starling/net/transport.h"

namespace net = starling::net;

namespace {

// The message of what constructing with `listen` throws, or "" when nothing is thrown.
template <typename Make>
std::string error_of(Make make) {
  try {
    make();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

}  // namespace

// A host name, a malformed address, IPv6 (which the transport is not set up for) and an address
// of another machine are not addresses ZeroMQ binds: named as such, with what it takes instead.
// No name is looked up, and nothing is sent.
TEST(ListenAddressTest, AHostThatIsNotThisMachinesSaysWhatIsTaken) {
  for (const std::string listen :
       {"tcp://999.1.1.1:5555", "tcp://nohost.invalid:5555", "tcp://[::1]:0",
        "tcp://192.0.2.1:5555"}) {  // the last: an address for documentation, of no machine
    const std::string what = error_of([&] {
      net::TransportOptions o;
      o.listen = listen;
      o.insecure = true;
      o.log = [](const std::string&) {};
      net::Transport t(o);
    });
    EXPECT_NE(what.find("cannot listen on " + listen), std::string::npos) << what;
    EXPECT_NE(what.find("not an IPv4 address of this machine"), std::string::npos) << what;
    EXPECT_EQ(what.find("No such device"), std::string::npos) << what;
  }
  // A good address binds.
  net::TransportOptions o;
  o.insecure = true;
  o.log = [](const std::string&) {};
  EXPECT_NO_THROW(net::Transport{o});
}

// The dashboard serves HTTP on HOST:PORT: a peer's tcp:// address given to it names the scheme,
// not a taken port.
TEST(ListenAddressTest, ADashboardAddressWithASchemeIsNamed) {
  const auto source = [] { return net::StatusReport{}; };
  const std::string what =
      error_of([&] { net::Dashboard d(source, {.listen = "tcp://127.0.0.1:0"}); });
  EXPECT_NE(what.find("without a scheme"), std::string::npos) << what;
  EXPECT_EQ(what.find("port taken"), std::string::npos) << what;
  EXPECT_NE(error_of([&] { net::Dashboard d(source, {.listen = "127.0.0.1"}); }).find("HOST:PORT"),
            std::string::npos);
  EXPECT_EQ(error_of([&] { net::Dashboard d(source, {.listen = "127.0.0.1:0"}); }), "");
}
