// The CPU backend: the Llama forward pass as a fixed plan of kernel calls over buffers sized at
// start-up (for max(slots, chunk) rows), so neither Decode nor Prefill allocates.
//
// Owner: the engine thread, which also drives the backend's thread pool.
#ifndef KVRM_RUNTIME_CPU_BACKEND_H_
#define KVRM_RUNTIME_CPU_BACKEND_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cpu/thread_pool.h"
#include "model/config.h"
#include "model/weights.h"
#include "runtime/backend.h"
#include "runtime/kv_pool.h"

namespace kvrm {

struct CpuBackendOptions {
  int64_t kv_blocks = 0;        // blocks in the KV pool
  int32_t kv_block_tokens = 16;
  int32_t max_slots = 8;
  int32_t max_chunk_tokens = 256;
  int32_t max_context = 0;  // positions; <= the model's max_position_embeddings
  int32_t num_threads = 2;
};

class CpuBackend : public Backend {
 public:
  // `weights` must outlive the backend, which allocates its KV pool and buffers here.
  static absl::StatusOr<std::unique_ptr<CpuBackend>> Create(const LlamaConfig& config,
                                                            const LlamaWeights* weights,
                                                            const CpuBackendOptions& options);

  absl::Status Decode(const StepDescriptor& step, float* logits) override;
  absl::Status Prefill(const PrefillChunk& chunk, float* last_logits) override;
  int32_t vocab_size() const override { return config_.vocab_size; }
  int32_t max_chunk_tokens() const override { return options_.max_chunk_tokens; }
  int32_t num_kv_pools() const override { return 1; }
  KvPool* kv_pool(int32_t rank) override { return pool_.get(); }

 private:
  // One row of the batch: a token at a position of a slot's history.
  struct Row {
    int32_t token;
    int32_t position;
    const KvRun* runs;
    int32_t num_runs;
  };

  CpuBackend(const LlamaConfig& config, const LlamaWeights* weights,
             std::unique_ptr<KvPool> pool, const CpuBackendOptions& options);
  // The forward pass over `n` rows (rows_[0, n)); logits for rows [first_logit_row, n).
  void Forward(int32_t n, int32_t first_logit_row, float* logits);
  void Attention(int32_t layer, int32_t n);

  const LlamaConfig config_;
  const LlamaWeights* weights_;
  std::unique_ptr<KvPool> pool_;
  const CpuBackendOptions options_;
  ThreadPool threads_;
  const int32_t max_rows_;

  // Start-up allocations; all [max_rows_][width] unless noted.
  std::vector<Row> rows_;
  std::vector<float> rope_;      // [max_context][head_dim]: cos half then sin half
  std::vector<float> x_, h_, q_, k_, v_, attn_, gate_, up_;
  std::vector<float> scores_;    // [threads][max_context]
  std::vector<float> scratch_;   // matmul widening scratch, [threads][...]
  std::vector<float> logits_;    // [max_rows_][vocab] before scattering to slots
};

}  // namespace kvrm

#endif  // KVRM_RUNTIME_CPU_BACKEND_H_
