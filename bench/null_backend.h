// A backend that computes nothing, for measuring what the engine does around a backend: its own
// time per step (bench/engine_overhead) and its scheduling decisions on a workload
// (bench/engine_claims --device=null: preemptions, transfer groups, recomputed prompt tokens,
// steps, counted exactly as on a real backend, in seconds instead of the CPU backend's hours).
//
// Each active row's next token is a fixed function of its token and position, returned as a
// token (when sampled on the device) or as a logits row: one of a few precomputed rows of
// normal(0, 2) logits, a model-like spread for top-p to cut, with the next token raised above
// the rest. Its KV pool is one layer of one 4-wide head with the engine's block count: the
// pager, the host tier and the transport run over it as over a real one (the copies move real
// bytes, only few of them).
#ifndef KVRM_BENCH_NULL_BACKEND_H_
#define KVRM_BENCH_NULL_BACKEND_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/time/time.h"
#include "runtime/backend.h"
#include "runtime/kv_pool.h"

namespace kvrm::bench {

class NullBackend : public Backend {
 public:
  // `device`: greedy rows are sampled "on the device" (DecodeAndSample returns their tokens);
  // `spin`: the handoff spin it reports (Backend::handoff_spin).
  NullBackend(int32_t vocab, int64_t blocks, int32_t block_tokens, int32_t chunk, bool device,
              absl::Duration spin);

  absl::Status Decode(const StepDescriptor& step, float* logits) override;
  absl::Status DecodeAndSample(const StepDescriptor& step, float* logits,
                               int32_t* tokens) override;
  absl::Status Prefill(const PrefillChunk& chunk, float* last_logits) override;
  bool samples_on_device() const override { return device_; }
  absl::Duration handoff_spin() const override { return spin_; }
  int32_t vocab_size() const override { return vocab_; }
  int32_t max_chunk_tokens() const override { return chunk_; }
  int32_t num_kv_pools() const override { return 1; }
  KvPool* kv_pool(int32_t) override { return pool_.get(); }

  // The next token it gives a row whose input is `token` at `position`.
  int32_t Next(int32_t token, int32_t position) const;
  // Its own time in Decode/DecodeAndSample (filling the logits rows the host reads).
  double backend_seconds() const { return backend_s_; }

 private:
  static constexpr int32_t kPatterns = 8;
  const int32_t vocab_;
  const int32_t chunk_;
  const bool device_;
  const absl::Duration spin_;
  std::vector<float> patterns_;
  std::unique_ptr<KvPool> pool_;
  double backend_s_ = 0;
};

}  // namespace kvrm::bench

#endif  // KVRM_BENCH_NULL_BACKEND_H_
