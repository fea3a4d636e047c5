// `starling keygen` and `starling status` end to end: key files, refusals with clear messages,
// and a status table from a live swarm.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "run_cli.h"
#include "starling/common/process.h"

namespace fs = std::filesystem;
using starling::Process;
using starling::testing::run_cli;
using namespace std::chrono_literals;

namespace {

class NetCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("starling_net_cli_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  std::string slurp(const std::string& name) const {
    std::ifstream in(path(name));
    std::stringstream s;
    s << in.rdbuf();
    return s.str();
  }
  fs::path dir_;
};

}  // namespace

TEST_F(NetCliTest, KeygenWritesAPrivateKeyAndAPublicTwin) {
  const auto r = run_cli("keygen --out " + path("alice.key") + " --name alice");
  ASSERT_EQ(r.code, 0) << r.output;
  struct stat st {};
  ASSERT_EQ(::stat(path("alice.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  EXPECT_NE(slurp("alice.key").find("secret-key = "), std::string::npos);
  const std::string pub = slurp("alice.pub");
  EXPECT_EQ(pub.size(), 40u + 7u);  // key, " alice", newline
  EXPECT_EQ(pub.substr(41), "alice\n");
  // Never overwrites a key.
  const auto again = run_cli("keygen --out " + path("alice.key"));
  EXPECT_EQ(again.code, 2);
  EXPECT_NE(again.output.find("already exists"), std::string::npos) << again.output;
  // A line break in the name would split the .pub line that allowlists copy.
  const auto broken = run_cli("keygen --out " + path("bob.key") + " --name \"$(printf 'b\\nob')\"");
  EXPECT_EQ(broken.code, 2) << broken.output;
  EXPECT_NE(broken.output.find("may not hold control characters"), std::string::npos)
      << broken.output;
  EXPECT_FALSE(fs::exists(path("bob.key")));
}

TEST_F(NetCliTest, StatusRejectsBadArgumentsClearly) {
  auto r = run_cli("status --join localhost:7000 --insecure");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("is not tcp://HOST:PORT"), std::string::npos) << r.output;
  r = run_cli("status --join tcp://127.0.0.1:7000");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("--key and --allow"), std::string::npos) << r.output;
  std::ofstream(path("bad.allow")) << "not-a-key someone\n";
  ASSERT_EQ(run_cli("keygen --out " + path("me.key")).code, 0);
  r = run_cli("status --join tcp://127.0.0.1:7000 --key " + path("me.key") + " --allow " +
              path("bad.allow"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("bad.allow:1"), std::string::npos) << r.output;
  // Nobody listening: a clear error after the timeout, not a hang.
  r = run_cli("status --join tcp://127.0.0.1:9 --insecure --timeout 0.5");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.output.find("no status reply"), std::string::npos) << r.output;
  // NaN passes a "<= 0" check; it and a timeout past any wait used to wait forever.
  for (const char* timeout : {"nan", "inf", "1e300", "0"}) {
    r = run_cli(std::string("status --join tcp://127.0.0.1:9 --insecure --timeout ") + timeout);
    EXPECT_EQ(r.code, 2) << timeout << ": " << r.output;
    EXPECT_NE(r.output.find("--timeout must be above 0"), std::string::npos) << r.output;
  }
}

TEST_F(NetCliTest, StatusShowsALiveSwarm) {
  for (const char* n : {"a", "b", "me"})
    ASSERT_EQ(run_cli("keygen --out " + path(std::string(n) + ".key") + " --name " + n).code, 0);
  {
    std::ofstream allow(path("swarm.allow"));
    allow << "# the swarm\n";
    for (const char* n : {"a", "b", "me"}) allow << slurp(std::string(n) + ".pub");
  }
  const auto worker = [&](const std::string& name, const std::string& join) {
    std::vector<std::string> argv{STARLING_NET_WORKER,
                                  "--name",
                                  name,
                                  "--key",
                                  path(name + ".key"),
                                  "--allow",
                                  path("swarm.allow"),
                                  "--expect",
                                  "2",
                                  "--linger-ms",
                                  "20000"};
    if (!join.empty()) argv.insert(argv.end(), {"--join", join});
    return Process(argv, path(name + ".log"));
  };
  Process a = worker("a", "");
  const auto line = a.read_line(10s);
  ASSERT_TRUE(line);
  const auto at = line->find("tcp://");
  const std::string endpoint = line->substr(at, line->find('"', at) - at);
  Process b = worker("b", endpoint);
  ASSERT_TRUE(b.read_line(10s));
  ASSERT_TRUE(b.read_line(10s));       // both members known
  std::this_thread::sleep_for(700ms);  // heartbeats measure latencies
  const auto r = run_cli("status --join " + endpoint + " --key " + path("me.key") + " --allow " +
                         path("swarm.allow"));
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("2 members"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" a "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(" b "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("alive"), std::string::npos) << r.output;
}
