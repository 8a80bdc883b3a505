#include "runtime/cpu_rank.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "kernels/cpu/lora.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"

namespace kvrm {

CpuRank::CpuRank(const LlamaConfig& config, RankWeights weights, std::unique_ptr<KvPool> pool,
                 Communicator* comm, const float* rope, const float* rope_local,
                 const CpuRankShape& shape)
    : config_(config),
      w_(std::move(weights)),
      pool_(std::move(pool)),
      comm_(comm),
      rope_(rope),
      rope_local_(rope_local != nullptr ? rope_local : rope),
      shape_(shape),
      threads_(shape.num_threads),
      d_(config.hidden_size),
      hd_(config.head_dim),
      qw_(int64_t{w_.heads} * config.head_dim),
      kvw_(int64_t{w_.kv_heads} * config.head_dim),
      ffn_(w_.ffn),
      moe_ffn_(w_.moe_ffn),
      shared_ffn_(w_.shared_ffn),
      gelu_(config.gelu_tanh()),
      scratch_per_thread_(MatMulScratchFloats(std::max({d_, qw_, ffn_, moe_ffn_, shared_ffn_}))) {
  const int64_t rows = shape.max_rows;
  x_.resize(rows * d_);
  h_.resize(rows * d_);
  q_.resize(rows * qw_);
  k_.resize(rows * kvw_);
  v_.resize(rows * kvw_);
  attn_.resize(rows * qw_);
  if (config.HasDenseMlp()) {
    gate_.resize(rows * ffn_);
    up_.resize(rows * ffn_);
  }
  if (config.moe()) {
    const int64_t experts = config.num_experts, routed = rows * config.num_experts_per_tok;
    router_logits_.resize(rows * experts);
    route_expert_.resize(routed);
    route_slot_.resize(routed);
    route_weight_.resize(routed);
    expert_begin_.resize(experts + 1);
    moe_x_.resize(routed * d_);
    moe_gate_.resize(routed * moe_ffn_);
    moe_up_.resize(routed * moe_ffn_);
    moe_y_.resize(routed * d_);
  }
  if (shared_ffn_ > 0) {
    shared_expert_gate_.assign(config.num_hidden_layers * d_, 0.0f);
    for (int32_t layer = 0; layer < config.num_hidden_layers; ++layer) {
      const WeightMatrix& g = w_.layers[layer].shared_expert_gate;
      if (g.data != nullptr) WeightRowToFloat(g, 0, &shared_expert_gate_[layer * d_]);
    }
    shared_scale_.resize(rows);
    shared_gate_.resize(rows * shared_ffn_);
    shared_up_.resize(rows * shared_ffn_);
    shared_y_.resize(rows * d_);
  }
  const int64_t group = config.num_attention_heads / config.num_key_value_heads;
  scores_.resize(static_cast<size_t>(threads_.num_threads()) * group * shape.max_context);
  if (config.qk_norm_whole) qk_sums_.resize(2 * rows);
  scratch_.resize(threads_.num_threads() * scratch_per_thread_);
  if (shape.lora_adapters > 0) {
    lora_.assign(shape.lora_adapters, nullptr);
    lora_stride_ = (shape.lora_max_rank + kLoraRankLanes - 1) / kLoraRankLanes * kLoraRankLanes;
    const size_t per_thread = static_cast<size_t>(shape.max_rows);
    lora_rows_.resize(threads_.num_threads() * per_thread);
    lora_done_.resize(threads_.num_threads() * per_thread);
    lora_mid_.resize(threads_.num_threads() * per_thread * lora_stride_);
  }
  if (config.attention_sinks) {
    sinks_.resize(config.num_hidden_layers * static_cast<size_t>(w_.heads));
    for (int32_t layer = 0; layer < config.num_hidden_layers; ++layer) {
      WeightRowToFloat(w_.layers[layer].sinks, 0, &sinks_[layer * w_.heads]);
    }
  }
  if (config.moe_biases) {
    const int64_t layers = config.num_hidden_layers, experts = config.num_experts;
    router_bias_.resize(layers * experts);
    expert_gate_bias_.resize(layers * experts * moe_ffn_);
    expert_up_bias_.resize(layers * experts * moe_ffn_);
    // (The down biases on rank 0 only, which adds them: 53 MB a rank for gpt-oss-120b.)
    const bool down = w_.rank == 0;
    if (down) expert_down_bias_.resize(layers * experts * d_);
    for (int64_t layer = 0; layer < layers; ++layer) {
      const LayerWeights& l = w_.layers[layer];
      WeightRowToFloat(l.router_bias, 0, &router_bias_[layer * experts]);
      for (int64_t e = 0; e < experts; ++e) {
        const int64_t at = layer * experts + e;
        WeightRowToFloat(l.expert_gate_bias[e], 0, &expert_gate_bias_[at * moe_ffn_]);
        WeightRowToFloat(l.expert_up_bias[e], 0, &expert_up_bias_[at * moe_ffn_]);
        if (down) WeightRowToFloat(l.expert_down_bias[e], 0, &expert_down_bias_[at * d_]);
      }
    }
  }
  if (config.qkv_bias || config.o_bias) {
    biases_.assign(config.num_hidden_layers * (qw_ + 2 * kvw_ + d_), 0.0f);
    for (int32_t layer = 0; layer < config.num_hidden_layers; ++layer) {
      const LayerWeights& l = w_.layers[layer];
      float* b = LayerBiases(layer);
      if (config.qkv_bias) {
        WeightRowToFloat(l.bq, 0, b);
        WeightRowToFloat(l.bk, 0, b + qw_);
        WeightRowToFloat(l.bv, 0, b + qw_ + kvw_);
      }
      if (config.o_bias) WeightRowToFloat(l.bo, 0, b + qw_ + 2 * kvw_);
    }
  }
}

void CpuRank::SetFarHistory(const FarHistoryShape& shape, std::unique_ptr<KvPool> summaries) {
  CHECK(summaries != nullptr && summaries->shape().kv_heads == w_.kv_heads);
  far_ = shape;
  summaries_ = std::move(summaries);
}

void CpuRank::Embed(const CpuRow* rows, int32_t n) {
  const float scale = static_cast<float>(config_.embedding_multiplier);  // Granite's
  for (int32_t i = 0; i < n; ++i) {
    WeightRowToFloat(w_.embed, rows[i].token, &x_[i * d_]);
    if (scale != 1.0f) ScaleInPlace(&x_[i * d_], scale, d_);
  }
}

void CpuRank::NormRows(const WeightMatrix& norm, int32_t n, bool in_place) {
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const float offset = static_cast<float>(config_.norm_weight_offset);  // Gemma's 1 + w
  const float* in = in_place ? h_.data() : x_.data();
  // Rows in shares of 64: a decode step normalises inline rather than paying a region.
  threads_.ParallelFor(n, 64, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) RmsNorm(&in[i * d_], norm, d_, eps, &h_[i * d_], offset);
  });
}

void CpuRank::AddRows(int32_t n) {
  const float scale = static_cast<float>(config_.residual_multiplier);  // Granite's
  if (scale == 1.0f) {
    AddInPlace(x_.data(), h_.data(), n * d_);
  } else {
    AddScaledInPlace(x_.data(), h_.data(), scale, n * d_);
  }
}

void CpuRank::set_record_kv_amax(bool on) {
  record_kv_amax_ = on;
  if (on && kv_amax_.empty())
    kv_amax_.assign(2 * static_cast<size_t>(config_.num_hidden_layers), 0);
}

KvLayerView CpuRank::KvLayer(int32_t layer) const {
  KvLayerView kv = pool_->Layer(layer);
  kv.k_scale = w_.layers[layer].k_cache_scale;  // (read by FP8 pools only)
  kv.v_scale = w_.layers[layer].v_cache_scale;
  return kv;
}

absl::Status CpuRank::WholeQkNorm(int32_t layer, int32_t n) {
  const LayerWeights& l = w_.layers[layer];
  for (int32_t i = 0; i < n; ++i) {
    qk_sums_[2 * i] = static_cast<float>(SumOfSquares(&q_[i * qw_], qw_));
    qk_sums_[2 * i + 1] = static_cast<float>(SumOfSquares(&k_[i * kvw_], kvw_));
  }
  if (comm_->size() > 1) RETURN_IF_ERROR(comm_->AllReduceSum(qk_sums_.data(), 2 * n));
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const double q_all = static_cast<double>(config_.num_attention_heads) * hd_;
  const double k_all = static_cast<double>(config_.num_key_value_heads) * hd_;
  for (int32_t i = 0; i < n; ++i) {
    float* q = &q_[i * qw_];
    float* k = &k_[i * kvw_];
    ScaleByNormWeight(q, 1.0f / std::sqrt(static_cast<float>(qk_sums_[2 * i] / q_all) + eps),
                      l.q_norm, qw_, q);
    ScaleByNormWeight(k, 1.0f / std::sqrt(static_cast<float>(qk_sums_[2 * i + 1] / k_all) + eps),
                      l.k_norm, kvw_, k);
  }
  return absl::OkStatus();
}

void CpuRank::RopeAndStoreKv(int32_t layer, const CpuRow* rows, int32_t n) {
  const KvLayerView kv = KvLayer(layer);
  const LayerWeights& l = w_.layers[layer];
  const float* bias = config_.qkv_bias ? LayerBiases(layer) : nullptr;
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const float offset = static_cast<float>(config_.norm_weight_offset);
  const float* rope = config_.IsSlidingLayer(layer) ? rope_local_ : rope_;
  for (int32_t i = 0; i < n; ++i) {
    const CpuRow& r = rows[i];
    if (bias != nullptr) {
      AddInPlace(&q_[i * qw_], bias, qw_);
      AddInPlace(&k_[i * kvw_], bias + qw_, kvw_);
      AddInPlace(&v_[i * kvw_], bias + qw_ + kvw_, kvw_);
    }
    if (config_.qk_norm && !config_.qk_norm_whole) {
      for (int64_t h = 0; h < w_.heads; ++h) {
        float* head = &q_[i * qw_ + h * hd_];
        RmsNorm(head, l.q_norm, hd_, eps, head, offset);
      }
      for (int64_t h = 0; h < w_.kv_heads; ++h) {
        float* head = &k_[i * kvw_ + h * hd_];
        RmsNorm(head, l.k_norm, hd_, eps, head, offset);
      }
    }
    if (config_.UsesRope(layer)) {  // (SmolLM3's NoPE layers attend without positions)
      const float* cs = rope + static_cast<int64_t>(r.position) * hd_;
      ApplyRope(&q_[i * qw_], w_.heads, hd_, cs);
      ApplyRope(&k_[i * kvw_], w_.kv_heads, hd_, cs);
    }
    if (record_kv_amax_) {
      float* amax = &kv_amax_[2 * static_cast<size_t>(layer)];
      for (int64_t e = 0; e < kvw_; ++e) {
        amax[0] = std::max(amax[0], std::abs(k_[i * kvw_ + e]));
        amax[1] = std::max(amax[1], std::abs(v_[i * kvw_ + e]));
      }
    }
    // The new token's K/V go where the run table puts its position.
    const int64_t phys =
        PhysicalToken(r.runs, r.num_runs, kv.block_tokens,
                      KeptPosition(r.position, kv.block_tokens, far_.sink_blocks, r.far_dropped));
    for (int64_t g = 0; g < w_.kv_heads; ++g) {
      StoreKv(kv, g, phys, &k_[i * kvw_ + g * hd_], &v_[i * kvw_ + g * hd_]);
    }
  }
}

void CpuRank::AddOutputBias(int32_t layer, int32_t n) {
  if (!config_.o_bias) return;
  const float* bias = LayerBiases(layer) + qw_ + 2 * kvw_;
  for (int32_t i = 0; i < n; ++i) AddInPlace(&h_[i * d_], bias, d_);
}

void CpuRank::Summarize(int32_t layer, const CpuRow* rows, int32_t n) {
  const KvLayerView kv = KvLayer(layer);
  const KvLayerView store = summaries_->Layer(layer);
  const int32_t bt = kv.block_tokens;
  const int64_t entries = store.block_tokens;
  // At most one new entry per decoding slot every block_tokens steps, a few per prefill chunk:
  // a few thousand adds per entry and head, not worth a parallel region.
  for (int32_t i = 0; i < n; ++i) {
    const CpuRow& r = rows[i];
    if (i + 1 < n && rows[i + 1].slot == r.slot) continue;  // the slot's last row decides
    for (int32_t j = r.far_dropped; j < r.far_summaries; ++j) {
      // Entry j summarizes logical block sink_blocks + j, still in the run table.
      const int64_t logical = int64_t{far_.sink_blocks + j} * bt;
      const int64_t phys = PhysicalToken(
          r.runs, r.num_runs, bt, KeptPosition(logical, bt, far_.sink_blocks, r.far_dropped));
      const int64_t entry = r.slot * entries + j;
      for (int32_t g = 0; g < w_.kv_heads; ++g) {
        SummarizeBlock(kv, g, phys, store.KeyAt(g, entry), store.ValueAt(g, entry));
      }
    }
  }
}

void CpuRank::Attention(int32_t layer, const CpuRow* rows, int32_t n) {
  const KvLayerView kv = KvLayer(layer);
  const KvLayerView store = summaries_ ? summaries_->Layer(layer) : KvLayerView{};
  const int32_t group = w_.heads / w_.kv_heads;
  AttentionScoring scoring;
  scoring.scale = config_.attention_scale > 0
                      ? static_cast<float>(config_.attention_scale)  // Granite's, Gemma's
                      : 1.0f / std::sqrt(static_cast<float>(hd_));
  scoring.softcap = static_cast<float>(config_.attn_logit_softcapping);  // Gemma 2's
  scoring.window = config_.SlidingWindowOf(layer);
  // A summary entry stands for one block's tokens: its score gets + log(block_tokens).
  const float log_weight = std::log(static_cast<float>(kv.block_tokens));
  const int64_t work = int64_t{n} * w_.kv_heads;  // (row, KV head) items
  threads_.RunOnAll([&](int t) {
    const int nt = threads_.num_threads();
    float* scores = &scores_[static_cast<size_t>(t) * group * shape_.max_context];
    // Interleaved items: a prefill chunk's later rows attend to longer histories, so
    // contiguous shares would be unbalanced.
    for (int64_t item = t; item < work; item += nt) {
      const int64_t i = item / w_.kv_heads, g = item % w_.kv_heads;
      const CpuRow& r = rows[i];
      const int64_t offset = i * qw_ + g * group * hd_;
      AttentionScoring head_scoring = scoring;  // gpt-oss: the group's sinks
      if (!sinks_.empty()) head_scoring.sinks = &sinks_[layer * w_.heads + g * group];
      if (r.far_summaries == 0 && (r.far_dropped == 0 || !far_.enabled())) {
        // (Without far history, dropped blocks are released ones, behind every layer's window.)
        head_scoring.released_tokens = int64_t{r.far_dropped} * kv.block_tokens;
        AttendGroup(&q_[offset], group, kv, static_cast<int32_t>(g), r.runs, r.num_runs,
                    r.position + 1, head_scoring, scores, &attn_[offset]);
        continue;
      }
      FarAttention far;
      far.sink_blocks = far_.sink_blocks;
      far.dropped = r.far_dropped;
      far.num_summaries = r.far_summaries;
      const int64_t entry = int64_t{r.slot} * store.block_tokens;
      far.k_summary = store.KeyAt(g, entry);
      far.v_summary = store.ValueAt(g, entry);
      far.log_weight = log_weight;
      AttendGroupFar(&q_[offset], group, kv, static_cast<int32_t>(g), r.runs, r.num_runs,
                     r.position + 1, far, head_scoring, scores, &attn_[offset]);
    }
  });
}

void CpuRank::SetLoraAdapter(int32_t index, const RankLora* adapter) {
  CHECK(index >= 0 && index < static_cast<int32_t>(lora_.size())) << "LoRA slot " << index;
  if (adapter != nullptr) {
    CHECK(static_cast<int32_t>(adapter->size()) == config_.num_hidden_layers);
    for (const auto& layer : *adapter) {
      for (const LoraShard& s : layer) CHECK(s.rank_stride <= lora_stride_);
    }
  }
  lora_[index] = adapter;
}

void CpuRank::LoraShare(int thread, int num_threads, int32_t layer, LoraTarget target,
                        const CpuRow* rows, int32_t n, const float* x, int64_t ldx, float* y,
                        int64_t ldy) {
  // Each adapter's rows together (they need not be consecutive), so its factors are read once.
  int32_t* ids = &lora_rows_[static_cast<size_t>(thread) * shape_.max_rows];
  uint8_t* done = &lora_done_[static_cast<size_t>(thread) * shape_.max_rows];
  float* mid = &lora_mid_[static_cast<size_t>(thread) * shape_.max_rows * lora_stride_];
  std::fill(done, done + n, 0);
  for (int32_t i = 0; i < n; ++i) {
    const int32_t adapter = rows[i].adapter;
    if (done[i] || adapter < 0) continue;
    const LoraShard& s = (*lora_[adapter])[layer][static_cast<int32_t>(target)];
    int32_t m = 0;
    for (int32_t j = i; j < n; ++j) {
      if (rows[j].adapter != adapter) continue;
      ids[m++] = j;
      done[j] = 1;
    }
    if (s.rank == 0) continue;
    int64_t begin, end;
    MatMulShareBounds(s.out, thread, num_threads, &begin, &end);
    if (begin >= end) continue;
    if (s.bf16) {
      LoraShrink(x, ldx, ids, m, s.at16.data(), s.in, s.rank_stride, mid);
      LoraExpand(mid, ids, m, s.rank, s.rank_stride, s.bt16.data(), s.out, begin, end, y, ldy);
    } else {
      LoraShrink(x, ldx, ids, m, s.at.data(), s.in, s.rank_stride, mid);
      LoraExpand(mid, ids, m, s.rank, s.rank_stride, s.bt.data(), s.out, begin, end, y, ldy);
    }
  }
}

void CpuRank::MatMulWithLora(const WeightMatrix& w, int32_t layer, LoraTarget target,
                             const CpuRow* rows, int32_t n, bool lora, const float* x,
                             int64_t ldx, float* y, int64_t ldy) {
  if (!lora) {
    MatMul(threads_, x, n, ldx, w, y, ldy, scratch_.data());
    return;
  }
  const CpuIsa isa = ActiveCpuIsa();
  threads_.RunOnAll([&](int t) {
    const int nt = threads_.num_threads();
    MatMulShare(isa, x, n, ldx, w, y, ldy, t, nt, &scratch_[t * scratch_per_thread_]);
    LoraShare(t, nt, layer, target, rows, n, x, ldx, y, ldy);
  });
}

void CpuRank::GateUpAct(int32_t layer, const CpuRow* rows, int32_t n, bool lora) {
  const CpuIsa isa = ActiveCpuIsa();
  const LayerWeights& l = w_.layers[layer];
  threads_.RunOnAll([&](int t) {
    const int nt = threads_.num_threads();
    float* scratch = &scratch_[t * scratch_per_thread_];
    MatMulShare(isa, h_.data(), n, d_, l.w_gate, gate_.data(), ffn_, t, nt, scratch);
    MatMulShare(isa, h_.data(), n, d_, l.w_up, up_.data(), ffn_, t, nt, scratch);
    if (lora) {  // the same columns of gate and up as the products above: still this thread's
      LoraShare(t, nt, layer, LoraTarget::kGate, rows, n, h_.data(), d_, gate_.data(), ffn_);
      LoraShare(t, nt, layer, LoraTarget::kUp, rows, n, h_.data(), d_, up_.data(), ffn_);
    }
    // SwiGLU (Gemma: GeGLU) on this thread's features while they are still in cache.
    int64_t b, e;
    MatMulShareBounds(ffn_, t, nt, &b, &e);
    for (int32_t i = 0; i < n; ++i) {
      float* g = &gate_[i * ffn_ + b];
      if (gelu_) {
        GeluTanhMul(g, &up_[i * ffn_ + b], e - b, g);
      } else {
        SiluMul(g, &up_[i * ffn_ + b], e - b, g);
      }
    }
  });
}

void CpuRank::Route(int32_t n) {
  const int32_t experts = config_.num_experts, k = config_.num_experts_per_tok;
  int32_t* count = expert_begin_.data();  // counts first, then turned into offsets
  std::fill(count, count + experts + 1, 0);
  for (int32_t i = 0; i < n; ++i) {
    // Softmax over every expert in f32 (as Transformers), then the k largest, the lower
    // expert first among equals.
    float* p = &router_logits_[static_cast<size_t>(i) * experts];
    const float top = *std::max_element(p, p + experts);
    float sum = 0;
    for (int32_t e = 0; e < experts; ++e) sum += p[e] = std::exp(p[e] - top);
    int32_t* chosen = &route_expert_[static_cast<size_t>(i) * k];
    float* weight = &route_weight_[static_cast<size_t>(i) * k];
    float kept = 0;
    for (int32_t j = 0; j < k; ++j) {
      int32_t best = -1;
      for (int32_t e = 0; e < experts; ++e) {
        if (p[e] >= 0 && (best < 0 || p[e] > p[best])) best = e;
      }
      if (best < 0) {  // NaN scores: the first expert not yet taken, rather than none
        best =
            static_cast<int32_t>(std::find_if(p, p + experts, [](float v) { return v != -1; }) - p);
      }
      chosen[j] = best;
      weight[j] = p[best] / sum;
      kept += weight[j];
      p[best] = -1;  // taken
      ++count[best + 1];
    }
    if (config_.norm_topk_prob) {
      for (int32_t j = 0; j < k; ++j) weight[j] /= kept;
    }
  }
  for (int32_t e = 0; e < experts; ++e) count[e + 1] += count[e];
  // Each expert's rows together, in row order: route_slot_ says where row i's j-th went.
  for (int32_t i = 0; i < n; ++i) {
    for (int32_t j = 0; j < k; ++j) {
      const size_t r = static_cast<size_t>(i) * k + j;
      route_slot_[r] = count[route_expert_[r]]++;
    }
  }
  // count[e] is now the end of expert e's rows, the beginning of e + 1's: shift back.
  for (int32_t e = experts; e > 0; --e) count[e] = count[e - 1];
  count[0] = 0;
  threads_.ParallelFor(int64_t{n} * k, 64, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      std::memcpy(&moe_x_[route_slot_[r] * d_], &h_[r / k * d_], d_ * sizeof(float));
    }
  });
}

void CpuRank::ExpertsGateUp(int32_t layer, int32_t n, int thread, int num_threads, float* scratch) {
  const CpuIsa isa = ActiveCpuIsa();
  const LayerWeights& l = w_.layers[layer];
  const float limit = static_cast<float>(config_.swiglu_limit);
  const auto act = [&](float* g, const float* u, int64_t count) {
    if (limit > 0) {  // gpt-oss's
      ClampedSwiGluMul(g, u, count, limit, static_cast<float>(kGptOssSwigluAlpha), g);
    } else if (gelu_) {
      GeluTanhMul(g, u, count, g);
    } else {
      SiluMul(g, u, count, g);
    }
  };
  if (shared_ffn_ > 0) {  // the shared expert, on every row (h_ is still the MLP's input)
    MatMulShare(isa, h_.data(), n, d_, l.shared_gate, shared_gate_.data(), shared_ffn_, thread,
                num_threads, scratch);
    MatMulShare(isa, h_.data(), n, d_, l.shared_up, shared_up_.data(), shared_ffn_, thread,
                num_threads, scratch);
    int64_t b, e;
    MatMulShareBounds(shared_ffn_, thread, num_threads, &b, &e);
    for (int32_t i = 0; i < n; ++i) {
      act(&shared_gate_[i * shared_ffn_ + b], &shared_up_[i * shared_ffn_ + b], e - b);
    }
  }
  int64_t b, e;
  MatMulShareBounds(moe_ffn_, thread, num_threads, &b, &e);
  for (int32_t x = 0; x < config_.num_experts; ++x) {
    const int64_t first = expert_begin_[x], m = expert_begin_[x + 1] - first;
    if (m == 0) continue;  // an expert no row chose: its weights are not read
    float* gate = &moe_gate_[first * moe_ffn_];
    float* up = &moe_up_[first * moe_ffn_];
    const float* in = &moe_x_[first * d_];
    MatMulShare(isa, in, m, d_, l.expert_gate[x], gate, moe_ffn_, thread, num_threads, scratch);
    MatMulShare(isa, in, m, d_, l.expert_up[x], up, moe_ffn_, thread, num_threads, scratch);
    if (!expert_gate_bias_.empty()) {  // gpt-oss's, on this thread's features
      const int64_t at = (int64_t{layer} * config_.num_experts + x) * moe_ffn_;
      for (int64_t i = 0; i < m; ++i) {
        AddInPlace(gate + i * moe_ffn_ + b, &expert_gate_bias_[at + b], e - b);
        AddInPlace(up + i * moe_ffn_ + b, &expert_up_bias_[at + b], e - b);
      }
    }
    for (int64_t i = 0; i < m; ++i) act(gate + i * moe_ffn_ + b, up + i * moe_ffn_ + b, e - b);
  }
}

void CpuRank::ExpertsDown(int32_t layer, int32_t n, int thread, int num_threads, float* scratch) {
  const CpuIsa isa = ActiveCpuIsa();
  const LayerWeights& l = w_.layers[layer];
  for (int32_t x = 0; x < config_.num_experts; ++x) {
    const int64_t first = expert_begin_[x], m = expert_begin_[x + 1] - first;
    if (m == 0) continue;
    MatMulShare(isa, &moe_gate_[first * moe_ffn_], m, moe_ffn_, l.expert_down[x],
                &moe_y_[first * d_], d_, thread, num_threads, scratch);
  }
  if (shared_ffn_ > 0) {
    MatMulShare(isa, shared_gate_.data(), n, shared_ffn_, l.shared_down, shared_y_.data(), d_,
                thread, num_threads, scratch);
  }
  // Each row's experts weighted and summed, over the columns this thread's shares wrote.
  int64_t b, e;
  MatMulShareBounds(d_, thread, num_threads, &b, &e);
  const int32_t k = config_.num_experts_per_tok;
  for (int32_t i = 0; i < n; ++i) {
    float* out = &h_[i * d_];
    for (int64_t c = b; c < e; ++c) out[c] = 0;
    if (shared_ffn_ > 0) AddScaledInPlace(out + b, &shared_y_[i * d_ + b], shared_scale_[i], e - b);
    for (int32_t j = 0; j < k; ++j) {
      const size_t r = static_cast<size_t>(i) * k + j;
      AddScaledInPlace(out + b, &moe_y_[route_slot_[r] * d_ + b], route_weight_[r], e - b);
      if (!expert_down_bias_.empty()) {  // gpt-oss's, on rank 0 only: once over the ranks
        const int64_t at = (int64_t{layer} * config_.num_experts + route_expert_[r]) * d_;
        AddScaledInPlace(out + b, &expert_down_bias_[at + b], route_weight_[r], e - b);
      }
    }
  }
}

absl::Status CpuRank::Experts(int32_t layer, int32_t n) {
  const LayerWeights& l = w_.layers[layer];
  const int64_t experts = config_.num_experts;
  // This rank's experts' scores; with several ranks, zeros elsewhere and an all-reduce, so every
  // rank routes by the same scores, bit for bit.
  if (w_.size > 1) std::fill(router_logits_.begin(), router_logits_.begin() + n * experts, 0.0f);
  MatMul(threads_, h_.data(), n, d_, l.router, &router_logits_[w_.router_begin], experts,
         scratch_.data());
  if (w_.size > 1) RETURN_IF_ERROR(comm_->AllReduceSum(router_logits_.data(), n * experts));
  if (!router_bias_.empty()) {  // gpt-oss's, on every rank alike
    for (int32_t i = 0; i < n; ++i) {
      AddInPlace(&router_logits_[i * experts], &router_bias_[layer * experts], experts);
    }
  }
  if (shared_ffn_ > 0) {
    // The shared expert's output gate: one dot product a row, computed alike on every rank
    // (each scales its partial sum of the shared expert's output by it).
    const float* g = &shared_expert_gate_[layer * d_];
    for (int32_t i = 0; i < n; ++i) {
      const float* x = &h_[i * d_];
      float dot = 0;
      for (int64_t c = 0; c < d_; ++c) dot += g[c] * x[c];
      shared_scale_[i] = 1.0f / (1.0f + std::exp(-dot));
    }
  }
  Route(n);
  for (int64_t e = 0; e < experts; ++e) experts_run_ += expert_begin_[e + 1] > expert_begin_[e];
  threads_.RunOnAll([&](int t) {
    ExpertsGateUp(layer, n, t, threads_.num_threads(), &scratch_[t * scratch_per_thread_]);
  });
  threads_.RunOnAll([&](int t) {
    ExpertsDown(layer, n, t, threads_.num_threads(), &scratch_[t * scratch_per_thread_]);
  });
  return absl::OkStatus();
}

void CpuRank::AddFinalHidden(int32_t begin, int32_t end, float* out) {
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const float offset = static_cast<float>(config_.norm_weight_offset);
  for (int32_t i = begin; i < end; ++i) {
    // h_ holds at least one row, free between passes.
    RmsNorm(&x_[i * d_], w_.final_norm, d_, eps, h_.data(), offset);
    for (int64_t c = 0; c < d_; ++c) out[c] += h_[c];
  }
}

absl::Status CpuRank::Forward(const CpuRow* rows, int32_t n, int32_t first_logit_row,
                              float* logits) {
  return Pass(rows, n, first_logit_row, nullptr, n - first_logit_row, logits);
}

absl::Status CpuRank::Forward(const CpuRow* rows, int32_t n, const int32_t* logit_rows, int32_t m,
                              float* logits) {
  for (int32_t j = 0; j < m; ++j) {
    if (logit_rows[j] < 0 || logit_rows[j] >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("logits of row ", logit_rows[j], " of a pass of ", n));
    }
  }
  return Pass(rows, n, 0, logit_rows, m, logits);
}

absl::Status CpuRank::Pass(const CpuRow* rows, int32_t n, int32_t first_logit_row,
                           const int32_t* logit_rows, int32_t m, float* logits) {
  const CpuIsa isa = ActiveCpuIsa();
  // Whether any row runs with a LoRA adapter: without, the pass is exactly the base model's.
  bool lora = false;
  for (int32_t i = 0; i < n && !lora_.empty(); ++i) lora |= rows[i].adapter >= 0;
  Embed(rows, n);
  for (int32_t layer = 0; layer < config_.num_hidden_layers; ++layer) {
    const LayerWeights& l = w_.layers[layer];
    // The block's input: the residual stream normalized, or as it is (OLMo 2).
    if (config_.pre_norms) {
      NormRows(l.attn_norm, n);
    } else {
      std::copy_n(x_.data(), int64_t{n} * d_, h_.data());
    }
    threads_.RunOnAll([&](int t) {
      const int nt = threads_.num_threads();
      float* scratch = &scratch_[t * scratch_per_thread_];
      MatMulShare(isa, h_.data(), n, d_, l.wq, q_.data(), qw_, t, nt, scratch);
      MatMulShare(isa, h_.data(), n, d_, l.wk, k_.data(), kvw_, t, nt, scratch);
      MatMulShare(isa, h_.data(), n, d_, l.wv, v_.data(), kvw_, t, nt, scratch);
      if (lora) {
        LoraShare(t, nt, layer, LoraTarget::kQ, rows, n, h_.data(), d_, q_.data(), qw_);
        LoraShare(t, nt, layer, LoraTarget::kK, rows, n, h_.data(), d_, k_.data(), kvw_);
        LoraShare(t, nt, layer, LoraTarget::kV, rows, n, h_.data(), d_, v_.data(), kvw_);
      }
    });
    if (config_.qk_norm_whole) RETURN_IF_ERROR(WholeQkNorm(layer, n));
    RopeAndStoreKv(layer, rows, n);
    if (far_.enabled()) Summarize(layer, rows, n);
    Attention(layer, rows, n);
    MatMulWithLora(l.wo, layer, LoraTarget::kO, rows, n, lora, attn_.data(), qw_, h_.data(), d_);
    RETURN_IF_ERROR(comm_->AllReduceSum(h_.data(), n * d_));
    AddOutputBias(layer, n);
    if (config_.sandwich_norms) NormRows(l.attn_post_norm, n, /*in_place=*/true);
    AddRows(n);

    if (config_.pre_norms) {
      NormRows(l.mlp_norm, n);
    } else {
      std::copy_n(x_.data(), int64_t{n} * d_, h_.data());
    }
    if (config_.IsMoeLayer(layer)) {
      RETURN_IF_ERROR(Experts(layer, n));
    } else {
      GateUpAct(layer, rows, n, lora);
      MatMulWithLora(l.w_down, layer, LoraTarget::kDown, rows, n, lora, gate_.data(), ffn_,
                     h_.data(), d_);
    }
    RETURN_IF_ERROR(comm_->AllReduceSum(h_.data(), n * d_));
    if (config_.sandwich_norms) NormRows(l.mlp_post_norm, n, /*in_place=*/true);
    AddRows(n);
  }
  if (m <= 0) return absl::OkStatus();
  const float eps = static_cast<float>(config_.rms_norm_eps);
  const float offset = static_cast<float>(config_.norm_weight_offset);
  for (int32_t j = 0; j < m; ++j) {
    const int64_t i = logit_rows != nullptr ? logit_rows[j] : first_logit_row + j;
    RmsNorm(&x_[i * d_], w_.final_norm, d_, eps, &h_[j * d_], offset);
  }
  MatMul(threads_, h_.data(), m, d_, w_.lm_head, logits + w_.vocab_begin, config_.vocab_size,
         scratch_.data());
  if (config_.logits_scaling != 1) {  // Granite's: this rank's vocabulary slice of each row
    const float inv = static_cast<float>(1 / config_.logits_scaling);
    for (int32_t i = 0; i < m; ++i) {
      ScaleInPlace(logits + int64_t{i} * config_.vocab_size + w_.vocab_begin, inv,
                   w_.lm_head.rows);
    }
  }
  if (config_.final_logit_softcapping > 0) {  // Gemma 2's: this rank's slice of each row
    const float cap = static_cast<float>(config_.final_logit_softcapping);
    const int64_t share = w_.lm_head.rows;
    // 256k logits a row: shared among the threads, in slices of at least 16k.
    threads_.ParallelFor(int64_t{m} * share, 16384, [&](int64_t b, int64_t e) {
      for (int64_t k = b; k < e;) {
        const int64_t i = k / share, v = k % share, len = std::min(e - k, share - v);
        SoftcapInPlace(logits + i * config_.vocab_size + w_.vocab_begin + v, cap, len);
        k += len;
      }
    });
  }
  return absl::OkStatus();
}

}  // namespace kvrm
