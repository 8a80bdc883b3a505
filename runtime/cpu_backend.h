// The CPU backend: the Llama forward pass as a fixed plan of kernel calls over buffers sized at
// start-up (for max(slots, chunk) rows), so neither Decode nor Prefill allocates.
//
// Tensor parallelism (`tensor_parallel` = T > 1): T ranks (runtime/cpu_rank.h), each with its
// Megatron shard of the weights (runtime/tp_shard.h), its share of the KV heads in its own pool
// (same block ids in every pool) and num_threads / T pool threads; the ranks run on T threads
// (rank 0 on the caller's) and all-reduce through an in-process Communicator.
//
// Owner: the engine thread, which also drives the rank threads and their pools.
#ifndef KVRM_RUNTIME_CPU_BACKEND_H_
#define KVRM_RUNTIME_CPU_BACKEND_H_

#include <memory>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/cpu/thread_pool.h"
#include "model/config.h"
#include "model/lora.h"
#include "model/weights.h"
#include "runtime/backend.h"
#include "runtime/communicator.h"
#include "runtime/cpu_rank.h"
#include "runtime/far_history.h"
#include "runtime/kv_pool.h"

namespace kvrm {

struct CpuBackendOptions {
  int64_t kv_blocks = 0;        // blocks in the KV pool (in each rank's pool)
  int32_t kv_block_tokens = 16;
  DType kv_dtype = DType::kF32;  // of the KV pool: f32, bf16 (half the bytes) or FP8 (a quarter)
  int32_t max_slots = 8;
  int32_t max_chunk_tokens = 256;
  // Prefill chunks one pass takes (PrefillChunks; EngineOptions::max_prefills_per_step); 0:
  // max_slots. Sizes the logits rows kept for them.
  int32_t max_chunks_per_pass = 0;
  // Speculative decoding: most draft tokens a step may carry per slot (StepDescriptor::draft),
  // verified in the decode pass as extra rows; 0: none. Sizes the activations for
  // slots x (1 + this) decode rows beside a chunk.
  int32_t max_draft_tokens = 0;
  int32_t max_context = 0;  // positions; <= the model's max_position_embeddings
  int32_t num_threads = 2;  // all threads, split evenly over the ranks (at least one each)
  int32_t tensor_parallel = 1;  // ranks; must divide heads, KV heads and intermediate size
  // Far-history summaries (runtime/far_history.h): on when window_blocks > 0; then every rank
  // holds a summary store of FarHistoryMaxSummaries entries per slot, allocated here.
  FarHistoryShape far_history;
  // Pack the linear weights into panels (AttachPanels) for the best path this processor has:
  // bf16 with avx512_bf16, f32 with avx512. The panel kernels are the fast ones for decode and
  // prefill, at the cost of a second copy of those weights; the engine turns this off when
  // another path is chosen (kvrmd --cpu_isa).
  bool weight_panels = true;
  // kQ8_0: every linear weight (Q, K, V, O, gate, up, down, lm_head) quantized to q8_0 at load
  // (kernels/cpu/q8_0.h; kvrmd --quantization=q8_0): about half the bytes of bf16 read a step.
  // kQ4K: quantized to q4_K (kernels/cpu/q4_k.h, ggml's reference quantizer; q8_0 for a matrix,
  // or a rank's share, whose rows are not whole 256-value super-blocks): about 0.29x bf16's
  // bytes. Matrices already in a block format (a GGUF file's) are multiplied in it whatever this
  // says.
  WeightFormat quantization = WeightFormat::kDense;
  // LoRA adapters served from the start (model/lora.h), loaded for `config`: in slots 0, 1, ...
  // (StepDescriptor::adapter and PrefillChunk::adapter index the slots). Each rank keeps its
  // share (ShardLoraAdapter), so these need not outlive Create.
  std::vector<const LoraAdapter*> lora_adapters;
  // LoRA adapter slots, for those and any put in later (SetLoraAdapter); 0: as many as
  // lora_adapters.
  int32_t max_lora_adapters = 0;
  // The largest rank a slot's adapter may have (sizes the scratch); 0: the largest of
  // lora_adapters'.
  int32_t max_lora_rank = 0;
  // What the ranks keep the adapters' factors in: f32, or bf16 (half the bytes held and read a
  // pass; each value rounded to nearest, as vLLM's --lora-dtype keeps them in the model's).
  DType lora_dtype = DType::kF32;
};

class CpuBackend : public Backend {
 public:
  // `weights` must outlive the backend, which allocates its KV pools and buffers here.
  static absl::StatusOr<std::unique_ptr<CpuBackend>> Create(const LlamaConfig& config,
                                                            const LlamaWeights* weights,
                                                            const CpuBackendOptions& options);
  ~CpuBackend() override;

  absl::Status Decode(const StepDescriptor& step, float* logits) override;
  absl::Status Prefill(const PrefillChunk& chunk, float* last_logits) override;
  bool fuses_prefill() const override { return true; }
  std::string weight_quantization() const override;
  absl::Status DecodeWithChunk(const PrefillChunk& chunk, float* last_logits,
                               const StepDescriptor& step, float* logits) override;
  // Up to every slot's chunk may share a pass (their tokens max_chunk_tokens together).
  int32_t max_chunks_per_pass() const override { return max_chunks_; }
  absl::Status PrefillChunks(absl::Span<const PrefillChunk> chunks,
                             absl::Span<float* const> chunk_logits, const StepDescriptor* step,
                             float* logits) override;
  int32_t vocab_size() const override { return config_.vocab_size; }
  int32_t max_draft_tokens() const override { return options_.max_draft_tokens; }
  int32_t max_lora_adapters() const override { return static_cast<int32_t>(lora_.size()); }
  int32_t max_lora_rank() const override { return lora_max_rank_; }
  absl::StatusOr<std::shared_ptr<const PreparedLoraAdapter>> PrepareLoraAdapter(
      const LoraAdapter& adapter) const override;
  absl::Status SetLoraAdapter(int32_t index,
                              std::shared_ptr<const PreparedLoraAdapter> adapter) override;
  bool computes_all_logits() const override { return true; }
  bool returns_hidden() const override { return true; }
  // The panel kernels convert activation rows in L2-sized blocks of whole 16-row groups, one
  // group for the widest matrices (FFN down at 3072 columns and up; every matrix of a model of
  // 4096 hidden): up to 16 rows every weight is streamed once.
  int32_t one_read_rows() const override { return WeightMatrix::kPanelRows; }
  int32_t max_chunk_tokens() const override { return options_.max_chunk_tokens; }
  int32_t num_kv_pools() const override { return static_cast<int32_t>(ranks_.size()); }
  KvPool* kv_pool(int32_t rank) override { return ranks_[rank]->kv_pool(); }
  bool supports_far_history() const override { return true; }

  int32_t tensor_parallel() const { return static_cast<int32_t>(ranks_.size()); }
  // Bytes of weight shards the ranks copied at load time (row-parallel O and down).
  int64_t owned_weight_bytes() const;
  // Mixtures of experts: the (layer, expert) pairs the passes so far ran (CpuRank::experts_run;
  // every rank runs the same ones, each its share of their features).
  int64_t experts_run() const;
  // Bytes of the ranks' panel copies (0 without them).
  int64_t panel_weight_bytes() const;
  // Calibration of static FP8 KV cache scales (tools/kv_scales): while on, every pass records
  // each layer's largest |key| and |value| (after RoPE, before the cache rounds them); KvAmax()
  // is that (key, value) pair per layer, the largest over the ranks, over every pass since.
  void RecordKvAmax(bool on);
  std::vector<std::pair<float, float>> KvAmax() const;

 private:
  CpuBackend(const LlamaConfig& config, const CpuBackendOptions& options);
  // INVALID_ARGUMENT unless `adapter` is -1 or a slot holding an adapter.
  absl::Status CheckAdapter(int32_t adapter, const char* what) const;
  // The far-history fields of a step or chunk against the backend's shape (INVALID_ARGUMENT);
  // with far history off, `dropped` blocks are released ones (StepDescriptor): only for a model
  // whose every layer slides, wholly behind the window of a row at `first_position` (the
  // slot's first row).
  absl::Status CheckFarHistory(const FarHistoryShape& far, int32_t dropped, int32_t summaries,
                               int64_t first_position) const;
  // The rows of a step's active slots (each slot's input token, then its drafts; the row of
  // `logits` each one's logits go to in logit_row) or of a chunk; return how many, or
  // INVALID_ARGUMENT / OUT_OF_RANGE naming what is wrong.
  absl::StatusOr<int32_t> DecodeRows(const StepDescriptor& step, CpuRow* rows,
                                     int32_t* logit_row) const;
  absl::StatusOr<int32_t> ChunkRows(const PrefillChunk& chunk, CpuRow* rows) const;
  // Copies logits_ rows [first, first + n) to their rows (logit_row_[0, n)) of `logits`.
  void ScatterLogits(int32_t first, int32_t n, float* logits) const;
  // Runs every rank's forward over rows_[0, n) (logits for rows [first_logit_row, n), or for
  // rows pass_logit_rows_[0, m) with the second).
  absl::Status Forward(int32_t n, int32_t first_logit_row);
  absl::Status ForwardListed(int32_t n, int32_t m);

  const LlamaConfig config_;
  const CpuBackendOptions options_;
  std::vector<float> rope_;  // [max_context][head_dim]: cos half then sin half
  // Gemma 3's sliding layers' table (LlamaConfig::rope_local_theta); empty: theirs is rope_.
  std::vector<float> rope_local_;
  std::unique_ptr<InProcessCommunicatorGroup> comm_;
  std::vector<std::unique_ptr<CpuRank>> ranks_;
  ThreadPool rank_threads_;            // thread r runs rank r
  std::vector<absl::Status> rank_status_;  // [ranks] of the last Forward
  // [slots x (1 + drafts) + chunk]: a chunk's rows (or several chunks'), then decode rows.
  std::vector<CpuRow> rows_;
  std::vector<int32_t> logit_row_;  // [slots x (1 + drafts)]: each decode row's logits row
  std::vector<int32_t> pass_logit_rows_;  // [rows_]: PrefillChunks' rows whose logits it wants
  const int32_t max_chunks_;              // options_.max_chunks_per_pass, or max_slots
  // [slots x (1 + drafts) + kMaxAllLogitsRows + max_chunks_ - 1][vocab] before scattering (the
  // last rows: the last rows of the other chunks of a PrefillChunks pass).
  std::vector<float> logits_;
  // The LoRA adapter slots (null: empty); the ranks point into these.
  std::vector<std::shared_ptr<const PreparedLoraAdapter>> lora_;
  int32_t lora_max_rank_ = 0;
};

}  // namespace kvrm

#endif  // KVRM_RUNTIME_CPU_BACKEND_H_
