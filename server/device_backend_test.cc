#include "server/device_backend.h"

#include <filesystem>

#include "gtest/gtest.h"

namespace kvrm {
namespace {

bool GpuMachine() {
  std::error_code ec;
  return std::filesystem::exists("/dev/nvidia0", ec) ||
         std::filesystem::exists("/proc/driver/nvidia/gpus", ec);
}

TEST(DeviceBackendTest, CpuIsTheEnginesDefaultBackend) {
  auto c = ChooseDevice("cpu");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->device, "cpu");
  EXPECT_FALSE(c->factory);
}

TEST(DeviceBackendTest, UnknownDeviceNamesTheFlag) {
  auto c = ChooseDevice("tpu");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("--device=tpu"), absl::string_view::npos);
}

TEST(DeviceBackendTest, WithoutAGpuAutoFallsBackAndCudaIsRefused) {
  if (GpuMachine()) GTEST_SKIP() << "this machine has a GPU";
  auto a = ChooseDevice("auto");
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(a->device, "cpu");
  EXPECT_FALSE(a->factory);
  auto c = ChooseDevice("cuda");
  EXPECT_EQ(c.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(c.status().message().find("--device=cuda"), absl::string_view::npos);
}

TEST(DeviceBackendTest, OnAGpuMachineCudaGivesABackendFactory) {
  if (!GpuMachine() || !BuiltWithCuda()) GTEST_SKIP() << "needs a GPU and a CUDA build";
  auto c = ChooseDevice("cuda");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->device, "cuda");
  EXPECT_TRUE(c->factory);
}

}  // namespace
}  // namespace kvrm
