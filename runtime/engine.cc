// Engine: construction, the public thread-safe API, and the step loop. The per-slot logic
// (admission, KV preparation, preemption, output) is in engine_slots.cc.
#include "runtime/engine.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <limits>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "kernels/cpu/isa.h"
#include "runtime/cpu_backend.h"

namespace kvrm {

const char* FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength: return "length";
    case FinishReason::kEos: return "eos";
    case FinishReason::kStop: return "stop";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kTimeLimit: return "time_limit";
    case FinishReason::kError: return "error";
  }
  return "unknown";
}

const char* PoolingName(Pooling pooling) {
  switch (pooling) {
    case Pooling::kNone:
      return "none";
    case Pooling::kLast:
      return "last";
    case Pooling::kMean:
      return "mean";
    case Pooling::kCls:
      return "cls";
  }
  return "unknown";
}

absl::StatusOr<Pooling> ParsePooling(std::string_view name) {
  for (Pooling p : {Pooling::kLast, Pooling::kMean, Pooling::kCls}) {
    if (name == PoolingName(p)) return p;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("pooling: ", std::string(name), " is not last, mean or cls"));
}

const char* KvModeName(KvMode mode) { return mode == KvMode::kStatic ? "static" : "kvrm"; }

const char* SlotStateName(SlotState state) {
  switch (state) {
    case SlotState::kFree: return "free";
    case SlotState::kPrefilling: return "prefilling";
    case SlotState::kDecoding: return "decoding";
    case SlotState::kPaused: return "paused";
    case SlotState::kFinishing: return "finishing";
  }
  return "unknown";
}

absl::StatusOr<EngineOptions> Engine::Resolve(const ModelBundle* model,
                                              const EngineOptions& options) {
  EngineOptions o = options;
  const LlamaConfig& c = model->config;
  const bool cap_window = c.sliding_window > 0 && !o.sliding_window_attention;
  if (o.max_context <= 0) {
    o.max_context = c.max_position_embeddings;
    if (cap_window) {
      // Within the window, sliding-window attention is full causal attention: serve that much,
      // exactly, rather than something else beyond it.
      o.max_context = c.sliding_window;
      LOG(WARNING) << "the model's sliding_window is " << c.sliding_window
                   << " (max_position_embeddings " << c.max_position_embeddings
                   << "): serving max context " << o.max_context
                   << ", where windowed attention is exact";
    }
  }
  if (o.max_context > c.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("--max_context ", o.max_context,
                                                   " exceeds the model's ",
                                                   c.max_position_embeddings));
  }
  if (cap_window && o.max_context > c.sliding_window) {
    return absl::UnimplementedError(absl::StrCat(
        "--max_context ", o.max_context, " exceeds the model's sliding_window (", c.sliding_window,
        "): this backend does not compute sliding-window attention; serve at "
        "most ",
        c.sliding_window, " positions, or use --device=cpu"));
  }
  if (o.slots <= 0 || o.slots > 1024) {
    return absl::InvalidArgumentError("--slots must be in [1, 1024]");
  }
  if (o.threads <= 0) o.threads = std::max(1u, std::thread::hardware_concurrency());
  const int32_t model_adapters = static_cast<int32_t>(model->lora_adapters.size());
  if (o.max_loras < 0 || o.max_loras > 1024 || (o.max_loras > 0 && o.max_loras < model_adapters)) {
    return absl::InvalidArgumentError(absl::StrCat("--max_loras=", o.max_loras, ": must be in [",
                                                   model_adapters, " (the --lora_modules), 1024]"));
  }
  o.max_loras = std::max(o.max_loras, model_adapters);
  if (o.max_lora_rank < 0 || o.max_lora_rank > kMaxLoraRank) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_lora_rank=", o.max_lora_rank, ": must be in [0, ", kMaxLoraRank, "]"));
  }
  if (!o.lora_dtype.has_value()) o.lora_dtype = DefaultLoraDtype(*model);
  if (*o.lora_dtype != DType::kF32 && *o.lora_dtype != DType::kBF16) {
    return absl::InvalidArgumentError("--lora_dtype: LoRA factors are kept in float32 or bfloat16");
  }
  if (o.max_lora_rank == 0 && o.max_loras > 0) {
    for (const LoraAdapter& a : model->lora_adapters) {
      o.max_lora_rank = std::max(o.max_lora_rank, a.rank);
    }
    if (o.max_loras > model_adapters) o.max_lora_rank = std::max(o.max_lora_rank, 16);
  }
  if (o.block_tokens <= 0 || o.prefill_chunk <= 0 || o.max_runs <= 0) {
    return absl::InvalidArgumentError("block tokens, prefill chunk and max runs must be positive");
  }
  if (o.max_prefills_per_step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max_prefills_per_step must be >= 0 (0: as many as fit; got ",
                     o.max_prefills_per_step, ")"));
  }
  if (o.max_queue < 1) {
    // It counts every request not yet in a slot, those that arrived since the last step
    // included: at 0 nothing could ever be admitted.
    return absl::InvalidArgumentError(
        absl::StrCat("--max_queue must be at least 1 (got ", o.max_queue, ")"));
  }
  if (o.max_runs > BlockSpace::kMaxSumRuns) {
    // Placement asks whether a history fits in that many of the largest free extents, and
    // counts at most this many.
    return absl::InvalidArgumentError(absl::StrCat("--kv_max_runs ", o.max_runs,
                                                   " is above ", BlockSpace::kMaxSumRuns));
  }
  o.max_new_tokens = std::max(1, std::min(o.max_new_tokens, o.max_context));
  const int64_t blocks_per_slot = (o.max_context + o.block_tokens - 1) / o.block_tokens;
  ASSIGN_OR_RETURN(const FarHistoryShape far, ResolveFarHistory(o.far_history, o.block_tokens));
  // Window release applies where every layer slides over a window shorter than the context,
  // computed as such (not capped), with a block table to release from; far history is refused
  // with any such window below.
  o.window_release = o.window_release && c.AllLayersSlide() && o.sliding_window_attention &&
                     c.sliding_window < o.max_context && o.kv_mode == KvMode::kKvrm &&
                     !far.enabled();
  const int64_t window_peak = o.window_release
                                  ? WindowPeakBlocks(c.sliding_window, o.block_tokens,
                                                     o.prefill_chunk, o.speculative_tokens)
                                  : blocks_per_slot;
  if (o.window_release && window_peak >= blocks_per_slot) o.window_release = false;
  if (o.kv_blocks <= 0) o.kv_blocks = std::min(blocks_per_slot, window_peak) * o.slots;
  if (o.kv_mode == KvMode::kStatic && o.kv_blocks < blocks_per_slot * o.slots) {
    // What a static-graph executor does with a KV budget: every usable slot reserves max
    // context, so only budget / max_context slots of the step can ever be filled.
    LOG(WARNING) << "static mode: --kv_blocks " << o.kv_blocks << " holds "
                 << o.kv_blocks / blocks_per_slot << " of " << o.slots
                 << " slots at max context; the others stay empty";
  }
  if (far.enabled() && c.sliding_window > 0 && o.max_context > c.sliding_window) {
    return absl::UnimplementedError(absl::StrCat(
        "--far_history does not combine with the model's sliding-window layers (window ",
        c.sliding_window, " of max context ", o.max_context, ")"));
  }
  if (far.enabled() && o.kv_mode != KvMode::kKvrm) {
    return absl::InvalidArgumentError(
        "--far_history needs --kv_mode=kvrm (the static baseline keeps every block)");
  }
  if (far.enabled() &&
      (int64_t{far.sink_blocks} + far.window_blocks) * o.block_tokens >= o.max_context) {
    LOG(WARNING) << "--far_history: sinks + window cover max context " << o.max_context
                 << ": no block will ever be summarized";
  }
  const int64_t far_peak = FarHistoryPeakBlocks(far, o.block_tokens, o.prefill_chunk);
  if (far.enabled() && far_peak < blocks_per_slot) {
    // A slot never holds more than sinks + window + one chunk: the budget needs only that.
    if (o.kv_blocks < far_peak) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--kv_blocks ", o.kv_blocks, " cannot hold one request's far-history working set (",
          far.sink_blocks, " sink + ", far.window_blocks, " window + ",
          far_peak - far.sink_blocks - far.window_blocks, " chunk blocks)"));
    }
  } else if (o.window_release) {
    if (o.kv_blocks < window_peak) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--kv_blocks ", o.kv_blocks, " cannot hold one request's sliding-window working set (",
          window_peak, " blocks: the model's window of ", c.sliding_window,
          " tokens, a prefill chunk or a step's drafts)"));
    }
  } else if (o.kv_blocks < blocks_per_slot) {
    return absl::InvalidArgumentError(absl::StrCat("--kv_blocks ", o.kv_blocks,
                                                   " cannot hold one request of max context (",
                                                   blocks_per_slot, " blocks)"));
  }
  RETURN_IF_ERROR(CheckSpeculativeOptions(o.speculative_tokens, o.speculative_ngram));
  if (o.speculative_tokens > 0 && far.enabled()) {
    return absl::InvalidArgumentError(
        "--speculative_tokens does not combine with --far_history (drafts are verified over "
        "the exact history)");
  }
  if (o.kv_host_blocks < 0) o.kv_host_blocks = o.kv_mode == KvMode::kKvrm ? o.kv_blocks : 0;
  // The static baseline has no block table to share through; far history frees a prompt's
  // distant blocks as it goes, so there is nothing to keep.
  if (o.kv_mode != KvMode::kKvrm || far.enabled()) o.prefix_caching = false;
  if (!o.prefix_caching || o.kv_host_blocks == 0) o.prefix_cache_offload = false;
  if (!o.prefix_caching) o.prefix_cache_partial_blocks = false;
  if (o.step_token_budget <= 0) o.step_token_budget = o.slots + o.prefill_chunk;
  if (o.recompute_max_tokens <= 0) o.recompute_max_tokens = o.prefill_chunk;
  if (o.clock == nullptr) o.clock = Clock::Real();
  return o;
}

DType DefaultLoraDtype(const ModelBundle& model) {
  return model.weights.dtype == DType::kF32 ? DType::kF32 : DType::kBF16;
}

absl::StatusOr<std::optional<DType>> ParseLoraDtype(std::string_view name) {
  if (name == "auto") return std::optional<DType>();
  if (name == "bfloat16") return std::optional<DType>(DType::kBF16);
  if (name == "float32") return std::optional<DType>(DType::kF32);
  return absl::InvalidArgumentError(
      absl::StrCat("--lora_dtype=", std::string(name), ": auto, bfloat16 or float32"));
}

absl::Status CheckSpeculativeOptions(int32_t tokens, const NgramDraftOptions& ngram) {
  if (tokens < 0 || tokens > 32) {
    return absl::InvalidArgumentError(
        absl::StrCat("--speculative_tokens=", tokens, " must be in [0, 32]"));
  }
  if (ngram.min_ngram < 1 || ngram.max_ngram < ngram.min_ngram || ngram.max_ngram > 64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--prompt_lookup_min=", ngram.min_ngram, " and --prompt_lookup_max=", ngram.max_ngram,
        ": need 1 <= min <= max <= 64"));
  }
  return absl::OkStatus();
}

int64_t WindowPeakBlocks(int32_t window, int32_t block_tokens, int32_t prefill_chunk,
                         int32_t speculative_tokens) {
  // Rows [p, p + n] of one slot hold blocks from BlocksBehindWindow(p) = floor((p + 1 - W) /
  // bt) to floor((p + n) / bt): at most floor((W - 1 + n) / bt) + 2 of them. A decode step
  // reaches n = max(drafts, 1) (pre-staging grows the next position during the step), a chunk
  // n = chunk - 1.
  const int64_t reach = std::max({1, speculative_tokens, prefill_chunk - 1});
  return (int64_t{window} - 1 + reach) / block_tokens + 2;
}

absl::StatusOr<std::unique_ptr<Backend>> MakeCpuBackend(const ModelBundle& model,
                                                        const EngineOptions& o) {
  CpuBackendOptions bo;
  bo.kv_blocks = o.kv_blocks;
  bo.kv_block_tokens = o.block_tokens;
  bo.kv_dtype = o.kv_dtype;
  bo.max_slots = o.slots;
  bo.max_chunk_tokens = o.prefill_chunk;
  bo.max_chunks_per_pass = o.max_prefills_per_step;
  bo.max_draft_tokens = o.speculative_tokens;
  bo.max_context = o.max_context;
  bo.num_threads = o.threads;
  bo.tensor_parallel = o.tensor_parallel;
  // Panels serve the best path only: another one chosen (kvrmd --cpu_isa), no second copy.
  bo.weight_panels = ActiveCpuIsa() == AvailableCpuIsas().back();
  bo.quantization = o.quantization;
  ASSIGN_OR_RETURN(bo.far_history, ResolveFarHistory(o.far_history, o.block_tokens));
  for (const LoraAdapter& a : model.lora_adapters) bo.lora_adapters.push_back(&a);
  bo.max_lora_adapters = o.max_loras;
  bo.max_lora_rank = o.max_lora_rank;
  bo.lora_dtype = o.lora_dtype.value_or(DType::kF32);
  ASSIGN_OR_RETURN(std::unique_ptr<CpuBackend> backend,
                   CpuBackend::Create(model.config, &model.weights, bo));
  return std::unique_ptr<Backend>(std::move(backend));
}

absl::Status CheckKvFitsMemory(const LlamaConfig& config, const EngineOptions& o,
                               bool pool_in_host_memory, const std::optional<MemoryLimit>& limit) {
  // K and V of a block for every layer and KV head, all ranks together (a rank holds its
  // share of the heads): the pool's own arithmetic, for the whole model.
  KvPoolShape whole;
  whole.num_layers = config.num_hidden_layers;
  whole.kv_heads = config.num_key_value_heads;
  whole.head_dim = config.head_dim;
  whole.block_tokens = o.block_tokens;
  whole.dtype = o.kv_dtype;
  const int64_t bytes_per_block = whole.BytesPerBlock();
  // Saturating: a budget whose bytes do not fit 64 bits fits no memory either.
  const auto bytes_of = [&](int64_t blocks) {
    return blocks > std::numeric_limits<int64_t>::max() / std::max<int64_t>(1, bytes_per_block)
               ? std::numeric_limits<int64_t>::max()
               : blocks * bytes_per_block;
  };
  const int64_t pool = pool_in_host_memory ? bytes_of(o.kv_blocks) : 0;
  const int64_t host_tier = bytes_of(o.kv_host_blocks);
  const std::string what = absl::StrCat(
      "the KV cache (", o.kv_blocks, " blocks of ", o.block_tokens, " tokens, ",
      bytes_per_block / 1024, " KiB each", pool_in_host_memory ? "" : ", on the device",
      "; host tier ", o.kv_host_blocks, " blocks", pool_in_host_memory ? "" : ", pinned", ")");
  const std::string advice = absl::StrCat(
      "lower --kv_blocks or --kv_host_blocks, or --max_context (", o.max_context, ") and --slots (",
      o.slots, ") which size --kv_blocks when it is 0",
      o.kv_dtype == DType::kF32    ? ", or halve the bytes with --kv_dtype=bf16 (a quarter: fp8)"
      : o.kv_dtype == DType::kBF16 ? ", or halve the bytes with --kv_dtype=fp8"
                                   : "");
  // The CPU host tier is touched as it fills; a GPU backend pins its host tier at start-up.
  return pool_in_host_memory ? CheckFitsMemory(pool, host_tier, limit, what, advice)
                             : CheckFitsMemory(host_tier, 0, limit, what, advice);
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const ModelBundle* model,
                                                       const EngineOptions& options) {
  ASSIGN_OR_RETURN(EngineOptions o, Resolve(model, options));
  if (IsFp8(o.kv_dtype) && !model->weights.kv_cache_scales_error.ok()) {
    // The scales an FP8 cache divides by are unreadable: refuse rather than serve with 1.
    const absl::Status& s = model->weights.kv_cache_scales_error;
    return absl::Status(s.code(), absl::StrCat("--kv_dtype=", std::string(DTypeName(o.kv_dtype)),
                                               ": ", s.message()));
  }
  if (o.backend_factory) {
    ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, o.backend_factory(*model, o));
    return CreateWithBackend(model, o, std::move(backend));
  }
  RETURN_IF_ERROR(CheckKvFitsMemory(model->config, o, /*pool_in_host_memory=*/true,
                                    o.memory_limit ? *o.memory_limit : ReadMemoryLimit()));
  ASSIGN_OR_RETURN(std::unique_ptr<Backend> backend, MakeCpuBackend(*model, o));
  return CreateWithBackend(model, o, std::move(backend));
}

absl::StatusOr<std::unique_ptr<Engine>> Engine::CreateWithBackend(
    const ModelBundle* model, const EngineOptions& options, std::unique_ptr<Backend> backend) {
  ASSIGN_OR_RETURN(EngineOptions o, Resolve(model, options));
  auto engine = std::unique_ptr<Engine>(new Engine(model, o));
  RETURN_IF_ERROR(engine->Init(std::move(backend)));
  engine->PublishStats();
  return engine;
}

Engine::Engine(const ModelBundle* model, const EngineOptions& options)
    : model_(model),
      options_(options),
      observer_(options.observer ? options.observer : &default_observer_),
      clock_(options.clock) {
  slots_.resize(options.slots);
  samplers_.reserve(options.slots);
  for (int i = 0; i < options.slots; ++i) {
    samplers_.push_back(std::make_unique<Sampler>(model->config.vocab_size));
  }
  // Resolve() validated the far-history options already.
  far_ = ResolveFarHistory(options.far_history, options.block_tokens).value_or(FarHistoryShape{});
  if (options.window_release) release_window_ = model->config.sliding_window;
  // (Under window release a slot's blocks go as it grows: no tails kept, none copied.)
  if (release_window_ > 0) options_.prefix_cache_partial_blocks = false;
  slot_peak_blocks_ =
      far_.enabled() ? FarHistoryPeakBlocks(far_, options.block_tokens, options.prefill_chunk)
      : release_window_ > 0 ? WindowPeakBlocks(release_window_, options.block_tokens,
                                               options.prefill_chunk, options.speculative_tokens)
                            : 0;
  for (StepDescriptor& d : descriptors_) {
    d.Resize(options.slots, options.max_runs, options.speculative_tokens);
    d.far = far_;
  }
  logits_.resize(static_cast<size_t>(options.slots) * (1 + options.speculative_tokens) *
                 model->config.vocab_size);
  eos_ids_ = model->config.eos_token_ids;
}

absl::Status Engine::Init(std::unique_ptr<Backend> backend) {
  const EngineOptions& o = options_;
  const int64_t blocks_per_slot = (o.max_context + o.block_tokens - 1) / o.block_tokens;
  backend_ = std::move(backend);
  if (far_.enabled() && !backend_->supports_far_history()) {
    return absl::InvalidArgumentError(
        "--far_history: this backend does not implement far-history summaries");
  }
  if (o.speculative_tokens > backend_->max_draft_tokens()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--speculative_tokens ", o.speculative_tokens, ": this backend verifies ",
        backend_->max_draft_tokens() == 0
            ? std::string("no draft tokens (speculative decoding runs on the CPU backend)")
            : absl::StrCat("at most ", backend_->max_draft_tokens(), " draft tokens a slot")));
  }
  int64_t bytes_per_block = 0;
  for (int32_t r = 0; r < backend_->num_kv_pools(); ++r) {
    bytes_per_block += backend_->kv_pool(r)->shape().BytesPerBlock();
  }
  if (o.kv_mode == KvMode::kStatic) {
    static_slots_ = static_cast<int32_t>(std::min<int64_t>(o.slots, o.kv_blocks / blocks_per_slot));
    kv_ = std::make_unique<StaticKvAllocator>(static_slots_, blocks_per_slot, o.block_tokens,
                                              bytes_per_block);
  } else {
    KvPagerOptions po;
    po.num_slots = o.slots;
    po.device_blocks = o.kv_blocks;
    po.host_blocks = o.kv_host_blocks;
    po.block_tokens = o.block_tokens;
    po.max_runs = o.max_runs;
    po.max_blocks_per_slot = static_cast<int32_t>(blocks_per_slot);
    po.bytes_per_block = bytes_per_block;
    po.prefix_cache = o.prefix_caching;
    po.host_prefix_cache = o.prefix_cache_offload;
    po.window = release_window_;
    auto pager = std::make_unique<KvPager>(po);
    pager_ = pager.get();
    kv_ = std::move(pager);
    if (o.kv_host_blocks > 0) RETURN_IF_ERROR(backend_->CreateHostTier(o.kv_host_blocks));
    const int64_t capacity = o.kv_blocks + std::max<int64_t>(1, o.kv_host_blocks);
    moves_.reserve(capacity);
    prefix_match_.reserve(blocks_per_slot);
    gated_moves_.reserve(capacity);
    groups_.reserve(capacity);
    // Each entry owns at least one planned or in-flight move: NoteTransfer, called while a step
    // runs (PreStageNext), need not grow it.
    transfer_owners_.reserve(capacity);
    transport_ = std::make_unique<Transport>(
        [this](const TransferGroup& g) { return CopyGroup(g); }, bytes_per_block,
        static_cast<int32_t>(std::min<int64_t>(capacity, 1 << 20)));
  }
  // LoRA adapter slots: the model's adapters are in the first (the backend put them there).
  if (o.max_loras > backend_->max_lora_adapters()) {
    return absl::InvalidArgumentError(
        backend_->max_lora_adapters() == 0
            ? std::string("--lora_modules / --max_loras: this device serves no LoRA adapters "
                          "(the CPU device does)")
            : absl::StrCat("--max_loras=", o.max_loras, ": the backend has ",
                           backend_->max_lora_adapters(), " adapter slots"));
  }
  lora_.resize(o.max_loras);
  for (size_t i = 0; i < model_->lora_adapters.size(); ++i) {
    LoraSlot& slot = lora_[i];
    slot.state = LoraSlot::State::kServing;
    slot.served.adapter = model_->lora_adapters[i];
    slot.served.adapter.layers.clear();
    slot.served.slot = static_cast<int32_t>(i);
    slot.served.serial = next_lora_serial_++;
    observer_->OnLoraAdapter(slot.served.slot, &slot.served.adapter);
  }
  runner_ = std::make_unique<StepRunner>(backend_.get(), clock_, backend_->handoff_spin());
  fuse_prefill_ = o.fuse_prefill && backend_->fuses_prefill();
  device_sampling_ = o.device_sampling && backend_->samples_on_device();
  sampled_tokens_.assign(o.slots, 0);
  chunk_capacity_ = std::clamp(backend_->max_chunks_per_pass(), 1, o.slots);
  if (o.max_prefills_per_step > 0) {
    chunk_capacity_ = std::min(chunk_capacity_, o.max_prefills_per_step);
  }
  chunks_.assign(chunk_capacity_, PrefillChunk{});
  for (PrefillChunk& c : chunks_) c.far = far_;
  chunk_last_.assign(chunk_capacity_, 0);
  chunk_logit_rows_.assign(chunk_capacity_, nullptr);
  prefill_runs_.resize(o.slots);
  const int32_t all_rows = backend_->computes_all_logits() ? kMaxAllLogitsRows : 1;
  chunk_logits_.resize(static_cast<size_t>(chunk_capacity_ + all_rows - 1) *
                       model_->config.vocab_size);
  return absl::OkStatus();
}

absl::Status Engine::CopyGroup(const TransferGroup& g) {
  if (options_.transfer_fault) RETURN_IF_ERROR(options_.transfer_fault(g));
  return backend_->CopyGroup(g);
}

Engine::~Engine() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Engine::Start() {
  CHECK(!thread_.joinable());
  {
    std::lock_guard<std::mutex> lock(mu_);
    running_ = true;
  }
  thread_ = std::thread([this] { Loop(); });
}

absl::StatusOr<uint64_t> Engine::Submit(std::unique_ptr<GenerationRequest> request,
                                        bool admitted_call) {
  if (request->prompt.empty()) return absl::InvalidArgumentError("prompt: empty");
  if (static_cast<int64_t>(request->prompt.size()) >= options_.max_context) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt: ", request->prompt.size(), " tokens leave no room in the context of ",
        options_.max_context));
  }
  // The front ends validate requests; this keeps a request built elsewhere from reaching the
  // sampler's CHECKs on the engine thread (one bad request must not end the daemon).
  const int32_t vocab = model_->config.vocab_size;
  for (size_t i = 0; i < request->prompt.size(); ++i) {
    if (request->prompt[i] < 0 || request->prompt[i] >= vocab) {
      return absl::InvalidArgumentError(absl::StrCat("prompt[", i, "]: token ",
                                                     request->prompt[i], " is not in [0, ", vocab,
                                                     ")"));
    }
  }
  if (request->prompt_logprobs < -1 || request->prompt_logprobs > kMaxTopLogprobs) {
    return absl::InvalidArgumentError(absl::StrCat("prompt_logprobs: ", request->prompt_logprobs,
                                                   " is outside [0, ", kMaxTopLogprobs, "]"));
  }
  if (request->prompt_logprobs >= 0 && !backend_->computes_all_logits()) {
    return absl::InvalidArgumentError(
        "prompt_logprobs: this device does not return a prompt's logits (the CPU device does)");
  }
  if (request->pooling == Pooling::kNone && !model_->weights.has_lm_head) {
    return absl::FailedPreconditionError(
        "the served model has no LM head (its checkpoint has no lm_head.weight: an embedding "
        "model's base weights, or a sequence classifier's), so it serves embeddings, "
        "classification and scoring (Embed, Classify, Score) only");
  }
  if (request->pooling != Pooling::kNone && !backend_->returns_hidden()) {
    return absl::InvalidArgumentError(
        "pooling: this device does not return hidden states for embeddings (the CPU device does)");
  }
  if (request->pooling != Pooling::kNone && request->prompt_logprobs >= 0) {
    return absl::InvalidArgumentError("prompt_logprobs: not with an embedding (pooling)");
  }
  if (request->lora_adapter < -1 || request->lora_adapter >= max_loras()) {
    return absl::InvalidArgumentError(absl::StrCat("lora_adapter: slot ", request->lora_adapter,
                                                   " is not in [-1, ", max_loras(), ")"));
  }
  if (const ThinkingBudget& b = request->thinking_budget; b.max_tokens >= 0) {
    if (b.end.empty() || b.forced.empty() || (b.start.empty() && !b.starts_inside)) {
      return absl::InvalidArgumentError(
          "thinking_budget: its end and forced tokens (and its start, unless the prompt opens "
          "the block) must be given");
    }
    for (const std::vector<int32_t>* seq : {&b.start, &b.end, &b.forced}) {
      for (int32_t id : *seq) {
        if (id < 0 || id >= vocab) {
          return absl::InvalidArgumentError(
              absl::StrCat("thinking_budget: token ", id, " is not in [0, ", vocab, ")"));
        }
      }
    }
  }
  RETURN_IF_ERROR(ValidateSamplingConfig(request->sampling));
  RETURN_IF_ERROR(ValidateSamplingTokens(request->sampling, vocab));
  if (request->sampling.seed == 0) {
    std::random_device rd;
    request->sampling.seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }
  uint64_t handle;
  {
    std::lock_guard<std::mutex> lock(mu_);
    absl::Status refused;
    if (stop_ || (draining_ && !admitted_call)) {
      refused = absl::UnavailableError("server is draining");
    } else if (queued_ >= options_.max_queue && !admitted_call) {
      refused = absl::ResourceExhaustedError(
          absl::StrCat("queue full (", options_.max_queue, " waiting requests)"));
    }
    if (!refused.ok()) {
      observer_->OnRejected(refused);
      return refused;
    }
    // The adapter: resolved here, under the lock that posts the request, so that it stays in
    // its slot until the request ends (ReleaseLoraLocked).
    if (!request->lora_name.empty() || request->lora_adapter >= 0) {
      absl::StatusOr<int32_t> slot = FindServedLoraLocked(*request);
      if (!slot.ok()) return slot.status();
      const LoraSlot* found = &lora_[*slot];
      request->lora_adapter = found->served.slot;
      request->lora_name = found->served.adapter.name;
      // The adapter's K/V are its own: its prompts share cached blocks only with its own (this
      // load's: an adapter loaded again under the name may have other weights).
      request->cache_salt = LoraCacheKey(request->cache_salt, found->served.serial);
      LoraSlot& used = lora_[found->served.slot];
      ++used.served.requests;
      used.last_used = ++lora_uses_;
    }
    handle = request->handle = next_handle_++;
    ++queued_;
    ++outstanding_;
    ++requests_total_;
    posted_.push_back(std::move(request));
  }
  cv_.notify_one();
  return handle;
}

void Engine::Cancel(uint64_t handle) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancels_.push_back(handle);
  }
  cv_.notify_one();
}

void Engine::BeginDrain() {
  std::lock_guard<std::mutex> lock(mu_);
  draining_ = true;
}

bool Engine::WaitIdle(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return idle_cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                           [&] { return outstanding_ == 0; });
}

void Engine::CancelAll() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancel_all_ = true;
  }
  cv_.notify_one();
}

std::vector<ServedLoraAdapter> Engine::LoraAdapters() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<ServedLoraAdapter> out;
  for (const LoraSlot& slot : lora_) {
    if (slot.state == LoraSlot::State::kServing) out.push_back(slot.served);
  }
  return out;
}

bool Engine::ServesLoraAdapter(std::string_view name) const {
  std::lock_guard<std::mutex> lock(mu_);
  for (const LoraSlot& slot : lora_) {
    if (slot.state == LoraSlot::State::kServing && slot.served.adapter.name == name) return true;
  }
  return false;
}

absl::StatusOr<ServedLoraAdapter> Engine::LoadLoraAdapter(LoraAdapter adapter, bool evictable) {
  if (lora_.empty()) {
    return absl::FailedPreconditionError(
        "LoRA adapters: this server has no adapter slots (kvrmd --max_loras; the CPU device "
        "serves adapters, the CUDA device none yet)");
  }
  if (adapter.name.empty()) return absl::InvalidArgumentError("lora_name: empty");
  if (adapter.name == model_->name) {
    return absl::InvalidArgumentError(
        absl::StrCat("lora_name: `", adapter.name, "` is the served model's name"));
  }
  int32_t index = -1;
  {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (stop_) return absl::UnavailableError("the engine is stopping");
      for (const LoraSlot& slot : lora_) {
        const bool named = slot.state == LoraSlot::State::kLoading ||
                           slot.state == LoraSlot::State::kInstalling ||
                           slot.state == LoraSlot::State::kServing;
        if (named && slot.served.adapter.name == adapter.name) {
          return absl::AlreadyExistsError(
              absl::StrCat("lora_name: an adapter named `", adapter.name, "` is already ",
                           slot.state == LoraSlot::State::kServing ? "served" : "being loaded"));
        }
      }
      for (size_t i = 0; i < lora_.size() && index < 0; ++i) {
        if (lora_[i].state == LoraSlot::State::kFree) index = static_cast<int32_t>(i);
      }
      if (index >= 0) break;
      // A slot whose adapter was unloaded and whose requests all ended is about to be emptied
      // by the owner thread: wait for that rather than refuse. Else the least recently used
      // evictable adapter no request runs with gives its slot.
      bool emptying = false;
      LoraSlot* victim = nullptr;
      for (LoraSlot& slot : lora_) {
        emptying |= slot.state == LoraSlot::State::kUnloading && slot.served.requests == 0;
        if (slot.state == LoraSlot::State::kServing && slot.served.evictable &&
            slot.served.requests == 0 &&
            (victim == nullptr || slot.last_used < victim->last_used)) {
          victim = &slot;
        }
      }
      if (!emptying && victim != nullptr) {
        LOG(INFO) << "LoRA adapter '" << victim->served.adapter.name << "' evicted from slot "
                  << victim->served.slot << " for '" << adapter.name << "'";
        victim->state = LoraSlot::State::kUnloading;
        lora_work_ = true;
        cv_.notify_one();
        emptying = true;
      }
      if (!emptying) {
        int64_t unloading = 0;
        for (const LoraSlot& slot : lora_) unloading += slot.state == LoraSlot::State::kUnloading;
        return absl::ResourceExhaustedError(absl::StrCat(
            "LoRA adapters: all ", lora_.size(), " slots are taken (kvrmd --max_loras)",
            unloading > 0 ? absl::StrCat("; ", unloading,
                                         " of them by unloaded adapters whose requests are running")
                          : std::string("; unload one first")));
      }
      AwaitLoraChanges(&lock);
    }
    LoraSlot& slot = lora_[index];
    slot.state = LoraSlot::State::kLoading;
    slot.served = ServedLoraAdapter();
    slot.served.adapter.name = adapter.name;  // reserves the name
    slot.served.slot = index;
    slot.served.evictable = evictable;
  }
  // The slow part, while steps run: the backend's copy of the weights.
  absl::StatusOr<std::shared_ptr<const PreparedLoraAdapter>> prepared =
      backend_->PrepareLoraAdapter(adapter);
  adapter.layers.clear();
  adapter.layers.shrink_to_fit();
  std::unique_lock<std::mutex> lock(mu_);
  LoraSlot& slot = lora_[index];
  if (!prepared.ok()) {
    slot = LoraSlot();
    return prepared.status();
  }
  slot.state = LoraSlot::State::kInstalling;
  slot.prepared = *std::move(prepared);
  slot.served.adapter = std::move(adapter);
  slot.served.serial = next_lora_serial_++;
  const ServedLoraAdapter result = slot.served;
  lora_work_ = true;
  cv_.notify_one();
  while (slot.state == LoraSlot::State::kInstalling) {
    if (stop_) {
      return absl::UnavailableError("the engine stopped before the adapter was in its slot");
    }
    AwaitLoraChanges(&lock);
  }
  if (!slot.install_status.ok()) {
    const absl::Status failed = slot.install_status;
    slot = LoraSlot();
    return failed;
  }
  return result;  // (an unload may already have followed)
}

absl::StatusOr<int64_t> Engine::UnloadLoraAdapter(std::string_view name) {
  std::lock_guard<std::mutex> lock(mu_);
  for (LoraSlot& slot : lora_) {
    if (slot.state != LoraSlot::State::kServing || slot.served.adapter.name != name) continue;
    slot.state = LoraSlot::State::kUnloading;
    if (slot.served.requests == 0) {
      lora_work_ = true;
      cv_.notify_one();
    }
    return slot.served.requests;
  }
  return absl::NotFoundError(
      absl::StrCat("lora_name: no LoRA adapter named `", std::string(name), "` is served"));
}

absl::StatusOr<int32_t> Engine::FindServedLoraLocked(const GenerationRequest& request) const {
  // A pinned request's copies: the load pinned, in its slot (kept through an unload until the
  // pin is let go of), or none.
  if (request.lora_pinned_serial != 0) {
    if (request.lora_adapter >= 0 && request.lora_adapter < max_loras()) {
      const LoraSlot& slot = lora_[request.lora_adapter];
      if ((slot.state == LoraSlot::State::kServing ||
           (slot.state == LoraSlot::State::kUnloading && slot.served.requests > 0)) &&
          slot.served.serial == request.lora_pinned_serial) {
        return slot.served.slot;
      }
    }
    return absl::InvalidArgumentError(absl::StrCat("lora_adapter: slot ", request.lora_adapter,
                                                   " no longer serves the adapter pinned"));
  }
  for (const LoraSlot& slot : lora_) {
    if (slot.state != LoraSlot::State::kServing) continue;
    if (request.lora_name.empty() ? slot.served.slot == request.lora_adapter
                                  : slot.served.adapter.name == request.lora_name) {
      return slot.served.slot;
    }
  }
  std::vector<std::string> served;
  for (const LoraSlot& slot : lora_) {
    if (slot.state == LoraSlot::State::kServing) served.push_back(slot.served.adapter.name);
  }
  const std::string which = request.lora_name.empty() ? absl::StrCat("slot ", request.lora_adapter)
                                                      : absl::StrCat("`", request.lora_name, "`");
  return absl::InvalidArgumentError(
      served.empty() ? absl::StrCat("lora_adapter: ", which,
                                    " is not served (this server serves no LoRA adapters)")
                     : absl::StrCat("lora_adapter: ", which, " is not served (served: `",
                                    absl::StrJoin(served, "`, `"), "`)"));
}

absl::StatusOr<int32_t> Engine::PinLoraAdapter(GenerationRequest* request) {
  if (request->lora_name.empty() && request->lora_adapter < 0) return -1;
  std::lock_guard<std::mutex> lock(mu_);
  ASSIGN_OR_RETURN(const int32_t slot, FindServedLoraLocked(*request));
  ++lora_[slot].served.requests;
  lora_[slot].last_used = ++lora_uses_;
  request->lora_adapter = slot;
  request->lora_name.clear();
  request->lora_pinned_serial = lora_[slot].served.serial;
  return slot;
}

void Engine::UnpinLoraAdapter(int32_t slot) {
  std::lock_guard<std::mutex> lock(mu_);
  ReleaseLoraLocked(slot);
  if (lora_work_) cv_.notify_one();
}

void Engine::ReleaseLoraLocked(int32_t slot) {
  if (slot < 0 || slot >= max_loras()) return;
  LoraSlot& s = lora_[slot];
  if (--s.served.requests == 0 && s.state == LoraSlot::State::kUnloading) lora_work_ = true;
}

void Engine::AwaitLoraChanges(std::unique_lock<std::mutex>* lock) {
  if (!running_) {
    lock->unlock();  // no owner thread yet: the caller is the owner
    ApplyLoraChanges();
    lock->lock();
  } else {
    lora_cv_.wait_for(*lock, std::chrono::milliseconds(50));
  }
}

void Engine::ApplyLoraChanges() {
  if (lora_.empty()) return;  // no slots (sized once, at start-up): nothing to lock for a step
  std::vector<std::pair<int32_t, std::shared_ptr<const PreparedLoraAdapter>>> installs;
  std::vector<int32_t> empties;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!lora_work_) return;
    lora_work_ = false;
    for (LoraSlot& slot : lora_) {
      if (slot.state == LoraSlot::State::kInstalling && slot.prepared) {
        installs.emplace_back(slot.served.slot, std::move(slot.prepared));
      } else if (slot.state == LoraSlot::State::kUnloading && slot.served.requests == 0) {
        empties.push_back(slot.served.slot);
      }
    }
  }
  // No step is running: the backend's slots are the owner thread's to change.
  std::vector<absl::Status> installed;
  for (auto& [index, prepared] : installs) {
    installed.push_back(backend_->SetLoraAdapter(index, std::move(prepared)));
  }
  for (int32_t index : empties) {
    // Emptying a slot only lets go of its weights; it cannot fail on a slot that was filled.
    if (absl::Status st = backend_->SetLoraAdapter(index, nullptr); !st.ok()) {
      LOG(ERROR) << "emptying LoRA adapter slot " << index << ": " << st;
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = 0; i < installs.size(); ++i) {
      LoraSlot& slot = lora_[installs[i].first];
      slot.install_status = installed[i];
      if (installed[i].ok()) {
        slot.state = LoraSlot::State::kServing;
      } else {
        // Still reserved: LoadLoraAdapter reads the status and frees the slot.
        slot.state = LoraSlot::State::kLoading;
      }
    }
    for (int32_t index : empties) lora_[index] = LoraSlot();
  }
  lora_cv_.notify_all();
  // A serving slot's metadata changes only when this thread empties it.
  for (size_t i = 0; i < installs.size(); ++i) {
    const int32_t index = installs[i].first;
    if (installed[i].ok()) observer_->OnLoraAdapter(index, &lora_[index].served.adapter);
  }
  for (int32_t index : empties) observer_->OnLoraAdapter(index, nullptr);
}

EngineStats Engine::Stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  EngineStats s = published_;
  s.queue_depth = queued_;
  s.requests_total = requests_total_;
  return s;
}

void Engine::PublishStats() {
  EngineStats s;
  s.slots_total = options_.slots;
  for (const Slot& slot : slots_) {
    s.slots_in_use += slot.state != SlotState::kFree;
    s.slots_prefilling += slot.state == SlotState::kPrefilling;
    s.slots_decoding += slot.state == SlotState::kDecoding;
    s.slots_paused += slot.state == SlotState::kPaused;
  }
  s.tokens_generated_total = tokens_generated_;
  s.steps_total = steps_;
  s.mixed_steps_total = mixed_steps_;
  s.prefill_steps_total = prefill_steps_;
  s.prefill_chunks_total = prefill_chunks_;
  s.device_sampled_tokens_total = device_sampled_;
  s.spec_decode_drafts_total = spec_drafts_;
  s.spec_decode_draft_tokens_total = spec_draft_tokens_;
  s.spec_decode_accepted_tokens_total = spec_accepted_;
  s.thinking_budget_ends_total = thinking_budget_ends_;
  s.kv = kv_->Stats();
  if (pager_ && options_.reserve == ReservePolicy::kPromptAndOutput) {
    // What admission set aside for prompt + output beyond the blocks already allocated is
    // reserved too: no other request can be admitted into it (the claims' reserved-KV figure).
    const int64_t aside = UnallocatedReservations(-1);
    s.kv.blocks_reserved += aside;
    s.kv.blocks_free = std::max<int64_t>(0, s.kv.blocks_free - aside);
  }
  s.descriptor_commits_total = commits_;
  s.preemptions_total = preemptions_;
  s.far_blocks_summarized_total = far_summarized_;
  s.window_blocks_released_total = window_released_;
  s.prefix_cache_queries_total = prefix_queries_;
  s.prefix_cache_hits_total = prefix_hits_;
  if (pager_) {
    s.prefix_cache_evictions_total = pager_->evictions();
    s.prefix_cache_host_hits_total = prefix_host_hits_;
    s.prefix_cache_copied_tokens_total = prefix_copied_;
    s.prefix_cache_offloaded_blocks_total = pager_->offloaded_blocks();
    s.prefix_cache_offload_shed_blocks_total = pager_->shed_offloads();
    s.prefix_cache_host_evictions_total = pager_->host_evictions();
  }
  s.transport_wait_seconds_total = absl::ToDoubleSeconds(transport_wait_);
  s.transport_drain_wait_seconds_total = absl::ToDoubleSeconds(transport_drain_wait_);
  if (transport_) {
    const TransportStats t = transport_->Stats();
    s.transfer_groups_total = t.groups_total;
    s.transfer_bytes_total = t.bytes_total;
    s.transfer_blocks_total = t.blocks_total;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    s.queue_depth = queued_;
    s.requests_total = requests_total_;
    s.prefix_cache_resets_total = cache_resets_done_;
    published_ = s;
  }
  observer_->OnStats(s);
}

void Engine::Loop() {
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stop_) break;
    }
    if (!Step()) {
      std::unique_lock<std::mutex> lock(mu_);
      // Wake for posts, or every 20 ms to enforce time limits and resume paused requests.
      cv_.wait_for(lock, std::chrono::milliseconds(20), [&] {
        return stop_ || !posted_.empty() || !cancels_.empty() || cancel_all_ || lora_work_ ||
               cache_resets_asked_ != cache_resets_done_;
      });
    }
  }
  lora_cv_.notify_all();  // a LoadLoraAdapter waiting for its install: stop_ is set
  reset_cv_.notify_all();  // and a ResetPrefixCache waiting for its reset
  // Shutting down: everything still here ends CANCELLED so every sink sees OnFinished.
  TakePosted();
  for (int32_t i = 0; i < options_.slots; ++i) {
    if (slots_[i].state != SlotState::kFree) FinishSlot(i, FinishReason::kCancelled, {});
  }
  while (!waiting_.empty()) {
    std::unique_ptr<GenerationRequest> r = std::move(waiting_.front());
    waiting_.pop_front();
    FinishQueued(std::move(r), FinishReason::kCancelled);
  }
}

bool Engine::MovesPlanned() const {
  return pager_ && (!moves_.empty() || !gated_moves_.empty() || !pager_->offload_moves().empty());
}

uint64_t Engine::SubmitTransfers(uint64_t gate_step) {
  // The pager's offloads first: they read device blocks evicted from the prefix cache, which
  // moves planned after them (and the next step) may write. Then the ungated moves (nothing
  // running writes their blocks); moves gated on the running step last. Every move was planned
  // with the last batch's fence (PlanFence), so sources stay held until all three are done.
  groups_.clear();
  PlanTransferGroups(pager_->offload_moves(), &groups_);
  uint64_t fence = transport_->Submit(groups_, 0);
  pager_->OffloadSubmitted(fence);
  groups_.clear();
  PlanTransferGroups(absl::MakeSpan(moves_), &groups_);
  fence = transport_->Submit(groups_, 0);
  groups_.clear();
  PlanTransferGroups(absl::MakeSpan(gated_moves_), &groups_);
  fence = transport_->Submit(groups_, gate_step);
  moves_.clear();
  gated_moves_.clear();
  return fence;
}

bool Engine::StepForTest() {
  const bool worked = Step();
  if (transport_ && transport_->next_fence() > 1) transport_->WaitFor(transport_->next_fence() - 1);
  return worked;
}

void Engine::ApplyCacheResets() {
  uint64_t asked;
  {
    std::lock_guard<std::mutex> lock(mu_);
    asked = cache_resets_asked_;
    if (asked == cache_resets_done_) return;
  }
  const KvPager::CacheReset freed = pager_->ResetPrefixCache();
  {
    std::lock_guard<std::mutex> lock(mu_);
    last_cache_reset_ = freed;
    cache_resets_done_ = asked;
  }
  PublishStats();
  reset_cv_.notify_all();
}

absl::StatusOr<KvPager::CacheReset> Engine::ResetPrefixCache(absl::Duration timeout) {
  if (pager_ == nullptr || !options_.prefix_caching) {
    return absl::FailedPreconditionError(
        "there is no prefix cache to reset (it needs --kv_mode=kvrm and --prefix_caching, "
        "without --far_history)");
  }
  std::unique_lock<std::mutex> lock(mu_);
  if (stop_) return absl::UnavailableError("the engine is stopping");
  const uint64_t ticket = ++cache_resets_asked_;
  if (!running_) {
    // No engine thread: the reset is done here, under mu_, so that callers before Start() take
    // turns and Start() waits for it.
    const KvPager::CacheReset freed = pager_->ResetPrefixCache();
    last_cache_reset_ = freed;
    cache_resets_done_ = ticket;
    lock.unlock();
    PublishStats();
    return freed;
  }
  cv_.notify_one();
  if (!reset_cv_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                          [&] { return cache_resets_done_ >= ticket || stop_; })) {
    return absl::DeadlineExceededError("the prefix cache reset did not run in time");
  }
  if (cache_resets_done_ < ticket) return absl::UnavailableError("the engine is stopping");
  return last_cache_reset_;
}

bool Engine::Step() {
  ApplyLoraChanges();
  ApplyCacheResets();
  TakePosted();
  const absl::Time now = clock_->Now();
  ExpireDeadlines(now);
  RetireTransfers();
  ResumePaused();
  Admit(now);
  int32_t active = BuildDescriptor();
  bool prefill = PickPrefillChunks();
  // Far history grows a prompt chunk by chunk, which may have paused a slot built above.
  if (bounded_slots()) active = RecountActiveRows();
  if (active == 0 && !prefill) {
    // Nothing to run, but a slot paused above (e.g. swapped out when its compaction found no
    // free extent) may have left moves planned: send them, or their source blocks stay held,
    // it can never resume and the engine idles for good. (Offloads too: evicted blocks.)
    if (MovesPlanned()) required_fence_ = std::max(required_fence_, SubmitTransfers(0));
    PublishStats();
    return false;
  }
  if (MovesPlanned()) required_fence_ = std::max(required_fence_, SubmitTransfers(0));
  const auto step_start = std::chrono::steady_clock::now();
  absl::Duration waited = absl::ZeroDuration();
  if (transport_) {
    if (required_fence_ > transport_->completed()) {
      waited = transport_->WaitFor(required_fence_);
      transport_wait_ += waited;
    }
    // A copy this step reads may have failed since the top of the step (copies planned here, a
    // compaction gated on the last step): its requests end now, before the step reads their
    // undefined KV, and their rows (or chunks) leave the step.
    if (RetireTransfers()) {
      active = RecountActiveRows();
      if (prefill) prefill = KeepPrefillingChunks();
      if (active == 0 && !prefill) {
        PublishStats();
        return true;  // it did work: requests ended
      }
    }
  }
  // Commit: the staged descriptor becomes the one this step reads (the epoch flip).
  committed_ ^= 1;
  ++commits_;
  StepWork work;
  if (prefill) {
    work.chunks = absl::MakeConstSpan(chunks_.data(), num_chunks_);
    work.chunk_logits = absl::MakeConstSpan(chunk_logit_rows_.data(), num_chunks_);
  }
  if (active > 0) {
    work.step = &descriptors_[committed_];
    work.logits = logits_.data();
  }
  // (A pass of several chunks samples nothing on the device, Backend::PrefillChunks: with
  // device sampling they run apart from the decode rows.)
  work.fused = fuse_prefill_ && prefill && work.step && (num_chunks_ == 1 || !device_sampling_);
  for (int32_t k = 0; work.fused && k < num_chunks_; ++k)
    work.fused = backend_->CanFuse(chunks_[k]);
  mixed_steps_ += work.fused;
  prefill_steps_ += prefill;
  prefill_chunks_ += work.chunks.size();
  if (device_sampling_ && work.step != nullptr && MarkDeviceSampling()) {
    work.tokens = sampled_tokens_.data();
  }
  const uint64_t step_id = ++steps_;
  runner_->Launch(work);
  PreStageNext(step_id);
  const StepResult result = runner_->Wait();
  if (transport_) transport_->StepDone(step_id);
  if (pager_ && options_.offload_shed_wait_share > 0) {
    // Offloads are a cache's write-back: where the host link is too slow for them and the
    // steps wait on the transport (they wait for every batch sent before them), evicted
    // blocks are dropped instead, as without offload, until the waits subside.
    const double total =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - step_start).count();
    const double share = total > 0 ? absl::ToDoubleSeconds(waited) / total : 0;
    transport_wait_share_ = 0.95 * transport_wait_share_ + 0.05 * share;
    if (transport_wait_share_ > options_.offload_shed_wait_share) pager_->ShedOffloads(true);
    if (transport_wait_share_ < 0.4 * options_.offload_shed_wait_share) {
      pager_->ShedOffloads(false);
    }
  }
  // What a decode step and a prefill chunk cost, for max_prefill_stall (PrefillTokenBudget):
  // with chunks in the decode pass, every pass that decodes; apart, the two on their own.
  // Speculative decoding reads the fit too (DraftThreshold): a draft is a row like any other.
  int32_t chunk_tokens = 0;
  for (const PrefillChunk& c : work.chunks) chunk_tokens += static_cast<int32_t>(c.tokens.size());
  if (fuse_prefill_ || options_.speculative_tokens > 0) {
    if (active > 0 && result.decode_status.ok()) {
      const int32_t rows = active + descriptors_[committed_].draft_rows();
      step_cost_.Add(rows + (work.fused ? chunk_tokens : 0),
                     absl::ToDoubleSeconds(result.decode_time));
    }
  }
  if (!fuse_prefill_) {
    if (active > 0 && result.decode_status.ok()) {
      const double t = absl::ToDoubleSeconds(result.decode_time);
      // A moving average (weight 1/8).
      decode_step_avg_s_ =
          decode_step_avg_s_ > 0 ? decode_step_avg_s_ + 0.125 * (t - decode_step_avg_s_) : t;
    }
    if (prefill && result.prefill_status.ok() && chunk_tokens > 0) {
      prefill_cost_.Add(chunk_tokens, absl::ToDoubleSeconds(result.prefill_time));
    }
  }
  if (work.fused) {
    observer_->OnMixedStep(active, chunk_tokens, result.decode_time);
  } else {
    if (prefill) observer_->OnPrefillChunk(chunk_tokens, result.prefill_time);
    if (active > 0) observer_->OnDecodeStep(active, result.decode_time);
  }
  if (prefill) FinishPrefillChunks(result);
  if (active > 0) FinishDecode(result);
  PublishStats();
  return true;
}

}  // namespace kvrm
