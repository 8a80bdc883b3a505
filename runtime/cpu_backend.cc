#include "runtime/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/matmul.h"
#include "runtime/tp_shard.h"

namespace kvrm {

absl::StatusOr<std::unique_ptr<CpuBackend>> CpuBackend::Create(const LlamaConfig& config,
                                                               const LlamaWeights* weights,
                                                               const CpuBackendOptions& options) {
  if (options.max_slots <= 0 || options.max_chunk_tokens <= 0 || options.num_threads <= 0) {
    return absl::InvalidArgumentError("cpu backend: slots, chunk and threads must be positive");
  }
  if (options.max_draft_tokens < 0 || options.max_draft_tokens > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("cpu backend: draft tokens ", options.max_draft_tokens, " not in [0, 64]"));
  }
  if (options.max_context <= 0 || options.max_context > config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("max_context must be in [1, ",
                                                   config.max_position_embeddings, "]"));
  }
  if (config.head_dim % 2 != 0) {
    return absl::InvalidArgumentError("head_dim must be even for rotary embeddings");
  }
  const int32_t tp = options.tensor_parallel;
  if (tp < 1 || tp > 16) {
    return absl::InvalidArgumentError(absl::StrCat("tensor_parallel ", tp, " not in [1, 16]"));
  }
  if (config.num_attention_heads / config.num_key_value_heads > kMaxAttentionGroup) {
    return absl::InvalidArgumentError("more query heads per KV head than attention supports");
  }
  if (options.quantization != WeightFormat::kDense &&
      options.quantization != WeightFormat::kQ8_0 && options.quantization != WeightFormat::kQ4K) {
    return absl::InvalidArgumentError("quantization at load is q8_0 or q4_K");
  }
  if (options.quantization != WeightFormat::kDense && tp > 1) {
    // The blocks are the matrix's own 32-column blocks whatever the ranks: each rank's share of
    // the row-parallel inputs must be whole blocks (as for a GGUF file's quantized matrices; a
    // q4_K share that splits a 256-column super-block falls back to q8_0).
    const int64_t q_share = int64_t{config.num_attention_heads} / tp * config.head_dim;
    const int64_t ffn_share = config.HasDenseMlp() ? config.intermediate_size / tp : 0;
    const int64_t expert_share = config.moe_intermediate_size / tp;
    const int64_t shared_share = config.shared_expert_intermediate_size / tp;
    for (const auto& [share, what] : {std::pair{q_share, "attention heads x head_dim"},
                                      std::pair{ffn_share, "intermediate_size"},
                                      std::pair{expert_share, "moe_intermediate_size"},
                                      std::pair{shared_share, "shared_expert_intermediate_size"}}) {
      if (share % WeightMatrix::kQ8Block != 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "quantized weights with tensor parallelism ", tp, ": each rank's share of the ", what,
            " inputs (", share, ") must be a multiple of ", WeightMatrix::kQ8Block));
      }
    }
  }
  std::unique_ptr<CpuBackend> b(new CpuBackend(config, options));
  ASSIGN_OR_RETURN(b->comm_, InProcessCommunicatorGroup::Create(tp));
  CpuRankShape shape;
  // A chunk beside a step whose slots each carry their drafts.
  shape.max_rows = options.max_slots * (1 + options.max_draft_tokens) + options.max_chunk_tokens;
  shape.max_context = options.max_context;
  shape.num_threads = std::max(1, options.num_threads / tp);
  const int32_t initial_adapters = static_cast<int32_t>(options.lora_adapters.size());
  if (options.max_lora_adapters < 0 ||
      (options.max_lora_adapters > 0 && options.max_lora_adapters < initial_adapters)) {
    return absl::InvalidArgumentError(absl::StrCat("max_lora_adapters ", options.max_lora_adapters,
                                                   ": below the ", initial_adapters,
                                                   " adapters to serve"));
  }
  shape.lora_adapters = std::max(options.max_lora_adapters, initial_adapters);
  b->lora_.resize(shape.lora_adapters);
  b->lora_max_rank_ = options.max_lora_rank;
  for (const LoraAdapter* a : options.lora_adapters) {
    if (options.max_lora_rank == 0) b->lora_max_rank_ = std::max(b->lora_max_rank_, a->rank);
  }
  if (b->lora_max_rank_ < 0 || b->lora_max_rank_ > kMaxLoraRank) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_lora_rank ", b->lora_max_rank_, " is not in [0, ", kMaxLoraRank, "]"));
  }
  shape.lora_max_rank = shape.lora_adapters > 0 ? b->lora_max_rank_ : 0;
  for (int32_t r = 0; r < tp; ++r) {
    ASSIGN_OR_RETURN(RankWeights shard, ShardLlamaWeights(config, *weights, r, tp));
    AttachPanels(&shard, AvailableCpuIsas().back(), options.weight_panels, options.quantization,
                 options.num_threads);
    KvPoolShape pool;
    pool.num_layers = config.num_hidden_layers;
    pool.kv_heads = shard.kv_heads;
    pool.head_dim = config.head_dim;
    pool.block_tokens = options.kv_block_tokens;
    pool.num_blocks = options.kv_blocks;
    pool.dtype = options.kv_dtype;
    ASSIGN_OR_RETURN(std::unique_ptr<KvPool> kv, KvPool::Create(pool, /*populate=*/true));
    b->ranks_.push_back(std::make_unique<CpuRank>(
        config, std::move(shard), std::move(kv), b->comm_->communicator(r), b->rope_.data(),
        b->rope_local_.empty() ? b->rope_.data() : b->rope_local_.data(), shape));
    if (options.far_history.enabled()) {
      // The summary store: "block" s holds slot s's entries, so one slot's entries of one head
      // are contiguous, as a run is.
      pool.block_tokens = FarHistoryMaxSummaries(options.far_history, options.kv_block_tokens,
                                                 options.max_context);
      pool.num_blocks = options.max_slots;
      pool.dtype = DType::kF32;  // summaries are means: kept in f32 whatever the pool's dtype
      ASSIGN_OR_RETURN(std::unique_ptr<KvPool> store, KvPool::Create(pool));
      b->ranks_.back()->SetFarHistory(options.far_history, std::move(store));
    }
  }
  for (int32_t i = 0; i < initial_adapters; ++i) {
    ASSIGN_OR_RETURN(std::shared_ptr<const PreparedLoraAdapter> prepared,
                     b->PrepareLoraAdapter(*options.lora_adapters[i]));
    RETURN_IF_ERROR(b->SetLoraAdapter(i, std::move(prepared)));
  }
  return b;
}

namespace {

// A LoRA adapter as the CPU backend holds it: each rank's share.
class CpuLoraAdapter : public PreparedLoraAdapter {
 public:
  std::vector<RankLora> ranks;
};

}  // namespace

absl::StatusOr<std::shared_ptr<const PreparedLoraAdapter>> CpuBackend::PrepareLoraAdapter(
    const LoraAdapter& adapter) const {
  // (The ranks' scratch holds lora_max_rank_ lanes a row.)
  RETURN_IF_ERROR(CheckLoraAdapterFits(adapter, max_lora_adapters(), lora_max_rank_));
  auto prepared = std::make_shared<CpuLoraAdapter>();
  const int32_t tp = tensor_parallel();
  for (int32_t r = 0; r < tp; ++r) {
    ASSIGN_OR_RETURN(RankLora share,
                     ShardLoraAdapter(config_, adapter, r, tp, options_.lora_dtype));
    prepared->ranks.push_back(std::move(share));
  }
  return std::shared_ptr<const PreparedLoraAdapter>(std::move(prepared));
}

absl::Status CpuBackend::SetLoraAdapter(int32_t index,
                                        std::shared_ptr<const PreparedLoraAdapter> adapter) {
  RETURN_IF_ERROR(CheckLoraSlot(index, max_lora_adapters()));
  const auto* cpu = dynamic_cast<const CpuLoraAdapter*>(adapter.get());
  if (adapter != nullptr &&
      (cpu == nullptr || static_cast<int32_t>(cpu->ranks.size()) != tensor_parallel())) {
    return absl::InvalidArgumentError("LoRA adapter: not prepared by this backend");
  }
  for (int32_t r = 0; r < tensor_parallel(); ++r) {
    ranks_[r]->SetLoraAdapter(index, cpu != nullptr ? &cpu->ranks[r] : nullptr);
  }
  lora_[index] = std::move(adapter);
  return absl::OkStatus();
}

CpuBackend::CpuBackend(const LlamaConfig& config, const CpuBackendOptions& options)
    : config_(config),
      options_(options),
      rank_threads_(options.tensor_parallel),
      rank_status_(options.tensor_parallel),
      rows_(options.max_slots * (1 + options.max_draft_tokens) + options.max_chunk_tokens),
      logit_row_(options.max_slots * (1 + options.max_draft_tokens)),
      pass_logit_rows_(rows_.size()),
      max_chunks_(options.max_chunks_per_pass > 0
                      ? std::min(options.max_chunks_per_pass, options.max_slots)
                      : options.max_slots),
      logits_(static_cast<size_t>(options.max_slots * (1 + options.max_draft_tokens) +
                                  kMaxAllLogitsRows + max_chunks_ - 1) *
              config.vocab_size) {
  // RoPE table in double, rounded once: [position][cos(half) | sin(half)].
  rope_ = RopeTable(config, options.max_context);
  if (config.rope_local_theta > 0)
    rope_local_ = RopeTable(LocalRopeConfig(config), options.max_context);
}

CpuBackend::~CpuBackend() = default;

int64_t CpuBackend::experts_run() const { return ranks_.front()->experts_run(); }

void CpuBackend::RecordKvAmax(bool on) {
  for (auto& rank : ranks_) rank->set_record_kv_amax(on);
}

std::vector<std::pair<float, float>> CpuBackend::KvAmax() const {
  std::vector<std::pair<float, float>> out(config_.num_hidden_layers, {0.0f, 0.0f});
  for (const auto& rank : ranks_) {
    const std::vector<float>& a = rank->kv_amax();
    for (size_t l = 0; l < out.size() && 2 * l + 1 < a.size(); ++l) {
      out[l].first = std::max(out[l].first, a[2 * l]);
      out[l].second = std::max(out[l].second, a[2 * l + 1]);
    }
  }
  return out;
}

int64_t CpuBackend::owned_weight_bytes() const {
  int64_t total = 0;
  for (const auto& r : ranks_) total += r->weights().owned_bytes;
  return total;
}

std::string CpuBackend::weight_quantization() const {
  // Every linear weight has q8_0 panels with --quantization=q8_0; a GGUF file's block-format
  // matrices have their panels whatever the flag (and its other matrices may not).
  std::set<WeightFormat> used;
  for (const auto& r : ranks_) {
    const RankWeights& w = r->weights();
    used.insert(w.lm_head.panel_format);
    for (const LayerWeights& l : w.layers) {
      ForEachLinearWeight(l, [&](const WeightMatrix& m) { used.insert(m.panel_format); });
    }
  }
  std::string out;
  for (const auto& [format, name] :
       {std::pair{WeightFormat::kQ4K, "q4_K"}, std::pair{WeightFormat::kQ4G, "q4_g"},
        std::pair{WeightFormat::kQ6K, "q6_K"}, std::pair{WeightFormat::kQ8_0, "q8_0"},
        std::pair{WeightFormat::kQ8Affine, "q8_affine"},
        std::pair{WeightFormat::kQ8Halves, "q8_halves"},
        std::pair{WeightFormat::kMxfp4, "mxfp4"}}) {
    if (used.count(format) != 0) out += (out.empty() ? "" : "+") + std::string(name);
  }
  return out;
}

absl::Status CpuBackend::CheckAdapter(int32_t adapter, const char* what) const {
  if (adapter == -1 || (adapter >= 0 && adapter < max_lora_adapters() && lora_[adapter])) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(what, ": LoRA adapter ", adapter,
                                                 " is not in a slot (the backend has ",
                                                 max_lora_adapters(), " slots)"));
}

int64_t CpuBackend::panel_weight_bytes() const {
  int64_t total = 0;
  for (const auto& r : ranks_) total += r->weights().panel_bytes;
  return total;
}

absl::Status CpuBackend::Forward(int32_t n, int32_t first_logit_row) {
  rank_threads_.RunOnAll([&](int r) {
    rank_status_[r] = ranks_[r]->Forward(rows_.data(), n, first_logit_row, logits_.data());
  });
  for (const absl::Status& s : rank_status_) RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

absl::Status CpuBackend::ForwardListed(int32_t n, int32_t m) {
  rank_threads_.RunOnAll([&](int r) {
    rank_status_[r] =
        ranks_[r]->Forward(rows_.data(), n, pass_logit_rows_.data(), m, logits_.data());
  });
  for (const absl::Status& s : rank_status_) RETURN_IF_ERROR(s);
  return absl::OkStatus();
}

absl::Status CpuBackend::CheckFarHistory(const FarHistoryShape& far, int32_t dropped,
                                         int32_t summaries, int64_t first_position) const {
  if (dropped == 0 && summaries == 0) return absl::OkStatus();
  if (!far.enabled() && !options_.far_history.enabled() && summaries == 0) {
    // Released blocks (window release): never one a row of the slot reads.
    const int32_t behind =
        config_.AllLayersSlide()
            ? BlocksBehindWindow(first_position, config_.sliding_window, options_.kv_block_tokens)
            : 0;
    if (dropped < 0 || dropped > behind) {
      return absl::InvalidArgumentError(absl::StrCat(
          dropped, " blocks released, but a row at position ", first_position, " reads all but ",
          behind,
          config_.AllLayersSlide() ? " (behind its window)" : " (a layer without a window)"));
    }
    return absl::OkStatus();
  }
  if (far != options_.far_history || !far.enabled()) {
    return absl::InvalidArgumentError("far-history fields set, but not the backend's far shape");
  }
  if (dropped < 0 || dropped > summaries ||
      summaries > FarHistoryMaxSummaries(far, options_.kv_block_tokens, options_.max_context)) {
    return absl::InvalidArgumentError(absl::StrCat("far history: ", dropped, " dropped blocks, ",
                                                   summaries, " summaries"));
  }
  return absl::OkStatus();
}

absl::StatusOr<int32_t> CpuBackend::DecodeRows(const StepDescriptor& step, CpuRow* rows,
                                                int32_t* logit_row) const {
  if (step.max_slots > options_.max_slots) {
    return absl::InvalidArgumentError("step descriptor wider than the backend's slots");
  }
  if (step.max_draft < 0 || step.max_draft > options_.max_draft_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("step descriptor with ", step.max_draft,
                                                   " draft tokens per slot; the backend takes ",
                                                   options_.max_draft_tokens));
  }
  int32_t n = 0;
  for (int32_t s = 0; s < step.max_slots; ++s) {
    if (!step.active[s]) continue;
    if (step.position[s] >= options_.max_context) {
      return absl::OutOfRangeError(absl::StrCat("slot ", s, " position past max context"));
    }
    const int32_t dropped = step.far_dropped[s], summaries = step.far_summaries[s];
    RETURN_IF_ERROR(CheckFarHistory(step.far, dropped, summaries, step.position[s]));
    const int32_t adapter = step.adapter[s];
    RETURN_IF_ERROR(CheckAdapter(adapter, "step descriptor"));
    rows[n] = CpuRow{step.token[s], step.position[s], step.SlotRunsData(s), step.num_runs[s],
                     s, dropped, summaries, adapter};
    logit_row[n++] = s * step.logit_rows_per_slot();
    if (step.max_draft == 0 || step.num_draft[s] == 0) continue;
    const int32_t drafts = step.num_draft[s];
    if (drafts < 0 || drafts > step.max_draft) {
      return absl::InvalidArgumentError(absl::StrCat("slot ", s, ": ", drafts, " draft tokens"));
    }
    if (summaries != 0 || (dropped != 0 && step.far.enabled())) {
      return absl::InvalidArgumentError(
          absl::StrCat("slot ", s, ": draft tokens with far-history summaries"));
    }
    if (step.position[s] + drafts >= options_.max_context) {
      return absl::OutOfRangeError(absl::StrCat("slot ", s, " drafts past max context"));
    }
    int64_t held = 0;  // tokens the run table holds: the drafts' K/V must land in the slot's own
    for (int32_t r = 0; r < step.num_runs[s]; ++r) held += step.SlotRunsData(s)[r].num_blocks;
    held += dropped;  // (released blocks behind the window: the table starts after them)
    if (held * options_.kv_block_tokens < int64_t{step.position[s]} + drafts + 1) {
      return absl::OutOfRangeError(
          absl::StrCat("slot ", s, ": run table holds ", held * options_.kv_block_tokens,
                       " tokens, drafts reach position ", step.position[s] + drafts));
    }
    const int32_t* draft = step.draft.data() + static_cast<size_t>(s) * step.max_draft;
    for (int32_t j = 0; j < drafts; ++j) {
      if (draft[j] < 0 || draft[j] >= config_.vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrCat("slot ", s, ": draft token ", draft[j], " outside the vocabulary"));
      }
      rows[n] = CpuRow{
          draft[j], step.position[s] + 1 + j, step.SlotRunsData(s), step.num_runs[s], s, dropped, 0,
          adapter};
      logit_row[n++] = s * step.logit_rows_per_slot() + 1 + j;
    }
  }
  return n;
}

absl::StatusOr<int32_t> CpuBackend::ChunkRows(const PrefillChunk& chunk, CpuRow* rows) const {
  const int32_t n = static_cast<int32_t>(chunk.tokens.size());
  if (n <= 0 || n > options_.max_chunk_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("prefill chunk of ", n, " tokens; max ",
                                                   options_.max_chunk_tokens));
  }
  if (chunk.start + n > options_.max_context) {
    return absl::OutOfRangeError("prefill chunk past max context");
  }
  if (chunk.far.enabled() &&
      chunk.far_dropped > chunk.far.SummariesAt(chunk.start, options_.kv_block_tokens)) {
    return absl::InvalidArgumentError("prefill chunk: blocks dropped that its first row reads");
  }
  if (chunk.all_logits && n > kMaxAllLogitsRows) {
    return absl::InvalidArgumentError(absl::StrCat("prefill chunk of ", n,
                                                   " tokens with every row's logits; max ",
                                                   kMaxAllLogitsRows));
  }
  if (chunk.far.enabled() && (chunk.slot < 0 || chunk.slot >= options_.max_slots)) {
    return absl::InvalidArgumentError(absl::StrCat("prefill chunk of slot ", chunk.slot));
  }
  RETURN_IF_ERROR(CheckAdapter(chunk.adapter, "prefill chunk"));
  if (chunk.hidden != nullptr &&
      (chunk.hidden_begin < 0 || chunk.hidden_begin > chunk.hidden_end || chunk.hidden_end > n)) {
    return absl::InvalidArgumentError(absl::StrCat("prefill chunk of ", n, " tokens: hidden rows [",
                                                   chunk.hidden_begin, ", ", chunk.hidden_end,
                                                   ")"));
  }
  for (int32_t i = 0; i < n; ++i) {
    const int32_t summaries = chunk.far.SummariesAt(chunk.start + i, options_.kv_block_tokens);
    RETURN_IF_ERROR(CheckFarHistory(chunk.far, chunk.far_dropped, summaries, chunk.start));
    rows[i] = CpuRow{chunk.tokens[i], chunk.start + i, chunk.runs, chunk.num_runs,
                     chunk.slot, chunk.far_dropped, summaries, chunk.adapter};
  }
  return n;
}

void CpuBackend::ScatterLogits(int32_t first, int32_t n, float* logits) const {
  const int64_t vocab = config_.vocab_size;
  for (int32_t i = 0; i < n; ++i) {
    std::memcpy(logits + logit_row_[i] * vocab, logits_.data() + (first + i) * vocab,
                vocab * sizeof(float));
  }
}

absl::Status CpuBackend::Decode(const StepDescriptor& step, float* logits) {
  ASSIGN_OR_RETURN(const int32_t n, DecodeRows(step, rows_.data(), logit_row_.data()));
  if (n == 0) return absl::OkStatus();
  RETURN_IF_ERROR(Forward(n, 0));
  ScatterLogits(0, n, logits);
  return absl::OkStatus();
}

absl::Status CpuBackend::Prefill(const PrefillChunk& chunk, float* last_logits) {
  return PrefillChunks(absl::MakeConstSpan(&chunk, 1), absl::MakeConstSpan(&last_logits, 1),
                       nullptr, nullptr);
}

absl::Status CpuBackend::DecodeWithChunk(const PrefillChunk& chunk, float* last_logits,
                                         const StepDescriptor& step, float* logits) {
  return PrefillChunks(absl::MakeConstSpan(&chunk, 1), absl::MakeConstSpan(&last_logits, 1), &step,
                       logits);
}

absl::Status CpuBackend::PrefillChunks(absl::Span<const PrefillChunk> chunks,
                                       absl::Span<float* const> chunk_logits,
                                       const StepDescriptor* step, float* logits) {
  if (chunks.empty() || chunks.size() > static_cast<size_t>(max_chunks_per_pass()) ||
      chunk_logits.size() != chunks.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        chunks.size(), " prefill chunks (", chunk_logits.size(), " logits buffers) in one pass; ",
        "the backend takes 1 to ", max_chunks_per_pass()));
  }
  // Rows: the chunks' one after the other, then the decode rows; the logits wanted (each chunk's
  // last row, or every row with all_logits, and every decode row) are gathered by the rank's
  // pass in that order. Every row's result is the same as in its own pass: the products compute
  // a row alike whatever the batch (MatMulTest.RowResultDoesNotDependOnTheBatch), attention and
  // the norms are per row, and the rows of a chunk write only its slot's blocks, which no other
  // row reads.
  const int64_t vocab = config_.vocab_size;
  const int32_t logit_rows_max = max_chunks_ - 1 + kMaxAllLogitsRows;
  int32_t c = 0, m = 0;
  for (size_t k = 0; k < chunks.size(); ++k) {
    const PrefillChunk& chunk = chunks[k];
    for (size_t j = 0; j < k; ++j) {
      if (chunks[j].slot == chunk.slot) {
        return absl::InvalidArgumentError(
            absl::StrCat("slot ", chunk.slot, " has two prefill chunks in one pass"));
      }
    }
    // (One chunk too long is ChunkRows' to name.)
    if (c > 0 && c + static_cast<int64_t>(chunk.tokens.size()) > options_.max_chunk_tokens) {
      return absl::InvalidArgumentError(absl::StrCat("prefill chunks of ", c + chunk.tokens.size(),
                                                     "+ tokens in one pass; max ",
                                                     options_.max_chunk_tokens));
    }
    ASSIGN_OR_RETURN(const int32_t n, ChunkRows(chunk, rows_.data() + c));
    if (chunk_logits[k] != nullptr) {
      const int32_t first = chunk.all_logits ? 0 : n - 1;
      if (m + n - first > logit_rows_max) {
        return absl::InvalidArgumentError(absl::StrCat("prefill chunks wanting ", m + n - first,
                                                       "+ rows of logits in one pass; max ",
                                                       logit_rows_max));
      }
      for (int32_t i = first; i < n; ++i) pass_logit_rows_[m++] = c + i;
    }
    c += n;
  }
  int32_t d = 0;
  if (step != nullptr) {
    ASSIGN_OR_RETURN(d, DecodeRows(*step, rows_.data() + c, logit_row_.data()));
    for (int32_t i = 0; i < d; ++i) {
      for (const PrefillChunk& chunk : chunks) {
        if (rows_[c + i].slot == chunk.slot) {
          return absl::InvalidArgumentError(
              absl::StrCat("slot ", chunk.slot, " both decodes and prefills in one step"));
        }
      }
      pass_logit_rows_[m + i] = c + i;
    }
  }
  RETURN_IF_ERROR(ForwardListed(c + d, m + d));
  int32_t row = 0, logit = 0;
  for (size_t k = 0; k < chunks.size(); ++k) {
    const PrefillChunk& chunk = chunks[k];
    const int32_t n = static_cast<int32_t>(chunk.tokens.size());
    if (chunk.hidden != nullptr) {
      ranks_[0]->AddFinalHidden(row + chunk.hidden_begin, row + chunk.hidden_end, chunk.hidden);
    }
    if (chunk_logits[k] != nullptr) {
      const int32_t rows = chunk.all_logits ? n : 1;
      std::memcpy(chunk_logits[k], logits_.data() + logit * vocab,
                  static_cast<size_t>(rows) * vocab * sizeof(float));
      logit += rows;
    }
    row += n;
  }
  ScatterLogits(m, d, logits);
  return absl::OkStatus();
}

}  // namespace kvrm
