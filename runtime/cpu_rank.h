// One tensor-parallel rank of the CPU backend: its weight shard, KV pool share, thread pool and
// activation buffers, and the Llama forward pass over them as a fixed plan of parallel regions.
//
// With one rank this is the whole model. With several, each rank computes its query/KV heads and
// intermediate features and all-reduces the partial outputs of O and down through its
// Communicator, so every rank holds the same residual stream (bit for bit: the all-reduce sums
// in rank order).
//
// Owner: the rank's thread (the engine thread for rank 0). Nothing here allocates after
// construction.
#ifndef KVRM_RUNTIME_CPU_RANK_H_
#define KVRM_RUNTIME_CPU_RANK_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/thread_pool.h"
#include "model/config.h"
#include "runtime/communicator.h"
#include "runtime/far_history.h"
#include "runtime/kv_pool.h"
#include "runtime/tp_shard.h"

namespace kvrm {

// One row of a batch: a token at a position of a slot's history.
struct CpuRow {
  int32_t token = 0;
  int32_t position = 0;
  const KvRun* runs = nullptr;
  int32_t num_runs = 0;
  // Far history (runtime/far_history.h; zero when off): the slot (its summary entries), the
  // blocks missing from `runs` after the sinks, and the summary entries this row attends to.
  // Rows of one slot are consecutive; its last row's entries [far_dropped, far_summaries) are
  // written before the layer's attention. Far history off, far_dropped counts blocks released
  // behind every layer's window (StepDescriptor), the run table starting after them.
  int32_t slot = 0;
  int32_t far_dropped = 0;
  int32_t far_summaries = 0;
  // The LoRA adapter the row runs with (its slot, CpuRank::SetLoraAdapter); -1: the base model.
  int32_t adapter = -1;
};

struct CpuRankShape {
  int32_t max_rows = 0;     // slots + chunk tokens (a chunk may ride with a decode step)
  int32_t max_context = 0;  // positions
  int32_t num_threads = 1;  // this rank's pool, the rank thread included
  // LoRA adapter slots (SetLoraAdapter) and the largest rank an adapter in them may have (sizes
  // LoraShare's scratch); 0: no adapters.
  int32_t lora_adapters = 0;
  int32_t lora_max_rank = 0;
};

class CpuRank {
 public:
  // `rope` ([max_context][head_dim], cos half then sin half) and `comm` outlive the rank;
  // `rope_local` likewise, the sliding layers' table (LocalRopeConfig), or null: theirs is `rope`.
  CpuRank(const LlamaConfig& config, RankWeights weights, std::unique_ptr<KvPool> pool,
          Communicator* comm, const float* rope, const float* rope_local,
          const CpuRankShape& shape);

  // The forward pass over rows[0, n); for rows [first_logit_row, n) writes this rank's
  // vocabulary slice of the logits: logits[(i - first_logit_row) * vocab + v] for v in
  // [vocab_begin, vocab_begin + share). Ranks write disjoint slices of the same buffer.
  absl::Status Forward(const CpuRow* rows, int32_t n, int32_t first_logit_row, float* logits);
  // The same pass, with the logits of the rows listed instead (logit_rows[j] < n, m of them):
  // row logit_rows[j]'s go to logits[j * vocab + v]. For a pass over several prefill chunks,
  // whose last rows are not contiguous.
  absl::Status Forward(const CpuRow* rows, int32_t n, const int32_t* logit_rows, int32_t m,
                       float* logits);
  // After a Forward over at least `end` rows: adds the final norm's output of each row in
  // [begin, end) (the residual stream is whole on every rank) to out[0, hidden_size).
  void AddFinalHidden(int32_t begin, int32_t end, float* out);

  KvPool* kv_pool() { return pool_.get(); }
  // Far history on: `summaries` is this rank's summary store, a pool whose "block" s is slot s's
  // entries ([layer][K|V][kv_heads][slots * entries][head_dim]). Called once, before Forward.
  void SetFarHistory(const FarHistoryShape& shape, std::unique_ptr<KvPool> summaries);
  const KvPool* summary_store() const { return summaries_.get(); }
  const RankWeights& weights() const { return w_; }
  // Mixtures of experts: how many (layer, expert) pairs the passes so far ran, i.e. whose
  // weights they read (an expert no row chose is not read).
  int64_t experts_run() const { return experts_run_; }
  // Calibration (tools/kv_scales): while on, each layer's largest |key| and |value| over this
  // rank's heads (after RoPE, before the cache rounds them), [layers][2], kept across passes.
  // Off by default (one test a layer on the step path). Not during a Forward.
  void set_record_kv_amax(bool on);
  const std::vector<float>& kv_amax() const { return kv_amax_; }
  // Puts this rank's share of an adapter in slot `index` (< CpuRankShape::lora_adapters; null
  // empties it): rows with adapter == index use it from the next Forward. The share must outlive
  // its time in the slot and have no rank above lora_max_rank. Not during a Forward.
  void SetLoraAdapter(int32_t index, const RankLora* adapter);

 private:
  // Both Forwards: the logits of rows logit_rows[0, m) when given, else of rows
  // [first_logit_row, first_logit_row + m).
  absl::Status Pass(const CpuRow* rows, int32_t n, int32_t first_logit_row,
                    const int32_t* logit_rows, int32_t m, float* logits);
  void Embed(const CpuRow* rows, int32_t n);
  // h_ = RmsNorm(x_), or RmsNorm(h_) in place (Gemma's norms of the attention and MLP outputs).
  void NormRows(const WeightMatrix& norm, int32_t n, bool in_place = false);
  void AddRows(int32_t n);  // x_ += h_
  // The pool's view of `layer`, with the layer's FP8 KV cache scales.
  KvLayerView KvLayer(int32_t layer) const;
  // OLMo 2's Q and K norms over the whole projections: the mean of squares spans every rank's
  // heads (one all-reduce of 2n sums).
  absl::Status WholeQkNorm(int32_t layer, int32_t n);
  // Q/K/V biases and Qwen3's Q/K head norms where the model has them, RoPE on Q and K, and the
  // K/V writes to the pool.
  void RopeAndStoreKv(int32_t layer, const CpuRow* rows, int32_t n);
  // h_ += the O projection's bias, when the model has one (after the all-reduce: once).
  void AddOutputBias(int32_t layer, int32_t n);
  // Far history: writes the summary entries of each slot's last row (see CpuRow).
  void Summarize(int32_t layer, const CpuRow* rows, int32_t n);
  void Attention(int32_t layer, const CpuRow* rows, int32_t n);
  // gate_ = act(gate) * up (SiLU, or GELU-tanh); with `lora`, each row's adapter deltas join
  // gate and up first.
  void GateUpAct(int32_t layer, const CpuRow* rows, int32_t n, bool lora);
  // A mixture-of-experts MLP: h_ (the normalized rows) is routed and replaced by this rank's
  // share of the weighted sum of each row's experts (a partial sum, as down's).
  absl::Status Experts(int32_t layer, int32_t n);
  // The router's softmax and top-k for rows [0, n) of router_logits_: route_expert_ and
  // route_weight_, then the rows gathered by expert into moe_x_ (expert_begin_, route_slot_).
  void Route(int32_t n);
  // One thread's share of act(gate) * up of every routed expert (and the shared expert), or of
  // their down products and the weighted sum into h_ (the output columns MatMulShareBounds gives
  // the thread).
  void ExpertsGateUp(int32_t layer, int32_t n, int thread, int num_threads, float* scratch);
  void ExpertsDown(int32_t layer, int32_t n, int thread, int num_threads, float* scratch);
  // Thread `thread`'s share of y[i] += B (A x[i]) (B times the adapter's scale) for each row i
  // whose adapter adapts projection `target` of `layer` (this rank's share of it: a partial sum
  // for O and down): the output columns MatMulShareBounds gives the thread, the ones its
  // MatMulShare of the base matrix wrote, so no barrier comes between the two. Each thread
  // computes the rows' A x itself (rank x in products a row). An adapter's rows go through the
  // kernels together (kernels/cpu/lora.h), so its factors are read once a pass. Rows without an
  // adapter are left alone.
  void LoraShare(int thread, int num_threads, int32_t layer, LoraTarget target,
                 const CpuRow* rows, int32_t n, const float* x, int64_t ldx, float* y,
                 int64_t ldy);
  // A base product and its adapters' deltas in one parallel region (MatMul, then LoraShare).
  void MatMulWithLora(const WeightMatrix& w, int32_t layer, LoraTarget target, const CpuRow* rows,
                      int32_t n, bool lora, const float* x, int64_t ldx, float* y, int64_t ldy);

  const LlamaConfig config_;
  const RankWeights w_;
  std::unique_ptr<KvPool> pool_;
  FarHistoryShape far_;                // all zero: off
  std::unique_ptr<KvPool> summaries_;  // far history on; see SetFarHistory
  Communicator* const comm_;
  const float* const rope_;
  const float* const rope_local_;  // the sliding layers' (Gemma 3's local base); may be rope_
  const CpuRankShape shape_;
  ThreadPool threads_;
  // Widths of this rank's activations.
  const int64_t d_, hd_, qw_, kvw_, ffn_;
  const int64_t moe_ffn_;             // this rank's features of each expert (0: a dense model)
  const int64_t shared_ffn_;          // this rank's features of the shared expert (0: none)
  const bool gelu_;                   // the MLP's activation: GELU (tanh), or SiLU
  const int64_t scratch_per_thread_;  // matmul widening floats per pool thread

  // [max_rows][width] each; h_ is [max_rows][hidden].
  std::vector<float> x_, h_, q_, k_, v_, attn_, gate_, up_;
  std::vector<float> scores_;   // [threads][group * max_context]
  std::vector<float> qk_sums_;  // WholeQkNorm's [max_rows][2] (OLMo 2 only)
  bool record_kv_amax_ = false;
  std::vector<float> kv_amax_;  // [layers][2] while recording
  std::vector<float> scratch_;  // [threads][scratch_per_thread_]
  // Mixtures of experts (empty otherwise), k = num_experts_per_tok: the router's scores
  // [max_rows][experts]; each row's experts and weights [max_rows][k] and where its j-th expert's
  // input went in the gathered rows [max_rows][k]; the first gathered row of each expert
  // [experts + 1]; the gathered inputs [max_rows * k][hidden], their act(gate) * up
  // [max_rows * k][moe_ffn] (up: scratch for up) and down outputs [max_rows * k][hidden].
  std::vector<float> router_logits_;
  std::vector<int32_t> route_expert_, route_slot_, expert_begin_;
  std::vector<float> route_weight_;
  std::vector<float> moe_x_, moe_gate_, moe_up_, moe_y_;
  int64_t experts_run_ = 0;
  // Qwen2-MoE's shared expert: its gate per layer in f32 ([layers][hidden]), each row's output
  // scale sigmoid(gate . x) [max_rows], act(gate) * up [max_rows][shared_ffn] (up: scratch for
  // up) and its down products [max_rows][hidden].
  std::vector<float> shared_expert_gate_, shared_scale_, shared_gate_, shared_up_, shared_y_;
  // gpt-oss (empty otherwise), in f32: each layer's sink logits of this rank's query heads
  // [layers][heads]; the router's bias [layers][experts]; each expert's gate and up biases over
  // this rank's features [layers][experts][moe_ffn], and its down bias [layers][experts][hidden]
  // (held and added by rank 0 only, empty on the others: their down outputs are partial sums of
  // the same rows).
  std::vector<float> sinks_, router_bias_, expert_gate_bias_, expert_up_bias_, expert_down_bias_;
  // The adapters' shares by slot (null: empty; see SetLoraAdapter).
  std::vector<const RankLora*> lora_;
  // LoraShare's, with adapter slots only: per thread, an adapter's row ids and which rows are
  // done ([max_rows] each), and their A x ([max_rows][lora_stride_]).
  int32_t lora_stride_ = 0;  // the widest LoraShard::rank_stride a slot may hold
  std::vector<int32_t> lora_rows_;
  std::vector<uint8_t> lora_done_;
  std::vector<float> lora_mid_;
  // The attention biases in f32, [layers][qw_ + 2 kvw_ + d_]: this rank's Q, K, V bias shares and
  // the O bias (zeros where the model has none); empty when it has neither.
  std::vector<float> biases_;
  float* LayerBiases(int32_t layer) { return biases_.data() + layer * (qw_ + 2 * kvw_ + d_); }
};

}  // namespace kvrm

#endif  // KVRM_RUNTIME_CPU_RANK_H_
