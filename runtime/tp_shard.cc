#include "runtime/tp_shard.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kvrm {
namespace {

// Columns [begin, begin + count) of `w`, copied dense into memory owned by `out` (q8_0: whole
// blocks, so begin and count must be multiples of 32).
absl::StatusOr<WeightMatrix> CopyColumns(const WeightMatrix& w, const char* name, int64_t begin,
                                         int64_t count, RankWeights* out) {
  if (w.format == WeightFormat::kQ8_0 &&
      (begin % WeightMatrix::kQ8Block != 0 || count % WeightMatrix::kQ8Block != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor parallelism ", out->size, " splits the q8_0 matrix ", name, " at input column ",
        begin, " (", count, " a rank), not at a 32-column block"));
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

}  // namespace

absl::StatusOr<RankWeights> ShardLlamaWeights(const LlamaConfig& config,
                                              const LlamaWeights& weights, int32_t rank,
                                              int32_t size) {
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " of ", size));
  }
  if (config.num_attention_heads % size != 0 || config.num_key_value_heads % size != 0 ||
      config.intermediate_size % size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor parallelism ", size, " must divide the attention heads (",
        config.num_attention_heads, "), KV heads (", config.num_key_value_heads,
        ") and intermediate size (", config.intermediate_size, ")"));
  }
  const int64_t hd = config.head_dim;
  RankWeights out;
  out.rank = rank;
  out.size = size;
  out.heads = config.num_attention_heads / size;
  out.kv_heads = config.num_key_value_heads / size;
  out.ffn = config.intermediate_size / size;
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
      ASSIGN_OR_RETURN(s.wo, CopyColumns(l.wo, "o_proj", rank * q_rows, q_rows, &out));
      s.w_gate = l.w_gate.RowSlice(int64_t{rank} * out.ffn, out.ffn);
      s.w_up = l.w_up.RowSlice(int64_t{rank} * out.ffn, out.ffn);
      ASSIGN_OR_RETURN(s.w_down,
                       CopyColumns(l.w_down, "down_proj", int64_t{rank} * out.ffn, out.ffn, &out));
    }
    out.layers.push_back(s);
  }
  return out;
}

void AttachPanels(RankWeights* weights, CpuIsa isa, bool dense_panels, bool quantize_q8_0) {
  auto attach = [&](WeightMatrix& w) {
    if (w.panels != nullptr) return;
    WeightFormat format = WeightFormat::kDense;
    if (w.format == WeightFormat::kQ8_0 || quantize_q8_0) {
      format = WeightFormat::kQ8_0;
    } else if (!dense_panels || !MatMulReadsPanels(isa, w.dtype)) {
      return;
    }
    weights->panels.emplace_back(w, format);
    w.panels = weights->panels.back().data();
    w.panel_format = format;
    weights->panel_bytes += weights->panels.back().bytes();
  };
  attach(weights->lm_head);
  for (LayerWeights& l : weights->layers) {
    for (WeightMatrix* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) attach(*w);
  }
}

}  // namespace kvrm
