// Human-readable and JSON renderings of kvrm.v1 messages for kvrm_cli.
#ifndef KVRM_TOOLS_CLI_FORMAT_H_
#define KVRM_TOOLS_CLI_FORMAT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "google/protobuf/message.h"
#include "kvrm/v1/kvrm.pb.h"

namespace kvrm::cli {

// One line of JSON (no trailing newline) with the proto's own field names and every field, defaults
// included, so scripts see a fixed schema.
absl::StatusOr<std::string> ToJsonLine(const google::protobuf::Message& message);

// "LENGTH" for FINISH_REASON_LENGTH.
std::string FinishReasonName(v1::FinishReason reason);

// The generate summary line (no trailing newline), e.g. "finish=LENGTH prompt_tokens=5
// completion_tokens=64 queue_ms=0.1 ttft_ms=12.0 total_ms=400.0 tokens/s=160.0". tokens/s counts
// completion tokens over the whole time since arrival.
// "off", or "on, H of Q prompt tokens hit (P%), N blocks cached, E evicted".
std::string FormatPrefixCache(const v1::PrefixCacheInfo& prefix_cache);
// "3 constraints cached (1.2 MiB); 4 compiled (1 refused) in 0.12 s, 9 cache hits".
std::string FormatStructuredOutput(const v1::StructuredOutputInfo& info);
// "off", or the draft length, n-gram range and how many draft tokens were accepted.
std::string FormatSpeculativeDecoding(const v1::SpeculativeDecodingInfo& info);
std::string FormatSummary(const v1::Finished& finished);
// One "tool call NAME ARGUMENTS (ID)" line per function call of a reply; "" without calls.
std::string FormatToolCalls(const v1::Finished& finished);

// One line per generated token: id, logprob and the top alternatives.
std::string FormatLogprobs(absl::Span<const v1::TokenLogprob> logprobs);
// GenerateResponse.prompt_logprobs: a line per prompt token (the first unscored), then
// "prompt: N tokens scored, logprob sum S, perplexity P" (P = exp(-S / N)).
std::string FormatPromptLogprobs(absl::Span<const v1::TokenLogprob> logprobs);

// The tokenize result: ids on one line, or with `pieces` one "index id piece" line per token, the
// piece quoted with control characters escaped.
std::string FormatTokens(const v1::TokenizeResponse& response, bool pieces);

// ModelInfo and ServerInfo as two aligned "key  value" sections.
std::string FormatInfo(const v1::ModelInfo& model, const v1::ServerInfo& server);

}  // namespace kvrm::cli

#endif  // KVRM_TOOLS_CLI_FORMAT_H_
