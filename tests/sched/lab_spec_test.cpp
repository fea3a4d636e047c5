// The heterogeneous lab's TOML form: clusters, the links between them, single links, CPUs, and
// the errors a mistyped file gets; and the lab laid over a cost table as devices and links.
#include "starling/sched/lab_spec.h"

#include <gtest/gtest.h>

#include "starling/common/error.h"

namespace starling::sched {
namespace {

std::string error_of(const std::string& text) {
  try {
    parse_lab_spec(text, "lab.toml");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "no error";
}

TEST(LabSpec, ClustersBetweenAndLinksSetEveryPair) {
  const LabSpec lab = parse_lab_spec(R"(
peers = 5
rate = "1gbit"
clusters = [[0, 1], [2, 3]]
between = "10mbit"
cpus = [1, 1, 0.5, 0.5, 2]
[[link]]
peers = [1, 2]
rate = "8mbit"
)",
                                     "lab.toml");
  ASSERT_EQ(lab.peers, 5);
  EXPECT_DOUBLE_EQ(lab.bits_per_s[0][1], 1e9);
  EXPECT_DOUBLE_EQ(lab.bits_per_s[2][3], 1e9);
  EXPECT_DOUBLE_EQ(lab.bits_per_s[0][2], 10e6);
  EXPECT_DOUBLE_EQ(lab.bits_per_s[3][0], 10e6);
  EXPECT_DOUBLE_EQ(lab.bits_per_s[1][2], 8e6);  // the link overrides the clusters
  EXPECT_DOUBLE_EQ(lab.bits_per_s[2][1], 8e6);
  EXPECT_DOUBLE_EQ(lab.bits_per_s[4][0], 10e6);  // peer 4 is in no cluster: a group of its own
  EXPECT_DOUBLE_EQ(lab.bits_per_s[4][4], 0);
  EXPECT_EQ(lab.tc_rate(0, 2), "10000000bit");
  EXPECT_EQ(lab.tc_rate(1, 1), "unlimited");
  EXPECT_EQ(lab.cpus, (std::vector<double>{1, 1, 0.5, 0.5, 2}));
  EXPECT_NE(lab.describe().find("1gbit: 0-1 2-3"), std::string::npos) << lab.describe();
  EXPECT_NE(lab.describe().find("8mbit: 1-2"), std::string::npos) << lab.describe();
}

TEST(LabSpec, DelaysByDefaultBetweenClustersAndPerLink) {
  const LabSpec lab = parse_lab_spec(R"(
peers = 5
delay = "250us"
clusters = [[0, 1], [2, 3]]
between = "10mbit"
between_delay = "20ms"
[[link]]
peers = [1, 2]
delay = "0.05s"
[[link]]
peers = [3, 4]
delay = 0
)",
                                     "lab.toml");
  EXPECT_DOUBLE_EQ(lab.delay_s[0][1], 250e-6);
  EXPECT_DOUBLE_EQ(lab.delay_s[0][2], 0.020);
  EXPECT_DOUBLE_EQ(lab.delay_s[2][0], 0.020);
  EXPECT_DOUBLE_EQ(lab.delay_s[1][2], 0.05);     // the link overrides the clusters' delay ...
  EXPECT_DOUBLE_EQ(lab.bits_per_s[1][2], 10e6);  // ... and keeps their rate
  EXPECT_DOUBLE_EQ(lab.delay_s[4][3], 0);
  EXPECT_DOUBLE_EQ(lab.delay_s[2][2], 0);
  EXPECT_TRUE(lab.has_delays());
  EXPECT_FALSE(parse_lab_spec("peers = 2", "lab.toml").has_delays());
  EXPECT_NE(lab.describe().find("delay 20ms: 0-2 0-3"), std::string::npos) << lab.describe();
  EXPECT_NE(lab.describe().find("delay 50ms: 1-2"), std::string::npos) << lab.describe();
  CostTable t;
  t.nodes = {{"a", 1, 0, 10}, {"b", 1, 0, 0}};
  apply_lab(t, lab);
  EXPECT_DOUBLE_EQ(t.links[0][2].latency_s, 0.020);
  EXPECT_DOUBLE_EQ(t.links[1][2].latency_s, 0.05);
  EXPECT_DOUBLE_EQ(t.links[3][4].latency_s, 0);
}

TEST(LabSpec, DefaultsAreUnshapedWithoutQuotas) {
  const LabSpec lab = parse_lab_spec("peers = 3\ncpus = 0.5\n", "lab.toml");
  EXPECT_EQ(lab.tc_rate(0, 1), "unlimited");
  EXPECT_EQ(lab.cpus, (std::vector<double>{0.5, 0.5, 0.5}));
  EXPECT_TRUE(parse_lab_spec("peers = 2", "lab.toml").cpus.empty());
}

TEST(LabSpec, MistakesAreNamed) {
  EXPECT_NE(error_of("rate = \"1gbit\"").find("missing peers"), std::string::npos);
  EXPECT_NE(error_of("peers = 0").find("peers = 0: expected a peer count in 1..64"),
            std::string::npos);
  EXPECT_NE(error_of("peers = 2\nrate = \"fast\"").find("lab.toml: rate = \"fast\""),
            std::string::npos);
  EXPECT_NE(error_of("peers = 2\nlatency = 3").find("unknown key \"latency\""), std::string::npos);
  EXPECT_NE(error_of("peers = 2\nclusters = [[0, 2]]").find("clusters[0][1] = 2"),
            std::string::npos);
  EXPECT_NE(error_of("peers = 3\nclusters = [[0, 1], [1, 2]]").find("already in clusters[0]"),
            std::string::npos);
  EXPECT_NE(error_of("peers = 2\nbetween = \"1mbit\"").find("between needs clusters"),
            std::string::npos);
  EXPECT_NE(error_of("peers = 2\ncpus = [1, 1, 1]").find("3 values for 2 peers"),
            std::string::npos);
  EXPECT_NE(error_of("peers = 2\ncpus = [1, 0]").find("cpus[1] = 0"), std::string::npos);
  EXPECT_NE(error_of("peers = 2\nrate = \"0.5kbit\"").find("1kbit or more"), std::string::npos);
  EXPECT_NE(
      error_of("peers = 2\n[[link]]\npeers = [0, 0]\nrate = \"1mbit\"").find("two different peers"),
      std::string::npos);
  EXPECT_NE(error_of("peers = 2\n[[link]]\npeers = [0, 1]").find("link[0]: missing rate"),
            std::string::npos);
  EXPECT_NE(error_of("peers = 2\ndelay = \"20\"").find("delay = \"20\": expected a one-way delay"),
            std::string::npos);
  EXPECT_NE(error_of("peers = 2\ndelay = \"11s\"").find("at most 10s"), std::string::npos);
  EXPECT_NE(error_of("peers = 2\ndelay = \"-1ms\"").find("delay = \"-1ms\""), std::string::npos);
  for (const char* odd : {" 5ms", "+5ms", "0x14ms", "1e3ms", "nan", "5 ms", "5"})
    EXPECT_NE(error_of(std::string("peers = 2\ndelay = \"") + odd + "\"")
                  .find("expected a one-way delay"),
              std::string::npos)
        << odd;
  EXPECT_FALSE(parse_lab_spec("peers = 2\ndelay = 0.0", "lab.toml").has_delays());
  EXPECT_NE(error_of("peers = 2\nbetween_delay = \"1ms\"").find("between_delay needs clusters"),
            std::string::npos);
  EXPECT_NE(error_of("peers = 2\n[[link]]\npeers = [0, 1]\ndelay = 5").find("link[0].delay = 5"),
            std::string::npos);
  EXPECT_NE(error_of("peers = [").find("lab.toml: "), std::string::npos);
  EXPECT_THROW(read_lab_spec("/nonexistent/lab.toml"), ConfigError);
}

// The rates --link-rate, plan pipeline and a lab file take: tc's units, as scripts/netlab.sh
// reads them, so a rate the lab accepts is one the planner reads the same.
TEST(LinkRate, ReadsTcsUnitsInAnyCase) {
  EXPECT_DOUBLE_EQ(parse_link_rate("10mbit", "r"), 10e6 / 8);
  EXPECT_DOUBLE_EQ(parse_link_rate("10Mbit", "r"), 10e6 / 8);
  EXPECT_DOUBLE_EQ(parse_link_rate("250kbit", "r"), 250e3 / 8);
  EXPECT_DOUBLE_EQ(parse_link_rate("1GBIT", "r"), 1e9 / 8);
  EXPECT_DOUBLE_EQ(parse_link_rate("1tbit", "r"), 1e12 / 8);
  EXPECT_DOUBLE_EQ(parse_link_rate("8000bit", "r"), 1000);
  EXPECT_DOUBLE_EQ(parse_link_rate("5MBps", "r"), 5e6);
  EXPECT_DOUBLE_EQ(parse_link_rate("5kbps", "r"), 5e3);
  EXPECT_DOUBLE_EQ(parse_link_rate("2gbps", "r"), 2e9);
  EXPECT_DOUBLE_EQ(parse_link_rate("100bps", "r"), 100);
  for (const char* bad :
       {"", "5", "mbit", "0mbit", "-1mbit", "10 mbit", "10xbit", "fast", "infmbit"}) {
    try {
      parse_link_rate(bad, "--link-rate");
      ADD_FAILURE() << "accepted \"" << bad << "\"";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string("--link-rate = \"") + bad + "\""),
                std::string::npos)
          << e.what();
    }
  }
  EXPECT_DOUBLE_EQ(parse_lab_spec("peers = 2\nrate = \"Unlimited\"", "lab.toml").bits_per_s[0][1],
                   0);
}

TEST(LabSpec, AppliedToACostTable) {
  CostTable t;
  t.nodes = {{"a", 1, 0, 10}, {"b", 1, 0, 0}};
  t.reference_cpus = 2;
  const LabSpec lab = parse_lab_spec(
      "peers = 3\nrate = \"8mbit\"\ncpus = [4, 1, 0.5]\n[[link]]\npeers = [0, 2]\n"
      "rate = \"unlimited\"",
      "lab.toml");
  apply_lab(t, lab);
  ASSERT_EQ(t.devices.size(), 3u);
  EXPECT_DOUBLE_EQ(t.devices[0].speed, 1);  // more CPUs than the profile's threads: no faster
  EXPECT_DOUBLE_EQ(t.devices[1].speed, 0.5);
  EXPECT_DOUBLE_EQ(t.devices[2].speed, 0.25);
  EXPECT_DOUBLE_EQ(t.links[0][1].bytes_per_s, 1e6);
  EXPECT_DOUBLE_EQ(t.links[2][0].bytes_per_s, kUnshapedBytesPerS);
  EXPECT_DOUBLE_EQ(t.devices[1].egress_bytes_per_s, 0);  // a link of its own per pair
  EXPECT_NO_THROW(t.validate());
  // A star (`--link-rate`): each peer's one upload.
  LabSpec star = lab;
  star.egress_bits_per_s = {8e6, 8e6, 16e6};
  apply_lab(t, star);
  EXPECT_DOUBLE_EQ(t.devices[2].egress_bytes_per_s, 2e6);
  EXPECT_DOUBLE_EQ(t.devices[2].ingress_bytes_per_s, 2e6);  // shaped both ways
}

}  // namespace
}  // namespace starling::sched
