// Hugging Face chat templates: the Jinja2 string in tokenizer_config.json's `chat_template` that
// turns a list of messages into the prompt text, rendered as transformers renders it
// (ImmutableSandboxedEnvironment with trim_blocks=True, lstrip_blocks=True, loopcontrols, and
// its own tojson = json.dumps(ensure_ascii=False)).
//
// Supported: the Jinja2 subset real chat templates use (Llama 2/3/3.x, Mistral, ChatML/Qwen,
// Gemma, Phi-3, Zephyr, DeepSeek): {{ }}, {% %}, {# #}, whitespace control (-, +), raw;
// if/elif/else, for (tuple targets, inline if, else, loop.*), break/continue, set (name, tuple,
// ns.attr, block), macro, generation, filter blocks; literals, attribute/item/slice access, calls
// with keyword arguments, the common filters (min, max, unique and dictsort among them), tests,
// string/dict methods (str.format without format specs), and the globals raise_exception,
// namespace, strftime_now, range, dict; and one filter Jinja lacks, from_json (JSON text to a
// value, as llama.cpp's engine has it, for DeepSeek V3.2's and V4's templates). Unsupported
// constructs (call blocks, include/extends/import, recursive loops, ...) are parse errors that
// name them. All 70 real models' templates parse (//model:chat_template_corpus_test).
//
// Context: messages (a list of {role, content} and, when set, tool_calls, tool_call_id and name,
// as transformers and vLLM pass OpenAI-style messages; an assistant turn with tool calls and no
// content has content none, as transformers passes it, and when the template fails on a none
// the render is done again with "" there, as vLLM passes it), add_generation_prompt, bos_token,
// eos_token, tools (a list, or none when no tools are given, as transformers passes it),
// documents (none), and the extra variables. Other names are undefined: empty when rendered,
// falsy, `is defined` false, and (more leniently than Jinja) their attributes and items are
// undefined too.
//
// Known gaps: lower/upper/title/capitalize map ASCII letters only; tuples are lists (rendered
// [a, b]); dict keys are strings (ByteDance Seed-OSS's integer keys fail); integers are int64
// (overflow is an error); no `%` string formatting, format specs, loop.cycle, or macro
// varargs/caller.
//
// Untrusted input: the template comes with a model directory, the messages from clients. Every
// failure is an INVALID_ARGUMENT status (never a crash or an exception); parse nesting, output
// size, loop iterations, evaluation work and recursion are all bounded (see the constants).
//
// Thread safety: a parsed ChatTemplate is immutable; Render is const and may run on any number
// of threads at once. Render recurses at most kMaxEvalDepth levels (under 0.5 MiB of stack).
#ifndef KVRM_MODEL_CHAT_TEMPLATE_H_
#define KVRM_MODEL_CHAT_TEMPLATE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace kvrm {

namespace jinja {
struct Program;
}  // namespace jinja

// A function call an assistant turn made (OpenAI's message.tool_calls[i]).
struct ChatToolCall {
  std::string id;         // the dict has no "id" when empty
  std::string name;
  std::string arguments;  // a JSON object as text; empty: {}
};

struct ChatMessage {
  std::string role;
  std::string content;
  // The template sees each as {"id", "type": "function", "function": {"name", "arguments"}} with
  // the arguments parsed into a dict (templates write them with tojson; vLLM parses them too).
  // With calls and no content, content is none (as OpenAI clients send it).
  std::vector<ChatToolCall> tool_calls;
  std::string tool_call_id;  // role "tool": the call this answers; absent from the dict when empty
  std::string name;          // absent from the dict when empty
  // An assistant turn's reasoning: the dict's reasoning_content and thinking (gpt-oss's
  // template reads `thinking`); absent when empty.
  std::string reasoning_content;
};

struct ChatTemplateInputs {
  std::vector<ChatMessage> messages;
  // The functions the model may call, each a JSON object as text (OpenAI's
  // {"type": "function", "function": {"name", "description", "parameters"}}); empty: tools is
  // none.
  std::vector<std::string> tools;
  // More template variables (vLLM's chat_template_kwargs, e.g. {"enable_thinking": false}): a JSON
  // object as text, or empty. Its keys are set after the standard ones and may not replace them.
  std::string extra_variables;
  bool add_generation_prompt = true;
  std::string bos_token;
  std::string eos_token;
  absl::Time now = absl::Now();                      // strftime_now()
  absl::TimeZone time_zone = absl::LocalTimeZone();  // strftime_now() formats `now` in it
};

class ChatTemplate {
 public:
  // Bounds (a template or input past one fails cleanly with INVALID_ARGUMENT).
  static constexpr size_t kMaxOutputBytes = size_t{4} << 20;  // also any one string value
  static constexpr int64_t kMaxLoopIterations = 1'000'000;    // all loops of one render
  static constexpr int64_t kMaxRange = 100'000;               // range() length (Jinja sandbox)
  static constexpr int64_t kMaxWork = int64_t{256} << 20;     // bytes made (strings, lists, output)
  static constexpr int kMaxParseDepth = 100;                  // expression / block nesting
  static constexpr int kMaxEvalDepth = 400;                   // evaluator recursion
  static constexpr int kMaxCallDepth = 20;                    // macro calls
  static constexpr size_t kMaxSourceBytes = size_t{1} << 20;

  // Parses the template; INVALID_ARGUMENT "chat_template: line L col C: ..." on a syntax error
  // or an unsupported construct (named).
  static absl::StatusOr<ChatTemplate> Parse(std::string_view source);

  // Renders. raise_exception("msg") in the template -> INVALID_ARGUMENT whose message is msg;
  // evaluation errors -> INVALID_ARGUMENT "chat_template: line L: ...".
  absl::StatusOr<std::string> Render(const ChatTemplateInputs& inputs) const;

 private:
  explicit ChatTemplate(std::shared_ptr<const jinja::Program> program)
      : program_(std::move(program)) {}

  std::shared_ptr<const jinja::Program> program_;
};

}  // namespace kvrm

#endif  // KVRM_MODEL_CHAT_TEMPLATE_H_
