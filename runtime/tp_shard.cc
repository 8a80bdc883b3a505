#include "runtime/tp_shard.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvrm {
namespace {

// Columns [begin, begin + count) of `w`, copied dense into memory owned by `out`.
WeightMatrix CopyColumns(const WeightMatrix& w, int64_t begin, int64_t count, RankWeights* out) {
  const int64_t elem = DTypeSize(w.dtype);
  auto memory = std::make_unique<uint8_t[]>(w.rows * count * elem);
  for (int64_t r = 0; r < w.rows; ++r) {
    std::memcpy(memory.get() + r * count * elem, w.RowPtr(r) + begin * elem, count * elem);
  }
  WeightMatrix shard{w.dtype, memory.get(), w.rows, count, count};
  out->owned_bytes += w.rows * count * elem;
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
      s.wo = CopyColumns(l.wo, rank * q_rows, q_rows, &out);
      s.w_gate = l.w_gate.RowSlice(int64_t{rank} * out.ffn, out.ffn);
      s.w_up = l.w_up.RowSlice(int64_t{rank} * out.ffn, out.ffn);
      s.w_down = CopyColumns(l.w_down, int64_t{rank} * out.ffn, out.ffn, &out);
    }
    out.layers.push_back(s);
  }
  return out;
}

void AttachPanels(RankWeights* weights, CpuIsa isa) {
  auto attach = [&](WeightMatrix& w) {
    if (w.panels != nullptr || !MatMulReadsPanels(isa, w.dtype)) return;
    weights->panels.emplace_back(w);
    w.panels = weights->panels.back().data();
    weights->panel_bytes += weights->panels.back().bytes();
  };
  attach(weights->lm_head);
  for (LayerWeights& l : weights->layers) {
    for (WeightMatrix* w : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) attach(*w);
  }
}

}  // namespace kvrm
