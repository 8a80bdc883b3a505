#include "common/memory_limit.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvrm {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr int64_t kGiB = int64_t{1} << 30;

// A directory laid out like / for the files ReadMemoryLimit reads.
class FakeRoot {
 public:
  explicit FakeRoot(const std::string& name) {
    const char* tmp = std::getenv("TEST_TMPDIR");
    root_ = (fs::path(tmp != nullptr ? tmp : "/tmp") / ("memlimit_" + name)).string();
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void Write(const std::string& path, const std::string& text) const {
    const fs::path p = fs::path(root_ + path);
    fs::create_directories(p.parent_path());
    std::ofstream(p) << text;
  }
  const std::string& root() const { return root_; }

 private:
  std::string root_;
};

const char kMeminfo32G[] = "MemTotal:       33554432 kB\nMemFree:        1000 kB\n";

TEST(MemoryLimitTest, CgroupV2ContainerLimitIsTighterThanTheMachine) {
  FakeRoot r("v2");
  r.Write("/proc/self/cgroup", "0::/\n");
  r.Write("/sys/fs/cgroup/memory.max", "17179869184\n");
  r.Write("/proc/meminfo", kMeminfo32G);
  const std::optional<MemoryLimit> l = ReadMemoryLimit(r.root());
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->bytes, 16 * kGiB);
  EXPECT_THAT(l->source, HasSubstr("memory.max"));
}

TEST(MemoryLimitTest, ParentCgroupLimitsApplyAndMaxIsNone) {
  // Kubernetes without a cgroup namespace: the container's own file says "max", the pod's
  // level above it holds the limit.
  FakeRoot r("v2_nested");
  r.Write("/proc/self/cgroup", "0::/kubepods/pod1/ctr\n");
  r.Write("/sys/fs/cgroup/kubepods/pod1/ctr/memory.max", "max\n");
  r.Write("/sys/fs/cgroup/kubepods/pod1/memory.max", "8589934592\n");
  r.Write("/sys/fs/cgroup/kubepods/memory.max", "max\n");
  r.Write("/proc/meminfo", kMeminfo32G);
  const std::optional<MemoryLimit> l = ReadMemoryLimit(r.root());
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->bytes, 8 * kGiB);
}

TEST(MemoryLimitTest, CgroupV1UnlimitedFallsBackToTheMachine) {
  FakeRoot r("v1");
  r.Write("/proc/self/cgroup", "4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n0::/\n");
  r.Write("/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", "9223372036854771712\n");
  r.Write("/proc/meminfo", kMeminfo32G);
  std::optional<MemoryLimit> l = ReadMemoryLimit(r.root());
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->bytes, 32 * kGiB);
  EXPECT_THAT(l->source, HasSubstr("MemTotal"));
  // A v1 limit set.
  r.Write("/sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes", "4294967296\n");
  l = ReadMemoryLimit(r.root());
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->bytes, 4 * kGiB);
  EXPECT_THAT(l->source, HasSubstr("memory.limit_in_bytes"));
}

TEST(MemoryLimitTest, NothingReadableIsNoLimit) {
  FakeRoot r("none");
  EXPECT_FALSE(ReadMemoryLimit(r.root()).has_value());
  r.Write("/proc/self/cgroup", "garbage\n");
  r.Write("/proc/meminfo", "MemTotal: lots\n");
  EXPECT_FALSE(ReadMemoryLimit(r.root()).has_value());
}

TEST(MemoryLimitTest, ThisMachineHasALimit) {
  // /proc/meminfo exists on every Linux machine this runs on.
  const std::optional<MemoryLimit> l = ReadMemoryLimit();
  ASSERT_TRUE(l.has_value());
  EXPECT_GT(l->bytes, 0);
}

TEST(MemoryLimitTest, CheckRefusesWhatCannotBeFaultedIn) {
  const MemoryLimit limit{16 * kGiB, "the cgroup's memory.max"};
  const absl::Status s =
      CheckFitsMemory(64 * kGiB, 0, limit, "the KV pool", "lower --kv_blocks");
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(s.message()), HasSubstr("the KV pool needs 64.00 GiB"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("memory.max (16.00 GiB)"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("lower --kv_blocks"));
  // What is touched only as load grows passes, with a warning.
  EXPECT_TRUE(CheckFitsMemory(8 * kGiB, 16 * kGiB, limit, "the KV pool", "").ok());
  EXPECT_TRUE(CheckFitsMemory(8 * kGiB, 0, limit, "the KV pool", "").ok());
  EXPECT_TRUE(CheckFitsMemory(64 * kGiB, 0, std::nullopt, "the KV pool", "").ok());
}

}  // namespace
}  // namespace kvrm
