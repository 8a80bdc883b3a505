// Reasoning output: models that think before they answer (DeepSeek-R1, Qwen3, QwQ) write their
// thinking between <think> and </think>, then the answer. kvrmd separates the two for chat
// requests (vLLM's --reasoning-parser, OpenAI's reasoning_content): the thinking streams as
// GenerateResponse.reasoning_text, the answer as text, and only the answer is read for tool calls.
//
// Where the thinking starts depends on the chat template: Qwen3's lets the model write <think>
// itself (and, with enable_thinking false, writes an empty <think></think> block into the prompt
// so the reply is all answer); DeepSeek-R1's and newer Qwen3 thinking models' write "<think>\n"
// at the end of the prompt, so the reply starts inside the thinking. The prompt's own text says
// which (PromptOpensReasoning), so one parser serves every such model.
//
// Pure and allocation-bounded by its input; never throws.
#ifndef KVRM_MODEL_REASONING_H_
#define KVRM_MODEL_REASONING_H_

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace kvrm {

// kHarmony: gpt-oss's harmony messages (analysis channel = reasoning; model/harmony.h).
enum class ReasoningFormat { kNone, kThink, kHarmony };

// "none", or "think" (also under vLLM's names for the same markup: "deepseek_r1", "qwen3"), or
// "harmony" (vLLM's "openai_gptoss"); INVALID_ARGUMENT naming the accepted ones.
absl::StatusOr<ReasoningFormat> ReasoningFormatFromName(std::string_view name);
std::string_view ReasoningFormatName(ReasoningFormat format);

// The format a chat template writes: kHarmony when it writes harmony messages (gpt-oss's
// "<|channel|>" and "<|message|>"); kThink when its text closes a thinking block ("</think>"),
// as the templates of reasoning models do to drop past turns' thinking; else kNone.
ReasoningFormat DetectReasoningFormat(std::string_view template_source);

inline constexpr std::string_view kThinkStart = "<think>";
inline constexpr std::string_view kThinkEnd = "</think>";

// Whether a prompt ending in `prompt_tail` (its last tokens' text, special tokens kept) leaves
// the reply inside a thinking block: its last <think> comes after its last </think>.
bool PromptOpensReasoning(std::string_view prompt_tail);

// One completion's text split into thinking and answer as it streams. Before the thinking
// starts, a reply that begins (after whitespace) with <think> enters it; any other text is
// answer, and the reply has no thinking. Inside, everything up to </think> is thinking (without
// the markers, and without the newlines next to them, as the chat templates strip them when they
// show a past turn); everything after it is answer, its leading whitespace dropped. Text that
// may begin a marker is held back until it is known not to (at most the marker's length).
class ReasoningStream {
 public:
  // `starts_inside`: the prompt opened the thinking block (PromptOpensReasoning).
  explicit ReasoningStream(bool starts_inside);

  struct Split {
    std::string reasoning;
    std::string content;
  };
  // The next text of the completion (markers included), split.
  Split Feed(std::string_view text);
  // The completion ended: the held text released (a reply cut off while thinking is all
  // thinking).
  Split Finish();

  // Whether the reply is (still) inside its thinking block.
  bool reasoning() const { return state_ == State::kReasoning; }

 private:
  enum class State { kStart, kReasoning, kContent };

  void FeedStart(Split& out);
  void FeedReasoning(Split& out);
  void FeedContent(Split& out);
  // Thinking text into out.reasoning, the newlines next to the markers dropped; `last`: the
  // block ends after it.
  void EmitThinking(std::string_view text, bool last, Split& out);

  State state_;
  std::string pending_;           // text not yet given out
  bool reasoning_begun_ = false;  // kReasoning: thinking text other than newlines given out
  std::string newlines_;          // kReasoning: newlines held until text follows them
  bool content_begun_ = false;    // kContent after </think>: text other than whitespace given out
};

}  // namespace kvrm

#endif  // KVRM_MODEL_REASONING_H_
