#include "runtime/cuda/cuda_backend.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "kernels/cuda/copy_rows.h"
#include "kernels/cuda/llama_kernels.h"
#include "model/lora.h"
#include "runtime/cuda/attention_vectors.h"
#include "runtime/cuda/cuda_raii.h"
#include "runtime/cuda/lt_gemm.h"
#include "runtime/cuda/nccl_communicator.h"
#include "runtime/cuda/transfer_lowering.h"
#include "runtime/tp_shard.h"

namespace kvrm::cuda {
namespace {

constexpr size_t kGemmWorkspaceBytes = 32u << 20;

int64_t RoundUp(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

// Converts `w` (any stored dtype, any row stride) to dense bf16 rows at `dst`.
void ToBf16(const WeightMatrix& w, uint16_t* dst, std::vector<float>& row) {
  row.resize(w.cols);
  for (int64_t r = 0; r < w.rows; ++r) {
    WeightRowToFloat(w, r, row.data());
    for (int64_t i = 0; i < w.cols; ++i) dst[r * w.cols + i] = FloatToBf16(row[i]);
  }
}

// The [in, out] of each LoraTarget's product on a rank with `heads` and `kv_heads` heads of
// `head_dim` and `ffn` intermediate features: what the LoRA kernels take for it (EnqueueForward)
// and so what a slot holds and an adapter's share must be.
using LoraShapes = std::array<std::array<int64_t, 2>, kNumLoraTargets>;
LoraShapes LoraTargetShapes(int64_t hidden, int64_t head_dim, int64_t heads, int64_t kv_heads,
                            int64_t ffn) {
  const int64_t d = hidden, qw = heads * head_dim, kvw = kv_heads * head_dim;
  return {{{d, qw}, {d, kvw}, {d, kvw}, {qw, d}, {d, ffn}, {d, ffn}, {ffn, d}}};
}

// One layer's RoPE + KV write and attention over a pool of `Kv` elements (float or bf16): the
// view's untyped pointers as the kernels' typed layer.
template <typename Kv>
absl::Status RopeKvAndAttention(const KvLayerView& view, float* qkv, const StepInputs& in,
                                const float* rope, int32_t heads, int32_t kv_heads, float scale,
                                int32_t window, const AttentionWorkspace& ws, bf16* out,
                                cudaStream_t s) {
  const KvLayer<Kv> kv{static_cast<Kv*>(view.k), static_cast<Kv*>(view.v), view.head_stride,
                       view.block_tokens, view.head_dim};
  RETURN_IF_ERROR(LaunchRopeAndStoreKv(qkv, in, rope, heads, kv_heads, kv, s));
  return LaunchAttention(qkv, in, kv, heads, kv_heads, scale, window, ws, out, s);
}

}  // namespace

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
}

struct CudaBackend::Rank {
  int32_t index = 0;
  int device = 0;
  int64_t max_pitch = 0;  // cudaDevAttrMaxPitch: cudaMemcpy2D refuses larger row pitches
  int32_t heads = 0, kv_heads = 0, ffn = 0, vocab_begin = 0, vocab_share = 0;
  StreamPtr stream, copy_stream;
  LtHandlePtr lt;
  DevicePtr gemm_workspace;

  DevicePtr weights;  // one allocation; the pointers below point into it
  bf16* embed = nullptr;
  bf16* final_norm = nullptr;
  bf16* lm_head = nullptr;
  struct Layer {
    bf16 *attn_norm, *mlp_norm, *wqkv, *wo, *wgu, *wdown;
    // Qwen2 / Qwen3 / biased attention (f32, in `vectors`; null where the model has none):
    // [q + k + v] biases of this rank's heads, the O bias, the per-head Q and K norm weights.
    const float* qkv_bias = nullptr;
    const float* o_bias = nullptr;
    const float* q_norm = nullptr;
    const float* k_norm = nullptr;
  };
  std::vector<Layer> layers;
  DevicePtr vectors;  // PackAttentionVectors' buffer; none for a plain Llama

  DevicePtr kv;
  std::unique_ptr<KvPool> kv_view;
  PinnedPtr host_tier;
  char* host_tier_device = nullptr;  // host_tier as the device sees it (host_copy_kernel)
  DevicePtr rope;

  DevicePtr activations;
  float* x = nullptr;      // [rows][hidden]
  bf16* xn = nullptr;      // [rows][hidden]
  float* qkv = nullptr;    // [rows][(heads + 2 kv_heads) head_dim]
  bf16* attn = nullptr;    // [rows][heads head_dim]
  float* gu = nullptr;     // [rows][2 ffn]
  bf16* act = nullptr;     // [rows][ffn]
  float* logits = nullptr; // [rows][vocab share]
  AttentionWorkspace ws;  // sized for the largest pass; passes run one at a time

  struct Gemms {
    std::unique_ptr<LtGemm> qkv, o, gu, down, lm;
  };
  // Per pass (Pass): the static input buffer, the products planned for its rows, its graph.
  struct PassState {
    DevicePtr inputs;
    Gemms gemms;
    GraphExecPtr graph;
    GraphExecPtr lora_graph;  // the same pass with the adapters' products (LoRA slots only)
  };
  PassState passes[kPasses];
  PinnedPtr logits_host;  // [max rows][vocab share]
  PinnedPtr hidden_host;  // rank 0: a chunk's final-norm rows, f32 [max chunk rows][hidden]
  // Device sampling (samples_on_device): probabilities scratch [slots][vocab], the sampled
  // tokens [slots] on the device and pinned on the host. With more than one rank also the
  // gathered shards [ranks][slots][share] and the whole rows [slots][vocab] they make (every
  // rank samples the same rows from the same logits; rank 0's tokens are read).
  DevicePtr sample_scratch;
  float* probs = nullptr;
  int32_t* sampled = nullptr;
  float* gathered = nullptr;
  float* full_logits = nullptr;
  PinnedPtr sampled_host;
  PinnedPtr inputs_host;  // rank 0 only: each pass's layout, one after the other
  Communicator* comm = nullptr;
  // LoRA (max_lora_adapters > 0). The slots' factor memory, allocated at start-up for
  // max_lora_rank: slot i at lora_factors + i * lora_slot_elems (bf16 elements), projection e
  // (layer * kNumLoraTargets + target) at lora_at[e] (A^T, [in][round_up(max rank, 16)]) and
  // lora_bt[e] (B^T, [max rank][out]) within it; an adapter of lower rank fills the start of
  // each. The table the graphs read, [layer][LoraTarget][slot], and its host mirror; the
  // shrink's partial sums for the largest pass.
  DevicePtr lora_factors;
  int64_t lora_slot_elems = 0;
  std::vector<int64_t> lora_at, lora_bt;
  DevicePtr lora_table;
  std::vector<LoraFactors> lora_table_host;
  DevicePtr lora_partial;
};

namespace {

// A LoRA adapter as the CUDA backend holds it before SetLoraAdapter uploads it into a slot: on
// the host only (preparing makes no CUDA call, so nothing allocates or frees device memory while
// steps, NCCL collectives among them, run). Per rank: every adapted projection's bf16 A^T and
// (scale B)^T, one after the other in `data`.
class CudaLoraAdapter : public PreparedLoraAdapter {
 public:
  struct Projection {
    int32_t entry = 0;  // layer * kNumLoraTargets + target
    int32_t rank = 0, stride = 0;
    int64_t at = 0, at_elems = 0, bt = 0, bt_elems = 0;  // offsets and sizes in `data`
  };
  struct Share {
    std::vector<uint16_t> data;
    std::vector<Projection> projections;
  };
  std::vector<Share> shares;  // one per rank
};

}  // namespace

CudaBackend::CudaBackend(const LlamaConfig& config, const CudaBackendOptions& options)
    : config_(config),
      options_(options),
      rank_threads_(std::max(1, options.tensor_parallel)) {}

CudaBackend::~CudaBackend() {
  // Each rank's resources go with its own device current, and before the NCCL communicators
  // (nccl_, destroyed after this body): its graphs hold captured collectives on them.
  for (auto& r : ranks_) {
    if (r == nullptr) continue;
    cudaSetDevice(r->device);
    if (r->stream) cudaStreamSynchronize(r->stream.get());
    if (r->copy_stream) cudaStreamSynchronize(r->copy_stream.get());
    r.reset();
  }
}

KvPool* CudaBackend::kv_pool(int32_t rank) { return ranks_[rank]->kv_view.get(); }

int64_t CudaBackend::kv_bytes_per_token_per_rank() const {
  return ranks_[0]->kv_view->shape().BytesPerToken();
}

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(
    const LlamaConfig& config, const LlamaWeights* weights, const CudaBackendOptions& options) {
  const int32_t tp = options.tensor_parallel;
  if (tp < 1) return absl::InvalidArgumentError("--tp must be at least 1");
  if (config.norm_weight_offset != 0 || config.sandwich_norms || !config.pre_norms ||
      config.qk_norm_whole || config.hidden_act != "silu" || config.attn_logit_softcapping > 0 ||
      config.final_logit_softcapping > 0 || config.rope_local_theta > 0) {
    return absl::UnimplementedError(absl::StrCat(
        "model_type ", config.model_type,
        ": the CUDA backend does not compute Gemma's or OLMo 2's block (output norms, GELU, "
        "softcapping, whole-projection Q/K norms) yet; use --device=cpu"));
  }
  if (config.moe()) {
    return absl::UnimplementedError(
        absl::StrCat("model_type ", config.model_type,
                     ": the CUDA backend does not compute mixtures of experts yet; use "
                     "--device=cpu"));
  }
  if (config.embedding_multiplier != 1 || config.attention_scale > 0 ||
      config.residual_multiplier != 1 || config.logits_scaling != 1) {
    return absl::UnimplementedError(absl::StrCat(
        "model_type ", config.model_type,
        ": the CUDA backend does not compute Granite's multipliers yet; use --device=cpu"));
  }
  const int devices = CudaDeviceCount();
  if (devices < tp) {
    return absl::FailedPreconditionError(absl::StrCat("--device=cuda --tp=", tp, " needs ", tp,
                                                      " GPUs; this process sees ", devices));
  }
  if (config.head_dim != 64 && config.head_dim != 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("head_dim ", config.head_dim, ": the CUDA kernels take 64 or 128"));
  }
  if (config.num_attention_heads / config.num_key_value_heads > 8) {
    return absl::InvalidArgumentError("more than 8 query heads per KV head");
  }
  if (options.max_slots < 1 || options.max_chunk_tokens < 1 || options.max_context < 1 ||
      options.kv_blocks < 1 || options.kv_block_tokens < 1 || options.max_runs < 1 ||
      options.split_tokens < 1) {
    return absl::InvalidArgumentError("CUDA backend: every size must be positive");
  }
  if (options.attention_token_sets != 2 && options.attention_token_sets != 4) {
    return absl::InvalidArgumentError("CUDA backend: attention_token_sets must be 2 or 4");
  }
  if (options.kv_dtype != DType::kF32 && options.kv_dtype != DType::kBF16) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CUDA backend: KV dtype ", std::string(DTypeName(options.kv_dtype)),
        ": f32 or bf16 (an FP8 KV cache, --kv_dtype=fp8, is the CPU backend's for now)"));
  }
  if (options.max_lora_adapters < 0 ||
      options.max_lora_adapters < static_cast<int32_t>(options.lora_adapters.size())) {
    return absl::InvalidArgumentError(absl::StrCat("max_lora_adapters ", options.max_lora_adapters,
                                                   ": below the ", options.lora_adapters.size(),
                                                   " adapters to serve"));
  }
  if (options.max_lora_rank < 0 || options.max_lora_rank > kMaxLoraRank ||
      (options.max_lora_adapters > 0 && options.max_lora_rank < 1)) {
    return absl::InvalidArgumentError(absl::StrCat("max_lora_rank ", options.max_lora_rank,
                                                   " is not in [1, ", kMaxLoraRank, "]"));
  }
  auto b = std::unique_ptr<CudaBackend>(new CudaBackend(config, options));
  b->limits_ =
      PackLimits{options.kv_blocks,         options.kv_block_tokens,
                 options.max_context,       config.vocab_size,
                 options.max_lora_adapters, config.AllLayersSlide() ? config.sliding_window : 0};
  b->lora_.resize(options.max_lora_adapters);
  b->layouts_[kDecodePass] = DecodeLayout(options.max_slots, options.max_runs);
  // A prompt's run table may be wider than the descriptor's rows while compaction is pending (the
  // engine then passes the pager's full table), so the prefill graph's one table takes as many
  // runs as a max-context history can have.
  const int32_t context_blocks =
      (options.max_context + options.kv_block_tokens - 1) / options.kv_block_tokens;
  b->layouts_[kPrefillPass] =
      PrefillLayout(options.max_chunk_tokens, std::max(options.max_runs, context_blocks));
  b->layouts_[kMixedPass] =
      MixedLayout(options.max_slots, options.max_chunk_tokens, options.max_runs);
  cudaDeviceProp prop{};
  KVRM_CUDA_RETURN_IF_ERROR(cudaGetDeviceProperties(&prop, 0));
  b->device_name_ = prop.name;
  if (tp > 1) {
    std::vector<int> devs(tp);
    for (int i = 0; i < tp; ++i) devs[i] = i;
    ASSIGN_OR_RETURN(b->nccl_, NcclGroup::Create(devs));
  }
  b->ranks_.resize(tp);
  b->rank_status_.resize(tp);
  for (int32_t r = 0; r < tp; ++r) RETURN_IF_ERROR(b->InitRank(r, *weights));
  b->logit_ranges_.reserve(options.max_slots + 1);  // decode rows and a chunk's last row
  // Capture on every rank's thread at once: NCCL collectives in the graphs are recorded, not
  // run, but each rank's capture must see its own device.
  for (Pass pass : {kDecodePass, kPrefillPass, kMixedPass}) {
    if (pass == kMixedPass && !options.mixed_graph) continue;
    for (bool lora : {false, true}) {
      if (lora && options.max_lora_adapters == 0) continue;
      b->rank_threads_.RunOnAll([&](int t) {
        Rank& rank = *b->ranks_[t];
        absl::Status st =
            CudaStatus(cudaSetDevice(rank.device), "cudaSetDevice", __FILE__, __LINE__);
        if (st.ok()) st = b->Capture(rank, pass, lora);
        b->rank_status_[t] = st;
      });
      for (const absl::Status& st : b->rank_status_) RETURN_IF_ERROR(st);
    }
  }
  for (size_t i = 0; i < options.lora_adapters.size(); ++i) {
    ASSIGN_OR_RETURN(std::shared_ptr<const PreparedLoraAdapter> prepared,
                     b->PrepareLoraAdapter(*options.lora_adapters[i]));
    RETURN_IF_ERROR(b->SetLoraAdapter(static_cast<int32_t>(i), std::move(prepared)));
  }
  LOG(INFO) << "CUDA backend on " << tp << "x " << b->device_name_ << ": "
            << b->weight_bytes_per_rank_ / (1 << 20) << " MiB of bf16 weights per rank, "
            << options.kv_blocks << " " << DTypeName(options.kv_dtype)
            << " KV blocks per rank, graphs " << (options.use_graphs ? "captured" : "off") << ", "
            << options.max_lora_adapters << " LoRA slots";
  return b;
}

absl::Status CudaBackend::InitRank(int32_t r, const LlamaWeights& full) {
  auto rank_owner = std::make_unique<Rank>();
  Rank& rank = *rank_owner;
  ranks_[r] = std::move(rank_owner);
  rank.index = r;
  rank.device = r;
  KVRM_CUDA_RETURN_IF_ERROR(cudaSetDevice(rank.device));
  int max_pitch = 0;
  KVRM_CUDA_RETURN_IF_ERROR(cudaDeviceGetAttribute(&max_pitch, cudaDevAttrMaxPitch, rank.device));
  rank.max_pitch = max_pitch;
  ASSIGN_OR_RETURN(RankWeights w, ShardLlamaWeights(config_, full, r, options_.tensor_parallel));
  rank.heads = w.heads;
  rank.kv_heads = w.kv_heads;
  rank.ffn = w.ffn;
  rank.vocab_begin = w.vocab_begin;
  rank.vocab_share = static_cast<int32_t>(w.lm_head.rows);
  ASSIGN_OR_RETURN(rank.stream, NewStream());
  ASSIGN_OR_RETURN(rank.copy_stream, NewStream());
  cublasLtHandle_t lt = nullptr;
  KVRM_CUBLAS_RETURN_IF_ERROR(cublasLtCreate(&lt));
  rank.lt.reset(lt);
  ASSIGN_OR_RETURN(rank.gemm_workspace, DeviceAlloc(kGemmWorkspaceBytes, "cuBLASLt workspace"));
  if (nccl_) {
    rank.comm = nccl_->communicator(r);
    nccl_->SetStream(r, rank.stream.get());
  }

  // ---- Weights: bf16, fused QKV and gate/up, one allocation.
  const int64_t d = config_.hidden_size, hd = config_.head_dim;
  const int64_t qw = int64_t{w.heads} * hd, kvw = int64_t{w.kv_heads} * hd, ffn = w.ffn;
  // Offsets first (every operand of a product starts 256-byte aligned, as cuBLASLt's heuristic
  // assumes by default; q/k/v and gate/up stay contiguous: each is one fused matrix), then one
  // allocation and one copy.
  struct Placed {
    const WeightMatrix* m;
    int64_t at;
  };
  std::vector<Placed> placed;
  int64_t at = 0, unpadded = 0;
  auto place = [&](const WeightMatrix& m, bool aligned) {
    if (aligned) at = RoundUp(at, 128);  // elements: 256 bytes
    placed.push_back({&m, at});
    at += m.rows * m.cols;
    unpadded += m.rows * m.cols;
    return at - m.rows * m.cols;
  };
  struct LayerAt {
    int64_t attn_norm, mlp_norm, wqkv, wo, wgu, wdown;
  };
  const int64_t embed_at = place(w.embed, true);
  const int64_t final_norm_at = place(w.final_norm, true);
  const int64_t lm_head_at = place(w.lm_head, true);
  std::vector<LayerAt> layer_at;
  for (const LayerWeights& l : w.layers) {
    LayerAt la{};
    la.attn_norm = place(l.attn_norm, true);
    la.mlp_norm = place(l.mlp_norm, true);
    la.wqkv = place(l.wq, true);  // wk and wv follow contiguously: one fused [q+k+v][hidden]
    place(l.wk, false);
    place(l.wv, false);
    la.wo = place(l.wo, true);
    la.wgu = place(l.w_gate, true);  // up follows: one fused [2 ffn][hidden] matrix
    place(l.w_up, false);
    la.wdown = place(l.w_down, true);
    layer_at.push_back(la);
  }
  const int64_t total = at;
  weight_bytes_per_rank_ = unpadded * 2;
  ASSIGN_OR_RETURN(rank.weights, DeviceAlloc(total * 2, "weights"));
  std::vector<uint16_t> host(total, 0);
  std::vector<float> row;
  for (const Placed& p : placed) ToBf16(*p.m, host.data() + p.at, row);
  bf16* wbase = static_cast<bf16*>(rank.weights.get());
  rank.embed = wbase + embed_at;
  rank.final_norm = wbase + final_norm_at;
  rank.lm_head = wbase + lm_head_at;
  for (const LayerAt& la : layer_at) {
    rank.layers.push_back(Rank::Layer{wbase + la.attn_norm, wbase + la.mlp_norm, wbase + la.wqkv,
                                      wbase + la.wo, wbase + la.wgu, wbase + la.wdown});
  }
  KVRM_CUDA_RETURN_IF_ERROR(
      cudaMemcpy(rank.weights.get(), host.data(), total * 2, cudaMemcpyHostToDevice));

  // ---- Attention biases and Q/K norms (Qwen2, Qwen3, attention_bias): f32, one allocation.
  {
    ASSIGN_OR_RETURN(const AttentionVectors v, PackAttentionVectors(config_, w));
    if (!v.data.empty()) {
      const int64_t bytes = static_cast<int64_t>(v.data.size()) * 4;
      ASSIGN_OR_RETURN(rank.vectors, DeviceAlloc(bytes, "attention biases and norms"));
      KVRM_CUDA_RETURN_IF_ERROR(
          cudaMemcpy(rank.vectors.get(), v.data.data(), bytes, cudaMemcpyHostToDevice));
      const float* vbase = static_cast<const float*>(rank.vectors.get());
      auto at = [&](int64_t offset) { return offset < 0 ? nullptr : vbase + offset; };
      // Read every step, as the weights are (the roofline's numerator).
      const int64_t floats_per_layer = (config_.qkv_bias ? qw + 2 * kvw : 0) +
                                       (config_.o_bias ? d : 0) + (config_.qk_norm ? 2 * hd : 0);
      weight_bytes_per_rank_ += floats_per_layer * 4 * config_.num_hidden_layers;
      for (size_t i = 0; i < rank.layers.size(); ++i) {
        const AttentionVectors::Layer& la = v.layers[i];
        Rank::Layer& l = rank.layers[i];
        l.qkv_bias = at(la.qkv_bias);
        l.o_bias = at(la.o_bias);
        l.q_norm = at(la.q_norm);
        l.k_norm = at(la.k_norm);
      }
    }
  }

  // ---- RoPE table: the CPU backend's own (RopeTable: the same floats, YaRN's attention factor
  // in cos and sin).
  {
    const std::vector<float> rope = RopeTable(config_, options_.max_context);
    ASSIGN_OR_RETURN(rank.rope, DeviceAlloc(rope.size() * 4, "RoPE table"));
    KVRM_CUDA_RETURN_IF_ERROR(
        cudaMemcpy(rank.rope.get(), rope.data(), rope.size() * 4, cudaMemcpyHostToDevice));
  }

  // ---- KV pool share.
  KvPoolShape shape;
  shape.num_layers = config_.num_hidden_layers;
  shape.kv_heads = w.kv_heads;
  shape.head_dim = config_.head_dim;
  shape.block_tokens = options_.kv_block_tokens;
  shape.num_blocks = options_.kv_blocks;
  shape.dtype = options_.kv_dtype;  // BytesPerBlock counts DTypeSize: 2 bytes an element for bf16
  ASSIGN_OR_RETURN(rank.kv, DeviceAlloc(shape.BytesPerBlock() * shape.num_blocks, "KV pool"));
  KVRM_CUDA_RETURN_IF_ERROR(cudaMemset(rank.kv.get(), 0, shape.BytesPerBlock() * shape.num_blocks));
  rank.kv_view = KvPool::Wrap(shape, rank.kv.get());

  // ---- Activations for the largest pass (slots + chunk rows with the mixed graph, else
  // max(slots, chunk)), and the attention scratch.
  const int64_t rows =
      options_.mixed_graph ? int64_t{options_.max_slots} + options_.max_chunk_tokens
                           : std::max(options_.max_slots, options_.max_chunk_tokens);
  const int32_t splits =
      static_cast<int32_t>((options_.max_context + options_.split_tokens - 1) / options_.split_tokens);
  const int64_t partial = AttentionPartialFloats(rows, w.heads, splits, hd);
  struct Part {
    int64_t bytes;
    void** out;
  };
  void* p_x; void* p_xn; void* p_qkv; void* p_attn; void* p_gu; void* p_act; void* p_logits;
  void* p_po; void* p_ml; void* p_done;
  const Part parts[] = {
      {rows * d * 4, &p_x},           {rows * d * 2, &p_xn},
      {rows * (qw + 2 * kvw) * 4, &p_qkv}, {rows * qw * 2, &p_attn},
      {rows * 2 * ffn * 4, &p_gu},    {rows * ffn * 2, &p_act},
      {rows * rank.vocab_share * 4, &p_logits}, {partial * 4, &p_po},
      {partial / hd * 2 * 4, &p_ml},
      {AttentionCounterInts(static_cast<int32_t>(rows), w.kv_heads) * 4, &p_done},  // zeroed below
  };
  int64_t act_bytes = 0;
  for (const Part& part : parts) act_bytes += RoundUp(part.bytes, 256);
  ASSIGN_OR_RETURN(rank.activations, DeviceAlloc(act_bytes, "activations"));
  KVRM_CUDA_RETURN_IF_ERROR(cudaMemset(rank.activations.get(), 0, act_bytes));
  char* base = static_cast<char*>(rank.activations.get());
  for (const Part& part : parts) {
    *part.out = base;
    base += RoundUp(part.bytes, 256);
  }
  rank.x = static_cast<float*>(p_x);
  rank.xn = static_cast<bf16*>(p_xn);
  rank.qkv = static_cast<float*>(p_qkv);
  rank.attn = static_cast<bf16*>(p_attn);
  rank.gu = static_cast<float*>(p_gu);
  rank.act = static_cast<bf16*>(p_act);
  rank.logits = static_cast<float*>(p_logits);
  rank.ws = AttentionWorkspace{static_cast<float*>(p_po), static_cast<float*>(p_ml), splits,
                                options_.split_tokens, static_cast<int32_t*>(p_done),
                                options_.attention_token_sets};

  // ---- Static input buffers and host staging.
  int64_t host_bytes = 0;
  for (int pass = 0; pass < kPasses; ++pass) {
    const int64_t bytes = layouts_[pass].bytes();
    ASSIGN_OR_RETURN(rank.passes[pass].inputs, DeviceAlloc(bytes, "step inputs"));
    KVRM_CUDA_RETURN_IF_ERROR(cudaMemset(rank.passes[pass].inputs.get(), 0, bytes));
    host_bytes += RoundUp(bytes, 256);
  }
  ASSIGN_OR_RETURN(rank.logits_host, PinnedAlloc(rows * rank.vocab_share * 4, "logits"));
  if (rank.index == 0) {
    ASSIGN_OR_RETURN(rank.hidden_host,
                     PinnedAlloc(int64_t{options_.max_chunk_tokens} * d * 4, "hidden states"));
  }
  if (options_.max_lora_adapters > 0) {
    // Each slot's regions, sized for max_lora_rank (what the kernels take: [in, out] per target).
    const int64_t max_rank = options_.max_lora_rank;
    const int64_t stride = RoundUp(max_rank, 16);
    const LoraShapes shapes = LoraTargetShapes(d, hd, w.heads, w.kv_heads, ffn);
    int64_t elems = 0;
    for (int32_t l = 0; l < config_.num_hidden_layers; ++l) {
      for (int32_t t = 0; t < kNumLoraTargets; ++t) {
        rank.lora_at.push_back(elems);
        elems = RoundUp(elems + shapes[t][0] * stride, 128);
        rank.lora_bt.push_back(elems);
        elems = RoundUp(elems + max_rank * shapes[t][1], 128);
      }
    }
    rank.lora_slot_elems = elems;
    ASSIGN_OR_RETURN(rank.lora_factors,
                     DeviceAlloc(elems * 2 * options_.max_lora_adapters, "LoRA adapter slots"));
    rank.lora_table_host.assign(static_cast<size_t>(config_.num_hidden_layers) * kNumLoraTargets *
                                    options_.max_lora_adapters,
                                LoraFactors{});
    const int64_t table_bytes =
        static_cast<int64_t>(rank.lora_table_host.size()) * sizeof(LoraFactors);
    ASSIGN_OR_RETURN(rank.lora_table, DeviceAlloc(table_bytes, "LoRA factor table"));
    KVRM_CUDA_RETURN_IF_ERROR(cudaMemcpy(rank.lora_table.get(), rank.lora_table_host.data(),
                                         table_bytes, cudaMemcpyHostToDevice));
    const int64_t partial_bytes =
        LoraPartialFloats(static_cast<int32_t>(rows), options_.max_lora_rank,
                          LoraSplits(static_cast<int32_t>(std::max({d, qw, ffn})))) *
        4;
    ASSIGN_OR_RETURN(rank.lora_partial, DeviceAlloc(partial_bytes, "LoRA shrink scratch"));
  }
  if (r == 0) {
    ASSIGN_OR_RETURN(rank.inputs_host, PinnedAlloc(host_bytes, "step inputs"));
    std::memset(rank.inputs_host.get(), 0, host_bytes);
    char* at = static_cast<char*>(rank.inputs_host.get());
    for (int pass = 0; pass < kPasses; ++pass) {
      inputs_host_[pass] = at;
      at += RoundUp(layouts_[pass].bytes(), 256);
    }
  }

  // ---- cuBLASLt plans for every pass's shapes.
  cublasLtHandle_t h = rank.lt.get();
  auto plan = [&](int64_t m, Rank::Gemms& g, int64_t lm_rows) -> absl::Status {
    ASSIGN_OR_RETURN(g.qkv, LtGemm::Create(h, m, d, qw + 2 * kvw, kGemmWorkspaceBytes));
    ASSIGN_OR_RETURN(g.o, LtGemm::Create(h, m, qw, d, kGemmWorkspaceBytes));
    ASSIGN_OR_RETURN(g.gu, LtGemm::Create(h, m, d, 2 * ffn, kGemmWorkspaceBytes));
    ASSIGN_OR_RETURN(g.down, LtGemm::Create(h, m, ffn, d, kGemmWorkspaceBytes));
    ASSIGN_OR_RETURN(g.lm, LtGemm::Create(h, lm_rows, d, rank.vocab_share, kGemmWorkspaceBytes));
    return absl::OkStatus();
  };
  // Sampling in the graph: at one rank over its logits; over several, after an all-gather of
  // the shards, which needs them equal (a vocabulary the ranks divide evenly).
  const bool tp = options_.tensor_parallel > 1;
  if (options_.device_sampling &&
      (!tp || config_.vocab_size % options_.tensor_parallel == 0)) {
    const int64_t row_floats = int64_t{options_.max_slots} * config_.vocab_size;
    const int64_t probs_bytes = RoundUp(row_floats * 4, 256);
    const int64_t tokens_bytes = RoundUp(int64_t{options_.max_slots} * 4, 256);
    const int64_t tp_bytes = tp ? 2 * probs_bytes : 0;  // gathered shards, then whole rows
    ASSIGN_OR_RETURN(rank.sample_scratch,
                     DeviceAlloc(probs_bytes + tokens_bytes + tp_bytes, "sampling"));
    char* at = static_cast<char*>(rank.sample_scratch.get());
    rank.probs = reinterpret_cast<float*>(at);
    rank.sampled = reinterpret_cast<int32_t*>(at + probs_bytes);
    if (tp) {
      rank.gathered = reinterpret_cast<float*>(at + probs_bytes + tokens_bytes);
      rank.full_logits = reinterpret_cast<float*>(at + 2 * probs_bytes + tokens_bytes);
    }
    ASSIGN_OR_RETURN(rank.sampled_host, PinnedAlloc(int64_t{options_.max_slots} * 4, "tokens"));
  }
  RETURN_IF_ERROR(plan(options_.max_slots, rank.passes[kDecodePass].gemms, options_.max_slots));
  RETURN_IF_ERROR(plan(options_.max_chunk_tokens, rank.passes[kPrefillPass].gemms, 1));
  if (options_.mixed_graph) {
    // The decode rows' logits and the chunk's last row's, after them.
    RETURN_IF_ERROR(plan(layouts_[kMixedPass].rows, rank.passes[kMixedPass].gemms,
                         options_.max_slots + 1));
  }
  KVRM_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize());
  return absl::OkStatus();
}

absl::Status CudaBackend::EnqueueLora(Rank& rank, const StepInputs& in, int32_t layer,
                                      int32_t first, int32_t targets, const bf16* x, float* y) {
  // The targets share their input and write their columns of y's rows side by side (the fused
  // QKV and gate/up products), in LoraTargetShapes' widths.
  const LoraShapes shapes =
      LoraTargetShapes(config_.hidden_size, config_.head_dim, rank.heads, rank.kv_heads, rank.ffn);
  const int32_t in_features = static_cast<int32_t>(shapes[first][0]);
  LoraOutputs outputs;
  int64_t ldy = 0;
  for (int32_t t = 0; t < targets; ++t) {
    outputs.col[t] = static_cast<int32_t>(ldy);
    outputs.out[t] = static_cast<int32_t>(shapes[first + t][1]);
    ldy += shapes[first + t][1];
  }
  const int32_t slots = options_.max_lora_adapters;
  const LoraFactors* factors = static_cast<const LoraFactors*>(rank.lora_table.get()) +
                               (int64_t{layer} * kNumLoraTargets + first) * slots;
  float* partial = static_cast<float*>(rank.lora_partial.get());
  cudaStream_t s = rank.stream.get();
  RETURN_IF_ERROR(LaunchLoraShrink(x, in_features, in, factors, targets, slots,
                                   options_.max_lora_rank, partial, s));
  return LaunchLoraExpand(partial, in_features, in, factors, targets, slots, options_.max_lora_rank,
                          outputs, y, ldy, s);
}

absl::Status CudaBackend::EnqueueForward(Rank& rank, Pass pass, bool lora) {
  const StepInputLayout& layout = layouts_[pass];
  const StepInputs in =
      StepInputs::At(layout, static_cast<const int32_t*>(rank.passes[pass].inputs.get()));
  const Rank::Gemms& g = rank.passes[pass].gemms;
  const AttentionWorkspace& ws = rank.ws;
  const int32_t slots = options_.max_slots;
  const int32_t rows = layout.rows;
  const int32_t d = config_.hidden_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const float scale = 1.0f / std::sqrt(static_cast<float>(config_.head_dim));
  // Row-parallel products add into x on rank 0 only; the all-reduce then sums the partials of
  // every rank onto the residual (x + p0 + p1 ...) on all ranks.
  const float residual_beta = rank.index == 0 ? 1.0f : 0.0f;
  cudaStream_t s = rank.stream.get();
  void* wsp = rank.gemm_workspace.get();
  const float* rope = static_cast<const float*>(rank.rope.get());

  // LoRA launches: consecutive targets that share an input (EnqueueLora).
  constexpr int32_t kQ = static_cast<int32_t>(LoraTarget::kQ);
  constexpr int32_t kO = static_cast<int32_t>(LoraTarget::kO);
  constexpr int32_t kGate = static_cast<int32_t>(LoraTarget::kGate);
  constexpr int32_t kDown = static_cast<int32_t>(LoraTarget::kDown);
  static_assert(static_cast<int32_t>(LoraTarget::kK) == kQ + 1 &&
                    static_cast<int32_t>(LoraTarget::kV) == kQ + 2 &&
                    static_cast<int32_t>(LoraTarget::kUp) == kGate + 1,
                "a launch takes consecutive targets");

  RETURN_IF_ERROR(LaunchEmbed(rank.embed, in, d, rank.x, s));
  for (int32_t layer = 0; layer < config_.num_hidden_layers; ++layer) {
    const Rank::Layer& l = rank.layers[layer];
    const KvLayerView view = rank.kv_view->Layer(layer);
    RETURN_IF_ERROR(LaunchRmsNorm<bf16>(rank.x, l.attn_norm, rank.xn, rows, d, eps, nullptr, s));
    RETURN_IF_ERROR(g.qkv->Run(rank.xn, l.wqkv, rank.qkv, 0.0f, wsp, s));
    if (lora) {
      RETURN_IF_ERROR(EnqueueLora(rank, in, layer, kQ, 3, rank.xn, rank.qkv));
    }
    if (l.qkv_bias != nullptr || l.q_norm != nullptr) {  // Qwen2 / Qwen3 only
      RETURN_IF_ERROR(LaunchQkvBiasAndNorm(rank.qkv, rows, rank.heads, rank.kv_heads,
                                           config_.head_dim, l.qkv_bias, l.q_norm, l.k_norm, eps,
                                           s));
    }
    // The pool's element type picks the kernels' instantiation (f32 or bf16; Create checked it).
    // SmolLM3's NoPE layers rotate nothing (a null table); a sliding-window layer (Mistral,
    // Qwen2, Phi-3) attends to its window.
    const float* layer_rope = config_.UsesRope(layer) ? rope : nullptr;
    const int32_t window = config_.SlidingWindowOf(layer);
    RETURN_IF_ERROR(view.dtype == DType::kBF16
                        ? RopeKvAndAttention<bf16>(view, rank.qkv, in, layer_rope, rank.heads,
                                                   rank.kv_heads, scale, window, ws, rank.attn, s)
                        : RopeKvAndAttention<float>(view, rank.qkv, in, layer_rope, rank.heads,
                                                    rank.kv_heads, scale, window, ws, rank.attn,
                                                    s));
    RETURN_IF_ERROR(g.o->Run(rank.attn, l.wo, rank.x, residual_beta, wsp, s));
    // Row-parallel: each rank's delta is a partial sum (its share of A's columns), completed by
    // the all-reduce with the product's.
    if (lora) RETURN_IF_ERROR(EnqueueLora(rank, in, layer, kO, 1, rank.attn, rank.x));
    if (rank.comm) RETURN_IF_ERROR(rank.comm->AllReduceSum(rank.x, int64_t{rows} * d));
    // An O bias joins the residual after the all-reduce (every rank adds it to its copy), in the
    // MLP norm's launch.
    RETURN_IF_ERROR(
        l.o_bias != nullptr
            ? LaunchAddBiasAndRmsNorm(rank.x, l.o_bias, l.mlp_norm, rank.xn, rows, d, eps, s)
            : LaunchRmsNorm<bf16>(rank.x, l.mlp_norm, rank.xn, rows, d, eps, nullptr, s));
    RETURN_IF_ERROR(g.gu->Run(rank.xn, l.wgu, rank.gu, 0.0f, wsp, s));
    if (lora) {
      RETURN_IF_ERROR(EnqueueLora(rank, in, layer, kGate, 2, rank.xn, rank.gu));
    }
    RETURN_IF_ERROR(LaunchSwiGlu(rank.gu, rows, rank.ffn, rank.act, s));
    RETURN_IF_ERROR(g.down->Run(rank.act, l.wdown, rank.x, residual_beta, wsp, s));
    if (lora) {
      RETURN_IF_ERROR(EnqueueLora(rank, in, layer, kDown, 1, rank.act, rank.x));
    }
    if (rank.comm) RETURN_IF_ERROR(rank.comm->AllReduceSum(rank.x, int64_t{rows} * d));
  }
  // The rows whose logits are wanted: every decode row, and a chunk's last row (after the decode
  // rows in a mixed pass).
  if (pass != kPrefillPass) {
    RETURN_IF_ERROR(LaunchRmsNorm<bf16>(rank.x, rank.final_norm, rank.xn, slots, d, eps, nullptr, s));
  }
  if (pass != kDecodePass) {
    bf16* last = rank.xn + (pass == kMixedPass ? int64_t{slots} * d : 0);
    RETURN_IF_ERROR(LaunchRmsNorm<bf16>(rank.x, rank.final_norm, last, 1, d, eps, in.last_row, s));
  }
  RETURN_IF_ERROR(g.lm->Run(rank.xn, rank.lm_head, rank.logits, 0.0f, wsp, s));
  if (pass != kPrefillPass && rank.sampled != nullptr) {
    // The decode rows the step marks (in.sample) are sampled; the others are left alone. One
    // rank samples its logits in place; several first gather every rank's share of the decode
    // rows and lay them out as whole rows (the host rows' shares stay as they were).
    StepInputs marked = in;
    marked.active = in.sample;
    marked.rows = slots;
    float* rows_logits = rank.logits;
    if (nccl_) {
      const int32_t ranks = static_cast<int32_t>(ranks_.size());
      RETURN_IF_ERROR(nccl_->AllGather(rank.index, rank.logits, rank.gathered,
                                       int64_t{slots} * rank.vocab_share));
      RETURN_IF_ERROR(
          LaunchInterleaveShards(rank.gathered, ranks, slots, rank.vocab_share, rank.full_logits, s));
      rows_logits = rank.full_logits;
    }
    RETURN_IF_ERROR(LaunchSample(rows_logits, marked, config_.vocab_size, in.sample_params,
                                 /*counts=*/nullptr, /*seen=*/nullptr, rank.probs, rank.sampled,
                                 s));
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::Capture(Rank& rank, Pass pass, bool lora) {
  // One eager pass over all-inactive inputs first: loads every module and cuBLASLt kernel
  // outside the capture.
  RETURN_IF_ERROR(EnqueueForward(rank, pass, lora));
  RETURN_IF_ERROR(Wait(rank));
  if (!options_.use_graphs) return absl::OkStatus();
  cudaStream_t s = rank.stream.get();
  KVRM_CUDA_RETURN_IF_ERROR(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  const absl::Status enqueued = EnqueueForward(rank, pass, lora);
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(s, &graph);
  GraphPtr graph_owner(graph);
  RETURN_IF_ERROR(enqueued);
  KVRM_CUDA_RETURN_IF_ERROR(end);
  cudaGraphExec_t exec = nullptr;
  KVRM_CUDA_RETURN_IF_ERROR(cudaGraphInstantiate(&exec, graph, 0));
  (lora ? rank.passes[pass].lora_graph : rank.passes[pass].graph).reset(exec);
  KVRM_CUDA_RETURN_IF_ERROR(cudaGraphUpload(exec, s));
  return Wait(rank);
}

absl::Status CudaBackend::Wait(Rank& rank) {
  // Poll rather than block: a collective that never completes (a peer died) must become an
  // error, not a hung engine thread.
  const auto deadline = std::chrono::steady_clock::now() +
                        absl::ToChronoNanoseconds(options_.step_timeout);
  int spins = 0;
  while (true) {
    const cudaError_t q = cudaStreamQuery(rank.stream.get());
    if (q == cudaSuccess) return absl::OkStatus();
    if (q != cudaErrorNotReady) {
      if (nccl_) nccl_->Abort();
      return CudaStatus(q, "step on the compute stream", __FILE__, __LINE__);
    }
    if (nccl_) {
      absl::Status st = nccl_->AsyncError();
      if (!st.ok()) {
        nccl_->Abort();
        return st;
      }
    }
    if (std::chrono::steady_clock::now() > deadline) {
      if (nccl_) nccl_->Abort();
      return absl::DeadlineExceededError(absl::StrCat(
          "GPU step did not finish within ", absl::FormatDuration(options_.step_timeout),
          nccl_ ? "; NCCL communicators aborted" : ""));
    }
    if (++spins > 64) std::this_thread::yield();
  }
}

absl::Status CudaBackend::RunStep(Pass pass, absl::Span<const RowRange> logit_rows, bool sampled,
                                  bool lora) {
  const StepInputLayout& layout = layouts_[pass];
  const void* host_inputs = inputs_host_[pass];
  auto run = [&](int t) {
    Rank& rank = *ranks_[t];
    auto body = [&]() -> absl::Status {
      KVRM_CUDA_RETURN_IF_ERROR(cudaSetDevice(rank.device));
      cudaStream_t s = rank.stream.get();
      void* dev_inputs = rank.passes[pass].inputs.get();
      KVRM_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(dev_inputs, host_inputs, layout.bytes(), cudaMemcpyHostToDevice, s));
      if (options_.use_graphs) {
        const Rank::PassState& p = rank.passes[pass];
        KVRM_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(lora ? p.lora_graph.get() : p.graph.get(), s));
      } else {
        RETURN_IF_ERROR(EnqueueForward(rank, pass, lora));
      }
      const int64_t row_bytes = int64_t{rank.vocab_share} * 4;
      for (const RowRange& r : logit_rows) {
        KVRM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
            static_cast<char*>(rank.logits_host.get()) + r.first * row_bytes,
            reinterpret_cast<const char*>(rank.logits) + r.first * row_bytes,
            (r.end - r.first) * row_bytes, cudaMemcpyDeviceToHost, s));
      }
      if (sampled) {
        KVRM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(rank.sampled_host.get(), rank.sampled,
                                                  int64_t{options_.max_slots} * 4,
                                                  cudaMemcpyDeviceToHost, s));
      }
      return Wait(rank);
    };
    rank_status_[t] = body();
  };
  if (ranks_.size() == 1) {
    run(0);
  } else {
    rank_threads_.RunOnAll(run);
  }
  for (const absl::Status& st : rank_status_) RETURN_IF_ERROR(st);
  return absl::OkStatus();
}

bool CudaBackend::samples_on_device() const { return ranks_[0]->sampled != nullptr; }

absl::Status CudaBackend::Decode(const StepDescriptor& step, float* logits) {
  return DecodeRows(nullptr, nullptr, step, logits, nullptr);
}

absl::Status CudaBackend::DecodeAndSample(const StepDescriptor& step, float* logits,
                                          int32_t* tokens) {
  if (!samples_on_device()) {
    return absl::FailedPreconditionError(
        "device sampling is off (disabled, or a vocabulary the ranks do not divide evenly)");
  }
  return DecodeRows(nullptr, nullptr, step, logits, tokens);
}

absl::Status CudaBackend::DecodeWithChunk(const PrefillChunk& chunk, float* last_logits,
                                          const StepDescriptor& step, float* logits) {
  return DecodeRows(&chunk, last_logits, step, logits, nullptr);
}

absl::Status CudaBackend::DecodeWithChunkAndSample(const PrefillChunk& chunk, float* last_logits,
                                                   const StepDescriptor& step, float* logits,
                                                   int32_t* tokens) {
  if (!samples_on_device()) {
    return absl::FailedPreconditionError(
        "device sampling is off (disabled, or a vocabulary the ranks do not divide evenly)");
  }
  return DecodeRows(&chunk, last_logits, step, logits, tokens);
}

bool CudaBackend::CanFuse(const PrefillChunk& chunk) const {
  return options_.mixed_graph && chunk.num_runs <= options_.max_runs &&
         static_cast<int64_t>(chunk.tokens.size()) <= options_.max_chunk_tokens;
}

absl::Status CudaBackend::DecodeRows(const PrefillChunk* chunk, float* last_logits,
                                     const StepDescriptor& step, float* logits,
                                     int32_t* tokens) {
  if (nccl_ && nccl_->aborted()) return absl::UnavailableError("GPU communicators were aborted");
  if (chunk != nullptr && !options_.mixed_graph) {
    return absl::UnimplementedError("the mixed graph is off (CudaBackendOptions::mixed_graph)");
  }
  const bool sample = tokens != nullptr;
  const Pass pass = chunk != nullptr ? kMixedPass : kDecodePass;
  RETURN_IF_ERROR(CheckAdapterSlots(&step, chunk));
  int32_t* host_inputs = static_cast<int32_t*>(inputs_host_[pass]);
  if (chunk != nullptr) {
    RETURN_IF_ERROR(PackMixedInputs(*chunk, step, layouts_[pass], limits_, host_inputs, sample));
  } else {
    RETURN_IF_ERROR(PackDecodeInputs(step, layouts_[pass], limits_, host_inputs, sample));
  }
  // Logits back for the host's rows only, as few copies as there are runs of such rows (gaps of
  // inactive rows are bridged: a copy costs more than a few idle rows). In a mixed pass the
  // chunk's last row's logits are row max_slots.
  const int32_t chunk_row = step.max_slots;
  const auto host_row = [&](int32_t s) {
    if (s == chunk_row) return chunk != nullptr && last_logits != nullptr;
    return step.active[s] && !(sample && step.sampling[s].on_device);
  };
  logit_ranges_.clear();
  bool any_active = chunk != nullptr, any_sampled = false;
  for (int32_t s = 0; s <= chunk_row; ++s) {
    if (s < chunk_row) {
      any_active |= step.active[s] != 0;
      any_sampled |= step.active[s] && sample && step.sampling[s].on_device;
    }
    if (!host_row(s)) continue;
    if (!logit_ranges_.empty() && s - logit_ranges_.back().end <= 2) {
      logit_ranges_.back().end = s + 1;
    } else {
      logit_ranges_.push_back(RowRange{s, s + 1});
    }
  }
  if (!any_active) return absl::OkStatus();
  const bool lora = !lora_.empty() && AnyAdapterRow(layouts_[pass], host_inputs);
  RETURN_IF_ERROR(RunStep(pass, logit_ranges_, any_sampled, lora));
  const int64_t vocab = config_.vocab_size;
  for (const auto& rank : ranks_) {
    const float* src = static_cast<const float*>(rank->logits_host.get());
    for (int32_t s = 0; s <= chunk_row; ++s) {
      if (!host_row(s)) continue;
      float* dst = s == chunk_row ? last_logits : logits + s * vocab;
      std::memcpy(dst + rank->vocab_begin, src + int64_t{s} * rank->vocab_share,
                  rank->vocab_share * sizeof(float));
    }
  }
  if (any_sampled) {
    const int32_t* got = static_cast<const int32_t*>(ranks_[0]->sampled_host.get());
    for (int32_t s = 0; s < step.max_slots; ++s) {
      if (step.active[s] && step.sampling[s].on_device) tokens[s] = got[s];
    }
  }
  // (The mixed pass lays the chunk's rows after the decode rows.)
  if (chunk != nullptr) RETURN_IF_ERROR(ReadHidden(*chunk, options_.max_slots));
  return absl::OkStatus();
}

absl::Status CudaBackend::ReadHidden(const PrefillChunk& chunk, int32_t first_row) {
  if (chunk.hidden == nullptr) return absl::OkStatus();
  const int32_t n = static_cast<int32_t>(chunk.tokens.size());
  if (chunk.hidden_begin < 0 || chunk.hidden_begin > chunk.hidden_end || chunk.hidden_end > n) {
    return absl::InvalidArgumentError(absl::StrCat("hidden rows [", chunk.hidden_begin, ", ",
                                                   chunk.hidden_end, ") of a chunk of ", n));
  }
  const int32_t rows = chunk.hidden_end - chunk.hidden_begin;
  if (rows == 0) return absl::OkStatus();
  Rank& rank = *ranks_[0];  // the residual stream is whole on every rank after its all-reduce
  const int32_t d = config_.hidden_size;
  KVRM_CUDA_RETURN_IF_ERROR(cudaSetDevice(rank.device));
  cudaStream_t s = rank.stream.get();
  // rank.gu ([rows][2 ffn] f32) is scratch once the pass is done, and holds [rows][hidden].
  const float* x = rank.x + (int64_t{first_row} + chunk.hidden_begin) * d;
  RETURN_IF_ERROR(LaunchRmsNorm<float>(x, rank.final_norm, rank.gu, rows, d,
                                       static_cast<float>(config_.rms_norm_eps), nullptr, s));
  KVRM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(rank.hidden_host.get(), rank.gu, int64_t{rows} * d * 4,
                                            cudaMemcpyDeviceToHost, s));
  RETURN_IF_ERROR(Wait(rank));
  const float* got = static_cast<const float*>(rank.hidden_host.get());
  for (int32_t r = 0; r < rows; ++r) {
    const float* row = got + int64_t{r} * d;
    for (int32_t j = 0; j < d; ++j) chunk.hidden[j] += row[j];
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::Prefill(const PrefillChunk& chunk, float* last_logits) {
  if (nccl_ && nccl_->aborted()) return absl::UnavailableError("GPU communicators were aborted");
  RETURN_IF_ERROR(CheckAdapterSlots(nullptr, &chunk));
  RETURN_IF_ERROR(PackPrefillInputs(chunk, layouts_[kPrefillPass], limits_,
                                    static_cast<int32_t*>(inputs_host_[kPrefillPass])));
  const RowRange first{0, 1};
  RETURN_IF_ERROR(RunStep(kPrefillPass, absl::MakeConstSpan(&first, 1), false,
                          !lora_.empty() && chunk.adapter >= 0));
  if (last_logits != nullptr) {
    for (const auto& rank : ranks_) {
      std::memcpy(last_logits + rank->vocab_begin, rank->logits_host.get(),
                  rank->vocab_share * sizeof(float));
    }
  }
  return ReadHidden(chunk, 0);
}

absl::StatusOr<double> CudaBackend::TimeDecodeReplays(int iterations, bool lora) {
  if (!options_.use_graphs) return absl::FailedPreconditionError("graphs are off");
  if (lora && lora_.empty()) return absl::FailedPreconditionError("no LoRA adapter slots");
  std::vector<EventPtr> start(ranks_.size()), stop(ranks_.size());
  for (size_t r = 0; r < ranks_.size(); ++r) {
    KVRM_CUDA_RETURN_IF_ERROR(cudaSetDevice(ranks_[r]->device));
    ASSIGN_OR_RETURN(start[r], NewEvent(true));
    ASSIGN_OR_RETURN(stop[r], NewEvent(true));
  }
  rank_threads_.RunOnAll([&](int t) {
    Rank& rank = *ranks_[t];
    auto body = [&]() -> absl::Status {
      KVRM_CUDA_RETURN_IF_ERROR(cudaSetDevice(rank.device));
      cudaStream_t s = rank.stream.get();
      KVRM_CUDA_RETURN_IF_ERROR(cudaEventRecord(start[t].get(), s));
      for (int i = 0; i < iterations; ++i) {
        const Rank::PassState& p = rank.passes[kDecodePass];
        KVRM_CUDA_RETURN_IF_ERROR(cudaGraphLaunch(lora ? p.lora_graph.get() : p.graph.get(), s));
      }
      KVRM_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop[t].get(), s));
      return Wait(rank);
    };
    rank_status_[t] = body();
  });
  for (const absl::Status& st : rank_status_) RETURN_IF_ERROR(st);
  float ms = 0;
  KVRM_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start[0].get(), stop[0].get()));
  return static_cast<double>(ms) / iterations;
}

absl::Status CudaBackend::CheckAdapterSlots(const StepDescriptor* step,
                                            const PrefillChunk* chunk) const {
  // Out-of-range indices are the packing's to refuse (PackLimits::lora_adapters).
  const auto empty = [&](int32_t a) {
    return a >= 0 && a < static_cast<int32_t>(lora_.size()) && lora_[a] == nullptr;
  };
  if (step != nullptr) {
    for (int32_t s = 0; s < step->max_slots && s < static_cast<int32_t>(step->adapter.size());
         ++s) {
      if (step->active[s] && empty(step->adapter[s])) {
        return absl::InvalidArgumentError(absl::StrCat("slot ", s, ".adapter = ", step->adapter[s],
                                                       ": that LoRA adapter slot is empty"));
      }
    }
  }
  if (chunk != nullptr && empty(chunk->adapter)) {
    return absl::InvalidArgumentError(absl::StrCat("prefill chunk of slot ", chunk->slot,
                                                   ".adapter = ", chunk->adapter,
                                                   ": that LoRA adapter slot is empty"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const PreparedLoraAdapter>> CudaBackend::PrepareLoraAdapter(
    const LoraAdapter& adapter) const {
  RETURN_IF_ERROR(CheckLoraAdapterFits(adapter, max_lora_adapters(), options_.max_lora_rank));
  auto prepared = std::make_shared<CudaLoraAdapter>();
  const int32_t tp = static_cast<int32_t>(ranks_.size());
  for (int32_t r = 0; r < tp; ++r) {
    ASSIGN_OR_RETURN(const RankLora share, ShardLoraAdapter(config_, adapter, r, tp, DType::kBF16));
    const Rank& rank = *ranks_[r];
    const LoraShapes shapes = LoraTargetShapes(config_.hidden_size, config_.head_dim, rank.heads,
                                               rank.kv_heads, rank.ffn);
    CudaLoraAdapter::Share out;
    for (size_t l = 0; l < share.size(); ++l) {
      for (int32_t t = 0; t < kNumLoraTargets; ++t) {
        const LoraShard& m = share[l][t];
        if (m.rank == 0) continue;
        if (!m.bf16 || m.in != shapes[t][0] || m.out != shapes[t][1] ||
            m.at16.size() != static_cast<size_t>(m.in * m.rank_stride) ||
            m.bt16.size() != static_cast<size_t>(m.rank * m.out)) {
          return absl::InternalError(absl::StrCat(
              "LoRA adapter '", adapter.name, "': rank ", r, "'s share of ",
              std::string(LoraTargetName(LoraTarget(t))), " is not the layout the kernels take"));
        }
        CudaLoraAdapter::Projection p;
        p.entry = static_cast<int32_t>(l) * kNumLoraTargets + t;
        p.rank = m.rank;
        p.stride = m.rank_stride;
        p.at = static_cast<int64_t>(out.data.size());
        p.at_elems = static_cast<int64_t>(m.at16.size());
        out.data.insert(out.data.end(), m.at16.begin(), m.at16.end());
        p.bt = static_cast<int64_t>(out.data.size());
        p.bt_elems = static_cast<int64_t>(m.bt16.size());
        out.data.insert(out.data.end(), m.bt16.begin(), m.bt16.end());
        out.projections.push_back(p);
      }
    }
    prepared->shares.push_back(std::move(out));
  }
  return std::shared_ptr<const PreparedLoraAdapter>(std::move(prepared));
}

absl::Status CudaBackend::SetLoraAdapter(int32_t index,
                                         std::shared_ptr<const PreparedLoraAdapter> adapter) {
  RETURN_IF_ERROR(CheckLoraSlot(index, max_lora_adapters()));
  const auto* cuda = dynamic_cast<const CudaLoraAdapter*>(adapter.get());
  if (adapter != nullptr && (cuda == nullptr || cuda->shares.size() != ranks_.size())) {
    return absl::InvalidArgumentError("LoRA adapter: not prepared by this backend");
  }
  const int32_t slots = max_lora_adapters();
  const size_t entries = static_cast<size_t>(config_.num_hidden_layers) * kNumLoraTargets;
  // Per rank, on its compute stream (between steps: nothing reads the slot meanwhile): the
  // factors into the slot's regions, then the whole table with the slot's new entries, then a
  // synchronize (the copies read host memory the caller may free). From pageable memory each
  // copy returns once its bytes are staged.
  const auto upload = [&](Rank& rank, const CudaLoraAdapter::Share* share) -> absl::Status {
    KVRM_CUDA_RETURN_IF_ERROR(cudaSetDevice(rank.device));
    cudaStream_t s = rank.stream.get();
    bf16* slot = static_cast<bf16*>(rank.lora_factors.get()) + index * rank.lora_slot_elems;
    for (size_t e = 0; e < entries; ++e) rank.lora_table_host[e * slots + index] = LoraFactors{};
    if (share != nullptr) {
      for (const CudaLoraAdapter::Projection& p : share->projections) {
        bf16* at = slot + rank.lora_at[p.entry];
        bf16* bt = slot + rank.lora_bt[p.entry];
        KVRM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(at, share->data.data() + p.at, p.at_elems * 2,
                                                  cudaMemcpyHostToDevice, s));
        KVRM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(bt, share->data.data() + p.bt, p.bt_elems * 2,
                                                  cudaMemcpyHostToDevice, s));
        rank.lora_table_host[static_cast<size_t>(p.entry) * slots + index] =
            LoraFactors{at, bt, p.rank, p.stride};
      }
    }
    KVRM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(rank.lora_table.get(), rank.lora_table_host.data(),
                                              rank.lora_table_host.size() * sizeof(LoraFactors),
                                              cudaMemcpyHostToDevice, s));
    KVRM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(s));
    return absl::OkStatus();
  };
  for (size_t r = 0; r < ranks_.size(); ++r) {
    absl::Status st = upload(*ranks_[r], cuda != nullptr ? &cuda->shares[r] : nullptr);
    if (!st.ok()) {
      // Leave the slot empty on every rank (best effort: a failed copy is a CUDA error the next
      // step reports too), never half an adapter.
      for (size_t q = 0; q <= r; ++q) upload(*ranks_[q], nullptr).IgnoreError();
      lora_[index] = nullptr;
      return st;
    }
  }
  lora_[index] = std::move(adapter);
  return absl::OkStatus();
}

absl::Status CudaBackend::CreateHostTier(int64_t blocks) {
  if (!host_tier_.empty()) return absl::FailedPreconditionError("host tier created twice");
  for (auto& rank : ranks_) {
    KvPoolShape shape = rank->kv_view->shape();
    shape.num_blocks = blocks;
    ASSIGN_OR_RETURN(rank->host_tier,
                     PinnedAlloc(shape.BytesPerBlock() * blocks, "KV host tier"));
    host_tier_.push_back(KvPool::Wrap(shape, rank->host_tier.get()));  // the device pool's dtype
    if (options_.host_copy_kernel) {
      // Pinned memory is mapped into every device's address space under unified addressing.
      KVRM_CUDA_RETURN_IF_ERROR(cudaSetDevice(rank->device));
      void* mapped = nullptr;
      KVRM_CUDA_RETURN_IF_ERROR(cudaHostGetDevicePointer(&mapped, rank->host_tier.get(), 0));
      rank->host_tier_device = static_cast<char*>(mapped);
    }
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::CopyGroup(const TransferGroup& g) {
  const bool host_side = g.src_tier == KvTier::kHost || g.dst_tier == KvTier::kHost;
  if (host_side && host_tier_.size() != ranks_.size()) {
    return absl::InternalError("transfer to the host tier, which was not created");
  }
  // Every rank's copy is enqueued before any is waited for: the ranks copy in parallel. Whatever
  // fails, every copy stream that was given work is synchronized before returning: the caller
  // takes a returned group as finished (its blocks are retired and reused), so no copy may still
  // be running then.
  const auto enqueue = [&](Rank& rank, size_t r) -> absl::Status {
    const KvPool* src = g.src_tier == KvTier::kDevice ? rank.kv_view.get() : host_tier_[r].get();
    const KvPool* dst = g.dst_tier == KvTier::kDevice ? rank.kv_view.get() : host_tier_[r].get();
    ASSIGN_OR_RETURN(PoolCopy2D c, LowerTransferGroup(src->shape(), dst->shape(), g));
    KVRM_CUDA_RETURN_IF_ERROR(cudaSetDevice(rank.device));
    char* to = reinterpret_cast<char*>(dst->Layer(0).k) + c.dst_offset;
    const char* from = reinterpret_cast<const char*>(src->Layer(0).k) + c.src_offset;
    if (host_side && rank.host_tier_device != nullptr) {
      // The host tier's side through its device mapping (the same offset from its base).
      char* const host = static_cast<char*>(rank.host_tier.get());
      if (g.dst_tier == KvTier::kHost) to = rank.host_tier_device + (to - host);
      if (g.src_tier == KvTier::kHost) {
        from = rank.host_tier_device + (from - static_cast<const char*>(host));
      }
      RETURN_IF_ERROR(LaunchCopyRows(to, c.dst_pitch, from, c.src_pitch, c.width, c.height,
                                     rank.copy_stream.get()));
    } else if (c.src_pitch <= rank.max_pitch && c.dst_pitch <= rank.max_pitch) {
      KVRM_CUDA_RETURN_IF_ERROR(cudaMemcpy2DAsync(to, c.dst_pitch, from, c.src_pitch, c.width,
                                                  c.height, cudaMemcpyDefault,
                                                  rank.copy_stream.get()));
    } else {
      // A pool whose (layer, K|V, head) row is past the device's pitch limit (a large pool with
      // few layers or KV heads a rank): the same rows one copy each.
      for (int64_t row = 0; row < c.height; ++row) {
        KVRM_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(to + row * c.dst_pitch, from + row * c.src_pitch,
                                                  c.width, cudaMemcpyDefault,
                                                  rank.copy_stream.get()));
      }
    }
    return absl::OkStatus();
  };
  absl::Status status;
  size_t enqueued = 0;  // ranks whose stream may hold copies of this group
  for (; enqueued < ranks_.size() && status.ok(); ++enqueued) {
    status = enqueue(*ranks_[enqueued], enqueued);
  }
  for (size_t r = 0; r < enqueued; ++r) {
    absl::Status synced = [&]() -> absl::Status {
      KVRM_CUDA_RETURN_IF_ERROR(cudaSetDevice(ranks_[r]->device));
      KVRM_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(ranks_[r]->copy_stream.get()));
      return absl::OkStatus();
    }();
    if (status.ok()) status = std::move(synced);
  }
  return status;
}

}  // namespace kvrm::cuda
