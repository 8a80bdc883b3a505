// Fuzzes ValidateGenerateRequest (and the pooling calls' validation: Embed, Classify, Score) on a
// kvrm.v1.GenerateRequest parsed from the input bytes (what a client controls), with the gpt2
// tokenizer and kvrmd-like limits. Invariants on success: the prompt fits the context with room for
// one token, its ids are in the vocabulary, max_new_tokens and the stop conditions are within their
// limits, the time limit is not negative. Chat prompts are rendered with a Llama-3-style template
// that raises on unknown roles and writes tools and tool calls (so their JSON reaches the
// renderer); tool choices that force calls compile their JSON Schema, as a request's own structured
// output does; structured outputs are compiled for the gpt2 vocabulary, with small state limits so
// that one input stays well inside the fuzzer's time limit. A validated beam search has at most
// kMaxBeamWidth beams and none of the fields it refuses. The template is read as a thinking
// model's or not by the input's last byte; a chat's thinking budget is kept only for one that
// thinks, its markers in the vocabulary.
#include <cmath>
#include <cstdint>
#include <memory>

#include "fuzz/fuzz_util.h"
#include "kvrm/v1/kvrm.pb.h"
#include "server/request_validation.h"

namespace {
kvrm::Tokenizer* tokenizer = nullptr;
kvrm::RequestLimits limits;
kvrm::ChatConfig* chat = nullptr;
kvrm::structured::ConstraintCompiler* structured = nullptr;
constexpr char kTemplate[] =
    "{{- bos_token }}{%- if tools %}{%- for t in tools %}{{- t | tojson(indent=1) }}{%- endfor %}"
    "{%- endif %}{%- for message in messages %}"
    "{%- if message['role'] not in ['system', 'user', 'assistant', 'tool'] %}"
    "{{- raise_exception('unknown role: ' + message['role']) }}{%- endif %}"
    "{%- for c in message['tool_calls'] %}{{- c['function']['name'] }}"
    "{{- c['function']['arguments'] | tojson }}{%- endfor %}"
    "{{- message['role'] + ':\\n' + (message['content'] or '') | trim + '<|endoftext|>' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{- 'assistant:\\n' }}{%- endif %}";
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tokenizer = kvrm::fuzz::LoadTokenizer("gpt2").release();
  limits.vocab_size = tokenizer->vocab_size();
  limits.max_context = 1024;
  limits.max_new_tokens = 512;
  limits.max_prompt_bytes = 64 << 10;
  chat = new kvrm::ChatConfig();
  absl::StatusOr<kvrm::ChatTemplate> t = kvrm::ChatTemplate::Parse(kTemplate);
  FUZZ_CHECK(t.ok());
  chat->chat_template = std::make_shared<const kvrm::ChatTemplate>(*std::move(t));
  chat->status = absl::OkStatus();
  chat->bos_token = "<|endoftext|>";
  std::vector<std::optional<std::string>> bytes = tokenizer->TokenContinuationBytes();
  bytes[tokenizer->vocab_size() - 1].reset();  // <|endoftext|> ends the text
  kvrm::structured::CompilerOptions options;
  options.limits.dfa.max_states = 400;
  options.limits.dfa.max_nfa_states = 100000;
  options.max_spec_bytes = 4096;
  options.cache_entries = 16;
  structured = new kvrm::structured::ConstraintCompiler(bytes, options);
  return 0;
}

// The same bytes as an EmbedRequest: on success every input fits the context, its ids are in
// the vocabulary, and it carries the resolved pooling; refusals are INVALID_ARGUMENT.
void CheckEmbed(const uint8_t* data, size_t size) {
  kvrm::v1::EmbedRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return;
  absl::StatusOr<kvrm::EmbedPlan> plan = kvrm::ValidateEmbedRequest(
      request, *tokenizer, limits, kvrm::Pooling::kLast, /*default_normalize=*/true,
      /*hidden_size=*/64);
  if (!plan.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(plan.status()));
    return;
  }
  FUZZ_CHECK(!plan->inputs.empty() &&
             static_cast<int32_t>(plan->inputs.size()) <= limits.max_embed_inputs);
  FUZZ_CHECK(plan->dimensions >= 0 && plan->dimensions <= 64);
  FUZZ_CHECK(plan->pooling != kvrm::Pooling::kNone);
  for (const auto& r : plan->inputs) {
    FUZZ_CHECK(!r->prompt.empty());
    FUZZ_CHECK(static_cast<int64_t>(r->prompt.size()) < limits.max_context);
    for (int32_t id : r->prompt) FUZZ_CHECK(id >= 0 && id < limits.vocab_size);
    FUZZ_CHECK(r->pooling == plan->pooling);
  }
  std::vector<float> v = {3.0f, -4.0f, 0.0f};
  kvrm::FinishEmbedding(plan->dimensions, plan->normalize, &v);
  FUZZ_CHECK(!v.empty() && v.size() <= 3);
}

// The same bytes as a ClassifyRequest and as a ScoreRequest (cross-encoder pairs when the first
// byte is odd, else embedding similarity): on success one engine request per input (per pair,
// or per query and document), each fitting the context (a truncated pair within
// truncate_prompt_tokens) with ids in the vocabulary; refusals are INVALID_ARGUMENT.
void CheckClassifyAndScore(const uint8_t* data, size_t size) {
  auto check_prompt = [](const kvrm::GenerationRequest& r) {
    FUZZ_CHECK(!r.prompt.empty());
    FUZZ_CHECK(static_cast<int64_t>(r.prompt.size()) < limits.max_context);
    for (int32_t id : r.prompt) FUZZ_CHECK(id >= 0 && id < limits.vocab_size);
    FUZZ_CHECK(r.pooling != kvrm::Pooling::kNone);
  };
  kvrm::v1::ClassifyRequest classify;
  if (classify.ParseFromArray(data, static_cast<int>(size))) {
    absl::StatusOr<std::vector<std::unique_ptr<kvrm::GenerationRequest>>> inputs =
        kvrm::ValidateClassifyRequest(classify, *tokenizer, limits);
    if (!inputs.ok()) {
      FUZZ_CHECK(absl::IsInvalidArgument(inputs.status()));
    } else {
      FUZZ_CHECK(static_cast<int32_t>(inputs->size()) == classify.inputs_size());
      for (const auto& r : *inputs) {
        check_prompt(*r);
        FUZZ_CHECK(r->pooling == kvrm::Pooling::kLast);
      }
    }
  }
  kvrm::v1::ScoreRequest score;
  if (size == 0 || !score.ParseFromArray(data, static_cast<int>(size))) return;
  const bool cross = data[0] % 2 == 1;
  absl::StatusOr<kvrm::ScorePlan> plan =
      kvrm::ValidateScoreRequest(score, *tokenizer, limits, cross, kvrm::Pooling::kMean);
  if (!plan.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(plan.status()));
    return;
  }
  FUZZ_CHECK(plan->documents == score.documents_size() && plan->documents > 0);
  FUZZ_CHECK(plan->queries == 1 || plan->queries == plan->documents);
  FUZZ_CHECK(static_cast<int32_t>(plan->inputs.size()) ==
             (cross ? plan->documents : plan->queries + plan->documents));
  for (const auto& r : plan->inputs) {
    check_prompt(*r);
    if (cross && score.truncate_prompt_tokens() > 0) {
      FUZZ_CHECK(static_cast<int64_t>(r->prompt.size()) <= score.truncate_prompt_tokens());
    }
  }
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  CheckEmbed(data, size);
  CheckClassifyAndScore(data, size);
  kvrm::v1::GenerateRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return 0;
  // The template read as a thinking model's (none, think, harmony) by the input's last byte.
  chat->reasoning_format = static_cast<kvrm::ReasoningFormat>(size == 0 ? 0 : data[size - 1] % 3);
  absl::StatusOr<std::unique_ptr<kvrm::GenerationRequest>> r =
      kvrm::ValidateGenerateRequest(request, *tokenizer, limits, chat, structured);
  if (!r.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(r.status()) || absl::IsOutOfRange(r.status()) ||
               absl::IsResourceExhausted(r.status()));
    return 0;
  }
  const kvrm::GenerationRequest& g = **r;
  FUZZ_CHECK(!g.prompt.empty());
  FUZZ_CHECK(static_cast<int64_t>(g.prompt.size()) < limits.max_context);
  for (int32_t id : g.prompt) FUZZ_CHECK(id >= 0 && id < limits.vocab_size);
  FUZZ_CHECK(g.max_new_tokens >= 1 && g.max_new_tokens <= limits.max_new_tokens);
  FUZZ_CHECK(static_cast<int32_t>(g.stop_sequences.size()) <= limits.max_stop_sequences);
  for (const std::string& s : g.stop_sequences) {
    FUZZ_CHECK(!s.empty() && static_cast<int32_t>(s.size()) <= limits.max_stop_sequence_bytes);
  }
  FUZZ_CHECK(static_cast<int32_t>(g.stop_token_ids.size()) <= limits.max_stop_token_ids);
  for (int32_t id : g.stop_token_ids) FUZZ_CHECK(id >= 0 && id < limits.vocab_size);
  FUZZ_CHECK(g.time_limit >= absl::ZeroDuration());
  if (request.has_beam_search()) {
    // Beam search validated: its width fits the logprobs it reads, and nothing it cannot honour
    // came through.
    FUZZ_CHECK(request.n() <= kvrm::kMaxBeamWidth);
    FUZZ_CHECK(g.stop_sequences.empty() && g.stop_token_ids.empty() && g.min_tokens == 0);
    FUZZ_CHECK(!request.has_structured() && !g.sampling.logprobs && g.prompt_logprobs < 0);
    FUZZ_CHECK(std::isfinite(request.beam_search().length_penalty()));
  }
  const bool forced =
      request.has_chat() && request.chat().has_tool_choice() &&
      (request.chat().tool_choice().has_function() ||
       request.chat().tool_choice().mode() == kvrm::v1::TOOL_CHOICE_MODE_REQUIRED);
  FUZZ_CHECK((request.has_structured() || forced) == (g.grammar != nullptr));
  // Whatever validated, the tool-calling settings are decided without a crash.
  for (const bool harmony : {false, true}) {  // (gpt-oss's calls: REQUIRED / named read as auto)
    absl::StatusOr<std::optional<kvrm::ToolCalling>> tools =
        kvrm::ToolCallingFromProto(request, kvrm::ToolCallFormat::kHermes, limits, harmony);
    FUZZ_CHECK(tools.ok() || absl::IsInvalidArgument(tools.status()));
    absl::StatusOr<std::optional<kvrm::StructuredField>> constraint =
        kvrm::RequestConstraint(request, limits, harmony);
    FUZZ_CHECK(constraint.ok() && constraint->has_value() == (g.grammar != nullptr));
  }
  if (g.grammar != nullptr) {
    FUZZ_CHECK(g.grammar->vocab_size() == limits.vocab_size);
    FUZZ_CHECK(!g.grammar->terminal(g.grammar->start()));
  }
  // A thinking budget is kept for a chat to a model that thinks, with markers the engine takes.
  const kvrm::ThinkingBudget& budget = g.thinking_budget;
  const bool budgeted = request.has_chat() && request.chat().has_thinking_budget() &&
                        chat->reasoning_format != kvrm::ReasoningFormat::kNone;
  FUZZ_CHECK(budgeted == (budget.max_tokens >= 0));
  if (budgeted) {
    FUZZ_CHECK(budget.max_tokens == request.chat().thinking_budget() && !request.has_beam_search());
    FUZZ_CHECK(!budget.start.empty() && !budget.end.empty() && !budget.forced.empty());
    for (const std::vector<int32_t>* seq : {&budget.start, &budget.end, &budget.forced}) {
      for (int32_t id : *seq) FUZZ_CHECK(id >= 0 && id < limits.vocab_size);
    }
  }
  return 0;
}
