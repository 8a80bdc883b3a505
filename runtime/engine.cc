#include "runtime/engine.h"

#include <algorithm>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
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

namespace {

double Ms(absl::Duration d) { return absl::ToDoubleMilliseconds(d); }

}  // namespace

absl::StatusOr<std::unique_ptr<Engine>> Engine::Create(const ModelBundle* model,
                                                       const EngineOptions& options) {
  EngineOptions o = options;
  const LlamaConfig& c = model->config;
  if (o.max_context <= 0) o.max_context = c.max_position_embeddings;
  if (o.max_context > c.max_position_embeddings) {
    return absl::InvalidArgumentError(absl::StrCat("--max-context ", o.max_context,
                                                   " exceeds the model's ",
                                                   c.max_position_embeddings));
  }
  if (o.slots <= 0 || o.slots > 1024) {
    return absl::InvalidArgumentError("--slots must be in [1, 1024]");
  }
  if (o.threads <= 0) o.threads = std::max(1u, std::thread::hardware_concurrency());
  if (o.block_tokens <= 0 || o.prefill_chunk <= 0 || o.max_queue < 0 || o.max_runs <= 0) {
    return absl::InvalidArgumentError("block tokens, prefill chunk and max runs must be positive");
  }
  o.max_new_tokens = std::max(1, std::min(o.max_new_tokens, o.max_context));
  auto engine = std::unique_ptr<Engine>(new Engine(model, o));

  const int64_t blocks_per_slot = (o.max_context + o.block_tokens - 1) / o.block_tokens;
  CpuBackendOptions bo;
  bo.kv_blocks = blocks_per_slot * o.slots;
  bo.kv_block_tokens = o.block_tokens;
  bo.max_slots = o.slots;
  bo.max_chunk_tokens = o.prefill_chunk;
  bo.max_context = o.max_context;
  bo.num_threads = o.threads;
  ASSIGN_OR_RETURN(engine->backend_, CpuBackend::Create(c, &model->weights, bo));
  engine->kv_ = std::make_unique<StaticKvAllocator>(
      o.slots, blocks_per_slot, o.block_tokens,
      engine->backend_->kv_pool(0)->shape().BytesPerBlock() * engine->backend_->num_kv_pools());
  engine->PublishStats();
  return engine;
}

Engine::Engine(const ModelBundle* model, const EngineOptions& options)
    : model_(model), options_(options),
      observer_(options.observer ? options.observer : &default_observer_) {
  slots_.resize(options.slots);
  samplers_.reserve(options.slots);
  for (int i = 0; i < options.slots; ++i) {
    samplers_.push_back(std::make_unique<Sampler>(model->config.vocab_size));
  }
  step_.Resize(options.slots, options.max_runs);
  logits_.resize(static_cast<size_t>(options.slots) * model->config.vocab_size);
  eos_ids_ = model->config.eos_token_ids;
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
  thread_ = std::thread([this] { Loop(); });
}

absl::StatusOr<uint64_t> Engine::Submit(std::unique_ptr<GenerationRequest> request) {
  if (request->prompt.empty()) return absl::InvalidArgumentError("prompt: empty");
  if (static_cast<int64_t>(request->prompt.size()) >= options_.max_context) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prompt: ", request->prompt.size(), " tokens leave no room in the context of ",
        options_.max_context));
  }
  if (request->sampling.seed == 0) {
    std::random_device rd;
    request->sampling.seed = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }
  uint64_t handle;
  {
    std::lock_guard<std::mutex> lock(mu_);
    absl::Status refused;
    if (draining_ || stop_) {
      refused = absl::UnavailableError("server is draining");
    } else if (queued_ >= options_.max_queue) {
      refused = absl::ResourceExhaustedError(
          absl::StrCat("queue full (", options_.max_queue, " waiting requests)"));
    }
    if (!refused.ok()) {
      observer_->OnRejected(refused);
      return refused;
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
  for (const Slot& slot : slots_) s.slots_in_use += slot.state != SlotState::kFree;
  s.tokens_generated_total = tokens_generated_;
  s.steps_total = steps_;
  s.kv = kv_->Stats();
  {
    std::lock_guard<std::mutex> lock(mu_);
    s.queue_depth = queued_;
    s.requests_total = requests_total_;
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
      // Wake for posts, or every 20 ms to enforce time limits of queued requests.
      cv_.wait_for(lock, std::chrono::milliseconds(20), [&] {
        return stop_ || !posted_.empty() || !cancels_.empty() || cancel_all_;
      });
    }
  }
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

bool Engine::Step() {
  TakePosted();
  const absl::Time now = absl::Now();
  ExpireDeadlines(now);
  Admit(now);
  bool worked = PrefillOneChunk();
  worked |= DecodeStep();
  if (worked) ++steps_;
  PublishStats();
  return worked;
}

void Engine::TakePosted() {
  std::vector<std::unique_ptr<GenerationRequest>> posted;
  std::vector<uint64_t> cancels;
  bool cancel_all;
  {
    std::lock_guard<std::mutex> lock(mu_);
    posted.swap(posted_);
    cancels.swap(cancels_);
    cancel_all = cancel_all_;
    cancel_all_ = false;
  }
  for (auto& r : posted) waiting_.push_back(std::move(r));
  auto cancelled = [&](uint64_t handle) {
    return cancel_all || std::find(cancels.begin(), cancels.end(), handle) != cancels.end();
  };
  if (cancels.empty() && !cancel_all) return;
  for (int32_t i = 0; i < options_.slots; ++i) {
    if (slots_[i].state != SlotState::kFree && cancelled(slots_[i].request->handle)) {
      FinishSlot(i, FinishReason::kCancelled, {});
    }
  }
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (cancelled((*it)->handle)) {
      std::unique_ptr<GenerationRequest> r = std::move(*it);
      it = waiting_.erase(it);
      FinishQueued(std::move(r), FinishReason::kCancelled);
    } else {
      ++it;
    }
  }
}

void Engine::ExpireDeadlines(absl::Time now) {
  auto expired = [&](const GenerationRequest& r) {
    return r.time_limit > absl::ZeroDuration() && now - r.arrival >= r.time_limit;
  };
  for (int32_t i = 0; i < options_.slots; ++i) {
    if (slots_[i].state != SlotState::kFree && expired(*slots_[i].request)) {
      StreamChunk last;
      if (slots_[i].text) last.text = slots_[i].text->Finish();
      FinishSlot(i, FinishReason::kTimeLimit, std::move(last));
    }
  }
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    if (expired(**it)) {
      std::unique_ptr<GenerationRequest> r = std::move(*it);
      it = waiting_.erase(it);
      FinishQueued(std::move(r), FinishReason::kTimeLimit);
    } else {
      ++it;
    }
  }
}

void Engine::Admit(absl::Time now) {
  for (int32_t i = 0; i < options_.slots && !waiting_.empty(); ++i) {
    if (slots_[i].state != SlotState::kFree) continue;
    // Highest priority first; FCFS within a priority (the deque is in arrival order).
    auto best = waiting_.begin();
    for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
      if ((*it)->priority > (*best)->priority) best = it;
    }
    std::unique_ptr<GenerationRequest> r = std::move(*best);
    waiting_.erase(best);
    {
      std::lock_guard<std::mutex> lock(mu_);
      --queued_;
    }
    Slot& slot = slots_[i];
    const absl::Status grown = kv_->Grow(i, static_cast<int64_t>(r->prompt.size()));
    if (!grown.ok()) {
      // Cannot happen in static mode (Submit bounds the prompt); fail only this request.
      slot.request = std::move(r);
      slot.state = SlotState::kPrefilling;
      FinishSlot(i, FinishReason::kError, {}, "", std::string(grown.message()));
      continue;
    }
    slot.state = SlotState::kPrefilling;
    slot.prefilled = 0;
    slot.position = 0;
    slot.generated = 0;
    slot.admitted = now;
    observer_->OnAdmitted(*r, now - r->arrival);
    samplers_[i]->Reset(r->sampling, r->prompt);
    const Tokenizer* tok = model_->tokenizer.get();
    // The last prompt tokens give the first generated token's text its context.
    const size_t ctx = std::min<size_t>(5, r->prompt.size());
    slot.text = std::make_unique<TextStream>(
        [tok](absl::Span<const int32_t> ids) { return tok->Decode(ids, true); },
        r->stop_sequences,
        std::vector<int32_t>(r->prompt.end() - ctx, r->prompt.end()));
    slot.request = std::move(r);
  }
}

bool Engine::PrefillOneChunk() {
  // The slot admitted first goes first, so prefill is FCFS across slots.
  int32_t pick = -1;
  for (int32_t i = 0; i < options_.slots; ++i) {
    if (slots_[i].state == SlotState::kPrefilling &&
        (pick < 0 || slots_[i].admitted < slots_[pick].admitted)) {
      pick = i;
    }
  }
  if (pick < 0) return false;
  Slot& slot = slots_[pick];
  const std::vector<int32_t>& prompt = slot.request->prompt;
  const int32_t n = std::min<int32_t>(backend_->max_chunk_tokens(),
                                      static_cast<int32_t>(prompt.size()) - slot.prefilled);
  const bool last = slot.prefilled + n == static_cast<int32_t>(prompt.size());
  PrefillChunk chunk;
  chunk.slot = pick;
  chunk.start = slot.prefilled;
  chunk.tokens = absl::MakeConstSpan(prompt).subspan(slot.prefilled, n);
  chunk.runs = step_.SlotRunsData(pick);
  chunk.num_runs = kv_->RunTable(pick, step_.SlotRuns(pick));
  float* logits = &logits_[static_cast<size_t>(pick) * backend_->vocab_size()];
  const absl::Time t0 = absl::Now();
  const absl::Status st = backend_->Prefill(chunk, last ? logits : nullptr);
  observer_->OnPrefillChunk(n, absl::Now() - t0);
  if (!st.ok()) {
    LOG(ERROR) << "prefill failed for " << slot.request->request_id << ": " << st;
    FinishSlot(pick, FinishReason::kError, {}, "", std::string(st.message()));
    return true;
  }
  slot.prefilled += n;
  slot.position = slot.prefilled;
  if (last) {
    slot.state = SlotState::kDecoding;
    const SampleResult s = samplers_[pick]->Sample(
        absl::MakeSpan(logits, backend_->vocab_size()));
    EmitToken(pick, s);
  }
  return true;
}

bool Engine::DecodeStep() {
  int32_t active = 0;
  for (int32_t i = 0; i < options_.slots; ++i) {
    Slot& slot = slots_[i];
    const bool on = slot.state == SlotState::kDecoding;
    step_.active[i] = on;
    if (!on) continue;
    const absl::Status grown = kv_->Grow(i, slot.position + 1);
    if (!grown.ok()) {
      step_.active[i] = 0;
      FinishSlot(i, FinishReason::kError, {}, "", std::string(grown.message()));
      continue;
    }
    step_.position[i] = slot.position;
    step_.token[i] = slot.next_token;
    step_.num_runs[i] = kv_->RunTable(i, step_.SlotRuns(i));
    ++active;
  }
  if (active == 0) return false;
  const absl::Time t0 = absl::Now();
  const absl::Status st = backend_->Decode(step_, logits_.data());
  observer_->OnDecodeStep(active, absl::Now() - t0);
  if (!st.ok()) {
    LOG(ERROR) << "decode step failed: " << st;
    for (int32_t i = 0; i < options_.slots; ++i) {
      if (step_.active[i]) FinishSlot(i, FinishReason::kError, {}, "", std::string(st.message()));
    }
    return true;
  }
  const int32_t vocab = backend_->vocab_size();
  for (int32_t i = 0; i < options_.slots; ++i) {
    if (!step_.active[i]) continue;
    ++slots_[i].position;
    const SampleResult s =
        samplers_[i]->Sample(absl::MakeSpan(&logits_[static_cast<size_t>(i) * vocab], vocab));
    EmitToken(i, s);
  }
  return true;
}

void Engine::EmitToken(int32_t slot_index, const SampleResult& sample) {
  Slot& slot = slots_[slot_index];
  GenerationRequest& r = *slot.request;
  const int32_t token = sample.token;
  samplers_[slot_index]->Accept(token);
  ++slot.generated;
  ++tokens_generated_;
  const absl::Time now = absl::Now();
  if (slot.generated == 1) {
    slot.first_token = now;
    observer_->OnFirstToken(r, now - r.arrival);
  } else {
    observer_->OnNextToken(r, now - slot.last_token);
  }
  slot.last_token = now;
  slot.next_token = token;

  StreamChunk chunk;
  chunk.token_ids.push_back(token);
  if (r.sampling.logprobs) {
    TokenLogprobs lp;
    lp.token = token;
    lp.logprob = sample.logprob;
    lp.num_top = sample.num_top;
    lp.top_ids = sample.top_ids;
    lp.top_logprobs = sample.top_logprobs;
    chunk.logprobs.push_back(lp);
  }
  const bool is_eos =
      !r.ignore_eos && std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end();
  if (is_eos) {
    chunk.text = slot.text->Finish();
    FinishSlot(slot_index, FinishReason::kEos, std::move(chunk));
    return;
  }
  TextStream::Delta delta = slot.text->Push(token);
  chunk.text = std::move(delta.text);
  if (delta.stopped) {
    FinishSlot(slot_index, FinishReason::kStop, std::move(chunk), delta.matched_stop);
    return;
  }
  if (std::find(r.stop_token_ids.begin(), r.stop_token_ids.end(), token) !=
      r.stop_token_ids.end()) {
    chunk.text += slot.text->Finish();
    FinishSlot(slot_index, FinishReason::kStop, std::move(chunk),
               model_->tokenizer->Decode({token}, false));
    return;
  }
  if (slot.generated >= r.max_new_tokens || slot.position + 1 >= options_.max_context) {
    chunk.text += slot.text->Finish();
    FinishSlot(slot_index, FinishReason::kLength, std::move(chunk));
    return;
  }
  r.sink->OnChunk(std::move(chunk));
}

void Engine::FinishSlot(int32_t slot_index, FinishReason reason, StreamChunk last,
                        std::string matched_stop, std::string error) {
  Slot& slot = slots_[slot_index];
  GenerationRequest& r = *slot.request;
  const absl::Time now = absl::Now();
  FinishInfo info;
  info.reason = reason;
  info.matched_stop = std::move(matched_stop);
  info.error = std::move(error);
  info.prompt_tokens = static_cast<int32_t>(r.prompt.size());
  info.completion_tokens = slot.generated;
  info.queue_time_ms = Ms(slot.admitted - r.arrival);
  info.time_to_first_token_ms = slot.generated > 0 ? Ms(slot.first_token - r.arrival) : 0;
  info.total_time_ms = Ms(now - r.arrival);
  observer_->OnFinished(r, info);
  r.sink->OnFinished(std::move(last), info);
  kv_->Release(slot_index);
  slot.state = SlotState::kFree;
  slot.request.reset();
  slot.text.reset();
  // Publish before `outstanding_` drops, so that a WaitIdle() caller sees the freed slot.
  PublishStats();
  std::lock_guard<std::mutex> lock(mu_);
  if (--outstanding_ == 0) idle_cv_.notify_all();
}

void Engine::FinishQueued(std::unique_ptr<GenerationRequest> request, FinishReason reason) {
  FinishInfo info;
  info.reason = reason;
  info.prompt_tokens = static_cast<int32_t>(request->prompt.size());
  info.queue_time_ms = Ms(absl::Now() - request->arrival);
  info.total_time_ms = info.queue_time_ms;
  observer_->OnFinished(*request, info);
  request->sink->OnFinished({}, info);
  std::lock_guard<std::mutex> lock(mu_);
  --queued_;
  if (--outstanding_ == 0) idle_cv_.notify_all();
}

}  // namespace kvrm
