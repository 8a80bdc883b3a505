#include "common/subprocess.h"

#include <signal.h>

#include <fstream>

#include "gtest/gtest.h"

namespace kvrm {
namespace {

TEST(SubprocessTest, ExitCodeAndLog) {
  const std::string log = TestTmpDir() + "/sub_exit.log";
  auto p = Subprocess::Start({"/bin/sh", "-c", "echo out; echo err >&2; exit 7"}, {log, ""});
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->Wait(), 7);
  const std::string tail = p->LogTail();
  EXPECT_NE(tail.find("out"), std::string::npos);
  EXPECT_NE(tail.find("err"), std::string::npos);
}

TEST(SubprocessTest, StdoutApartFromTheLog) {
  const std::string log = TestTmpDir() + "/sub_split.log", out = TestTmpDir() + "/sub_split.out";
  auto p = Subprocess::Start({"/bin/sh", "-c", "echo data; echo noise >&2"}, {log, out});
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->Wait(), 0);
  std::string line;
  std::getline(std::ifstream(out) >> std::ws, line);
  EXPECT_EQ(line, "data");
  EXPECT_EQ(p->LogTail().find("data"), std::string::npos);
}

TEST(SubprocessTest, PortFileIsReadOnceWritten) {
  const std::string port = TestTmpDir() + "/sub.port";
  std::remove(port.c_str());
  auto p = Subprocess::Start(
      {"/bin/sh", "-c", "sleep 0.2; echo 4242 > " + port + ".tmp; mv " + port + ".tmp " + port +
                            "; sleep 30"},
      {TestTmpDir() + "/sub_port.log", ""});
  ASSERT_TRUE(p.ok());
  auto got = p->WaitForPortFile(port, absl::Seconds(20));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, 4242);
  p->Signal(SIGTERM);
  EXPECT_EQ(p->Wait(), 128 + SIGTERM);
}

TEST(SubprocessTest, ChildDyingFirstEndsThePortWaitWithItsOutput) {
  auto p = Subprocess::Start({"/bin/sh", "-c", "echo cannot load model; exit 1"},
                             {TestTmpDir() + "/sub_die.log", ""});
  ASSERT_TRUE(p.ok());
  auto got = p->WaitForPortFile(TestTmpDir() + "/never.port", absl::Seconds(20));
  EXPECT_EQ(got.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(got.status().message().find("cannot load model"), absl::string_view::npos);
}

TEST(SubprocessTest, MissingProgramIsAnError) {
  auto p = Subprocess::Start({"/no/such/program"}, {});
  // posix_spawn reports the failed exec either at once or as exit status 127.
  if (p.ok()) {
    EXPECT_EQ(p->Wait(), 127);
  } else {
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInternal);
  }
}

}  // namespace
}  // namespace kvrm
