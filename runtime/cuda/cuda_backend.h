// The CUDA backend: the Llama step on one or two GPUs as captured CUDA graphs (Qwen2's Q/K/V
// biases, Qwen3's per-head Q/K norms and an O bias too, where the model has them).
//
// Per rank (one GPU each; tensor parallel over ranks with NCCL, Megatron style as on the CPU):
// bf16 weight shards (fused QKV and gate/up), f32 attention biases and Q/K norm weights
// (runtime/cuda/attention_vectors.h), the KV pool share in device memory (f32, or bf16
// with kv_dtype: half the bytes per token, rounded as the CPU backend's bf16 pool), activation
// buffers for the largest pass, cuBLASLt products planned at start-up, and three graphs captured
// at start-up over fixed shapes: the decode step for all slots, one prefill chunk, and the two in
// one pass (mixed: the chunk's rows after the decode rows, so a step that carries a chunk reads
// the weights once). A step is: pack the committed descriptor on the host
// (runtime/cuda/step_packing.h), one asynchronous copy into the graph's static input buffer, one
// graph launch, then copies of what the host needs: the sampled tokens (the decode graph
// ends with the sampling kernel over the rows the engine marks, after an all-gather of the
// ranks' vocabulary shares at --tp=2) and the other rows' logits. With LoRA adapter slots, each
// pass has a second graph with the adapters' products, replayed for steps whose rows run one.
// Transfer groups run on a separate copy stream (one 2-D copy per rank, see
// runtime/cuda/transfer_lowering.h); the engine's transport orders them ahead of the step that
// needs them and measures any wait.
//
// Owner: the engine thread (Decode, Prefill) and the transport thread (CopyGroup); each uses its
// own streams. Nothing here allocates after Create.
#ifndef KVRM_RUNTIME_CUDA_CUDA_BACKEND_H_
#define KVRM_RUNTIME_CUDA_CUDA_BACKEND_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cuda/llama_kernels.h"
#include "kernels/cuda/step_inputs.h"
#include "model/config.h"
#include "model/weights.h"
#include "runtime/backend.h"
#include "runtime/cuda/step_packing.h"

namespace kvrm::cuda {

struct CudaBackendOptions {
  int64_t kv_blocks = 0;  // blocks in each rank's device pool
  int32_t kv_block_tokens = 16;
  // K and V elements of the device pool and the pinned host tier: f32, or bf16 (--kv_dtype=bf16:
  // half the bytes per token; stored rounded to nearest even, attention still sums in f32).
  DType kv_dtype = DType::kF32;
  int32_t max_slots = 8;
  int32_t max_chunk_tokens = 256;
  int32_t max_context = 0;
  int32_t max_runs = 8;          // the descriptor's [slots][max runs] shape
  int32_t tensor_parallel = 1;   // GPUs: devices 0 .. tensor_parallel - 1
  int32_t split_tokens = 256;    // attention KV split length
  int32_t attention_token_sets = 2;  // tokens' K/V sets in flight per warp (2 or 4)
  bool use_graphs = true;        // false: launch the kernels each step (debugging, checks)
  // Sample rows inside the decode graph (DecodeAndSample). With more ranks each computes a share
  // of the vocabulary's logits: the graph all-gathers the decode rows' shares first (only when
  // the ranks divide the vocabulary evenly; otherwise the engine samples on the host).
  bool device_sampling = true;
  // A third graph over max_slots + max_chunk_tokens rows: a prefill chunk rides in the decode
  // pass (fuses_prefill), so a step that carries one reads the weights once, not twice.
  bool mixed_graph = true;
  absl::Duration step_timeout = absl::Seconds(60);  // then NCCL is aborted and the step fails
  // Host<->device transfer groups copied by a kernel on the copy stream (SM loads and stores
  // through the pinned host tier's device mapping, kernels/cuda/copy_rows.h) instead of
  // cudaMemcpy2DAsync's copy engine, one DMA descriptor per 4 KB row. Off until a GPU has
  // measured both (tools/device_check.sh run: the "transfer group" table).
  bool host_copy_kernel = false;
  // LoRA adapter slots (StepDescriptor::adapter, PrefillChunk::adapter; 0: none). Each rank
  // keeps an adapter's share of the factors in bf16 whatever EngineOptions::lora_dtype says (A^T
  // and (scale B)^T, cut as the CPU ranks cut them: runtime/tp_shard.h ShardLoraAdapter), in
  // slot memory allocated at Create for max_lora_rank, and a table of every slot's factors that
  // the graphs read; with slots, each pass is captured a second time with every adapted
  // projection's shrink and expand after its product (kernels/cuda/lora.cu), and a step replays
  // that graph only when one of its rows runs an adapter.
  int32_t max_lora_adapters = 0;
  int32_t max_lora_rank = 0;  // the largest rank a slot takes (sizes the shrink's scratch)
  // Put in slots 0, 1, ... at Create (kvrmd --lora_modules); at most max_lora_adapters.
  std::vector<const LoraAdapter*> lora_adapters;
};

// Number of CUDA devices usable by this process (0 when there is no driver or no GPU).
int CudaDeviceCount();

class CudaBackend : public Backend {
 public:
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const LlamaConfig& config,
                                                             const LlamaWeights* weights,
                                                             const CudaBackendOptions& options);
  ~CudaBackend() override;

  absl::Status Decode(const StepDescriptor& step, float* logits) override;
  absl::Status Prefill(const PrefillChunk& chunk, float* last_logits) override;
  bool samples_on_device() const override;
  // A graph replay takes about a millisecond: the engine and the step runner poll for each
  // other instead of paying two futex wake-ups a step (bench/engine_overhead measures both).
  absl::Duration handoff_spin() const override { return absl::Milliseconds(2); }
  bool fuses_prefill() const override { return options_.mixed_graph; }
  // Chunks whose run table fits the mixed graph's (max_runs; a wider prompt table runs apart).
  bool CanFuse(const PrefillChunk& chunk) const override;
  absl::Status DecodeWithChunk(const PrefillChunk& chunk, float* last_logits,
                               const StepDescriptor& step, float* logits) override;
  absl::Status DecodeWithChunkAndSample(const PrefillChunk& chunk, float* last_logits,
                                        const StepDescriptor& step, float* logits,
                                        int32_t* tokens) override;
  // The decode graph ends with the sampling kernel over the rows the step marks; their tokens
  // come back (4 bytes a row) and only the other rows' logits are copied.
  absl::Status DecodeAndSample(const StepDescriptor& step, float* logits,
                               int32_t* tokens) override;
  int32_t vocab_size() const override { return config_.vocab_size; }
  // Embeddings, classification and scoring (PrefillChunk::hidden): after a chunk's pass the
  // final norm of the rows asked for is recomputed from rank 0's residual stream, in f32, into
  // scratch the pass no longer reads, and copied back (ReadHidden).
  bool returns_hidden() const override { return true; }
  int32_t max_chunk_tokens() const override { return options_.max_chunk_tokens; }
  int32_t num_kv_pools() const override { return static_cast<int32_t>(ranks_.size()); }
  // Views of device memory: shapes for the engine; pointers for this backend's kernels only.
  KvPool* kv_pool(int32_t rank) override;
  absl::Status CreateHostTier(int64_t blocks) override;
  absl::Status CopyGroup(const TransferGroup& group) override;
  int32_t max_lora_adapters() const override { return options_.max_lora_adapters; }
  int32_t max_lora_rank() const override { return options_.max_lora_rank; }
  // Shards the adapter for every rank into bf16 host buffers: no CUDA call (a device allocation
  // or free while steps run could stall behind, or deadlock with, NCCL collectives at --tp=2).
  absl::StatusOr<std::shared_ptr<const PreparedLoraAdapter>> PrepareLoraAdapter(
      const LoraAdapter& adapter) const override;
  // Uploads the adapter's factors into slot `index`'s memory on each rank and rewrites the slot's
  // entries of the factor table, on the compute stream between two steps (the one part of a
  // load on the engine thread: the factors' bytes over PCIe, about a millisecond for the small
  // model's rank-16 adapter), and lets go of the adapter it held. On an error the slot is left
  // empty on every rank.
  absl::Status SetLoraAdapter(int32_t index,
                              std::shared_ptr<const PreparedLoraAdapter> adapter) override;

  // Bytes of weights and of KV each decode step reads on one rank at the given total history
  // length (the roofline numerator of the device check).
  int64_t weight_bytes_per_rank() const { return weight_bytes_per_rank_; }
  int64_t kv_bytes_per_token_per_rank() const;
  std::string device_name() const { return device_name_; }
  // Replays the decode graph `iterations` times over the inputs of the last Decode (device
  // check only: it rewrites those rows' KV) and returns milliseconds per replay (CUDA events,
  // rank 0; every rank replays). With `lora`, the decode graph with the adapters' products.
  absl::StatusOr<double> TimeDecodeReplays(int iterations, bool lora = false);

 private:
  struct Rank;
  // The captured passes: the decode step, a prefill chunk alone, and both in one (mixed).
  enum Pass : int { kDecodePass = 0, kPrefillPass = 1, kMixedPass = 2 };
  static constexpr int kPasses = 3;
  CudaBackend(const LlamaConfig& config, const CudaBackendOptions& options);
  absl::Status InitRank(int32_t r, const LlamaWeights& weights);
  // Enqueues the forward pass over the pass's rows reading its static inputs (device memory);
  // with `lora`, each adapted projection's shrink and expand after its product.
  absl::Status EnqueueForward(Rank& rank, Pass pass, bool lora);
  // The shrink and expand of `targets` projections from `first` on (consecutive LoraTargets that
  // share the input x and write their columns of y's rows side by side).
  absl::Status EnqueueLora(Rank& rank, const StepInputs& in, int32_t layer, int32_t first,
                           int32_t targets, const bf16* x, float* y);
  absl::Status Capture(Rank& rank, Pass pass, bool lora);
  // INVALID_ARGUMENT when an active row names an empty adapter slot.
  absl::Status CheckAdapterSlots(const StepDescriptor* step, const PrefillChunk* chunk) const;
  // Runs the decode or prefill step on every rank (its own thread each) and waits: one input
  // upload, the graph, then copies of the logits of rows [first, end) for each range in
  // `logit_rows` and, with `sampled`, of the sampled tokens.
  struct RowRange {
    int32_t first = 0, end = 0;
  };
  absl::Status RunStep(Pass pass, absl::Span<const RowRange> logit_rows, bool sampled, bool lora);
  // Shared by Decode, DecodeAndSample and (with a chunk: the mixed pass) the DecodeWithChunk
  // pair.
  absl::Status DecodeRows(const PrefillChunk* chunk, float* last_logits,
                          const StepDescriptor& step, float* logits, int32_t* tokens);
  absl::Status Wait(Rank& rank);
  // PrefillChunk::hidden after the chunk's pass: rows [hidden_begin, hidden_end) of the chunk,
  // whose first row is residual row `first_row` (0 in the prefill pass; max_slots in the mixed
  // one), normalized by the final norm and added to chunk.hidden. Nothing without one.
  absl::Status ReadHidden(const PrefillChunk& chunk, int32_t first_row);

  const LlamaConfig config_;
  const CudaBackendOptions options_;
  PackLimits limits_;
  StepInputLayout layouts_[kPasses];  // the mixed one is allocated even when its graph is off
  std::vector<std::unique_ptr<Rank>> ranks_;
  std::unique_ptr<class NcclGroup> nccl_;
  ThreadPool rank_threads_;
  std::vector<absl::Status> rank_status_;
  std::vector<RowRange> logit_ranges_;   // reserved to max_slots: no allocation per step
  void* inputs_host_[kPasses] = {};      // pinned, owned by ranks_[0]
  int64_t weight_bytes_per_rank_ = 0;
  std::string device_name_;
  // The adapter in each LoRA slot (null: empty); its device memory lives as long as it does.
  std::vector<std::shared_ptr<const PreparedLoraAdapter>> lora_;
};

}  // namespace kvrm::cuda

#endif  // KVRM_RUNTIME_CUDA_CUDA_BACKEND_H_
