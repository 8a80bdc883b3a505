// The serving engine: fixed decode slots, admission, chunked prefill, decode steps, sampling,
// stop conditions, and streaming output to each request's sink.
//
// Threading: one owner thread (started by Start()) owns the slots, the queue, the KV allocator
// and the backend. Other threads (gRPC reactors) only post into it through Submit and Cancel,
// which take `mu_` briefly; nothing else is shared. Stats() reads a snapshot the owner publishes.
#ifndef KVRM_RUNTIME_ENGINE_H_
#define KVRM_RUNTIME_ENGINE_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "common/memory_limit.h"
#include "runtime/backend.h"
#include "runtime/clock.h"
#include "runtime/engine_observer.h"
#include "runtime/far_history.h"
#include "runtime/kv_allocator.h"
#include "runtime/kv_pager.h"
#include "runtime/kv_pool.h"
#include "runtime/model_bundle.h"
#include "runtime/ngram_proposer.h"
#include "runtime/request.h"
#include "runtime/sampler.h"
#include "runtime/step_runner.h"
#include "runtime/text_stream.h"
#include "runtime/transport.h"

namespace kvrm {

enum class KvMode { kStatic, kKvrm };

// What admission sets aside for a request (kvrm mode). kPrompt: only its prompt (the rest grows
// on demand; under pressure others are paused). kPromptAndOutput: prompt + max_new_tokens, so an
// admitted request never needs anyone paused (fewer requests fit at once).
enum class ReservePolicy { kPrompt, kPromptAndOutput };

struct EngineOptions {
  int32_t slots = 8;
  int32_t max_context = 0;        // 0: the model's max_position_embeddings
  // Prompt tokens one engine step prefills: the most a chunk of one prompt takes, and all the
  // step's chunks together (max_prefills_per_step).
  int32_t prefill_chunk = 256;
  int32_t max_queue = 256;        // waiting requests beyond this get RESOURCE_EXHAUSTED
  int32_t max_new_tokens = 4096;  // upper bound a request may ask for
  int32_t block_tokens = 16;
  int32_t max_runs = 8;           // R: the descriptor's run-table width per slot
  // KV budget in blocks. 0: slots * ceil(max_context / block_tokens), what static mode needs.
  int64_t kv_blocks = 0;
  int64_t kv_host_blocks = -1;    // host tier (paused requests); -1: same as kv_blocks
  // KV element type: f32, or bf16 (half the bytes per token: twice the tokens in the same
  // memory, half the attention reads; CPU device). Both tiers use it.
  DType kv_dtype = DType::kF32;
  // kQ8_0 / kQ4K: the CPU backend quantizes every linear weight to q8_0 / q4_K at load (kvrmd
  // --quantization; CpuBackendOptions::quantization). The CUDA backend refuses both.
  WeightFormat quantization = WeightFormat::kDense;
  int32_t threads = 0;  // 0: hardware concurrency (all ranks together)
  int32_t tensor_parallel = 1;  // ranks (--tp); CPU: rank threads with an in-process all-reduce
  KvMode kv_mode = KvMode::kKvrm;
  ReservePolicy reserve = ReservePolicy::kPrompt;
  // Tokens one step may process: decode rows + the prefill chunk. 0: slots + prefill_chunk.
  // A long prompt therefore delays the others' next token by at most one chunk.
  int32_t step_token_budget = 0;
  // The most a prefill chunk may lengthen a step that also decodes, as a fraction of the
  // decode-only step time (both measured as the engine runs: moving averages of the decode time
  // and of the prefill time per token). 0.5: a decoding request's inter-token latency rises by
  // at most half while prompts are being prefilled. 0: off (the chunk takes the token budget).
  // A chunk is never cut below one token, so every prompt progresses.
  double max_prefill_stall = 0;
  // Prompts whose chunks one step may prefill together, first come first served, while the
  // step's prefill tokens (PrefillTokenBudget) last and the backend takes them in one pass
  // (Backend::max_chunks_per_pass: the CPU backend). vLLM's steps fill their token budget with
  // several prompts likewise: a burst of short prompts gets its first tokens in one step instead
  // of one step each. 0: as many as fit; 1: one prompt a step. Results are the same either way.
  int32_t max_prefills_per_step = 0;
  // Run a step's prefill chunk in the same pass as its decode rows where the backend can
  // (Backend::fuses_prefill: the CPU backend): the weights are read once for both, so the chunk
  // costs the decode rows only its own arithmetic. Off, or on a backend without it: the chunk
  // runs first, then the decode step. Results are the same either way.
  bool fuse_prefill = true;
  // Sample decode rows inside the step where the backend can (Backend::samples_on_device: the
  // CUDA backend): only their tokens come back, not [slots][vocab] logits, and the
  // engine thread makes no pass over the vocabulary for them. Rows with penalties, logit bias,
  // logprobs or a pending min_tokens mask are always sampled on the host. Greedy results are the
  // same either way; seeded sampling is reproducible on each path, not across the two (the
  // device keeps top-k/top-p ties at the threshold and draws in id order).
  bool device_sampling = true;
  // Prefix caching (kvrm mode; off with far history, whose prompts do not keep their blocks):
  // a prompt that starts with the tokens of an earlier history (a shared system prompt, the
  // previous turns of a conversation) reuses that history's KV blocks instead of prefilling
  // them again, as vLLM's automatic prefix caching does (KvPager, "Prefix cache"). Finished
  // histories stay in the pool until their blocks are wanted. Results are the same either way.
  bool prefix_caching = true;
  // Offload of the prefix cache to the host tier (with prefix_caching and a host tier): a cached
  // block evicted from the device is copied to the host tier first (when a lookup could still
  // reach it), and a later prompt that matches it there copies it back instead of prefilling it
  // again, as vLLM's KV offloading and TensorRT-LLM's secondary offloading do.
  // The host tier is shared with paused requests, which take its space first. Results are the
  // same either way.
  bool prefix_cache_offload = true;
  // Matching to the token (with prefix_caching): after a prompt's whole cached blocks, a cached
  // block whose first tokens are the prompt's next ones (an ended history's partly filled last
  // block, or a whole block of a history that went on differently) is copied for those tokens,
  // as TensorRT-LLM's partial reuse with copy_on_partial_reuse (KvPager::MatchPrefix's `tail`).
  // Off: whole blocks only, as vLLM. Results are the same either way.
  bool prefix_cache_partial_blocks = true;
  // Shed offloads (drop evicted blocks instead, as without offload) while the steps spend more
  // than this share of their time waiting on the transport (a moving average; back on below
  // 40 % of it): on a host link too slow for the offloads, the cache gives way to the copies
  // the steps need. 0: never (the default until a GPU has measured it; docs/benchmarks.md,
  // "2026-12-04 — the pager's placement under the claims' pressure").
  double offload_shed_wait_share = 0;
  // A paused request whose history is at most this many tokens is dropped and recomputed on
  // resume (one prefill chunk is cheaper than two copies); longer ones are swapped. 0: chunk.
  int32_t recompute_max_tokens = 0;
  // Speculative decoding by prompt lookup (--speculative_tokens; runtime/ngram_proposer.h, vLLM's
  // `ngram` method): each decoding slot may carry up to this many draft tokens, taken from an
  // earlier occurrence of its history's last tokens, which the decode pass verifies as extra rows
  // of the same pass (the weights are read once for them all); each step then gives a slot
  // 1 + the drafts accepted tokens. Every token is still sampled from the model's own logits
  // after the tokens before it, so outputs are exactly those without speculation, greedy or
  // seeded. How many a slot drafts is chosen per step: only while the slot's measured acceptance
  // makes the extra rows pay for their share of the pass (so drafting fades out as the pass grows
  // compute-bound). 0: off. Needs a backend that verifies drafts (the CPU backend); not with far
  // history.
  int32_t speculative_tokens = 0;
  NgramDraftOptions speculative_ngram;
  // Far-history summaries (--far_history; kvrm mode only): off (the default) every step attends
  // over the full history; on, over sinks + a recent window + one summary per distant block,
  // which is approximate and bounds a decoding slot's KV blocks (runtime/far_history.h).
  FarHistoryOptions far_history;
  // A model whose every layer attends within a sliding window shorter than max_context
  // (Mistral 7B v0.1, Phi-3-mini, Qwen2 with every layer sliding): its K/V wholly behind the
  // window of a slot's next row is never read again, so those blocks go back to the pool as the
  // history moves on (--kv_window_release; kvrm mode, on a backend that computes windows), as
  // vLLM's sliding-window manager frees them. A slot then holds at most WindowPeakBlocks blocks
  // whatever its length, and the default --kv_blocks is that many a slot. Exact: the same tokens
  // as keeping them. Resolve() leaves it true only where it applies.
  bool window_release = true;
  Clock* clock = nullptr;  // null: the wall clock
  // Fault injection (tests only): called before each transfer group is copied; a non-OK status
  // fails that copy as a real copy error would. It may also sleep (a slow transport).
  std::function<absl::Status(const TransferGroup&)> transfer_fault;
  EngineObserver* observer = nullptr;  // not owned; outlives the engine
  // Whether the backend computes sliding-window layers (the CPU and CUDA backends do; a backend
  // that does not sets false). Without, max_context is kept within the model's window, where
  // windowed attention is full causal attention, and no block is released behind it.
  bool sliding_window_attention = true;
  // Builds the backend from the resolved options (kvrmd's --device=cuda); null: the CPU backend.
  std::function<absl::StatusOr<std::unique_ptr<Backend>>(const ModelBundle& model,
                                                         const EngineOptions& resolved)>
      backend_factory;
  // The memory the KV cache must fit (tests); unset: ReadMemoryLimit() (the container's).
  std::optional<std::optional<MemoryLimit>> memory_limit;
  // LoRA adapter slots (kvrmd --max_loras): the model's adapters (ModelBundle::lora_adapters)
  // take the first, Engine::LoadLoraAdapter the others while serving. 0: as many as the model's.
  // More than 0 needs a backend that serves adapters (the CPU backend).
  int32_t max_loras = 0;
  // The largest rank an adapter may have (kvrmd --max_lora_rank; sizes the backend's scratch).
  // 0: the largest of the model's adapters', and at least 16 when slots are left for loads.
  int32_t max_lora_rank = 0;
  // What the backend keeps adapters' factors in (kvrmd --lora_dtype): f32 or bf16. Unset: the
  // model's dtype (bf16 unless its weights are f32), as vLLM's --lora-dtype auto.
  std::optional<DType> lora_dtype;
};

// A LoRA adapter the engine serves (Engine::LoraAdapters).
struct ServedLoraAdapter {
  LoraAdapter adapter;  // what was loaded, without its layers (name, path, rank, ...)
  int32_t slot = 0;     // GenerationRequest::lora_adapter, StepDescriptor::adapter
  // This load's number (1, 2, ... in load order; never reused): the prefix-cache key is made of
  // it (LoraCacheKey), so an adapter loaded again under the same name shares no stale KV.
  uint64_t serial = 0;
  int64_t requests = 0;  // submitted with it and not finished
  // Loaded on demand (LoadLoraAdapter's `evictable`): a later load that finds no free slot may
  // take its slot while no request runs with it, the least recently used first.
  bool evictable = false;
};

// EngineOptions::lora_dtype unset: the model's dtype (f32 for an f32 model, else bf16).
DType DefaultLoraDtype(const ModelBundle& model);
// kvrmd's --lora_dtype spelling: "auto" (nullopt: DefaultLoraDtype), "bfloat16" or "float32";
// INVALID_ARGUMENT naming the flag and the choices otherwise.
absl::StatusOr<std::optional<DType>> ParseLoraDtype(std::string_view name);

// INVALID_ARGUMENT naming the flag (kvrmd's spelling, `--flag=value`) when the draft length is
// outside [0, 32] or the n-gram range is not 1 <= min <= max <= 64 (EngineOptions::
// speculative_tokens and speculative_ngram; checked whether speculation is on or not).
absl::Status CheckSpeculativeOptions(int32_t tokens, const NgramDraftOptions& ngram);

// Window release (EngineOptions::window_release): the most device blocks one slot holds, from
// the block behind the window of its first row to the block of its last: a decode step's input
// and drafts (at least the next position, which the step's pre-staging grows), or a prefill
// chunk.
int64_t WindowPeakBlocks(int32_t window, int32_t block_tokens, int32_t prefill_chunk,
                         int32_t speculative_tokens);

// The CPU backend Engine::Create builds for `resolved` options (when there is no
// backend_factory); for a factory that wraps it.
absl::StatusOr<std::unique_ptr<Backend>> MakeCpuBackend(const ModelBundle& model,
                                                        const EngineOptions& resolved);

// Whether the KV cache of `resolved` options fits `limit` (ReadMemoryLimit(): the container's
// memory): the device pool when it lives in host memory (`pool_in_host_memory`, the CPU
// backend, which faults it in at start-up), and the host tier, which a CPU backend touches as
// it fills and a GPU backend pins at start-up. RESOURCE_EXHAUSTED naming the flags when what is
// allocated at start-up exceeds the limit (instead of an out-of-memory kill part way through).
absl::Status CheckKvFitsMemory(const LlamaConfig& config, const EngineOptions& resolved,
                               bool pool_in_host_memory, const std::optional<MemoryLimit>& limit);

struct EngineStats {
  int32_t slots_total = 0;
  int32_t slots_in_use = 0;
  int32_t queue_depth = 0;
  uint64_t requests_total = 0;
  uint64_t tokens_generated_total = 0;
  uint64_t steps_total = 0;
  uint64_t mixed_steps_total = 0;  // of those, a prefill chunk and decode rows in one pass
  // Steps that prefilled, and the prompt chunks they prefilled (several a step where the
  // backend takes them in one pass: EngineOptions::max_prefills_per_step).
  uint64_t prefill_steps_total = 0;
  uint64_t prefill_chunks_total = 0;
  uint64_t device_sampled_tokens_total = 0;  // tokens the backend sampled (device_sampling)
  KvStats kv;
  // KV-RM pager figures (cumulative; stay 0 under --kv_mode=static). Read by metrics/.
  uint64_t transfer_groups_total = 0;       // merged host<->device copy groups issued
  uint64_t transfer_bytes_total = 0;        // bytes those groups moved
  double transport_wait_seconds_total = 0;  // time the step replay waited on transport
  // Time KV growth waited for copies in flight to give back the blocks they held (under KV
  // pressure, instead of pausing a request): not a pre-staged copy the replay needed.
  double transport_drain_wait_seconds_total = 0;
  uint64_t descriptor_commits_total = 0;    // step descriptors committed: one a step that runs
  uint64_t preemptions_total = 0;           // requests swapped out or recomputed
  uint64_t transfer_blocks_total = 0;
  int32_t slots_prefilling = 0;
  int32_t slots_decoding = 0;
  int32_t slots_paused = 0;
  uint64_t far_blocks_summarized_total = 0;  // far history: distant blocks summarized and freed
  uint64_t window_blocks_released_total = 0;  // window release: blocks behind the window freed
  // Prefix caching: prompt tokens looked up at admission (and histories at a recompute), and
  // those found in the cache (their prefill skipped).
  uint64_t prefix_cache_queries_total = 0;
  uint64_t prefix_cache_hits_total = 0;
  uint64_t prefix_cache_evictions_total = 0;  // cached blocks whose space was taken
  // Offload: prompt tokens brought back from the host tier (counted in hits too), blocks copied
  // there, and blocks evicted from there.
  uint64_t prefix_cache_host_hits_total = 0;
  // Prompt tokens that came from a cached block copied for part of its tokens (counted in hits
  // too; prefix_cache_partial_blocks).
  uint64_t prefix_cache_copied_tokens_total = 0;
  uint64_t prefix_cache_offloaded_blocks_total = 0;
  // Evicted blocks not offloaded because the offloads already sent were a backlog on the
  // transport (a slow host link): the cache gives way to the copies steps wait on.
  uint64_t prefix_cache_offload_shed_blocks_total = 0;
  uint64_t prefix_cache_host_evictions_total = 0;
  // Speculative decoding (vLLM's spec_decode counters): drafts proposed (one per slot and step
  // that carried any), their tokens, and those the model's own tokens matched.
  uint64_t spec_decode_drafts_total = 0;
  uint64_t spec_decode_draft_tokens_total = 0;
  uint64_t spec_decode_accepted_tokens_total = 0;
  // Thinking blocks whose end a thinking budget forced (GenerationRequest::thinking_budget).
  uint64_t thinking_budget_ends_total = 0;
  // Prefix-cache resets done (ResetPrefixCache).
  uint64_t prefix_cache_resets_total = 0;
};

// A slot's life (requests wait in the queue, "queued", before they have a slot):
//   kFree -> kPrefilling -> kDecoding -> kFinishing -> kFree
//   kDecoding or kPrefilling -> kPaused (KV in the host tier, or dropped)
//   kPaused -> kDecoding (swap-in) or kPrefilling (recompute)
//   any state but kFree -> kFinishing (cancel, deadline, error)
// Engine::SetState is the only place a state changes, and it checks the transition.
enum class SlotState { kFree, kPrefilling, kDecoding, kPaused, kFinishing };

const char* KvModeName(KvMode mode);
const char* SlotStateName(SlotState state);

struct CachedPrefix {
  int64_t blocks = 0;       // device blocks
  int32_t runs = 0;         // ... in how many runs (and one per stretch of host blocks between)
  int64_t idle = 0;         // ... of them idle
};

// What Engine::AttachCachedPrefix attached: the tokens the slot holds, and of them those copied
// back from the host tier and those of a block copied in part.
struct AttachedPrefix {
  int32_t tokens = 0;
  int64_t from_host = 0;
  int32_t copied = 0;
};

class Engine {
 public:
  // `model` must outlive the engine. Its LoRA adapters' values (lora_adapters[i].layers) are
  // read only here: the caller may let go of them after.
  static absl::StatusOr<std::unique_ptr<Engine>> Create(const ModelBundle* model,
                                                        const EngineOptions& options);
  ~Engine();  // Stops the owner thread; pending requests end CANCELLED.
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  void Start();

  // Queues a request and returns its handle (for Cancel). RESOURCE_EXHAUSTED when the queue is
  // full, UNAVAILABLE when draining, INVALID_ARGUMENT when the prompt cannot fit the context.
  // On success the request's sink will see exactly one OnFinished.
  // `admitted_call`: the request belongs to a call already admitted (the other completions of
  // a Generate with n > 1): it is not refused for a full queue or while draining, so an
  // accepted call is served whole (the queue may then exceed max_queue by those requests).
  absl::StatusOr<uint64_t> Submit(std::unique_ptr<GenerationRequest> request,
                                  bool admitted_call = false);
  // Ends the request at the next step boundary with CANCELLED (no-op if already finished).
  void Cancel(uint64_t handle);

  // Refuses new requests from now on (UNAVAILABLE).
  void BeginDrain();
  // Waits until no request is queued or running; false on timeout.
  bool WaitIdle(absl::Duration timeout);
  // Ends every queued and running request with CANCELLED.
  void CancelAll();

  EngineStats Stats() const;

  // LoRA adapters. Thread-safe. A request names one (GenerationRequest::lora_name); Submit
  // resolves the name, and the adapter stays in its slot until the request ends.
  //
  // The adapters served now, by slot.
  std::vector<ServedLoraAdapter> LoraAdapters() const;
  // Serves `adapter` (loaded for the model's config) under its name from now on, in a free slot:
  // the backend prepares it on the calling thread while steps run, and the engine thread puts
  // it in the slot between two steps; returns once it is there (or, before Start(), puts it
  // there itself). With every slot taken, the least recently used evictable adapter (see
  // ServedLoraAdapter::evictable) that no request runs with is unloaded for it. ALREADY_EXISTS
  // for a name already served; RESOURCE_EXHAUSTED when every slot holds one that cannot be
  // evicted (EngineOptions::max_loras); INVALID_ARGUMENT naming the adapter when it does not fit
  // (rank above max_lora_rank, shapes); FAILED_PRECONDITION when the engine has no slots;
  // UNAVAILABLE when it is stopping.
  absl::StatusOr<ServedLoraAdapter> LoadLoraAdapter(LoraAdapter adapter, bool evictable = false);
  // Whether an adapter of this name is served now (a request naming it would be taken).
  bool ServesLoraAdapter(std::string_view name) const;
  // Holds the adapter `request` names (lora_name, else the lora_adapter slot) in its slot as a
  // running request does, until UnpinLoraAdapter: no load evicts it, and an unload empties its
  // slot only after. Rewrites `request` to name that slot alone, so that requests copied from
  // it reach this load of the adapter and no later one of the same name (a beam search's
  // steps, each its own requests), and run with it after an unload too, as requests submitted
  // before it do (GenerationRequest::lora_pinned_serial). Returns the slot, or -1 (nothing held)
  // when the request names no adapter; INVALID_ARGUMENT as Submit when it is not served.
  absl::StatusOr<int32_t> PinLoraAdapter(GenerationRequest* request);
  void UnpinLoraAdapter(int32_t slot);
  // Stops serving `name`: a request naming it is refused from now on; those already submitted
  // with it finish with it, after which its slot is emptied (the engine thread lets go of its
  // weights) and may take another. Returns how many requests are still running with it.
  // NOT_FOUND when no adapter of that name is served.
  absl::StatusOr<int64_t> UnloadLoraAdapter(std::string_view name);
  // Forgets every cached prefix (vLLM's reset_prefix_cache; KvPager::ResetPrefixCache), on the
  // engine thread between two steps; returns the blocks it freed in each tier once done (or,
  // before Start(), does it itself). Requests running keep their KV; the blocks they wrote
  // before it are not cached again. FAILED_PRECONDITION without a prefix cache (the static KV mode,
  // or prefix_caching off); UNAVAILABLE when the engine stops first; DEADLINE_EXCEEDED after
  // `timeout` (the reset is still done, at the engine's next step). Requests that come together
  // may share one reset.
  absl::StatusOr<KvPager::CacheReset> ResetPrefixCache(absl::Duration timeout);
  // EngineOptions::max_loras and max_lora_rank, resolved.
  int32_t max_loras() const { return static_cast<int32_t>(lora_.size()); }
  int32_t max_lora_rank() const { return options_.max_lora_rank; }

  // Tests: runs one engine iteration on the calling thread (instead of Start()), then waits for
  // the transport to finish what it has queued so the next iteration is deterministic.
  bool StepForTest();
  SlotState slot_state(int32_t slot) const { return slots_[slot].state; }

  // Tests: an engine over a given backend (a scripted one) instead of the CPU backend.
  static absl::StatusOr<std::unique_ptr<Engine>> CreateWithBackend(
      const ModelBundle* model, const EngineOptions& options, std::unique_ptr<Backend> backend);
  const EngineOptions& options() const { return options_; }
  // Whether prefill chunks run in the decode pass (options().fuse_prefill and the backend can).
  bool fuses_prefill() const { return fuse_prefill_; }
  // The block formats the backend multiplies linear weights in (Backend::weight_quantization).
  std::string weight_quantization() const { return backend_->weight_quantization(); }
  bool samples_on_device() const { return device_sampling_; }
  // Whether embedding requests are served (GenerationRequest::pooling; Backend::returns_hidden).
  bool returns_hidden() const { return backend_->returns_hidden(); }
  // Requests submitted and not yet admitted (what options().max_queue bounds).
  int32_t QueuedRequests() {
    std::lock_guard<std::mutex> lock(mu_);
    return queued_;
  }
  // The resolved far-history policy, in blocks (all zero: off).
  const FarHistoryShape& far_history() const { return far_; }
  const ModelBundle& model() const { return *model_; }

 private:
  struct Slot {
    SlotState state = SlotState::kFree;
    std::unique_ptr<GenerationRequest> request;
    std::unique_ptr<TextStream> text;
    // Tokens whose KV must be in the history: the prompt, then every generated token but the
    // last (which is the next input). Recompute after a dropped KV prefills from this.
    std::vector<int32_t> history;
    int32_t prefilled = 0;   // history tokens whose KV is written
    int32_t position = 0;    // history length = position of the next input token
    int32_t next_token = 0;  // input of the next decode step
    int32_t generated = 0;
    int32_t cached_tokens = 0;  // prompt tokens admission found in the prefix cache
    int32_t grammar_state = 0;  // the request's structured-output automaton state, if it has one
    // GenerationRequest::thinking_budget: whether the reply is inside a thinking block, the
    // tokens spent in blocks so far, and while the budget's end is being forced, how many of its
    // `forced` tokens are written (-1: not forcing).
    bool thinking = false;
    int32_t thinking_tokens = 0;  // over every block
    int32_t thinking_block = 0;   // in the open block
    int32_t thinking_forced = -1;
    // Speculative decoding: draft tokens verified and accepted, decayed per decode step (the
    // slot's acceptance rate, SlotAcceptance).
    double drafts_verified = 0;
    double drafts_accepted = 0;
    // Of the staged drafts, how many lead with text its structured output forces (jump-forward:
    // kept out of the acceptance rate, which is prompt lookup's).
    int32_t forced_drafts = 0;
    // GenerationRequest::prompt_logprobs: the prompt tokens scored so far (sent with the first
    // token).
    std::vector<TokenLogprobs> prompt_logprobs;
    // Embeddings (GenerationRequest::pooling): the sum of the pooled rows' final hidden states
    // ([hidden_size], allocated once), and the prompt position it holds every pooled row
    // before (a chunk redone after a pause adds none twice).
    std::vector<float> pooled;
    int32_t pooled_rows = 0;
    bool swapped = false;    // paused with its KV in the host tier (else dropped: recompute)
    uint64_t resumed_step = 0;  // the step it was last resumed for
    int64_t reserve_blocks = 0;  // blocks admission set aside (kPromptAndOutput)
    uint64_t admit_seq = 0;      // admission order (ties of the clock broken by it)
    absl::Time admitted;
    absl::Time first_token;
    absl::Time last_token;
  };

  Engine(const ModelBundle* model, const EngineOptions& options);
  static absl::StatusOr<EngineOptions> Resolve(const ModelBundle* model,
                                               const EngineOptions& options);
  absl::Status Init(std::unique_ptr<Backend> backend);
  void SetState(int32_t slot, SlotState to);
  // Blocks set aside for a slot beyond what it holds (ReservePolicy::kPromptAndOutput).
  int64_t UnallocatedReservation(int32_t slot) const;
  int64_t UnallocatedReservations(int32_t except) const;
  void Loop();
  // One iteration of the loop: one step of work; false when there was nothing to do.
  bool Step();
  void TakePosted();
  // Does the prefix-cache resets asked for (the engine thread, between steps; before Start(),
  // ResetPrefixCache does its own).
  void ApplyCacheResets();
  void ExpireDeadlines(absl::Time now);
  void Admit(absl::Time now);
  // kvrm: retires finished transfers and resumes paused slots when room returns.
  // Retires completed transfers; the requests a failed copy concerned end with ERROR first.
  // Whether any did.
  bool RetireTransfers();
  void ResumePaused();
  // Makes room for `slot`'s next input at `position` (growing its KV, preempting others if the
  // pool is exhausted) and plans compaction past max_runs. Called with no step running. Returns
  // false if `slot` itself had to be paused (or failed).
  bool PrepareSlotKv(int32_t slot, int32_t position);
  // The growth part of PrepareSlotKv: room for `tokens` positions, preempting others if needed.
  bool GrowSlotKv(int32_t slot, int64_t tokens);
  // A request resumed within this many steps is not paused again (no pause/resume thrash).
  static constexpr uint64_t kResumeGraceSteps = 8;
  // Priority preemption at admission (Admit): the running request a newcomer of `priority`
  // would pause first (-1: none ranks below it), and in `freeable` what all such requests hold.
  int32_t NewcomerVictim(int32_t priority, int64_t* freeable) const;
  // Whether `a` ranks below `b` for preemption: a lower priority, or the same and admitted later.
  static bool RanksBelow(const Slot& a, const Slot& b);
  // Whether `s` resumed within kResumeGraceSteps (not to be paused again yet).
  bool InResumeGrace(const Slot& s) const;
  // Sends the planned moves, waits for every copy in flight and retires them: the blocks they
  // held come back. Nothing may be running.
  void DrainTransfers();
  // Pauses one request ranking below `requester` (see engine_slots.cc).
  enum class PreemptResult { kPaused, kNone, kWait };
  PreemptResult PreemptOne(int32_t requester);
  // Moves a decoding slot's KV to the host tier (or drops it for recompute): kPaused.
  void PauseSlot(int32_t slot);
  // Submits the moves planned so far as their own batch (see engine_slots.cc).
  void FlushMoves();
  // Builds the staged descriptor for the decoding slots; returns the number active.
  int32_t BuildDescriptor();
  // Clears staged rows whose slot is no longer decoding (paused while later rows were built);
  // returns the number active.
  int32_t RecountActiveRows();
  // Marks the committed descriptor's rows the backend samples: those whose request needs
  // nothing the host sampler alone does, each with a uniform from its own generator (the others
  // are cleared). Returns whether any row is marked.
  bool MarkDeviceSampling();
  bool SampledOnDevice(int32_t slot_index) const;
  // Whether the slot's EOS ids (unless ignore_eos) and stop tokens are masked from sampling now:
  // it has any and fewer than min_tokens generated.
  bool MasksStopTokens(int32_t slot_index) const;
  // The token the thinking budget forces next (GenerationRequest::thinking_budget), or -1.
  int32_t ThinkingForcedToken(int32_t slot_index) const;
  // Follows the slot's thinking blocks over its last token (`token` just emitted; -1: none yet,
  // at admission) and starts forcing the end once the budget is spent.
  void TrackThinking(int32_t slot_index, int32_t token);
  // Whether the slot's request still needs its prompt's logits (prompt logprobs not yet sent):
  // its prompt is prefilled with every row's logits and never from the prefix cache.
  bool ScoresPrompt(int32_t slot) const;
  // The prompt rows [first, end) of `tokens` an embedding pools: the last; every one; the first.
  static std::pair<int32_t, int32_t> PooledRows(Pooling pooling, int32_t tokens) {
    return pooling == Pooling::kLast   ? std::pair{tokens - 1, tokens}
           : pooling == Pooling::kMean ? std::pair{0, tokens}
                                       : std::pair{0, 1};
  }
  // Whether `request` needs every prompt row's output (prompt logprobs; mean or first-token
  // pooling): it is matched against the prefix cache with no runs, so prefilled whole.
  static bool NeedsEveryPromptRow(const GenerationRequest& request) {
    return request.prompt_logprobs >= 0 || request.pooling == Pooling::kMean ||
           request.pooling == Pooling::kCls;
  }
  // Speculative decoding: the acceptance probability above which one more draft row pays for
  // its share of a pass of `rows` decode rows (0 until the pass's cost was measured at
  // different sizes).
  double DraftThreshold(int32_t rows) const;
  // The slot's per-token draft acceptance rate: its own record, pulled toward the engine's.
  double SlotAcceptance(const Slot& s) const;
  // Proposes the drafts of decoding slot `i` into staged descriptor `d` (after PrepareSlotKv
  // made room for its input token), growing its KV for them where that needs no preemption;
  // returns how many.
  // At most `*room` drafts (decremented by those staged).
  int32_t StageDrafts(int32_t i, double threshold, int32_t* room, StepDescriptor* d);
  // Blocks a history of `tokens` needs to be admitted or resumed (its next token included),
  // and the prompt tokens admission grows at once: all of them, but under far history or window
  // release (bounded_slots()) the working set, the rest growing chunk by chunk.
  int64_t HistoryBlocksNeeded(int64_t tokens) const;
  int64_t FirstGrowTokens(int64_t tokens) const;
  // Whether a slot's device blocks are bounded whatever its length (far history, window
  // release): its prompt grows chunk by chunk and its distant blocks leave as it goes.
  bool bounded_slots() const { return far_.enabled() || release_window_ > 0; }
  // Window release: frees `slot`'s blocks wholly behind the window of a row at `position` (its
  // next one).
  void ReleaseBehindWindow(int32_t slot, int64_t position);
  // Prefix caching: the cached blocks that hold the start of `tokens` (at most those before the
  // block of its last token, and in at most `max_runs` runs), left in prefix_match_; how many,
  // in how many runs, and how many of them are idle (attaching them takes them out of the free
  // count). Nothing when prefix caching is off.
  // Only blocks registered under the same `salt` (GenerationRequest::cache_salt) match.
  // With `host` (and offload on), blocks the device tier lacks may come from the host tier.
  CachedPrefix MatchCachedPrefix(absl::Span<const int32_t> tokens, int32_t max_runs,
                                 uint64_t salt, bool host = false);
  // Attaches the prefix the last MatchCachedPrefix left in prefix_match_ to empty `slot`
  // (nothing may change the cache in between) and plans the copies of its host blocks into new
  // device blocks; returns what it attached (counted by CountPrefixLookup once the attach
  // stands).
  AttachedPrefix AttachCachedPrefix(int32_t slot);
  // The fence to plan moves with: the last of the three batches SubmitTransfers sends.
  uint64_t PlanFence() const { return transport_->next_fence() + 2; }
  // Counts a lookup of `tokens` tokens that found `found` (when prefix caching is on).
  void CountPrefixLookup(size_t tokens, const AttachedPrefix& found);
  // Registers the full blocks of the slot's written KV in the prefix cache; `ended` (the
  // history ends here, its blocks released next): its partly filled last block too, as a tail
  // (KvPager::RegisterTail).
  void RegisterCachedPrefix(int32_t slot, bool ended = false);
  // Far history: frees the slot's blocks whose summaries (entries below `summaries`) exist.
  void DropSummarized(int32_t slot, int32_t summaries);
  // Chooses this step's prefill chunks (FCFS over prefilling slots, while the budget lasts and
  // up to chunk_capacity_ of them); false if none.
  // Tokens the step's chunks may take beside `decoding` decode rows: the step token budget, cut
  // to max_prefill_stall of a decode step when that is on.
  int32_t PrefillTokenBudget(int32_t decoding) const;
  bool PickPrefillChunks();
  // Chunk `k` of the step: `n` prompt tokens of slot `pick` from where its prefill stands.
  void SetPrefillChunk(int32_t k, int32_t pick, int32_t n);
  // Drops the step's chunks whose slot no longer prefills (a failed copy ended it); whether any
  // is left.
  bool KeepPrefillingChunks();
  // Turns the planned moves into transfer groups and queues them as three batches (the pager's
  // offloads, the ungated moves, the moves gated on `gate_step`); returns the last one's fence.
  uint64_t SubmitTransfers(uint64_t gate_step);
  // Whether any move is planned and not yet submitted.
  bool MovesPlanned() const;
  // While the step runs: reserve KV for every active slot's next position.
  void PreStageNext(uint64_t running_step);
  // After the step: each of its chunks' slots.
  void FinishPrefillChunks(const StepResult& result);
  void FinishPrefillChunk(int32_t k, const StepResult& result);
  void FinishDecode(const StepResult& result);
  // Samples the slot's next token from its logits (in place), masking its stop tokens first
  // while it has fewer than min_tokens.
  SampleResult SampleNext(int32_t slot_index, absl::Span<float> logits);
  // Applies a sampled token to the slot: output, stop checks, finish.
  void EmitToken(int32_t slot_index, const SampleResult& sample);
  void FinishSlot(int32_t slot_index, FinishReason reason, StreamChunk last,
                  std::string matched_stop = "", std::string error = "");
  void FinishQueued(std::unique_ptr<GenerationRequest> request, FinishReason reason);
  void PublishStats();
  // Owner thread, between steps (top of Step): puts loaded adapters in their slots and empties
  // the slots of unloaded adapters whose last request ended. Takes mu_.
  void ApplyLoraChanges();
  // A request with adapter `slot` ended (mu_ held).
  void ReleaseLoraLocked(int32_t slot);
  // The adapter slot serving what `request` names (lora_name, else the lora_adapter slot), or
  // INVALID_ARGUMENT naming lora_adapter and what is served (mu_ held).
  absl::StatusOr<int32_t> FindServedLoraLocked(const GenerationRequest& request) const;
  // With `lock` (on mu_) held: lets the slots change once, then returns (lock held again) for
  // the caller to look again: before Start() by applying the changes on this thread (the owner
  // then), else by waiting for the owner thread's next ApplyLoraChanges (at most 50 ms).
  void AwaitLoraChanges(std::unique_lock<std::mutex>* lock);
  absl::Status CopyGroup(const TransferGroup& group);
  // Records that moves planned now carry `slot`'s KV (to fail its request if a copy fails).
  void NoteTransfer(int32_t slot);

  const ModelBundle* model_;
  EngineOptions options_;
  FarHistoryShape far_;           // resolved from options_.far_history; all zero: off
  int32_t release_window_ = 0;    // window release: the model's window; 0: off
  int64_t slot_peak_blocks_ = 0;  // bounded_slots(): the most device blocks one slot holds
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<KvAllocator> kv_;
  KvPager* pager_ = nullptr;  // == kv_ in kvrm mode, null in static mode
  int32_t static_slots_ = 0;  // static mode: slots the KV budget can back (a prefix of slots_)
  std::unique_ptr<Transport> transport_;              // kvrm mode
  std::unique_ptr<StepRunner> runner_;
  EngineObserver default_observer_;  // no-op when options_.observer is null
  EngineObserver* observer_;
  Clock* clock_;

  // Owner-thread state.
  std::vector<Slot> slots_;
  std::vector<std::unique_ptr<Sampler>> samplers_;  // [slots]
  std::deque<std::unique_ptr<GenerationRequest>> waiting_;
  // Double-buffered descriptor: `staged_` is built while the committed one runs; Commit flips.
  StepDescriptor descriptors_[2];
  int32_t committed_ = 0;
  // The step's prefill chunks, [0, num_chunks_) of each: the chunk, whether it ends its
  // prompt, and where its logits go (null: none wanted). Sized chunk_capacity_ at start-up.
  std::vector<PrefillChunk> chunks_;
  std::vector<uint8_t> chunk_last_;
  std::vector<float*> chunk_logit_rows_;
  int32_t num_chunks_ = 0;
  int32_t chunk_capacity_ = 1;  // max_prefills_per_step, as far as the backend goes
  // [slots]: a prefilling slot's runs when wider than a row.
  std::vector<std::vector<KvRun>> prefill_runs_;
  std::vector<PrefixBlock> prefix_match_;  // capacity reserved at start-up
  uint64_t prefix_copied_ = 0;             // tokens from blocks copied for part of theirs
  uint64_t prefix_host_hits_ = 0;           // tokens brought back from the host tier
  uint64_t prefix_queries_ = 0;           // tokens looked up in the prefix cache
  uint64_t prefix_hits_ = 0;              // ... and found
  std::vector<BlockMove> moves_;          // planned this step; capacity reserved at start-up
  std::vector<BlockMove> gated_moves_;    // ... that must wait for the running step
  std::vector<TransferGroup> groups_;     // capacity reserved at start-up
  uint64_t required_fence_ = 0;           // transfers the next launched step depends on
  // (planned fence, request handle) of requests whose KV is in planned or in-flight moves;
  // capacity reserved at start-up.
  std::vector<std::pair<uint64_t, uint64_t>> transfer_owners_;
  // The share of recent steps' time spent waiting on the transport (a moving average), for
  // EngineOptions::offload_shed_wait_share.
  double transport_wait_share_ = 0;
  std::vector<float> logits_;             // [slots][vocab]
  // The chunks' logits: [chunk_capacity_][vocab], and kMaxAllLogitsRows - 1 more rows where
  // the backend returns every row of a chunk (a step takes one such chunk).
  std::vector<float> chunk_logits_;
  std::vector<int32_t> eos_ids_;
  uint64_t steps_ = 0;
  uint64_t mixed_steps_ = 0;
  uint64_t prefill_steps_ = 0;
  uint64_t prefill_chunks_ = 0;
  uint64_t device_sampled_ = 0;
  uint64_t spec_drafts_ = 0;
  uint64_t spec_draft_tokens_ = 0;
  uint64_t spec_accepted_ = 0;
  uint64_t thinking_budget_ends_ = 0;  // EngineStats::thinking_budget_ends_total
  // Engine-wide draft acceptance (decayed sums), the prior of a slot with little record.
  double spec_verified_decayed_ = 0;
  double spec_accepted_decayed_ = 0;
  int32_t staged_draft_rows_ = 0;  // draft rows in the staged descriptor (BuildDescriptor)
  bool device_sampling_ = false;  // options_.device_sampling && the backend samples
  std::vector<int32_t> sampled_tokens_;  // [slots] DecodeAndSample's tokens
  uint64_t tokens_generated_ = 0;
  uint64_t commits_ = 0;
  uint64_t preemptions_ = 0;
  uint64_t admissions_ = 0;
  uint64_t far_summarized_ = 0;  // blocks replaced by summaries and freed
  uint64_t window_released_ = 0;  // blocks behind the window freed
  absl::Duration transport_wait_;
  absl::Duration transport_drain_wait_;
  // For max_prefill_stall. Chunks apart from the step: the moving average of a decode step
  // (seconds; 0 until measured), and a fit of a chunk's time as fixed + per_token * tokens (a
  // chunk reads every weight once whatever its size, so small chunks cost far more per token
  // than large). Fused chunks: a fit of a pass's time as fixed + per_row * (decode rows + chunk
  // tokens) over every pass that decodes. A chunk token and a decode row are alike to the
  // products (one row each); the line matches the compute-bound passes that carry chunks and
  // puts the read-bound ones (few decode rows, no chunk) a little low, so a chunk beside them is
  // kept a little shorter than the limit. (Cost models fitted apart for the two kinds of row, a
  // plane or a per-row-count table, were tried: under kvrm's changing row counts both starved
  // prefill; docs/benchmarks.md, "mixed steps".)
  double decode_step_avg_s_ = 0;
  // A decayed least-squares fit of time = fixed + per_unit * units.
  struct CostFit {
    double w = 0, n = 0, t = 0, nn = 0, nt = 0;  // decayed sums of 1, units, time, ...
    void Add(double units, double seconds);
    // False until something was measured. Until samples of different sizes were, the whole
    // cost is put per unit (fixed 0) and `*split` (if given) is false.
    bool Estimate(double* fixed_s, double* per_unit_s, bool* split = nullptr) const;
  };
  CostFit prefill_cost_;
  CostFit step_cost_;
  bool fuse_prefill_ = false;  // options_.fuse_prefill and the backend can

  // Posted by other threads.
  mutable std::mutex mu_;
  std::condition_variable cv_;     // wakes the owner thread
  std::condition_variable idle_cv_;
  std::vector<std::unique_ptr<GenerationRequest>> posted_;  // guarded by mu_
  std::vector<uint64_t> cancels_;                           // guarded by mu_
  bool cancel_all_ = false;                                 // guarded by mu_
  bool stop_ = false;                                       // guarded by mu_
  bool draining_ = false;                                   // guarded by mu_
  int32_t outstanding_ = 0;  // submitted and not finished; guarded by mu_
  int32_t queued_ = 0;       // submitted and not admitted; guarded by mu_
  uint64_t next_handle_ = 1;  // guarded by mu_
  uint64_t requests_total_ = 0;  // guarded by mu_
  EngineStats published_;     // guarded by mu_
  // LoRA adapter slots, guarded by mu_: kFree -> kLoading (LoadLoraAdapter took it, the backend
  // prepares) -> kInstalling (prepared; the owner thread puts it in the slot) -> kServing (Submit
  // resolves its name) -> kUnloading (refused by name; its requests finish) -> kFree (the owner
  // thread emptied it).
  struct LoraSlot {
    enum class State { kFree, kLoading, kInstalling, kServing, kUnloading };
    State state = State::kFree;
    ServedLoraAdapter served;
    std::shared_ptr<const PreparedLoraAdapter> prepared;  // kInstalling: for the owner thread
    absl::Status install_status;  // the owner thread's SetLoraAdapter, for LoadLoraAdapter
    uint64_t last_used = 0;       // lora_uses_ when a request last named it (eviction order)
  };
  std::vector<LoraSlot> lora_;
  bool lora_work_ = false;           // guarded by mu_: ApplyLoraChanges has something to do
  // ResetPrefixCache: resets asked for and done (guarded by mu_; reset_cv_ tells of each), and
  // what the last one freed.
  uint64_t cache_resets_asked_ = 0;
  uint64_t cache_resets_done_ = 0;
  KvPager::CacheReset last_cache_reset_;
  std::condition_variable reset_cv_;
  uint64_t next_lora_serial_ = 1;    // guarded by mu_
  uint64_t lora_uses_ = 0;           // guarded by mu_: requests resolved to an adapter
  bool running_ = false;             // guarded by mu_: Start() was called
  std::condition_variable lora_cv_;  // an install finished
  std::thread thread_;
};

}  // namespace kvrm

#endif  // KVRM_RUNTIME_ENGINE_H_
