#include "tools/cli/interrupt.h"

#include <pthread.h>
#include <signal.h>
#include <unistd.h>

namespace kvrm::cli {
namespace {

// SIGUSR1 only wakes the watcher when it is destroyed.
sigset_t WatchedSignals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGUSR1);
  return set;
}

}  // namespace

void BlockInterruptSignals() {
  const sigset_t set = WatchedSignals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
}

CancelOnInterrupt::CancelOnInterrupt(grpc::ClientContext* context)
    : context_(context), watcher_([this] { Watch(); }) {}

CancelOnInterrupt::~CancelOnInterrupt() {
  stopping_.store(true);
  pthread_kill(watcher_.native_handle(), SIGUSR1);
  watcher_.join();
}

void CancelOnInterrupt::Watch() {
  const sigset_t set = WatchedSignals();
  while (true) {
    int signal = 0;
    if (sigwait(&set, &signal) != 0) continue;
    if (stopping_.load()) return;
    if (signal == SIGUSR1) continue;
    if (interrupted_.exchange(true)) _exit(130);  // second Ctrl-C: the user means it
    context_->TryCancel();
  }
}

}  // namespace kvrm::cli
