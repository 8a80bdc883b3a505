// OpenAI's harmony response format (gpt-oss): a reply is a sequence of messages, each a header
// and a body,
//   <|channel|>analysis<|message|>...thinking...<|end|>
//   <|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>
//       {"city": "Oslo"}<|call|>
//   <|start|>assistant<|channel|>final<|message|>...the answer...<|return|>
// (the first message's "<|start|>assistant" is the prompt's last text; <|return|> and <|call|>
// end the reply: they are the model's stop tokens). The channel says who a body is for:
// analysis is the model's reasoning, final the answer, commentary a preamble to the user or,
// with a recipient ("to=functions.NAME" in the header, before or after the channel), a call of
// the offered function NAME whose body is its JSON arguments.
//
// HarmonyStream splits a completion's text, its harmony markers kept (they are special tokens:
// the request keeps them in the decoded text), as it streams: analysis bodies (and bodies for
// recipients other than functions.*, the built-in browser and python tools, which kvrm does not
// run) become reasoning; final and recipient-less commentary bodies become content; a function
// call becomes, when the request offered tools, its Hermes markup in the content,
//   <tool_call>\n{"name": "NAME", "arguments": BODY}\n</tool_call>
// so the tool-call stream of the Hermes format (model/tool_calls.h) parses and streams it like any
// other call; without tools, reasoning. Headers and markers are never output; a side's second
// and later bodies begin on a new line. A reply that does not begin with a harmony header (a
// model that ignores the format) is all content.
//
// Pure and allocation-bounded by its input; never throws.
#ifndef KVRM_MODEL_HARMONY_H_
#define KVRM_MODEL_HARMONY_H_

#include <initializer_list>
#include <string>
#include <string_view>

namespace kvrm {

// The harmony markers (gpt-oss's special tokens, which requests keep): each by name, for what
// writes or matches them (the thinking budget's markers, structured outputs' harmony prefix), and
// all of them, as HarmonyStream reads them.
inline constexpr std::string_view kHarmonyStart = "<|start|>";
inline constexpr std::string_view kHarmonyChannel = "<|channel|>";
inline constexpr std::string_view kHarmonyMessage = "<|message|>";
inline constexpr std::string_view kHarmonyEnd = "<|end|>";
inline constexpr std::string_view kHarmonyCall = "<|call|>";
inline constexpr std::string_view kHarmonyReturn = "<|return|>";
inline constexpr std::string_view kHarmonyConstrain = "<|constrain|>";
inline constexpr std::string_view kHarmonyMarkers[] = {
    kHarmonyStart, kHarmonyChannel, kHarmonyMessage,  kHarmonyEnd,
    kHarmonyCall,  kHarmonyReturn,  kHarmonyConstrain};
// `parts` joined (markers and text: "<|channel|>" "final" "<|message|>").
std::string HarmonyText(std::initializer_list<std::string_view> parts);

// Whether a chat template writes harmony messages (gpt-oss's: "<|channel|>" and "<|message|>").
bool IsHarmonyTemplate(std::string_view template_source);

class HarmonyStream {
 public:
  // `tool_calls`: the request offered tools (auto mode), so function calls become Hermes markup
  // in the content.
  explicit HarmonyStream(bool tool_calls);

  struct Split {
    std::string reasoning;
    std::string content;
  };
  // The next text of the completion (markers included), split.
  Split Feed(std::string_view text);
  // The completion ended: the held text released; a call whose <|call|> never came is closed.
  Split Finish();

  // Whether the text fed last is not the answer: a header, reasoning, or a call.
  // (Before the reply's first text shows whether it is harmony at all: no.)
  bool reasoning() const {
    return state_ != State::kFirst && state_ != State::kPlain &&
           (state_ != State::kBody || kind_ != Kind::kContent);
  }
  // Whether the reply's text so far does not yet show whether it is harmony (its first text, a
  // prefix of a header's beginning).
  bool undecided() const { return state_ == State::kFirst; }
  // The function calls begun so far (Hermes markup given out).
  int calls() const { return calls_; }

 private:
  enum class State { kFirst, kHeader, kBody, kBetween, kPlain };
  enum class Kind { kReasoning, kContent, kCall };

  // Moves through pending_ as far as it can; `final`: no more text comes.
  void Run(Split& out, bool final);
  // `header` (before <|message|>) decides the body's kind (and opens a call).
  void StartBody(std::string_view header, Split& out);
  void EndBody(Split& out);
  // A body's text to its side (a call's to the content), after a new line where it is the
  // side's second body.
  void Append(std::string_view text, Split& out);

  const bool tool_calls_;
  State state_ = State::kFirst;
  Kind kind_ = Kind::kContent;
  std::string pending_;  // text not yet consumed
  int calls_ = 0;
  bool reasoning_given_ = false, content_given_ = false;  // text given out to each side
  bool separate_ = false;  // the current body's first text goes after a new line
};

}  // namespace kvrm

#endif  // KVRM_MODEL_HARMONY_H_
