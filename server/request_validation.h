// Turns a kvrm.v1.GenerateRequest into the engine's GenerationRequest, or INVALID_ARGUMENT whose
// message names the offending field ("sampling.top_p: 1.5 is outside (0, 1]").
#ifndef KVRM_SERVER_REQUEST_VALIDATION_H_
#define KVRM_SERVER_REQUEST_VALIDATION_H_

#include <memory>

#include "absl/status/statusor.h"
#include "kvrm/v1/kvrm.pb.h"
#include "model/chat_config.h"
#include "model/tokenizer.h"
#include "runtime/request.h"
#include "runtime/structured/compiler.h"

namespace kvrm {

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

// The request's structured-output constraint compiled by `compiler` (null: refused), or
// INVALID_ARGUMENT naming the field ("structured.json_schema: /properties/age: ...").
absl::StatusOr<std::shared_ptr<const structured::Grammar>> CompileStructuredOutput(
    const v1::StructuredOutput& proto, structured::ConstraintCompiler* compiler);

// `chat`: the model's chat template for GenerateRequest.chat (null: chat requests are refused).
// `structured`: compiles GenerateRequest.structured (null: such requests are refused); it runs
// last, after every cheaper check.
absl::StatusOr<std::unique_ptr<GenerationRequest>> ValidateGenerateRequest(
    const v1::GenerateRequest& proto, const Tokenizer& tokenizer, const RequestLimits& limits,
    const ChatConfig* chat = nullptr, structured::ConstraintCompiler* structured = nullptr);

}  // namespace kvrm

#endif  // KVRM_SERVER_REQUEST_VALIDATION_H_
