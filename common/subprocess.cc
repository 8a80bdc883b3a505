#include "common/subprocess.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

extern char** environ;

namespace kvrm {
namespace {

int DecodeStatus(int status) {
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

absl::StatusOr<Subprocess> Subprocess::Start(const std::vector<std::string>& args,
                                             const Options& options) {
  if (args.empty()) return absl::InvalidArgumentError("subprocess: empty argv");
  std::vector<std::string> copy = args;
  std::vector<char*> argv;
  for (std::string& a : copy) argv.push_back(a.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  if (!options.log.empty()) {
    posix_spawn_file_actions_addopen(&actions, 2, options.log.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (options.stdout_path.empty()) {
      posix_spawn_file_actions_adddup2(&actions, 2, 1);
    }
  }
  if (!options.stdout_path.empty()) {
    posix_spawn_file_actions_addopen(&actions, 1, options.stdout_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
  }
  Subprocess p;
  p.options_ = options;
  const int err = posix_spawn(&p.pid_, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (err != 0) {
    p.pid_ = -1;
    return absl::InternalError("cannot start " + args[0] + ": " + std::strerror(err));
  }
  return p;
}

Subprocess::Subprocess(Subprocess&& other) noexcept
    : pid_(other.pid_), options_(std::move(other.options_)) {
  other.pid_ = -1;
}

Subprocess& Subprocess::operator=(Subprocess&& other) noexcept {
  if (this != &other) {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    pid_ = other.pid_;
    options_ = std::move(other.options_);
    other.pid_ = -1;
  }
  return *this;
}

Subprocess::~Subprocess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

void Subprocess::Signal(int signal) const {
  if (pid_ > 0) kill(pid_, signal);
}

int Subprocess::Wait() {
  if (pid_ <= 0) return -1;
  int status = 0;
  while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  pid_ = -1;
  return DecodeStatus(status);
}

bool Subprocess::Exited(int* code) {
  if (pid_ <= 0) return true;
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) != pid_) return false;
  pid_ = -1;
  if (code) *code = DecodeStatus(status);
  return true;
}

absl::StatusOr<int> Subprocess::WaitForPortFile(const std::string& path, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    int port = 0;
    std::ifstream in(path);
    if (in >> port && port > 0) return port;
    int code = 0;
    if (Exited(&code)) {
      return absl::FailedPreconditionError("process exited with " + std::to_string(code) +
                                           " before writing " + path + ":\n" + LogTail());
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError("no port in " + path + " after " +
                                         absl::FormatDuration(timeout) + ":\n" + LogTail());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
}

std::string Subprocess::LogTail(size_t max_bytes) const {
  if (options_.log.empty()) return "";
  std::ifstream in(options_.log, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  const std::string all = s.str();
  return all.size() > max_bytes ? all.substr(all.size() - max_bytes) : all;
}

std::string TestTmpDir() {
  const char* t = std::getenv("TEST_TMPDIR");
  return t ? t : "/tmp";
}

int TestTimeoutScale() {
  const char* s = std::getenv("KVRM_TEST_TIMEOUT_SCALE");
  const int scale = s ? std::atoi(s) : 1;
  return scale > 0 ? scale : 1;
}

}  // namespace kvrm
