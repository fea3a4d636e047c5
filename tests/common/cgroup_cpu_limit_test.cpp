// A cgroup's CPU limit: where the process's cgroup lies (v1's cpu hierarchy first, then v2, seen
// through a container's mount), and the tightest quota from there up to the hierarchy's top.
#include "starling/common/cgroup_cpu_limit.h"

#include <gtest/gtest.h>

#include "../data/test_util.h"

namespace starling {
namespace {

namespace fs = std::filesystem;

const char* kV1Mounts =
    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
    "33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct\n"
    "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime shared:9 - cgroup cgroup rw,cpu\n"
    "40 31 0:36 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";

TEST(CgroupCpuLimit, TheV1CpuHierarchyComesBeforeV2) {
  const auto cg = find_cpu_cgroup(
      "5:cpuset:/s\n4:memory:/m\n3:cpuacct:/x\n2:name=systemd:/\n1:cpu:/jobs/a\n0::/u\n",
      kV1Mounts);
  ASSERT_TRUE(cg);
  EXPECT_FALSE(cg->v2);
  EXPECT_EQ(cg->mount, fs::path("/sys/fs/cgroup/cpu"));
  EXPECT_EQ(cg->dir, fs::path("/sys/fs/cgroup/cpu/jobs/a"));
  // The usual v1 pairing: one hierarchy for cpu and cpuacct, mounted with both options.
  const auto both = find_cpu_cgroup("4:cpu,cpuacct:/job\n3:cpuset:/\n",
                                    "32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw shared:9 master:2 "
                                    "- cgroup cgroup rw,cpu,cpuacct\n");
  ASSERT_TRUE(both);
  EXPECT_EQ(both->dir, fs::path("/sys/fs/cgroup/cpu,cpuacct/job"));
}

TEST(CgroupCpuLimit, AV1CpuLineWithoutItsHierarchyMountedFallsToV2) {
  const auto cg =
      find_cpu_cgroup("1:cpu:/a\n0::/b\n", "40 31 0:36 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
  ASSERT_TRUE(cg);
  EXPECT_TRUE(cg->v2);
  EXPECT_EQ(cg->dir, fs::path("/sys/fs/cgroup/b"));
}

TEST(CgroupCpuLimit, WithoutAV1CpuHierarchyV2IsRead) {
  const auto cg =
      find_cpu_cgroup("0::/user.slice/a b.scope\n",
                      "28 22 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n");
  ASSERT_TRUE(cg);
  EXPECT_TRUE(cg->v2);
  EXPECT_EQ(cg->dir, fs::path("/sys/fs/cgroup/user.slice/a b.scope"));
  // A container's mount shows its own cgroup as the top: a path at or outside that root is it,
  // one below it is under it; octal escapes in mountinfo are undone.
  const char* container = "40 30 0:26 /docker/a\\040b /sys/fs/my\\040cg rw - cgroup2 cgroup2 rw\n";
  EXPECT_EQ(find_cpu_cgroup("0::/\n", container).value().dir, fs::path("/sys/fs/my cg"));
  EXPECT_EQ(find_cpu_cgroup("0::/docker/a b\n", container).value().dir, fs::path("/sys/fs/my cg"));
  EXPECT_EQ(find_cpu_cgroup("0::/docker/a b/job\n", container).value().dir,
            fs::path("/sys/fs/my cg/job"));
}

TEST(CgroupCpuLimit, NoCgroupMountedIsNoLimit) {
  EXPECT_FALSE(
      find_cpu_cgroup("1:cpu:/a\n0::/\n", "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n"));
  EXPECT_FALSE(find_cpu_cgroup("", kV1Mounts));
}

using data::testing::write_text;

TEST(CgroupCpuLimit, TheTightestLimitOnTheWayUpCounts) {
  data::testing::TempDir tmp;
  const fs::path top = tmp.path() / "cg";
  write_text(top / "cpu.max", "max 100000\n");
  write_text(top / "a" / "cpu.max", "250000 100000\n");
  write_text(top / "a" / "b" / "cpu.max", "max 100000\n");
  const CpuCgroup v2{top, top / "a" / "b", true};
  EXPECT_DOUBLE_EQ(cpu_limit_under(v2).value(), 2.5);
  write_text(top / "a" / "b" / "cpu.max", "3000 10000\n");  // a local swarm's 10 ms period
  EXPECT_DOUBLE_EQ(cpu_limit_under(v2).value(), 0.3);
  // Above the hierarchy's top is not read.
  write_text(tmp.path() / "cpu.max", "1000 100000\n");
  EXPECT_DOUBLE_EQ(cpu_limit_under(v2).value(), 0.3);
  write_text(top / "a" / "b" / "cpu.max", "max 100000\n");
  write_text(top / "a" / "cpu.max", "max 100000\n");
  EXPECT_FALSE(cpu_limit_under(v2));
  // A container's own limit sits at the top of what it sees (its cgroup namespace's root).
  write_text(top / "cpu.max", "200000 100000\n");
  EXPECT_DOUBLE_EQ(cpu_limit_under(v2).value(), 2.0);
  EXPECT_DOUBLE_EQ(cpu_limit_under({top, top, true}).value(), 2.0);
}

TEST(CgroupCpuLimit, V1QuotasAndUnreadableFiles) {
  data::testing::TempDir tmp;
  const fs::path top = tmp.path();
  write_text(top / "cpu.cfs_quota_us", "-1\n");
  write_text(top / "cpu.cfs_period_us", "100000\n");
  write_text(top / "job" / "cpu.cfs_quota_us", "150000\n");
  write_text(top / "job" / "cpu.cfs_period_us", "100000\n");
  const CpuCgroup v1{top, top / "job", false};
  EXPECT_DOUBLE_EQ(cpu_limit_under(v1).value(), 1.5);
  write_text(top / "job" / "cpu.cfs_quota_us", "-1\n");
  EXPECT_FALSE(cpu_limit_under(v1));
  write_text(top / "job" / "cpu.cfs_quota_us", "lots\n");  // malformed: no limit, no throw
  EXPECT_FALSE(cpu_limit_under(v1));
  EXPECT_FALSE(cpu_limit_under({top, top / "gone", false}));
}

}  // namespace
}  // namespace starling
