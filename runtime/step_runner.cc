#include "runtime/step_runner.h"

#include <chrono>

#include "common/logging.h"

namespace kvrm {

namespace {

// Polls `done` until it holds or `spin` has passed; whether it holds.
template <typename Done>
bool SpinUntil(absl::Duration spin, const Done& done) {
  if (spin <= absl::ZeroDuration()) return done();
  const auto until = std::chrono::steady_clock::now() + absl::ToChronoNanoseconds(spin);
  while (!done()) {
    if (std::chrono::steady_clock::now() >= until) return false;
#if defined(__x86_64__)
    __builtin_ia32_pause();
#endif
  }
  return true;
}

}  // namespace

StepRunner::StepRunner(Backend* backend, Clock* clock, absl::Duration spin)
    : backend_(backend), clock_(clock), spin_(spin) {
  thread_ = std::thread([this] { Loop(); });
}

StepRunner::~StepRunner() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void StepRunner::Launch(const StepWork& work) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    CHECK(!running_) << "a step is already running";
    work_ = work;
    pending_ = true;
    running_ = true;
    running_flag_.store(true, std::memory_order_relaxed);
    pending_flag_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

StepResult StepRunner::Wait() {
  // The flags only shorten the wait: the condition variable's predicate, under mu_, decides.
  SpinUntil(spin_, [&] { return !running_flag_.load(std::memory_order_acquire); });
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return !running_; });
  return result_;
}

void StepRunner::Loop() {
  for (;;) {
    StepWork work;
    SpinUntil(spin_, [&] { return pending_flag_.load(std::memory_order_acquire); });
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stop_ || pending_; });
      if (stop_) return;
      work = work_;
      pending_ = false;
      pending_flag_.store(false, std::memory_order_relaxed);
    }
    StepResult r;
    if (work.chunks.size() > 1) {
      const absl::Time t0 = clock_->Now();
      const absl::Status status = backend_->PrefillChunks(
          work.chunks, work.chunk_logits, work.fused ? work.step : nullptr, work.logits);
      r.prefill_time = clock_->Now() - t0;
      r.prefill_status = status;
      if (work.fused) {
        r.decode_status = status;
        r.decode_time = r.prefill_time;
      }
    } else if (work.fused) {
      const absl::Time t0 = clock_->Now();
      const PrefillChunk& chunk = work.chunks[0];
      r.decode_status =
          work.tokens != nullptr
              ? backend_->DecodeWithChunkAndSample(chunk, work.chunk_logits[0], *work.step,
                                                   work.logits, work.tokens)
              : backend_->DecodeWithChunk(chunk, work.chunk_logits[0], *work.step, work.logits);
      r.decode_time = clock_->Now() - t0;
      r.prefill_status = r.decode_status;
      r.prefill_time = r.decode_time;
    } else if (!work.chunks.empty()) {
      const absl::Time t0 = clock_->Now();
      r.prefill_status = backend_->Prefill(work.chunks[0], work.chunk_logits[0]);
      r.prefill_time = clock_->Now() - t0;
    }
    if (work.step && !work.fused) {
      const absl::Time t0 = clock_->Now();
      r.decode_status = work.tokens != nullptr
                            ? backend_->DecodeAndSample(*work.step, work.logits, work.tokens)
                            : backend_->Decode(*work.step, work.logits);
      r.decode_time = clock_->Now() - t0;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      result_ = r;
      running_ = false;
      running_flag_.store(false, std::memory_order_release);
    }
    cv_.notify_all();
  }
}

}  // namespace kvrm
