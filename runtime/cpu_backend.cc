#include "runtime/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"

namespace kvrm {

absl::StatusOr<std::unique_ptr<CpuBackend>> CpuBackend::Create(const LlamaConfig& config,
                                                               const LlamaWeights* weights,
                                                               const CpuBackendOptions& options) {
  if (options.max_slots <= 0 || options.max_chunk_tokens <= 0 || options.num_threads <= 0) {
    return absl::InvalidArgumentError("cpu backend: slots, chunk and threads must be positive");
  }
  if (options.max_context <= 0 || options.max_context > config.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("max_context must be in [1, ",
                                                   config.max_position_embeddings, "]"));
  }
  if (config.head_dim % 2 != 0) {
    return absl::InvalidArgumentError("head_dim must be even for rotary embeddings");
  }
  KvPoolShape shape;
  shape.num_layers = config.num_hidden_layers;
  shape.kv_heads = config.num_key_value_heads;
  shape.head_dim = config.head_dim;
  shape.block_tokens = options.kv_block_tokens;
  shape.num_blocks = options.kv_blocks;
  absl::StatusOr<std::unique_ptr<KvPool>> pool = KvPool::Create(shape);
  if (!pool.ok()) return pool.status();
  return std::unique_ptr<CpuBackend>(
      new CpuBackend(config, weights, std::move(*pool), options));
}

CpuBackend::CpuBackend(const LlamaConfig& config, const LlamaWeights* weights,
                       std::unique_ptr<KvPool> pool, const CpuBackendOptions& options)
    : config_(config),
      weights_(weights),
      pool_(std::move(pool)),
      options_(options),
      threads_(options.num_threads),
      max_rows_(std::max(options.max_slots, options.max_chunk_tokens)) {
  const int64_t d = config.hidden_size, hd = config.head_dim;
  const int64_t qw = config.num_attention_heads * hd, kvw = config.num_key_value_heads * hd;
  const int64_t ffn = config.intermediate_size;
  rows_.resize(max_rows_);
  x_.resize(max_rows_ * d);
  h_.resize(max_rows_ * d);
  q_.resize(max_rows_ * qw);
  k_.resize(max_rows_ * kvw);
  v_.resize(max_rows_ * kvw);
  attn_.resize(max_rows_ * qw);
  gate_.resize(max_rows_ * ffn);
  up_.resize(max_rows_ * ffn);
  scores_.resize(static_cast<size_t>(threads_.num_threads()) * options.max_context);
  const int64_t widest = std::max({d, qw, ffn});
  scratch_.resize(threads_.num_threads() * MatMulScratchFloats(widest));
  logits_.resize(static_cast<size_t>(options.max_slots) * config.vocab_size);

  // RoPE table in double, rounded once: [position][cos(half) | sin(half)].
  const std::vector<double> inv_freq = RopeInverseFrequencies(config);
  const int64_t half = hd / 2;
  rope_.resize(static_cast<size_t>(options.max_context) * hd);
  for (int64_t p = 0; p < options.max_context; ++p) {
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(p) * inv_freq[i];
      rope_[p * hd + i] = static_cast<float>(std::cos(angle));
      rope_[p * hd + half + i] = static_cast<float>(std::sin(angle));
    }
  }
}

absl::Status CpuBackend::Decode(const StepDescriptor& step, float* logits) {
  int32_t n = 0;
  int32_t slot_of_row[1024];
  if (step.max_slots > options_.max_slots || step.max_slots > 1024) {
    return absl::InvalidArgumentError("step descriptor wider than the backend's slots");
  }
  for (int32_t s = 0; s < step.max_slots; ++s) {
    if (!step.active[s]) continue;
    if (step.position[s] >= options_.max_context) {
      return absl::OutOfRangeError(absl::StrCat("slot ", s, " position past max context"));
    }
    rows_[n] = Row{step.token[s], step.position[s], step.SlotRunsData(s), step.num_runs[s]};
    slot_of_row[n++] = s;
  }
  if (n == 0) return absl::OkStatus();
  Forward(n, 0, logits_.data());
  const int64_t vocab = config_.vocab_size;
  for (int32_t i = 0; i < n; ++i) {
    std::memcpy(logits + slot_of_row[i] * vocab, logits_.data() + i * vocab,
                vocab * sizeof(float));
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::Prefill(const PrefillChunk& chunk, float* last_logits) {
  const int32_t n = static_cast<int32_t>(chunk.tokens.size());
  if (n <= 0 || n > options_.max_chunk_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("prefill chunk of ", n, " tokens; max ",
                                                   options_.max_chunk_tokens));
  }
  if (chunk.start + n > options_.max_context) {
    return absl::OutOfRangeError("prefill chunk past max context");
  }
  for (int32_t i = 0; i < n; ++i) {
    rows_[i] = Row{chunk.tokens[i], chunk.start + i, chunk.runs, chunk.num_runs};
  }
  Forward(n, last_logits ? n - 1 : n, logits_.data());
  if (last_logits) {
    std::memcpy(last_logits, logits_.data(), config_.vocab_size * sizeof(float));
  }
  return absl::OkStatus();
}

void CpuBackend::Forward(int32_t n, int32_t first_logit_row, float* logits) {
  const LlamaWeights& w = *weights_;
  const int64_t d = config_.hidden_size, hd = config_.head_dim;
  const int64_t heads = config_.num_attention_heads, kv_heads = config_.num_key_value_heads;
  const int64_t qw = heads * hd, kvw = kv_heads * hd, ffn = config_.intermediate_size;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  float* scratch = scratch_.data();

  for (int32_t i = 0; i < n; ++i) WeightRowToFloat(w.embed, rows_[i].token, &x_[i * d]);

  for (int32_t layer = 0; layer < config_.num_hidden_layers; ++layer) {
    const LayerWeights& l = w.layers[layer];
    for (int32_t i = 0; i < n; ++i) RmsNorm(&x_[i * d], l.attn_norm, d, eps, &h_[i * d]);
    MatMul(threads_, h_.data(), n, d, l.wq, q_.data(), qw, scratch);
    MatMul(threads_, h_.data(), n, d, l.wk, k_.data(), kvw, scratch);
    MatMul(threads_, h_.data(), n, d, l.wv, v_.data(), kvw, scratch);
    const KvLayerView kv = pool_->Layer(layer);
    for (int32_t i = 0; i < n; ++i) {
      const Row& r = rows_[i];
      const float* cs = &rope_[static_cast<int64_t>(r.position) * hd];
      ApplyRope(&q_[i * qw], heads, hd, cs);
      ApplyRope(&k_[i * kvw], kv_heads, hd, cs);
      // The new token's K/V go where the run table puts its position.
      const int64_t phys = PhysicalToken(r.runs, r.num_runs, kv.block_tokens, r.position);
      for (int64_t g = 0; g < kv_heads; ++g) {
        std::memcpy(kv.KeyAt(g, phys), &k_[i * kvw + g * hd], hd * sizeof(float));
        std::memcpy(kv.ValueAt(g, phys), &v_[i * kvw + g * hd], hd * sizeof(float));
      }
    }
    Attention(layer, n);
    MatMul(threads_, attn_.data(), n, qw, l.wo, h_.data(), d, scratch);
    for (int32_t i = 0; i < n; ++i) AddInPlace(&x_[i * d], &h_[i * d], d);

    for (int32_t i = 0; i < n; ++i) RmsNorm(&x_[i * d], l.mlp_norm, d, eps, &h_[i * d]);
    MatMul(threads_, h_.data(), n, d, l.w_gate, gate_.data(), ffn, scratch);
    MatMul(threads_, h_.data(), n, d, l.w_up, up_.data(), ffn, scratch);
    for (int32_t i = 0; i < n; ++i) SiluMul(&gate_[i * ffn], &up_[i * ffn], ffn, &gate_[i * ffn]);
    MatMul(threads_, gate_.data(), n, ffn, l.w_down, h_.data(), d, scratch);
    for (int32_t i = 0; i < n; ++i) AddInPlace(&x_[i * d], &h_[i * d], d);
  }
  const int32_t m = n - first_logit_row;
  if (m <= 0) return;
  for (int32_t i = first_logit_row; i < n; ++i) {
    RmsNorm(&x_[i * d], w.final_norm, d, eps, &h_[(i - first_logit_row) * d]);
  }
  MatMul(threads_, h_.data(), m, d, w.lm_head, logits, config_.vocab_size, scratch);
}

void CpuBackend::Attention(int32_t layer, int32_t n) {
  const KvLayerView kv = pool_->Layer(layer);
  const int64_t hd = config_.head_dim, heads = config_.num_attention_heads;
  const int64_t group = heads / config_.num_key_value_heads;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t work = n * heads;  // (row, head) pairs
  threads_.RunOnAll([&](int t) {
    const int nt = threads_.num_threads();
    float* scores = &scores_[static_cast<size_t>(t) * options_.max_context];
    for (int64_t item = work * t / nt; item < work * (t + 1) / nt; ++item) {
      const int64_t i = item / heads, h = item % heads;
      const Row& r = rows_[i];
      AttendOneHead(&q_[(i * heads + h) * hd], kv, static_cast<int32_t>(h / group), r.runs,
                    r.num_runs, r.position + 1, scale, scores, &attn_[(i * heads + h) * hd]);
    }
  });
}

}  // namespace kvrm
