// Ctrl-C (SIGINT) and SIGTERM cancel the RPC in flight instead of killing the process, so the
// server sees a clean cancellation and frees the request's slot at once.
//
// A signal handler may call only async-signal-safe functions and TryCancel is not one, so the
// signals are blocked in every thread (BlockInterruptSignals, before any thread exists, gRPC's
// included, since threads inherit the mask) and a watcher thread takes them with sigwait.
#ifndef KVRM_TOOLS_CLI_INTERRUPT_H_
#define KVRM_TOOLS_CLI_INTERRUPT_H_

#include <atomic>
#include <thread>

#include "grpcpp/client_context.h"

namespace kvrm::cli {

// Blocks SIGINT, SIGTERM and the watcher's wake-up signal in the calling thread and in every thread
// it later starts. Call first thing in main.
void BlockInterruptSignals();

// While alive, the first SIGINT or SIGTERM calls context->TryCancel(); a second one exits the
// process at once with status 130. Without a live watcher the blocked signals stay pending, so one
// is live around every RPC.
class CancelOnInterrupt {
 public:
  explicit CancelOnInterrupt(grpc::ClientContext* context);
  ~CancelOnInterrupt();

  CancelOnInterrupt(const CancelOnInterrupt&) = delete;
  CancelOnInterrupt& operator=(const CancelOnInterrupt&) = delete;

  // True once a signal cancelled the call.
  bool interrupted() const { return interrupted_.load(); }

 private:
  void Watch();

  grpc::ClientContext* const context_;
  std::atomic<bool> interrupted_{false};
  std::atomic<bool> stopping_{false};
  std::thread watcher_;
};

}  // namespace kvrm::cli

#endif  // KVRM_TOOLS_CLI_INTERRUPT_H_
