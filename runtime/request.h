// A validated, tokenized generation request as the engine sees it, and the sink its output
// goes to. The server builds these from kvrm.v1 messages (server/request_validation.h).
#ifndef KVRM_RUNTIME_REQUEST_H_
#define KVRM_RUNTIME_REQUEST_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/siphash.h"
#include "runtime/sampler.h"
#include "runtime/structured/grammar.h"

namespace kvrm {

enum class FinishReason { kLength, kEos, kStop, kCancelled, kTimeLimit, kError };

const char* FinishReasonName(FinishReason reason);

struct TokenLogprobs {
  int32_t token = 0;
  float logprob = 0;
  int32_t rank = 0;  // prompt logprobs: 1 + the tokens more likely than this one
  int32_t num_top = 0;
  std::array<int32_t, kMaxTopLogprobs> top_ids;
  std::array<float, kMaxTopLogprobs> top_logprobs;
};

// A sampled or scored token's entry (SampleResult's token, logprob, rank and alternatives).
inline TokenLogprobs ToTokenLogprobs(const SampleResult& s) {
  TokenLogprobs lp;
  lp.token = s.token;
  lp.logprob = s.logprob;
  lp.rank = s.rank;
  lp.num_top = s.num_top;
  lp.top_ids = s.top_ids;
  lp.top_logprobs = s.top_logprobs;
  return lp;
}

// Output produced by one engine step for one request.
struct StreamChunk {
  std::vector<int32_t> token_ids;
  std::string text;
  std::vector<TokenLogprobs> logprobs;  // one per token when asked for
  // GenerationRequest::prompt_logprobs: on the request's first chunk, one entry per prompt
  // token, entry i scoring prompt token i after the tokens before it under the model's raw
  // distribution (no temperature or penalties). Entry 0 has no score (nothing precedes it):
  // logprob 0, no alternatives.
  std::vector<TokenLogprobs> prompt_logprobs;
  // On the request's first chunk (its first token's): the prompt's length in tokens and how
  // many of them came from the prefix cache, as FinishInfo will say; -1 on later chunks.
  int32_t prompt_tokens = -1;
  int32_t cached_prompt_tokens = -1;
  // GenerationRequest::pooling (an embedding request; on its only chunk, the last): the pooled
  // final hidden state, [hidden_size], as the model computed it (not normalized).
  std::vector<float> embedding;
};

struct FinishInfo {
  FinishReason reason = FinishReason::kLength;
  std::string matched_stop;
  std::string error;
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  int32_t cached_prompt_tokens = 0;  // prompt tokens whose KV came from the prefix cache
  double cumulative_logprob = 0;     // a beam search's completion (server/beam_search.h)
  double queue_time_ms = 0;
  double time_to_first_token_ms = 0;
  double total_time_ms = 0;
};

// Where a request's output goes. Called on the engine thread only; must not block (a gRPC
// reactor queues the message and returns). After OnFinished nothing more is called.
class RequestSink {
 public:
  virtual ~RequestSink() = default;
  virtual void OnChunk(StreamChunk chunk) = 0;
  virtual void OnFinished(StreamChunk last, const FinishInfo& info) = 0;
};

// How an embedding request pools the final norm's output over its prompt (sentence-transformers'
// pooling modes, vLLM's PoolingType): kLast, the last token's (decoder embedding models:
// e5-mistral, gte-Qwen2, Qwen3-Embedding); kMean, the mean over every token; kCls, the first
// token's.
enum class Pooling : uint8_t { kNone, kLast, kMean, kCls };

const char* PoolingName(Pooling pooling);
// "last", "mean" or "cls" (PoolingName's); INVALID_ARGUMENT otherwise.
absl::StatusOr<Pooling> ParsePooling(std::string_view name);

// A thinking model's budget for its thinking (vLLM's thinking_token_budget, Anthropic's
// thinking.budget_tokens): once the reply has written `max_tokens` tokens inside its thinking
// blocks (counted from the end of `start` to the end of `end`, over every block), the next
// tokens are `forced` (the block's end), sampled as the only choice; the model then answers.
// Markers are matched as token sequences, as the tokenizer writes them.
struct ThinkingBudget {
  int32_t max_tokens = -1;      // -1: none
  std::vector<int32_t> start;   // opens a block ("<think>")
  std::vector<int32_t> end;     // closes one ("</think>")
  std::vector<int32_t> forced;  // written when the budget is spent: `end`, or more (harmony)
  bool starts_inside = false;   // the prompt opened the first block
};

struct GenerationRequest {
  std::string request_id;
  uint64_t handle = 0;  // assigned by Engine::Submit; used to cancel
  std::vector<int32_t> prompt;
  SamplingConfig sampling;
  int32_t max_new_tokens = 16;
  // Until this many tokens are generated the EOS ids (unless ignore_eos) and stop_token_ids
  // cannot be sampled, and stop_sequences are not matched in their text (vLLM's min_tokens).
  int32_t min_tokens = 0;
  std::vector<std::string> stop_sequences;
  bool include_stop_str_in_output = false;  // the matched stop ends the text instead of being cut
  std::vector<int32_t> stop_token_ids;
  // Special tokens whose text the completion keeps (decoded text skips special tokens): the
  // model's tool-call markers when the request offered tools and they are special tokens.
  std::vector<int32_t> kept_special_tokens;
  bool ignore_eos = false;
  // Score the prompt (vLLM's prompt_logprobs): -1 off; else every prompt token's logprob and
  // this many alternatives (at most kMaxTopLogprobs) come with the first chunk
  // (StreamChunk::prompt_logprobs). Such a prompt is prefilled whole, in chunks of at most
  // kMaxAllLogitsRows tokens, without the prefix cache (its tokens need their logits).
  int32_t prompt_logprobs = -1;
  absl::Duration time_limit = absl::ZeroDuration();  // zero: none
  int32_t priority = 0;
  // Prefix-cache namespace (CacheSaltKey of the request's cache_salt; 0: the shared default):
  // cached KV is shared only between requests with the same key. Engine::Submit folds the LoRA
  // adapter in (LoraCacheKey): an adapter's K/V differ from the base model's.
  uint64_t cache_salt = 0;
  // The LoRA adapter the request runs with, by name (Engine::LoraAdapters; kvrmd
  // --lora_modules, or loaded while serving); "": the base model. Engine::Submit resolves it.
  std::string lora_name;
  // Its slot (StepDescriptor::adapter), set by Engine::Submit; -1: the base model. (A request
  // built with a slot and no name runs with the adapter in that slot.)
  int32_t lora_adapter = -1;
  // Set by Engine::PinLoraAdapter on the request it rewrote (and so on its copies): the load
  // (ServedLoraAdapter::serial) held in the slot for them, which they run with after an unload
  // too, as requests submitted before the unload do; once it is let go of they are refused, not
  // run with another adapter in that slot. 0: not pinned.
  uint64_t lora_pinned_serial = 0;
  // Structured output (null: none): the completion's text must be a whole match of this
  // constraint when it ends. Tokens that cannot continue a match are masked before sampling, the
  // end-of-sequence tokens are allowed only where the text is a whole match, and the completion
  // ends (kStop) as soon as no token can follow. Shared, immutable (runtime/structured).
  std::shared_ptr<const structured::Grammar> grammar;
  ThinkingBudget thinking_budget;
  // An embedding request (kNone: generation): the prompt is prefilled, no token is sampled, and
  // the request ends (kStop, no completion tokens) with its pooled hidden state in the last
  // chunk's `embedding` (Engine::returns_hidden; a device that does not is INVALID_ARGUMENT).
  // kMean and kCls need every prompt row's state: such a prompt is prefilled whole, without the
  // prefix cache; kLast takes cached blocks as a generation prompt does.
  Pooling pooling = Pooling::kNone;
  absl::Time arrival;
  std::shared_ptr<RequestSink> sink;
};

// The prefix-cache key of a cache_salt string: 0 for "", else a 64-bit SipHash under a key drawn
// at start-up (never 0), so that no client can choose a salt whose key is another tenant's (an
// unkeyed hash such as FNV-1a, as this was, lets one compute such a salt).
inline uint64_t CacheSaltKey(std::string_view salt) {
  if (salt.empty()) return 0;
  static const SipKey key = RandomSipKey();
  const uint64_t h = SipHash128(key, salt.data(), salt.size()).lo;
  return h == 0 ? 1 : h;
}

// The prefix-cache key of a request with the LoRA adapter of load number `serial`
// (ServedLoraAdapter::serial) and cache-salt key `salt`: never 0, and another adapter's (or
// another load's) for the same salt only by a 64-bit collision (FNV-1a steps over the serial's
// bytes).
inline uint64_t LoraCacheKey(uint64_t salt, uint64_t serial) {
  uint64_t h = (salt == 0 ? 1469598103934665603ull : salt) ^ 0x4c6f5241ull;  // "LoRA"
  for (int i = 0; i < 8; ++i) h = (h ^ ((serial >> (8 * i)) & 0xff)) * 1099511628211ull;
  return h == 0 ? 1 : h;
}

}  // namespace kvrm

#endif  // KVRM_RUNTIME_REQUEST_H_
