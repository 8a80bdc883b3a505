#include "runtime/tp_shard.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/q4_k.h"
#include "kernels/cpu/q8_0.h"
#include "model/gguf_quants.h"

namespace kvrm {
namespace {

// Columns [begin, begin + count) of a q4_K or q6_K matrix as 8-bit blocks of exactly their
// values (q8 affine, q8 halves: a share that splits a 256-column super-block; begin and count
// multiples of 32), into memory owned by `out`.
WeightMatrix CopyKQuantColumnsAs8Bit(const WeightMatrix& w, int64_t begin, int64_t count,
                                     RankWeights* out) {
  constexpr int64_t kSub = WeightMatrix::kQ8Block, kSuper = WeightMatrix::kQ4KBlock;
  const GgmlType type = GgmlTypeOf(w.format);
  const WeightFormat format = Exact8BitFormat(type);
  const int64_t block_bytes = WeightMatrix::DataBlockSize(format);
  const int64_t first = begin / kSuper, last = (begin + count + kSuper - 1) / kSuper;
  const int64_t row_bytes = count / kSub * block_bytes;
  auto memory = std::make_unique<uint8_t[]>(w.rows * row_bytes);
  // The super-blocks the share touches, converted whole; the share's sub-blocks copied out.
  std::vector<std::byte> converted((last - first) * kSuper / kSub * block_bytes);
  for (int64_t r = 0; r < w.rows; ++r) {
    const std::byte* from = reinterpret_cast<const std::byte*>(w.RowPtr(r)) +
                            first * WeightMatrix::DataBlockSize(w.format);
    CHECK(ToExact8Bit(type, from, (last - first) * kSuper, converted.data()));
    std::memcpy(memory.get() + r * row_bytes,
                converted.data() + (begin - first * kSuper) / kSub * block_bytes, row_bytes);
  }
  WeightMatrix shard{w.dtype, memory.get(), w.rows, count, count, nullptr, format};
  out->owned_bytes += w.rows * row_bytes;
  out->owned.push_back(std::move(memory));
  return shard;
}

// Columns [begin, begin + count) of a q4 group matrix as q8 affine blocks of exactly its values
// (s * q - s * z per 32; a share that splits a 256-column super-block), into memory owned by
// `out`.
WeightMatrix CopyQ4GColumnsAs8Bit(const WeightMatrix& w, int64_t begin, int64_t count,
                                  RankWeights* out) {
  constexpr int64_t kSub = WeightMatrix::kQ8Block, kSuper = WeightMatrix::kQ4KBlock;
  constexpr int64_t kBlockBytes = WeightMatrix::kQ8AffineBlockBytes;
  const int64_t row_bytes = count / kSub * kBlockBytes;
  auto memory = std::make_unique<uint8_t[]>(w.rows * row_bytes);
  float s[8];
  uint8_t z[8], q[kSuper];
  for (int64_t r = 0; r < w.rows; ++r) {
    const uint8_t* row = reinterpret_cast<const uint8_t*>(w.RowPtr(r));
    for (int64_t c = begin; c < begin + count; c += kSub) {
      DecodeBlockQ4G(row + c / kSuper * WeightMatrix::kQ4GBlockBytes, s, z, q);
      const int j = static_cast<int>(c % kSuper / kSub);
      const float o = -s[j] * static_cast<float>(z[j]);
      uint8_t* to = memory.get() + r * row_bytes + (c - begin) / kSub * kBlockBytes;
      std::memcpy(to, &s[j], 4);
      std::memcpy(to + 4, &o, 4);
      for (int i = 0; i < kSub; ++i) to[8 + i] = q[32 * j + i];  // 0..15: int8 as is
    }
  }
  WeightMatrix shard{w.dtype, memory.get(), w.rows, count, count, nullptr, WeightFormat::kQ8Affine};
  out->owned_bytes += w.rows * row_bytes;
  out->owned.push_back(std::move(memory));
  return shard;
}

// Columns [begin, begin + count) of `w`, copied into memory owned by `out` (block formats: whole
// blocks, so begin and count must be multiples of 32; a q4_K or q6_K share that splits a
// 256-column super-block becomes 8-bit blocks).
absl::StatusOr<WeightMatrix> CopyColumns(const WeightMatrix& w, const char* name, int64_t begin,
                                         int64_t count, RankWeights* out) {
  if (WeightMatrix::IsQuantized(w.format) &&
      (begin % WeightMatrix::kQ8Block != 0 || count % WeightMatrix::kQ8Block != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor parallelism ", out->size, " splits the quantized matrix ", name,
        " at input column ", begin, " (", count, " a rank), not at a 32-column block"));
  }
  if (w.input_order != nullptr) {
    // An act-order matrix's columns are in its groups' order, not the inputs': the share's
    // values, in input order, quantized to q8_0 again (as an act-order checkpoint is without
    // q4 groups).
    const int64_t row_bytes = count / WeightMatrix::kQ8Block * WeightMatrix::kQ8BlockBytes;
    auto memory = std::make_unique<uint8_t[]>(w.rows * row_bytes);
    std::vector<float> row(w.cols);
    for (int64_t r = 0; r < w.rows; ++r) {
      WeightRowToFloat(w, r, row.data());
      QuantizeRowQ8_0(row.data() + begin, count, memory.get() + r * row_bytes);
    }
    WeightMatrix shard{w.dtype, memory.get(), w.rows, count, count, nullptr, WeightFormat::kQ8_0};
    out->owned_bytes += w.rows * row_bytes;
    out->owned.push_back(std::move(memory));
    return shard;
  }
  const int64_t super = WeightMatrix::kQ4KBlock;
  if (WeightMatrix::IsKQuant(w.format) && (begin % super != 0 || count % super != 0)) {
    return w.format == WeightFormat::kQ4G ? CopyQ4GColumnsAs8Bit(w, begin, count, out)
                                          : CopyKQuantColumnsAs8Bit(w, begin, count, out);
  }
  const int64_t row_bytes = w.DataBytes(count);
  auto memory = std::make_unique<uint8_t[]>(w.rows * row_bytes);
  for (int64_t r = 0; r < w.rows; ++r) {
    std::memcpy(memory.get() + r * row_bytes, w.RowPtr(r) + w.DataBytes(begin), row_bytes);
  }
  WeightMatrix shard{w.dtype, memory.get(), w.rows, count, count, nullptr, w.format};
  out->owned_bytes += w.rows * row_bytes;
  out->owned.push_back(std::move(memory));
  return shard;
}

// Elements [begin, begin + count) of a [1][n] vector (a bias): a view.
WeightMatrix VectorSlice(const WeightMatrix& v, int64_t begin, int64_t count) {
  if (v.data == nullptr) return v;
  return WeightMatrix{v.dtype, v.RowPtr(0) + v.DataBytes(begin), 1, count, count};
}

}  // namespace

absl::StatusOr<RankWeights> ShardLlamaWeights(const LlamaConfig& config,
                                              const LlamaWeights& weights, int32_t rank,
                                              int32_t size) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " of ", size));
  }
  // (A model of MoE layers only has no MLP of intermediate_size.)
  if (config.num_attention_heads % size != 0 || config.num_key_value_heads % size != 0 ||
      (config.HasDenseMlp() && config.intermediate_size % size != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor parallelism ", size, " must divide the attention heads (",
        config.num_attention_heads, "), KV heads (", config.num_key_value_heads,
        ") and intermediate size (", config.intermediate_size, ")"));
  }
  if (config.moe_intermediate_size % size != 0 ||
      config.shared_expert_intermediate_size % size != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor parallelism ", size, " must divide the experts' intermediate size (",
                     config.moe_intermediate_size, ") and the shared expert's (",
                     config.shared_expert_intermediate_size, ")"));
  }
  const int64_t hd = config.head_dim;
  RankWeights out;
  out.rank = rank;
  out.size = size;
  out.heads = config.num_attention_heads / size;
  out.kv_heads = config.num_key_value_heads / size;
  out.ffn = config.intermediate_size / size;
  out.moe_ffn = config.moe_intermediate_size / size;
  out.shared_ffn = config.shared_expert_intermediate_size / size;
  out.router_begin = static_cast<int32_t>(int64_t{config.num_experts} * rank / size);
  const int32_t router_end = static_cast<int32_t>(int64_t{config.num_experts} * (rank + 1) / size);
  const int64_t vocab = config.vocab_size;
  out.vocab_begin = static_cast<int32_t>(vocab * rank / size);
  const int64_t vocab_end = vocab * (rank + 1) / size;
  out.embed = weights.embed;
  out.final_norm = weights.final_norm;
  out.lm_head = weights.lm_head.RowSlice(out.vocab_begin, vocab_end - out.vocab_begin);
  const int64_t q_rows = out.heads * hd, kv_rows = out.kv_heads * hd;
  for (const LayerWeights& l : weights.layers) {
    LayerWeights s = l;
    if (size > 1) {
      s.wq = l.wq.RowSlice(rank * q_rows, q_rows);
      s.wk = l.wk.RowSlice(rank * kv_rows, kv_rows);
      s.wv = l.wv.RowSlice(rank * kv_rows, kv_rows);
      s.bq = VectorSlice(l.bq, rank * q_rows, q_rows);
      s.bk = VectorSlice(l.bk, rank * kv_rows, kv_rows);
      s.bv = VectorSlice(l.bv, rank * kv_rows, kv_rows);
      s.sinks = VectorSlice(l.sinks, int64_t{rank} * out.heads, out.heads);  // gpt-oss's
      if (config.qk_norm_whole) {  // OLMo 2's norms span the projections: this rank's heads' part
        s.q_norm = VectorSlice(l.q_norm, rank * q_rows, q_rows);
        s.k_norm = VectorSlice(l.k_norm, rank * kv_rows, kv_rows);
      }
      ASSIGN_OR_RETURN(s.wo, CopyColumns(l.wo, "o_proj", rank * q_rows, q_rows, &out));
      if (l.router.data == nullptr) {
        s.w_gate = l.w_gate.RowSlice(int64_t{rank} * out.ffn, out.ffn);
        s.w_up = l.w_up.RowSlice(int64_t{rank} * out.ffn, out.ffn);
        ASSIGN_OR_RETURN(
            s.w_down, CopyColumns(l.w_down, "down_proj", int64_t{rank} * out.ffn, out.ffn, &out));
        out.layers.push_back(s);
        continue;
      }
      s.router = l.router.RowSlice(out.router_begin, router_end - out.router_begin);
      const int64_t begin = int64_t{rank} * out.moe_ffn;
      for (size_t e = 0; e < l.expert_gate.size(); ++e) {
        s.expert_gate[e] = l.expert_gate[e].RowSlice(begin, out.moe_ffn);
        s.expert_up[e] = l.expert_up[e].RowSlice(begin, out.moe_ffn);
        ASSIGN_OR_RETURN(s.expert_down[e], CopyColumns(l.expert_down[e], "an expert's down_proj",
                                                       begin, out.moe_ffn, &out));
      }
      // gpt-oss's expert biases: gate and up cut like their rows; down's (and the router's)
      // whole, added by one rank (CpuRank::ExpertsDown).
      for (size_t e = 0; e < l.expert_gate_bias.size(); ++e) {
        s.expert_gate_bias[e] = VectorSlice(l.expert_gate_bias[e], begin, out.moe_ffn);
        s.expert_up_bias[e] = VectorSlice(l.expert_up_bias[e], begin, out.moe_ffn);
      }
      if (l.shared_gate.data != nullptr) {  // cut as a dense MLP; its output gate replicated
        const int64_t shared_begin = int64_t{rank} * out.shared_ffn;
        s.shared_gate = l.shared_gate.RowSlice(shared_begin, out.shared_ffn);
        s.shared_up = l.shared_up.RowSlice(shared_begin, out.shared_ffn);
        ASSIGN_OR_RETURN(s.shared_down, CopyColumns(l.shared_down, "the shared expert's down_proj",
                                                    shared_begin, out.shared_ffn, &out));
      }
    }
    out.layers.push_back(s);
  }
  return out;
}

absl::StatusOr<RankLora> ShardLoraAdapter(const LlamaConfig& config, const LoraAdapter& adapter,
                                          int32_t rank, int32_t size, DType dtype) {
  if (dtype != DType::kF32 && dtype != DType::kBF16) {
    return absl::InvalidArgumentError("LoRA factors are kept in f32 or bf16");
  }
  if (static_cast<int32_t>(adapter.layers.size()) != config.num_hidden_layers) {
    return absl::InvalidArgumentError(absl::StrCat("LoRA adapter '", adapter.name, "' has ",
                                                   adapter.layers.size(), " layers; the model ",
                                                   config.num_hidden_layers));
  }
  RankLora layers(adapter.layers.size());
  for (size_t l = 0; l < adapter.layers.size(); ++l) {
    for (int32_t t = 0; t < kNumLoraTargets; ++t) {
      const LoraMatrix& m = adapter.layers[l].m[t];
      if (m.rank == 0) continue;
      // The rank's input columns [in_begin, in_begin + in) and output rows
      // [out_begin, out_begin + out) of the full matrix, cut as ShardLlamaWeights cuts the base:
      // O and down (row-parallel) by inputs, the others by outputs.
      const auto [out, in] = LoraTargetShape(config, LoraTarget(t));
      const bool by_inputs = LoraTarget(t) == LoraTarget::kO || LoraTarget(t) == LoraTarget::kDown;
      const int64_t in_share = by_inputs ? in / size : in;
      const int64_t out_share = by_inputs ? out : out / size;
      const int64_t in_begin = by_inputs ? rank * in_share : 0;
      const int64_t out_begin = by_inputs ? 0 : rank * out_share;
      if (m.rank > kMaxLoraRank || m.in != in || m.out != out ||
          m.a.size() != static_cast<size_t>(m.rank * m.in) ||
          m.b.size() != static_cast<size_t>(m.out * m.rank)) {
        return absl::InvalidArgumentError(
            absl::StrCat("LoRA adapter '", adapter.name, "' layer ", l, " ",
                         std::string(LoraTargetName(LoraTarget(t))), ": [", m.rank, " x ", m.in,
                         "] x [", m.out, " x ", m.rank, "] does not fit the model"));
      }
      LoraShard& s = layers[l][t];
      s.rank = m.rank;
      s.rank_stride = (m.rank + kLoraRankLanes - 1) / kLoraRankLanes * kLoraRankLanes;
      s.in = in_share;
      s.out = out_share;
      s.at.assign(in_share * s.rank_stride, 0.0f);
      s.bt.resize(m.rank * out_share);
      for (int64_t k = 0; k < m.rank; ++k) {
        for (int64_t i = 0; i < in_share; ++i) {
          s.at[i * s.rank_stride + k] = m.a[k * m.in + in_begin + i];
        }
        for (int64_t o = 0; o < out_share; ++o) {
          s.bt[k * out_share + o] = m.b[(out_begin + o) * m.rank + k];
        }
      }
      if (dtype == DType::kBF16) {
        s.bf16 = true;
        s.at16.resize(s.at.size());
        s.bt16.resize(s.bt.size());
        for (size_t i = 0; i < s.at.size(); ++i) s.at16[i] = FloatToBf16(s.at[i]);
        for (size_t i = 0; i < s.bt.size(); ++i) s.bt16[i] = FloatToBf16(s.bt[i]);
        std::vector<float>().swap(s.at);
        std::vector<float>().swap(s.bt);
      }
    }
  }
  return layers;
}

void AttachPanels(RankWeights* weights, CpuIsa isa, bool dense_panels, WeightFormat quantize,
                  int threads) {
  struct Job {
    WeightMatrix* w;
    WeightFormat format;
  };
  std::vector<Job> jobs;
  auto want = [&](WeightMatrix& w) {
    if (w.panels != nullptr) return;
    if (WeightMatrix::IsQuantized(w.format)) {
      jobs.push_back({&w, BlockPanelFormat(w)});
    } else if (quantize == WeightFormat::kQ4K && w.cols % WeightMatrix::kQ4KBlock == 0) {
      jobs.push_back({&w, WeightFormat::kQ4K});
    } else if (WeightMatrix::IsQuantized(quantize)) {
      jobs.push_back({&w, WeightFormat::kQ8_0});
    } else if (dense_panels && MatMulReadsPanels(isa, w.dtype)) {
      jobs.push_back({&w, WeightFormat::kDense});
    }
  };
  want(weights->lm_head);
  for (LayerWeights& l : weights->layers) {
    ForEachLinearWeight(l, want);
    // The router stays in its own format (vLLM and llama-quantize leave it unquantized): a few
    // columns a token, and its choices are what a rounding error would flip.
    if (l.router.data != nullptr && l.router.panels == nullptr) {
      if (WeightMatrix::IsQuantized(l.router.format)) {
        jobs.push_back({&l.router, BlockPanelFormat(l.router)});
      } else if (dense_panels && MatMulReadsPanels(isa, l.router.dtype)) {
        jobs.push_back({&l.router, WeightFormat::kDense});
      }
    }
  }
  // Packing (and quantizing) is most of a large model's start-up: the matrices are shared among
  // the threads, each taking the next one.
  std::vector<std::optional<PanelCopy>> made(jobs.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i = next++; i < jobs.size(); i = next++) {
      made[i].emplace(*jobs[i].w, jobs[i].format);
    }
  };
  std::vector<std::thread> pool;
  const size_t extra = std::min<size_t>(std::max(threads, 1), jobs.size()) - (jobs.empty() ? 0 : 1);
  for (size_t t = 0; t < extra; ++t) pool.emplace_back(work);
  work();
  for (std::thread& th : pool) th.join();
  for (size_t i = 0; i < jobs.size(); ++i) {
    weights->panels.push_back(std::move(*made[i]));
    jobs[i].w->panels = weights->panels.back().data();
    jobs[i].w->panel_format = jobs[i].format;
    weights->panel_bytes += weights->panels.back().bytes();
  }
}

}  // namespace kvrm
