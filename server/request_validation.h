// Turns a kvrm.v1.GenerateRequest into the engine's GenerationRequest, or INVALID_ARGUMENT whose
// message names the offending field ("sampling.top_p: 1.5 is outside (0, 1]").
#ifndef KVRM_SERVER_REQUEST_VALIDATION_H_
#define KVRM_SERVER_REQUEST_VALIDATION_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kvrm/v1/kvrm.pb.h"
#include "model/chat_config.h"
#include "model/tokenizer.h"
#include "model/tool_calls.h"
#include "runtime/request.h"
#include "runtime/sampler.h"
#include "runtime/structured/compiler.h"

namespace kvrm {

// Beam search's most beams (GenerateRequest.beam_search with n): each step scores every beam's
// top 2n tokens, and a request's logprobs carry at most kMaxTopLogprobs alternatives.
inline constexpr int32_t kMaxBeamWidth = kMaxTopLogprobs / 2;

struct RequestLimits {
  int32_t vocab_size = 0;
  int32_t max_context = 0;
  int32_t max_new_tokens = 0;
  int64_t max_prompt_bytes = 1 << 20;
  int32_t max_stop_sequences = 16;
  int32_t max_stop_sequence_bytes = 256;
  int32_t max_stop_token_ids = 64;
  int32_t max_n = 16;  // completions per request (GenerateRequest.n)
  int32_t max_chat_messages = 1024;
  int32_t max_tools = 128;                 // chat.tools, and tool_calls per message
  int32_t max_tool_json_bytes = 64 << 10;  // one tool's parameters, one call's arguments,
                                           // template_kwargs
  int32_t max_embed_inputs = 2048;         // EmbedRequest.inputs (OpenAI's bound)
  // chat.thinking_budget of a chat request that sets none (kvrmd --thinking_budget); -1: none.
  int32_t default_thinking_budget = -1;
};

// The prompt text of a chat prompt: its messages checked (INVALID_ARGUMENT naming
// "chat.messages[i].role" ...), then rendered by `chat` (null: refused).
absl::StatusOr<std::string> RenderChatPrompt(const v1::ChatPrompt& prompt, const ChatConfig* chat,
                                             const RequestLimits& limits);

// The constraint of `proto` as the compiler takes it, and the field its errors name
// ("structured.regex"); INVALID_ARGUMENT when no constraint is set.
struct StructuredField {
  structured::ConstraintSpec spec;
  const char* field = "structured";
};
absl::StatusOr<StructuredField> StructuredSpecFromProto(const v1::StructuredOutput& proto);

// A chat prompt's tools, checked (INVALID_ARGUMENT naming "chat.tools[i].name" ...).
absl::StatusOr<std::vector<ToolSpec>> ToolsFromProto(const v1::ChatPrompt& chat,
                                                     const RequestLimits& limits);

// How a request's reply is read for function calls: only for a chat prompt with tools and a
// tool_choice other than NONE.
struct ToolCalling {
  bool parse = true;  // false for NONE: the tools are shown, the reply is text
  ToolCallStream::Mode mode = ToolCallStream::Mode::kAuto;
  std::string function;  // kNamed
  bool single_call = false;  // chat.parallel_tool_calls false
  std::vector<ToolSpec> tools;  // kAuto: the offered functions (their schemas type the values
                                // of the XML-like formats)
  int choice = 0;        // for metrics: 0 auto, 1 none, 2 required, 3 function
};
// nullopt without tools. AUTO on a server whose model has no tool-call format is
// INVALID_ARGUMENT, as is REQUIRED or a named function without tools. `harmony` (a gpt-oss
// server): REQUIRED and a named function are read as AUTO calls (HarmonyStream hands them over),
// the constraint making the call.
absl::StatusOr<std::optional<ToolCalling>> ToolCallingFromProto(const v1::GenerateRequest& proto,
                                                                ToolCallFormat format,
                                                                const RequestLimits& limits,
                                                                bool harmony = false);

// The constraint the request's reply is held to: its own `structured`, or the one a
// tool_choice of REQUIRED or a named function implies (a JSON Schema built from the tools, its
// errors naming "chat.tool_choice"; `harmony`, a gpt-oss chat request: the call in gpt-oss's own
// form, ConstraintSpec::Kind::kHarmonyToolCalls); nullopt when neither. Both at once is
// INVALID_ARGUMENT.
absl::StatusOr<std::optional<StructuredField>> RequestConstraint(const v1::GenerateRequest& proto,
                                                                 const RequestLimits& limits,
                                                                 bool harmony = false);

// `field`'s constraint compiled by `compiler` (null: refused), or INVALID_ARGUMENT naming the
// field ("structured.json_schema: /properties/age: ...").
absl::StatusOr<std::shared_ptr<const structured::Grammar>> CompileConstraint(
    const StructuredField& field, structured::ConstraintCompiler* compiler);
// The same for a StructuredOutput message.
absl::StatusOr<std::shared_ptr<const structured::Grammar>> CompileStructuredOutput(
    const v1::StructuredOutput& proto, structured::ConstraintCompiler* compiler);

// Whether the request's constraint holds only the answer after a thinking block: a chat request
// to a model that thinks (chat->reasoning_format kThink) or writes harmony messages (kHarmony:
// the answer is the final message's text), without structured.include_thinking.
bool ConstraintFollowsThinking(const v1::GenerateRequest& proto, const ChatConfig* chat);
// Whether the request is a chat request to a model that writes harmony messages (gpt-oss).
bool IsHarmonyChat(const v1::GenerateRequest& proto, const ChatConfig* chat);

// `chat`: the model's chat template for GenerateRequest.chat (null: chat requests are refused).
// `structured`: compiles GenerateRequest.structured or the constraint of chat.tool_choice (null:
// such requests are refused); it runs last, after every cheaper check.
// A chat prompt to a model that thinks (chat->reasoning_format kThink) sets `*thinking`: kInside
// when the rendered prompt opened the <think> block, else kMayOpen; to one that writes harmony
// messages, kHarmony (kNone otherwise; may be null). Its constraint then holds the answer after
// the thinking (or the analysis), not the thinking.
absl::StatusOr<std::unique_ptr<GenerationRequest>> ValidateGenerateRequest(
    const v1::GenerateRequest& proto, const Tokenizer& tokenizer, const RequestLimits& limits,
    const ChatConfig* chat = nullptr, structured::ConstraintCompiler* structured = nullptr,
    structured::ConstraintSpec::Thinking* thinking = nullptr);

// An EmbedRequest checked: one GenerationRequest per input (prompt, pooling, priority, salt,
// adapter; the caller sets request ids), and how the vectors are finished.
struct EmbedPlan {
  std::vector<std::unique_ptr<GenerationRequest>> inputs;
  Pooling pooling = Pooling::kLast;
  bool normalize = true;
  int32_t dimensions = 0;  // 0: all
};
// INVALID_ARGUMENT naming the field ("inputs[2].token_ids", "dimensions"). The defaults are the
// server's (ModelInfo.pooling, embedding_normalize); `hidden_size` bounds `dimensions`.
absl::StatusOr<EmbedPlan> ValidateEmbedRequest(const v1::EmbedRequest& proto,
                                               const Tokenizer& tokenizer,
                                               const RequestLimits& limits, Pooling default_pooling,
                                               bool default_normalize, int32_t hidden_size);

// A ClassifyRequest checked: one last-token-pooled GenerationRequest per input, as Embed's are
// (the same fields, the same errors).
absl::StatusOr<std::vector<std::unique_ptr<GenerationRequest>>> ValidateClassifyRequest(
    const v1::ClassifyRequest& proto, const Tokenizer& tokenizer, const RequestLimits& limits);

// A ScoreRequest checked. Cross-encoder: inputs[d] is document d's pair with its query (joined by
// Tokenizer::JoinPair, last-token pooled). Embedding similarity: inputs are the queries, then the
// documents, each tokenized and pooled (`pooling`) as Embed's text inputs are.
struct ScorePlan {
  std::vector<std::unique_ptr<GenerationRequest>> inputs;
  bool cross_encoder = false;
  int32_t queries = 0;  // 1, or one per document
  int32_t documents = 0;
};
absl::StatusOr<ScorePlan> ValidateScoreRequest(const v1::ScoreRequest& proto,
                                               const Tokenizer& tokenizer,
                                               const RequestLimits& limits, bool cross_encoder,
                                               Pooling pooling);

// A pooled vector as the client gets it: its first `dimensions` components (0: all), then, with
// `normalize`, divided by their L2 norm (computed in double; a zero vector stays zero).
void FinishEmbedding(int32_t dimensions, bool normalize, std::vector<float>* v);

}  // namespace kvrm

#endif  // KVRM_SERVER_REQUEST_VALIDATION_H_
