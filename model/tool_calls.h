// Function calling (OpenAI's tools): the formats models write their calls in, the parsers that
// read calls out of a completion, and the filter that keeps call text out of the streamed reply.
//
// A chat request lists the functions the model may call (GenerateRequest.chat.tools); the chat
// template shows them to the model, and the model answers with text, or with calls written in
// its own format (vLLM's --tool-call-parser names the same formats):
//   hermes       <tool_call>{"name": "f", "arguments": {...}}</tool_call>, one block per call,
//                after optional text (Hermes 2/3, Qwen 2.5 / 3, and kvrm's built-in model)
//   llama3_json  {"name": "f", "parameters": {...}} as the whole reply, calls separated by ";",
//                optionally after <|python_tag|> (Llama 3.1 / 3.2 / 3.3 JSON tool calling)
//   mistral      [TOOL_CALLS][{"name": "f", "arguments": {...}}, ...] (Mistral v0.3, Nemo), or
//                [TOOL_CALLS]f[ARGS]{...} for each call (v11+ tokenizers: Mistral Small 3.2,
//                Devstral, Ministral 3, Magistral)
//   granite      <|tool_call|>[{"name": "f", "arguments": {...}}, ...] (Granite 3.x)
//   qwen3_coder  <tool_call><function=f><parameter=city>Lima</parameter>...</function></tool_call>
//                (Qwen3-Coder, Qwen3.5, Nemotron 3 Nano, Step 3.5), one value a parameter
//   glm45        <tool_call>f<arg_key>city</arg_key><arg_value>Lima</arg_value>...</tool_call>
//                (GLM-4.5 / 4.6 / 4.7, Ling 3, Laguna)
//   minimax_m2   <minimax:tool_call><invoke name="f"><parameter name="city">Lima</parameter>
//                </invoke></minimax:tool_call> (MiniMax-M2)
//   deepseek_v3  <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{...}<｜tool▁call▁end｜>
//                ...<｜tool▁calls▁end｜> (DeepSeek V3.1; also R1's and V3's
//                "function<｜tool▁sep｜>f" then the arguments in a ```json fence)
//   minimax      <tool_calls>{"name": "f", "arguments": {...}} one a line</tool_calls>
//   (MiniMax-M1),
//                or a JSON array of them inside (Apriel 1.5 / 1.6)
//   deepseek_v32 DeepSeek's DSML: <｜DSML｜function_calls> (V3.2; V4: <｜DSML｜tool_calls>) holding
//                <｜DSML｜invoke name="f"><｜DSML｜parameter name="city" string="true">Lima
//                </｜DSML｜parameter></｜DSML｜invoke>, string="false" on values written as JSON
//   kimi_k2      <|tool_calls_section_begin|><|tool_call_begin|>functions.f:0
//                <|tool_call_argument_begin|>{...}<|tool_call_end|>...<|tool_calls_section_end|>
//   pythonic     [f(city="Lima", days=3), g()] as the whole reply: a Python list of calls with
//                literal keyword arguments (Llama 3.2's pythonic template, Llama 4, ToolACE),
//                optionally inside <|python_start|> ... <|python_end|> (Llama 4);
//                model/pythonic_calls.h reads the literals into JSON
// The XML-like formats (qwen3_coder, glm45, minimax_m2, deepseek_v32) write each parameter's
// value as text: it is read by the function's JSON Schema (ToolParamTypes), or by DSML's
// string="true|false": a parameter typed "string" keeps its text, "integer" / "number" /
// "boolean" values are read as such (True and False too, as Python's str() writes them),
// anything else as JSON when it parses, else as text.
// With tool_choice "required" or a named function the model's format does not matter: the reply
// is constrained (structured outputs) to a JSON array of {"name", "parameters"} objects, or to the
// named function's arguments, as vLLM does.
//
// Everything here is pure and allocation-bounded by its input; parsing never throws.
#ifndef KVRM_MODEL_TOOL_CALLS_H_
#define KVRM_MODEL_TOOL_CALLS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace kvrm {

enum class ToolCallFormat {
  kNone,
  kHermes,
  kLlama3Json,
  kMistral,
  kGranite,
  kQwen3Coder,
  kGlm45,
  kMinimaxM2,
  kDeepSeekV3,
  kKimiK2,
  kMinimax,
  kDeepSeekV32,
  kPythonic,
};

// "none", "hermes", "llama3_json", "mistral", "granite", "qwen3_coder", "glm45", "minimax_m2",
// "deepseek_v3" (also "deepseek_v31"), "kimi_k2", "minimax", "deepseek_v32", "pythonic" (also
// "llama4_pythonic") (INVALID_ARGUMENT
// naming the accepted ones).
absl::StatusOr<ToolCallFormat> ToolCallFormatFromName(std::string_view name);
std::string_view ToolCallFormatName(ToolCallFormat format);

// The format a chat template teaches, by the call markup its text writes: "<tool_calls>" is
// minimax (M1's, Apriel's), "｜DSML｜" deepseek_v32, "<tool_call>" with
// "<function=" is qwen3_coder, with "<arg_key>" glm45, alone hermes; "<minimax:tool_call>",
// DeepSeek's "<｜tool▁calls▁begin｜>", Kimi's "<|tool_calls_section_begin|>", "[TOOL_CALLS]",
// "<|tool_call|>" and "<|python_tag|>" (or Llama 3.2's JSON instruction) theirs; the
// pythonic instruction's "[func_name1(" (Llama 4's, vLLM's Llama 3.2 pythonic template) pythonic.
// kNone when it writes none, or markup none of the formats reads (MiniMax-M3's "<invoke" under its
// own namespace token, which hermes would misread; Functionary v3.1's "<function=f>{...}").
ToolCallFormat DetectToolCallFormat(std::string_view template_source);

// A function the model may call: OpenAI's {"type": "function", "function": {...}}.
struct ToolSpec {
  std::string name;
  std::string description;
  std::string parameters;  // a JSON Schema (a JSON object as text); empty: takes no arguments
};

// The tool as the chat template sees it (OpenAI's shape), as JSON text; `parameters` must be a
// JSON object or empty (the caller checked it), and empty is written {"type": "object",
// "properties": {}}.
std::string ToolTemplateJson(const ToolSpec& tool);

// The JSON Schema of tool_choice "required": a non-empty array of {"name": one of the tools,
// "parameters": that tool's arguments}, of one item when `single_call` (OpenAI's
// parallel_tool_calls false). Parameters schemas must be JSON objects or empty.
std::string RequiredToolCallsSchema(absl::Span<const ToolSpec> tools, bool single_call = false);
// The schema of a named tool_choice: the function's arguments (an object when it has none).
std::string NamedToolCallSchema(const ToolSpec& tool);

// The types of the offered functions' parameters, from their JSON Schemas ("properties" and
// each one's "type"), for the formats that write values as text.
class ToolParamTypes {
 public:
  ToolParamTypes() = default;
  explicit ToolParamTypes(absl::Span<const ToolSpec> tools);

  // The JSON type parameter `param` of `function` takes: its schema's "type" (the first that is
  // not "null" of a list), else the first typed branch of its "anyOf" / "oneOf", else "string"
  // for an "enum" of strings or a string "const"; "" when the schema says none of these, or the
  // function or parameter is not offered.
  std::string_view Type(std::string_view function, std::string_view param) const;

 private:
  // function -> parameter -> the type Type() returns.
  std::vector<std::pair<std::string, std::vector<std::pair<std::string, std::string>>>> types_;
};

struct ToolCall {
  std::string id;         // "call_" and 24 hex digits, unique per call
  std::string name;
  std::string arguments;  // a JSON object, compact, keys in the order the model wrote them
};

// A piece of a call as it is generated (OpenAI's streamed `tool_calls` deltas): a call's first
// delta carries its id and name, each delta the next piece of its arguments' JSON text; the
// pieces of one call joined are its arguments as the model wrote them (spacing included).
struct ToolCallDelta {
  int32_t index = 0;  // the call's place in the reply's calls
  std::string id;     // first delta of a call only
  std::string name;   // first delta of a call only
  std::string arguments;
};

// A fresh call id ("call_" + 24 random hex digits).
std::string NewToolCallId();

// The calls written in `text` (a format's markup from its first marker on) and the text the
// model wrote between and after them (whitespace dropped), or an error naming what is wrong
// unless every call is well-formed and there is at least one. Arguments must be JSON objects (a
// JSON string holding one is accepted too, as some models write it).
struct ParsedToolCalls {
  std::vector<ToolCall> calls;
  std::string text;
};
// `types` reads the XML-like formats' values (none: every value as JSON when it parses).
absl::StatusOr<ParsedToolCalls> ParseToolCalls(ToolCallFormat format, std::string_view text,
                                               const ToolParamTypes* types = nullptr);
// tool_choice "required": `text` is the JSON array RequiredToolCallsSchema describes.
absl::StatusOr<std::vector<ToolCall>> ParseRequiredToolCalls(std::string_view text);
// A named tool_choice: `text` is the function's arguments (a JSON object).
absl::StatusOr<ToolCall> ParseNamedToolCall(std::string_view name, std::string_view text);

// What a format starts its calls with. Llama 3's <|python_tag|> and Mistral's [TOOL_CALLS] are
// special tokens, and so are Hermes's <tool_call> and </tool_call> in some vocabularies (Hermes 2
// Pro; not Qwen's): decoded text skips special tokens, so a request that offered tools keeps
// these in its text (GenerationRequest::kept_special_tokens, what vLLM's skip_special_tokens
// false does for its tool parsers) and the stream reads every marker as text.
struct ToolCallSyntax {
  ToolCallFormat format = ToolCallFormat::kNone;
  std::string start;                   // the marker as text ("" for kNone)
  // Markers that begin calls too: Qwen3-Coder's "<function=" when the model leaves out
  // <tool_call>, as vLLM's parser takes it.
  std::vector<std::string> also_starts;
  std::vector<int32_t> marker_tokens;  // the format's markers that are special tokens, by id
};
// The strings a format writes its calls with: the start marker (and Hermes's end marker).
std::vector<std::string_view> ToolCallMarkers(ToolCallFormat format);
// The syntax with no marker tokens (the caller resolves them against its vocabulary).
ToolCallSyntax MakeToolCallSyntax(ToolCallFormat format);

// One completion's text on its way to the client when the request offered tools. In kAuto the
// text before the first call marker streams as usual (text that might begin a marker is held
// back, as for stop sequences) and everything from the marker on is held; in the forced modes
// (kRequired, kNamed) all of it is held. At the end the held text is parsed: well-formed calls
// are returned instead of their text; anything else is released as text.
//
// Held calls also stream as they are generated (TakeDeltas), as vLLM's tool parsers do: once a
// call's name is known and its arguments object has begun, each new piece of the object is a
// delta. A pythonic call, whose keyword arguments are not JSON while they are written, is one
// delta (its name and whole arguments) once its ")" closes it. A call whose arguments come
// before its name, or are not a JSON object (a string holding one), is not streamed: it comes
// whole with Finish. A call streamed and then found
// malformed (the reply cut by its length limit) cannot be taken back: its deltas were sent,
// and Finish releases the held text as text.
class ToolCallStream {
 public:
  enum class Mode { kAuto, kRequired, kNamed };

  // `syntax` (kAuto) must outlive the stream; `function` names the kNamed call. `single_call`
  // (OpenAI's parallel_tool_calls false): a reply's first call is returned and those after it
  // dropped, as vLLM does. `tools`: the offered functions, whose schemas type the values of the
  // XML-like formats.
  ToolCallStream(Mode mode, const ToolCallSyntax* syntax, std::string function = "",
                 bool single_call = false, absl::Span<const ToolSpec> tools = {});

  ~ToolCallStream();

  // The part of `text` (the completion's next text, markers included) to send now.
  std::string Feed(std::string_view text);
  // The call deltas the text fed so far added (moved out: each is returned once).
  std::vector<ToolCallDelta> TakeDeltas();

  struct Result {
    std::string text;  // held text released (with calls: only the text around them)
    std::vector<ToolCall> calls;
    bool malformed = false;  // call text was held and parsed, but is not well-formed
    int32_t dropped = 0;     // calls after the first, with single_call
  };
  // The completion ended. `parse`: it ended by itself or at its length limit (not cancelled,
  // timed out or failed), so held calls are parsed; otherwise the held text is released. A
  // call that was streamed keeps the id its first delta carried; where the reply's end closed a
  // streamed call (an XML-like call with no end tag), its last piece is one more delta, for
  // TakeDeltas after Finish.
  Result Finish(bool parse);

  bool holding_call() const { return state_ == State::kCall; }

 private:
  enum class State { kLeading, kContent, kCall };

  class Scanner;
  Result Parse(bool parse);  // Finish before single_call
  std::string FeedText(std::string_view text);  // Feed's text
  void Scan();               // held_'s new text into deltas_
  void ScanMarkup();         // Scan for the markup formats: parses held_ as far as it goes
  void ScanPythonic();       // Scan for pythonic calls: each call once its ")" closes it
  void AddPiece(int index, const std::string& name, std::string_view text);  // to deltas_

  Mode mode_;
  const ToolCallSyntax* syntax_;
  std::string function_;
  bool single_call_;
  ToolParamTypes types_;  // kAuto in a markup format: the offered functions' parameter types
  State state_;
  std::string pending_;  // kLeading / kContent: text that may begin a marker
  std::string held_;     // kCall: from the marker on
  std::unique_ptr<Scanner> scanner_;  // kAuto and kRequired: finds calls in held_
  struct MarkupState;
  std::unique_ptr<MarkupState> markup_;  // ScanMarkup's: what it read, arguments being written
  struct PythonicState;
  std::unique_ptr<PythonicState> pythonic_;  // ScanPythonic's: where it is in the list
  struct Streamed {
    std::string id;  // "" for a call not streamed
    std::string name;
    std::string arguments;  // the pieces so far, joined
  };
  std::vector<Streamed> streamed_;  // [call index]
  std::vector<ToolCallDelta> deltas_;
  size_t named_emitted_ = 0;  // kNamed: held_ given out as arguments so far
};

}  // namespace kvrm

#endif  // KVRM_MODEL_TOOL_CALLS_H_
