// The engine's device interface: one decode step over all slots, or one prefill chunk.
//
// A backend (CPU now, CUDA next) owns the activations and the KV pool memory; the engine owns
// placement (the KvAllocator) and hands the backend plain data: the step descriptor.
#ifndef KVRM_RUNTIME_BACKEND_H_
#define KVRM_RUNTIME_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "kernels/cpu/attention.h"
#include "runtime/far_history.h"
#include "runtime/kv_allocator.h"  // BlocksBehindWindow
#include "runtime/kv_pool.h"
#include "runtime/transfer_plan.h"

namespace kvrm {

// How the backend samples one decode row itself (Backend::samples_on_device; vLLM's and
// TensorRT-LLM's sampling on the GPU): temperature, then top-k, top-p and min-p as thresholds on
// the probability relative to the row's max, then the inverse CDF at `uniform` over the kept ids
// in id order (the procedure of runtime/device_sampling.h). The engine sends a row here only when
// nothing else applies to it: no penalties, no logit bias, no logprobs, no min_tokens mask; the
// rest are sampled on the host from their logits, as before.
struct DeviceSampling {
  uint8_t on_device = 0;  // 0: the row's logits come back and the host samples it
  float temperature = 0;  // 0: greedy (argmax, lowest id on ties)
  int32_t top_k = 0;      // 0: off
  float top_p = 1;        // 1: off
  float min_p = 0;        // 0: off
  float uniform = 0;      // in [0, 1): drawn from the request's own seeded generator
};

// Everything one decode step reads, with a fixed shape [max_slots][max_runs]: rows of inactive
// slots are present but ignored, so the step's shape never changes.
struct StepDescriptor {
  int32_t max_slots = 0;
  int32_t max_runs = 0;
  std::vector<uint8_t> active;    // [max_slots]
  std::vector<int32_t> position;  // [max_slots] position of the input token (= history length)
  std::vector<int32_t> token;     // [max_slots] input token
  std::vector<int32_t> num_runs;  // [max_slots]
  std::vector<KvRun> runs;        // [max_slots][max_runs]
  // Far-history summaries (runtime/far_history.h, docs/runtime.md): all zero when off, and then
  // nothing above changes meaning. On, a row's run table lists its kept blocks only: logical
  // blocks [0, far.sink_blocks), then those from far.sink_blocks + far_dropped on (the blocks in
  // between were summarized and freed). The row attends to its sinks and to logical blocks from
  // far.sink_blocks + far_summaries on exactly, and to summary entries [0, far_summaries) of its
  // slot (entry j: the mean K and V of logical block far.sink_blocks + j, score + log(block
  // tokens)). The step writes entries [far_dropped, far_summaries), from blocks still in the run
  // table, before the layer's attention; the engine frees those blocks after the step.
  // Window release (EngineOptions::window_release; far history off, far_summaries 0): the
  // first far_dropped logical blocks are missing from the run table, all of them wholly behind
  // the window of the slot's first row (at most BlocksBehindWindow of its position); the table
  // starts at logical block far_dropped. Only for a model whose every layer slides.
  FarHistoryShape far;
  std::vector<int32_t> far_dropped;    // [max_slots]
  std::vector<int32_t> far_summaries;  // [max_slots] = far.SummariesAt(position), >= far_dropped
  // [max_slots] Which active rows the backend samples (Backend::DecodeAndSample); all off for
  // Decode, and for backends that do not sample.
  std::vector<DeviceSampling> sampling;
  // Speculative decoding (Backend::max_draft_tokens; 0: off, and nothing below is read): an
  // active slot s also runs its num_draft[s] draft tokens draft[s][0, num_draft[s]) at positions
  // position[s] + 1, + 2, ... after its input token, in the same pass, each attending to the
  // rows before it as a prefill chunk's rows do. Slot s's logits then fill rows
  // s * (max_draft + 1) + j, j in [0, num_draft[s]], of the logits: the logits after its input
  // token, then after each draft. Far history is not combined with drafts.
  int32_t max_draft = 0;
  std::vector<int32_t> num_draft;  // [max_slots]
  std::vector<int32_t> draft;      // [max_slots][max_draft]
  // [max_slots] The LoRA adapter each active slot runs with (Backend::num_lora_adapters;
  // -1: the base model). Its rows, drafts included, add the adapter's deltas to the projections
  // it adapts.
  std::vector<int32_t> adapter;

  void Resize(int32_t slots, int32_t runs_per_slot, int32_t drafts_per_slot = 0) {
    max_slots = slots;
    max_runs = runs_per_slot;
    max_draft = drafts_per_slot;
    num_draft.assign(slots, 0);
    draft.assign(static_cast<size_t>(slots) * drafts_per_slot, 0);
    active.assign(slots, 0);
    position.assign(slots, 0);
    token.assign(slots, 0);
    num_runs.assign(slots, 0);
    runs.assign(static_cast<size_t>(slots) * runs_per_slot, KvRun{});
    far_dropped.assign(slots, 0);
    far_summaries.assign(slots, 0);
    sampling.assign(slots, DeviceSampling{});
    adapter.assign(slots, -1);
  }
  absl::Span<KvRun> SlotRuns(int32_t slot) {
    return absl::MakeSpan(runs).subspan(static_cast<size_t>(slot) * max_runs, max_runs);
  }
  const KvRun* SlotRunsData(int32_t slot) const { return runs.data() + slot * max_runs; }
  // Rows of logits per slot: 1, or 1 + max_draft with speculative decoding.
  int32_t logit_rows_per_slot() const { return 1 + max_draft; }
  // Draft rows of the active slots.
  int32_t draft_rows() const {
    int32_t n = 0;
    for (int32_t s = 0; max_draft > 0 && s < max_slots; ++s) n += active[s] ? num_draft[s] : 0;
    return n;
  }
};

// Most tokens of a chunk whose every row's logits come back (PrefillChunk::all_logits).
inline constexpr int32_t kMaxAllLogitsRows = 32;

// One chunk of one slot's prompt: tokens at positions [start, start + tokens.size()).
struct PrefillChunk {
  int32_t slot = 0;
  int32_t start = 0;
  absl::Span<const int32_t> tokens;
  const KvRun* runs = nullptr;
  int32_t num_runs = 0;
  // Far history (see StepDescriptor; zero when off): row i attends like a decode row at
  // start + i, far.SummariesAt(start + i) entries; the chunk writes entries [far_dropped,
  // far.SummariesAt(start + tokens.size() - 1)) before each layer's attention. Window
  // release: as in StepDescriptor, at most BlocksBehindWindow(start).
  FarHistoryShape far;
  int32_t far_dropped = 0;
  // Prompt logprobs (Backend::computes_all_logits): the logits after every token of the chunk
  // (at most kMaxAllLogitsRows), [tokens][vocab] in `last_logits`, instead of the last one's.
  bool all_logits = false;
  // The LoRA adapter the chunk's rows run with (see StepDescriptor::adapter); -1: none.
  int32_t adapter = -1;
  // Embeddings (Backend::returns_hidden): when non-null, the final norm's output (what lm_head
  // multiplies) of each of the chunk's rows [hidden_begin, hidden_end) is added to
  // hidden[0, hidden_size). Null: nothing is written.
  float* hidden = nullptr;
  int32_t hidden_begin = 0;
  int32_t hidden_end = 0;
};

struct LoraAdapter;  // model/lora.h

// A LoRA adapter as a backend holds it (Backend::PrepareLoraAdapter); opaque to the engine.
class PreparedLoraAdapter {
 public:
  virtual ~PreparedLoraAdapter() = default;
};

class Backend {
 public:
  virtual ~Backend() = default;
  // Runs one step; writes logits of each active slot s to logits[s * vocab, (s + 1) * vocab)
  // (with drafts, rows s * (max_draft + 1) + j: see StepDescriptor).
  virtual absl::Status Decode(const StepDescriptor& step, float* logits) = 0;
  // Writes the chunk's K/V; when `last_logits` is non-null also the logits after its last token.
  virtual absl::Status Prefill(const PrefillChunk& chunk, float* last_logits) = 0;
  // Whether DecodeWithChunk is implemented: the chunk's rows ride along with the decode rows in
  // one pass (as vLLM's mixed batches and Sarathi's piggybacked chunks do), so the weights are
  // read once for both. Engines without it run Prefill, then Decode.
  virtual bool fuses_prefill() const { return false; }
  // The formats the linear weights are multiplied in when not the model's dtype (ModelInfo's
  // weight_quantization: "q4_K", "q8_0", "q8_affine", "q8_halves", joined by "+"), on a CPU
  // backend with block panels; "" otherwise.
  virtual std::string weight_quantization() const { return ""; }
  // Prefill(chunk, last_logits) and Decode(step, logits) as one pass, with the same results
  // (`chunk.slot` must not be active in `step`).
  virtual absl::Status DecodeWithChunk(const PrefillChunk& chunk, float* last_logits,
                                       const StepDescriptor& step, float* logits);
  // Most prefill chunks one pass takes (PrefillChunks); 1: one at a time (Prefill,
  // DecodeWithChunk), and the engine gives each step one chunk.
  virtual int32_t max_chunks_per_pass() const { return 1; }
  // Several prompts' chunks in one pass (vLLM's steps that prefill several requests): `chunks`
  // of distinct slots, max_chunk_tokens() tokens at most together, at most max_chunks_per_pass()
  // of them; with `step` non-null its decode rows ride along (as in DecodeWithChunk: no chunk's
  // slot active in it) and their logits go to `logits`. chunk_logits[i] (one per chunk): where
  // chunk i's logits go (its last row's, or every row's with all_logits), or null for none. The
  // results are those of each chunk's Prefill, then Decode. Default: UNIMPLEMENTED.
  virtual absl::Status PrefillChunks(absl::Span<const PrefillChunk> chunks,
                                     absl::Span<float* const> chunk_logits,
                                     const StepDescriptor* step, float* logits);
  // Whether Prefill and DecodeWithChunk honour PrefillChunk::all_logits (prompt logprobs).
  virtual bool computes_all_logits() const { return false; }
  // Whether Prefill and DecodeWithChunk honour PrefillChunk::hidden (embeddings).
  virtual bool returns_hidden() const { return false; }
  // Whether this chunk can ride in the decode pass (a backend with fixed shapes may take only
  // chunks whose run table fits its graph); the engine runs the others apart.
  virtual bool CanFuse(const PrefillChunk& chunk) const { return fuses_prefill(); }
  // Whether DecodeAndSample (and, with fuses_prefill, DecodeWithChunkAndSample) is implemented:
  // the step samples the rows marked in step.sampling itself, and only their tokens come back
  // (no logits copy, no host pass over the vocabulary for those rows).
  virtual bool samples_on_device() const { return false; }
  // Decode(step, logits), except that each active row with step.sampling[s].on_device gets its
  // token in tokens[s] and its logits row is left unwritten. Default: UNIMPLEMENTED.
  virtual absl::Status DecodeAndSample(const StepDescriptor& step, float* logits,
                                       int32_t* tokens);
  // DecodeWithChunk with the decode rows sampled as DecodeAndSample does. Default: UNIMPLEMENTED.
  virtual absl::Status DecodeWithChunkAndSample(const PrefillChunk& chunk, float* last_logits,
                                                const StepDescriptor& step, float* logits,
                                                int32_t* tokens);
  // Most draft tokens per slot a step descriptor may carry (StepDescriptor::max_draft); 0: the
  // backend does not verify drafts (speculative decoding off).
  virtual int32_t max_draft_tokens() const { return 0; }
  // LoRA adapter slots (StepDescriptor::adapter and PrefillChunk::adapter index them); 0: the
  // backend serves none, and a step or chunk naming one is refused, as is one naming an empty
  // slot.
  virtual int32_t max_lora_adapters() const { return 0; }
  // The largest rank an adapter in a slot may have (its scratch is sized for it).
  virtual int32_t max_lora_rank() const { return 0; }
  // `adapter` (loaded for the served model's config) in the backend's own layout, ready for
  // SetLoraAdapter: the slow part of a load (copies, a device upload), on any thread, while
  // steps run. INVALID_ARGUMENT naming the adapter when it does not fit (rank above
  // max_lora_rank, shapes); FAILED_PRECONDITION where the backend serves no adapters.
  virtual absl::StatusOr<std::shared_ptr<const PreparedLoraAdapter>> PrepareLoraAdapter(
      const LoraAdapter& adapter) const;
  // Puts a prepared adapter in slot `index` (null: empties it; the backend lets go of the old
  // one). The owner thread, between steps.
  virtual absl::Status SetLoraAdapter(int32_t index,
                                      std::shared_ptr<const PreparedLoraAdapter> adapter);
  // The checks both backends' PrepareLoraAdapter and SetLoraAdapter make: FAILED_PRECONDITION
  // with no slots; INVALID_ARGUMENT naming the adapter when a projection's rank is above
  // `max_rank`, or for a slot index outside [0, slots).
  static absl::Status CheckLoraAdapterFits(const LoraAdapter& adapter, int32_t slots,
                                           int32_t max_rank);
  static absl::Status CheckLoraSlot(int32_t index, int32_t slots);
  // Rows a pass takes while reading each weight once (more rows read some matrices again: a
  // step in the pass's cost, which speculative decoding's extra rows must not cross); 0:
  // unknown.
  virtual int32_t one_read_rows() const { return 0; }
  virtual int32_t vocab_size() const = 0;
  // Largest number of tokens Prefill takes at once.
  virtual int32_t max_chunk_tokens() const = 0;
  // The KV pools the backend owns: one per tensor-parallel rank, each holding that rank's share
  // of KV heads for the same block ids. The transport copies blocks in every pool alike.
  virtual int32_t num_kv_pools() const = 0;
  virtual KvPool* kv_pool(int32_t rank) = 0;
  // Whether Decode and Prefill implement the far-history fields (the engine refuses
  // --far_history otherwise rather than compute something else).
  virtual bool supports_far_history() const { return false; }

  // How long the engine thread and the step runner busy-wait for each other before they sleep
  // (StepRunner): a step's two thread handoffs each cost a futex wake-up (tens of microseconds),
  // which matters where a step takes about a millisecond (a GPU graph replay), not where it
  // takes tens and needs every core (the CPU backend: 0).
  virtual absl::Duration handoff_spin() const { return absl::ZeroDuration(); }

  // The host tier (paused requests' KV, kvrm mode): `blocks` blocks per rank, same shape as the
  // device pools. Called once at start-up, before any CopyGroup. The default allocates pageable
  // host pools; a GPU backend allocates pinned memory its copy stream can reach.
  virtual absl::Status CreateHostTier(int64_t blocks);
  // Executes one transfer group on every rank: for each (layer, K|V, KV head) one contiguous
  // token range (see kv_pool.h). Called on the transport thread while a step may be running; the
  // transport never passes a group that touches a block that step reads or writes. Returns when
  // the copy is complete. The default copies between kv_pool(r) and the host tier with memcpy.
  virtual absl::Status CopyGroup(const TransferGroup& group);

 protected:
  std::vector<std::unique_ptr<KvPool>> host_tier_;  // [ranks], after CreateHostTier
};

}  // namespace kvrm

#endif  // KVRM_RUNTIME_BACKEND_H_
