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

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "runtime/backend.h"
#include "runtime/kv_pool.h"

namespace kvrm::bench {

// A device's cost of each call, from measured figures: with it the null backend takes that
// long (it sleeps, then spins the last stretch), so that the engine runs on this machine at the
// device's pace: its step times, chunk sizes (the prefill stall limit works from timed steps),
// arrivals against capacity and the transport's overlap with the steps are the device's, and
// tokens/s, TTFT and TPOT are a model of the device's. Zero: no time (the default).
struct DeviceTiming {
  // A decode step: fixed + per active row + per KV token its attention reads (the sum of the
  // rows' positions + 1).
  double decode_fixed_us = 0, decode_row_us = 0, decode_kv_token_ns = 0;
  // A prefill chunk run apart from the step (a fixed-shape graph: the same cost for any
  // length), or in the decode pass (what it adds to the step); either way plus its attention
  // over the history before it, per (chunk token x history token).
  double chunk_apart_us = 0, chunk_in_pass_us = 0, chunk_attention_ns = 0;
  // A transfer group: fixed, then its bytes at the device-to-device or the host-device rate.
  double copy_group_us = 0, copy_device_gbs = 0, copy_host_gbs = 0;
  int64_t bytes_per_block = 0;  // of the modelled model's KV (all layers, K and V)

  bool enabled() const { return decode_fixed_us > 0; }
  // "h200": the `small` shape, f32 KV, on the H200 of docs/cuda.md ("Measured on an H200
  // (2026-12-04)"): decode 610 us + 0.05 us a row + 7.2 ns a KV token (fits the device check's
  // graph + sampling steps at 16-128 slots and contexts 512-4000 within 7 %); a 256-row chunk
  // 850 us apart, 530 us in the pass (its 16-slot figures). Not measured, estimates: a chunk's
  // attention 0.5 ns per (token x history token), a copy group 10 us + its bytes at 1500 GB/s
  // on the device or 20 GB/s over PCIe (strided rows of one block's width).
  // (bytes_per_block is left to the caller.)
  static absl::StatusOr<DeviceTiming> Preset(const std::string& name);
};

class NullBackend : public Backend {
 public:
  // `device`: greedy rows are sampled "on the device" (DecodeAndSample returns their tokens);
  // `spin`: the handoff spin it reports (Backend::handoff_spin); `timing`: how long each call
  // takes (none by default).
  NullBackend(int32_t vocab, int64_t blocks, int32_t block_tokens, int32_t chunk, bool device,
              absl::Duration spin, DeviceTiming timing = {});

  absl::Status Decode(const StepDescriptor& step, float* logits) override;
  absl::Status DecodeAndSample(const StepDescriptor& step, float* logits,
                               int32_t* tokens) override;
  absl::Status Prefill(const PrefillChunk& chunk, float* last_logits) override;
  // With a timing, chunks ride in the decode pass (as on the CUDA backend, whose mixed graph
  // is on by default).
  bool fuses_prefill() const override { return timing_.enabled(); }
  absl::Status DecodeWithChunk(const PrefillChunk& chunk, float* last_logits,
                               const StepDescriptor& step, float* logits) override;
  absl::Status DecodeWithChunkAndSample(const PrefillChunk& chunk, float* last_logits,
                                        const StepDescriptor& step, float* logits,
                                        int32_t* tokens) override;
  absl::Status CopyGroup(const TransferGroup& group) override;
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
  // With a timing: the modelled time of the calls, and how far past it the waits overshot.
  double modelled_seconds() const { return modelled_ns_.load() / 1e9; }
  double overshoot_seconds() const { return overshoot_ns_.load() / 1e9; }

 private:
  static constexpr int32_t kPatterns = 8;
  const int32_t vocab_;
  const int32_t chunk_;
  const bool device_;
  const absl::Duration spin_;
  std::vector<float> patterns_;
  void FillRows(const StepDescriptor& step, float* logits, int32_t* tokens) const;
  void FillLast(const PrefillChunk& chunk, float* last_logits) const;
  // Waits out `us` of modelled time from `start` (on the calling thread).
  void Take(std::chrono::steady_clock::time_point start, double us);
  double DecodeUs(const StepDescriptor& step) const;
  double ChunkUs(const PrefillChunk& chunk, bool in_pass) const;

  const DeviceTiming timing_;
  std::unique_ptr<KvPool> pool_;
  double backend_s_ = 0;
  // Added to by the step runner's and the transport's threads.
  std::atomic<int64_t> modelled_ns_{0}, overshoot_ns_{0};
};

}  // namespace kvrm::bench

#endif  // KVRM_BENCH_NULL_BACKEND_H_
