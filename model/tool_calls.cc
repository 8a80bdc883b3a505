#include "model/tool_calls.h"

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/json.h"
#include "common/status_macros.h"
#include "model/pythonic_calls.h"
#include "model/tool_call_markup.h"

namespace kvrm {
namespace {

constexpr std::string_view kHermesStart = "<tool_call>";
constexpr std::string_view kHermesEnd = "</tool_call>";
constexpr std::string_view kPythonTag = "<|python_tag|>";
constexpr std::string_view kMistralStart = "[TOOL_CALLS]";
constexpr std::string_view kGraniteStart = "<|tool_call|>";

absl::string_view AV(std::string_view s) { return absl::string_view(s.data(), s.size()); }

using tool_markup::AppendLeftover;
using tool_markup::JsonValueEnd;
using tool_markup::SkipSpace;
using tool_markup::Strip;

// A call's arguments: a JSON object, or a JSON string holding one; compact, in the model's key
// order.
absl::StatusOr<std::string> ArgumentsFromJson(const OrderedJson& args, std::string_view what) {
  if (args.is_string()) {
    ASSIGN_OR_RETURN(
        const OrderedJson inner,
        ParseOrderedJson(args.get<std::string>(), absl::StrCat(AV(what), " arguments")));
    if (!inner.is_object()) {
      return absl::InvalidArgumentError(absl::StrCat(AV(what), ": arguments are not an object"));
    }
    return inner.dump();
  }
  if (!args.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(AV(what), ": arguments are not an object"));
  }
  return args.dump();
}

// A call object {"name": ..., <args_key>: {...}}; arguments may also be a JSON string holding an
// object, and are returned compact, in the model's key order.
absl::StatusOr<ToolCall> CallFromJson(const OrderedJson& j, std::string_view what) {
  if (!j.is_object()) return absl::InvalidArgumentError(absl::StrCat(AV(what), ": not an object"));
  auto name = j.find("name");
  if (name == j.end() || !name->is_string() || name->get<std::string>().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(AV(what), ": no \"name\" string"));
  }
  auto args = j.find("arguments");
  if (args == j.end()) args = j.find("parameters");
  ToolCall call;
  call.id = NewToolCallId();
  call.name = name->get<std::string>();
  if (args == j.end()) {
    call.arguments = "{}";
    return call;
  }
  ASSIGN_OR_RETURN(call.arguments, ArgumentsFromJson(*args, what));
  return call;
}

absl::StatusOr<ToolCall> CallFromText(std::string_view text, std::string_view what) {
  ASSIGN_OR_RETURN(const OrderedJson j, ParseOrderedJson(text, what));
  return CallFromJson(j, what);
}

absl::StatusOr<ParsedToolCalls> ParseHermes(std::string_view text) {
  ParsedToolCalls out;
  size_t pos = 0;
  while (true) {
    const size_t at = text.find(kHermesStart, pos);
    if (at == std::string_view::npos) {
      AppendLeftover(text.substr(pos), &out.text);
      break;
    }
    AppendLeftover(text.substr(pos, at - pos), &out.text);
    const size_t body = at + kHermesStart.size();
    const size_t end = text.find(kHermesEnd, body);
    // An unclosed last block is accepted when its JSON is whole (a model may end at EOS there).
    ASSIGN_OR_RETURN(ToolCall call,
                     CallFromText(Strip(text.substr(body, end == std::string_view::npos
                                                              ? std::string_view::npos
                                                              : end - body)),
                                  absl::StrCat("tool call ", out.calls.size())));
    out.calls.push_back(std::move(call));
    if (end == std::string_view::npos) break;
    pos = end + kHermesEnd.size();
  }
  return out;
}

// Llama 3: JSON objects separated by ";", optionally after <|python_tag|>.
absl::StatusOr<ParsedToolCalls> ParseLlama3(std::string_view text) {
  ParsedToolCalls out;
  size_t i = SkipSpace(text, 0);
  if (text.substr(i, kPythonTag.size()) == kPythonTag) i += kPythonTag.size();
  while (true) {
    i = SkipSpace(text, i);
    if (i >= text.size()) break;
    if (text[i] != '{') {
      AppendLeftover(text.substr(i), &out.text);
      break;
    }
    const size_t end = JsonValueEnd(text, i);
    const std::string what = absl::StrCat("tool call ", out.calls.size());
    if (end == std::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": unterminated JSON"));
    }
    ASSIGN_OR_RETURN(ToolCall call, CallFromText(text.substr(i, end - i), what));
    out.calls.push_back(std::move(call));
    i = SkipSpace(text, end);
    if (i < text.size() && text[i] == ';') ++i;
  }
  return out;
}

// Mistral's and Granite's: the marker ([TOOL_CALLS], <|tool_call|>) then a JSON array of call
// objects (or one object).
absl::StatusOr<ParsedToolCalls> ParseJsonArray(std::string_view text, std::string_view marker) {
  ParsedToolCalls out;
  size_t i = SkipSpace(text, 0);
  if (text.substr(i, marker.size()) == marker) i += marker.size();
  i = SkipSpace(text, i);
  if (i >= text.size() || (text[i] != '[' && text[i] != '{')) {
    return absl::InvalidArgumentError(
        absl::StrCat("tool calls: expected a JSON array after ", AV(marker)));
  }
  const size_t end = JsonValueEnd(text, i);
  if (end == std::string_view::npos) {
    return absl::InvalidArgumentError("tool calls: unterminated JSON");
  }
  ASSIGN_OR_RETURN(const OrderedJson j, ParseOrderedJson(text.substr(i, end - i), "tool calls"));
  if (j.is_object()) {
    ASSIGN_OR_RETURN(ToolCall call, CallFromJson(j, "tool call 0"));
    out.calls.push_back(std::move(call));
  } else {
    for (size_t k = 0; k < j.size(); ++k) {
      ASSIGN_OR_RETURN(ToolCall call, CallFromJson(j[k], absl::StrCat("tool call ", k)));
      out.calls.push_back(std::move(call));
    }
  }
  AppendLeftover(text.substr(end), &out.text);
  return out;
}

OrderedJson ParametersOrEmpty(const ToolSpec& tool) {
  if (!tool.parameters.empty()) {
    absl::StatusOr<OrderedJson> p = ParseOrderedJson(tool.parameters, "parameters");
    if (p.ok() && p->is_object()) return *std::move(p);
  }
  // A function without arguments: exactly {}.
  return OrderedJson{{"type", "object"},
                     {"properties", OrderedJson::object()},
                     {"additionalProperties", false}};
}

}  // namespace

constexpr ToolCallFormat kAllFormats[] = {
    ToolCallFormat::kNone,    ToolCallFormat::kHermes,    ToolCallFormat::kLlama3Json,
    ToolCallFormat::kMistral, ToolCallFormat::kGranite,   ToolCallFormat::kQwen3Coder,
    ToolCallFormat::kGlm45,   ToolCallFormat::kMinimaxM2, ToolCallFormat::kDeepSeekV3,
    ToolCallFormat::kKimiK2,  ToolCallFormat::kMinimax,   ToolCallFormat::kDeepSeekV32,
    ToolCallFormat::kPythonic};

absl::StatusOr<ToolCallFormat> ToolCallFormatFromName(std::string_view name) {
  for (ToolCallFormat f : kAllFormats) {
    if (name == ToolCallFormatName(f)) return f;
  }
  if (name == "deepseek_v31") return ToolCallFormat::kDeepSeekV3;  // vLLM's name for V3.1's
  if (name == "llama4_pythonic") return ToolCallFormat::kPythonic;  // vLLM's, for Llama 4's
  std::string names;
  for (ToolCallFormat f : kAllFormats) {
    absl::StrAppend(&names, names.empty() ? "" : ", ", AV(ToolCallFormatName(f)));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown tool-call format '", AV(name), "' (", names, ")"));
}

std::string_view ToolCallFormatName(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kNone: return "none";
    case ToolCallFormat::kHermes: return "hermes";
    case ToolCallFormat::kLlama3Json: return "llama3_json";
    case ToolCallFormat::kMistral: return "mistral";
    case ToolCallFormat::kGranite:
      return "granite";
    case ToolCallFormat::kQwen3Coder:
      return "qwen3_coder";
    case ToolCallFormat::kGlm45:
      return "glm45";
    case ToolCallFormat::kMinimaxM2:
      return "minimax_m2";
    case ToolCallFormat::kDeepSeekV3:
      return "deepseek_v3";
    case ToolCallFormat::kKimiK2:
      return "kimi_k2";
    case ToolCallFormat::kMinimax:
      return "minimax";
    case ToolCallFormat::kDeepSeekV32:
      return "deepseek_v32";
    case ToolCallFormat::kPythonic:
      return "pythonic";
  }
  return "none";
}

ToolCallFormat DetectToolCallFormat(std::string_view source) {
  const absl::string_view s = AV(source);
  const auto has = [&](ToolCallFormat f) {
    return absl::StrContains(s, AV(tool_markup::StartMarker(f)));
  };
  if (has(ToolCallFormat::kMinimaxM2)) return ToolCallFormat::kMinimaxM2;
  // MiniMax-M3 writes <tool_call> and <invoke name=...> after its own namespace token: markup
  // no parser here reads (hermes would take it for JSON).
  if (absl::StrContains(s, "<invoke name=")) return ToolCallFormat::kNone;
  // DeepSeek V3.2's and V4's DSML (their templates spell the token apart from the tags).
  if (absl::StrContains(s, "｜DSML｜")) return ToolCallFormat::kDeepSeekV32;
  // MiniMax-M1's and Apriel's <tool_calls> block (Apriel 1.5 also mentions <tool_call>).
  if (has(ToolCallFormat::kMinimax)) return ToolCallFormat::kMinimax;
  if (has(ToolCallFormat::kDeepSeekV3)) return ToolCallFormat::kDeepSeekV3;
  if (has(ToolCallFormat::kKimiK2)) return ToolCallFormat::kKimiK2;
  if (absl::StrContains(s, AV(kHermesStart))) {
    if (absl::StrContains(s, "<function=")) return ToolCallFormat::kQwen3Coder;
    if (absl::StrContains(s, "<arg_key>")) return ToolCallFormat::kGlm45;
    return ToolCallFormat::kHermes;
  }
  // Functionary v3.1's <function=NAME>{...}</function> (its <|python_tag|> is for code): no
  // parser here reads it.
  if (absl::StrContains(s, "<function=")) return ToolCallFormat::kNone;
  if (absl::StrContains(s, AV(kMistralStart))) return ToolCallFormat::kMistral;
  // Llama 4's and the Llama 3.2 pythonic template's instruction: "[func_name1(params_name1=...".
  if (absl::StrContains(s, "[func_name1(")) return ToolCallFormat::kPythonic;
  if (absl::StrContains(s, AV(kGraniteStart))) return ToolCallFormat::kGranite;
  if (absl::StrContains(s, AV(kPythonTag))) return ToolCallFormat::kLlama3Json;
  // Llama 3.2's template teaches the JSON calls without <|python_tag|>.
  if (absl::StrContains(s, R"("parameters": dictionary of argument name and its value)")) {
    return ToolCallFormat::kLlama3Json;
  }
  return ToolCallFormat::kNone;
}

namespace {

// The JSON type a parameter's schema gives its values: "type" (the first that is not "null" of
// a list), else the first typed branch of "anyOf" / "oneOf" (Pydantic's Optional[str]), else what
// "enum" / "const" values are (all strings: "string"); "" when it says nothing.
std::string SchemaType(const OrderedJson& schema, int depth = 0) {
  if (!schema.is_object() || depth > 8) return "";
  if (const auto t = schema.find("type"); t != schema.end()) {
    if (t->is_string()) return t->get<std::string>();
    if (t->is_array()) {
      for (const OrderedJson& one : *t) {
        if (one.is_string() && one.get<std::string>() != "null") return one.get<std::string>();
      }
    }
  }
  for (const char* key : {"anyOf", "oneOf"}) {
    const auto branches = schema.find(key);
    if (branches == schema.end() || !branches->is_array()) continue;
    for (const OrderedJson& branch : *branches) {
      std::string type = SchemaType(branch, depth + 1);
      if (!type.empty() && type != "null") return type;
    }
  }
  if (const auto e = schema.find("enum"); e != schema.end() && e->is_array() && !e->empty()) {
    bool strings = true;
    for (const OrderedJson& v : *e) strings = strings && v.is_string();
    if (strings) return "string";
  }
  if (const auto c = schema.find("const"); c != schema.end() && c->is_string()) return "string";
  return "";
}

}  // namespace

ToolParamTypes::ToolParamTypes(absl::Span<const ToolSpec> tools) {
  for (const ToolSpec& tool : tools) {
    auto& params =
        types_.emplace_back(tool.name, decltype(types_)::value_type::second_type{}).second;
    absl::StatusOr<OrderedJson> schema = ParseOrderedJson(tool.parameters, "parameters");
    if (!schema.ok() || !schema->is_object()) continue;
    const auto props = schema->find("properties");
    if (props == schema->end() || !props->is_object()) continue;
    for (auto it = props->begin(); it != props->end(); ++it) {
      params.emplace_back(it.key(), SchemaType(it.value()));
    }
  }
}

std::string_view ToolParamTypes::Type(std::string_view function, std::string_view param) const {
  for (const auto& [name, params] : types_) {
    if (name != function) continue;
    for (const auto& [p, type] : params) {
      if (p == param) return type;
    }
  }
  return "";
}

std::string ToolTemplateJson(const ToolSpec& tool) {
  OrderedJson function{{"name", tool.name}};
  if (!tool.description.empty()) function["description"] = tool.description;
  if (absl::StatusOr<OrderedJson> p = ParseOrderedJson(tool.parameters, "parameters");
      p.ok() && p->is_object()) {
    function["parameters"] = *std::move(p);
  } else {
    function["parameters"] = OrderedJson{{"type", "object"}, {"properties", OrderedJson::object()}};
  }
  return OrderedJson{{"type", "function"}, {"function", std::move(function)}}.dump();
}

namespace {

// Rewrites the document-local "$ref"s of a schema moved to `base` ("#/$defs/x") of another
// document: "#" becomes `base`, "#/a/b" becomes base + "/a/b". Whether it rewrote any.
bool RebaseRefs(OrderedJson& j, const std::string& base) {
  bool rewrote = false;
  if (j.is_object()) {
    for (auto it = j.begin(); it != j.end(); ++it) {
      if (it.key() == "$ref" && it.value().is_string()) {
        const std::string ref = it.value().get<std::string>();
        if (!ref.empty() && ref[0] == '#') {
          it.value() = base + ref.substr(1);
          rewrote = true;
        }
      } else {
        rewrote |= RebaseRefs(it.value(), base);
      }
    }
  } else if (j.is_array()) {
    for (OrderedJson& v : j) rewrote |= RebaseRefs(v, base);
  }
  return rewrote;
}

}  // namespace

std::string RequiredToolCallsSchema(absl::Span<const ToolSpec> tools, bool single_call) {
  OrderedJson any = OrderedJson::array();
  OrderedJson defs = OrderedJson::object();
  for (size_t i = 0; i < tools.size(); ++i) {
    const ToolSpec& tool = tools[i];
    OrderedJson parameters = ParametersOrEmpty(tool);
    // Its "$ref"s point into its own document ("#/$defs/Unit", "#" for recursion): moved to
    // the root's $defs, with them rewritten to point there, they resolve as before.
    const std::string name = absl::StrCat("kvrm_tool_", i);
    if (RebaseRefs(parameters, absl::StrCat("#/$defs/", name))) {
      defs[name] = std::move(parameters);
      parameters = OrderedJson{{"$ref", absl::StrCat("#/$defs/", name)}};
    }
    any.push_back(OrderedJson{
        {"type", "object"},
        {"properties", OrderedJson{{"name", OrderedJson{{"type", "string"},
                                                        {"enum", OrderedJson::array({tool.name})}}},
                                   {"parameters", std::move(parameters)}}},
        {"required", OrderedJson::array({"name", "parameters"})},
        {"additionalProperties", false}});
  }
  OrderedJson schema{{"type", "array"}, {"minItems", 1}};
  if (single_call) schema["maxItems"] = 1;
  schema["items"] = OrderedJson{{"anyOf", any}};
  if (!defs.empty()) schema["$defs"] = std::move(defs);
  return schema.dump();
}

std::string NamedToolCallSchema(const ToolSpec& tool) { return ParametersOrEmpty(tool).dump(); }

std::string NewToolCallId() {
  thread_local absl::BitGen gen;
  return absl::StrFormat("call_%08x%016x", absl::Uniform<uint32_t>(gen),
                         absl::Uniform<uint64_t>(gen));
}

namespace {

// The markup formats' calls, their arguments checked and made compact.
absl::StatusOr<ParsedToolCalls> ParseMarkup(ToolCallFormat format, std::string_view text,
                                            const ToolParamTypes* types) {
  static const ToolParamTypes* const kNoTypes = new ToolParamTypes();
  ASSIGN_OR_RETURN(tool_markup::Calls m,
                   tool_markup::Parse(format, text, types ? *types : *kNoTypes, false));
  ParsedToolCalls out;
  out.text = std::move(m.text);
  for (size_t k = 0; k < m.calls.size(); ++k) {
    const std::string what = absl::StrCat("tool call ", k);
    ASSIGN_OR_RETURN(const OrderedJson args, ParseOrderedJson(m.calls[k].arguments, what));
    ToolCall call{NewToolCallId(), std::move(m.calls[k].name), ""};
    ASSIGN_OR_RETURN(call.arguments, ArgumentsFromJson(args, what));
    out.calls.push_back(std::move(call));
  }
  return out;
}

}  // namespace

absl::StatusOr<ParsedToolCalls> ParseToolCalls(ToolCallFormat format, std::string_view text,
                                               const ToolParamTypes* types) {
  absl::StatusOr<ParsedToolCalls> out;
  switch (format) {
    case ToolCallFormat::kHermes: out = ParseHermes(text); break;
    case ToolCallFormat::kLlama3Json: out = ParseLlama3(text); break;
    case ToolCallFormat::kMistral:
      out = tool_markup::MistralNamedForm(text).value_or(false)
                ? ParseMarkup(format, text, types)
                : ParseJsonArray(text, kMistralStart);
      break;
    case ToolCallFormat::kGranite:
      out = ParseJsonArray(text, kGraniteStart);
      break;
    case ToolCallFormat::kQwen3Coder:
    case ToolCallFormat::kGlm45:
    case ToolCallFormat::kMinimaxM2:
    case ToolCallFormat::kDeepSeekV3:
    case ToolCallFormat::kKimiK2:
    case ToolCallFormat::kMinimax:
    case ToolCallFormat::kDeepSeekV32:
      out = ParseMarkup(format, text, types);
      break;
    case ToolCallFormat::kPythonic: {
      absl::StatusOr<std::vector<pythonic::Call>> calls = pythonic::ParseCalls(text);
      if (!calls.ok()) return calls.status();
      out = ParsedToolCalls();
      for (pythonic::Call& c : *calls) {
        out->calls.push_back(ToolCall{NewToolCallId(), std::move(c.name), std::move(c.arguments)});
      }
      break;
    }
    case ToolCallFormat::kNone:
      return absl::InvalidArgumentError("tool calls: no tool-call format");
  }
  if (out.ok() && out->calls.empty()) return absl::InvalidArgumentError("tool calls: none found");
  return out;
}

absl::StatusOr<std::vector<ToolCall>> ParseRequiredToolCalls(std::string_view text) {
  ASSIGN_OR_RETURN(const OrderedJson j, ParseOrderedJson(Strip(text), "tool calls"));
  if (!j.is_array() || j.empty()) {
    return absl::InvalidArgumentError("tool calls: expected a non-empty JSON array");
  }
  std::vector<ToolCall> calls;
  for (size_t k = 0; k < j.size(); ++k) {
    ASSIGN_OR_RETURN(ToolCall call, CallFromJson(j[k], absl::StrCat("tool call ", k)));
    calls.push_back(std::move(call));
  }
  return calls;
}

absl::StatusOr<ToolCall> ParseNamedToolCall(std::string_view name, std::string_view text) {
  ASSIGN_OR_RETURN(const OrderedJson j, ParseOrderedJson(Strip(text), "tool call arguments"));
  if (!j.is_object()) {
    return absl::InvalidArgumentError("tool call arguments: expected a JSON object");
  }
  return ToolCall{NewToolCallId(), std::string(name), j.dump()};
}

ToolCallSyntax MakeToolCallSyntax(ToolCallFormat format) {
  ToolCallSyntax s;
  s.format = format;
  switch (format) {
    case ToolCallFormat::kNone: return s;
    case ToolCallFormat::kHermes: s.start = std::string(kHermesStart); break;
    case ToolCallFormat::kLlama3Json: s.start = std::string(kPythonTag); break;
    case ToolCallFormat::kMistral: s.start = std::string(kMistralStart); break;
    case ToolCallFormat::kGranite:
      s.start = std::string(kGraniteStart);
      break;
    case ToolCallFormat::kPythonic:
      s.start = std::string(pythonic::kPythonStart);
      break;
    default:
      s.start = std::string(tool_markup::StartMarker(format));
      if (format == ToolCallFormat::kQwen3Coder) s.also_starts = {"<function="};
      break;
  }
  return s;
}

std::vector<std::string_view> ToolCallMarkers(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kNone: return {};
    case ToolCallFormat::kHermes: return {kHermesStart, kHermesEnd};
    case ToolCallFormat::kLlama3Json: return {kPythonTag};
    // [ARGS] and [CALL_ID] are control tokens of Mistral's v11+ vocabularies: kept too, or the
    // decoded text would run a call's name into its arguments.
    case ToolCallFormat::kMistral:
      return {kMistralStart, "[ARGS]", "[CALL_ID]"};
    case ToolCallFormat::kGranite:
      return {kGraniteStart};
    case ToolCallFormat::kPythonic:
      return {pythonic::kPythonStart, pythonic::kPythonEnd};
    default:
      return tool_markup::Markers(format);
  }
}

// Finds the calls in held reply text as it grows and cuts their arguments into pieces: a
// bracket-depth scan outside strings (the text is parsed properly at the end). Call objects are
// the objects at depth `base` (0; 1 inside an array, for Mistral's calls and the required
// schema's) where the format's parser looks for calls, so that the scanner's call k is the
// parser's call k: in Hermes the object right after each <tool_call>; in Llama 3's the objects
// from the start, separated by ";" and space, until any other text; in Mistral's and the required
// schema's the first top-level value only. Their "name" string and "arguments" / "parameters"
// object are one level below.
class ToolCallStream::Scanner {
 public:
  enum class Layout { kHermes, kObjects, kOneValue };
  // `skip`: a marker the text may start with (after space), skipped: "[TOOL_CALLS]" holds a
  // bracket, "<|python_tag|>" is not a call's text.
  Scanner(Layout layout, std::string_view skip) : layout_(layout), skip_(skip) {}

  // Scans what `buf` (the held text, which only grows) gained since the last call; `piece`
  // gets (call index, its name, the next piece of its arguments' text).
  template <typename Piece>
  void Scan(std::string_view buf, bool only_first, const Piece& piece) {
    if (!skip_.empty()) {
      const size_t k = SkipSpace(buf, 0);
      const std::string_view rest = buf.substr(k);
      if (rest.size() < skip_.size() && skip_.substr(0, rest.size()) == rest) return;
      if (rest.substr(0, skip_.size()) == skip_) pos_ = k + skip_.size();
      skip_ = {};
    }
    for (size_t i = pos_; i < buf.size() && !done_; ++i) Step(buf, i, only_first, piece);
    pos_ = buf.size();
    if (streaming_ && emit_from_ < buf.size()) {
      piece(call_, *name_, buf.substr(emit_from_));
      emit_from_ = buf.size();
    }
  }

 private:
  enum class Expect { kKey, kColon, kValue, kComma };

  static bool IsArgsKey(std::string_view key) { return key == "arguments" || key == "parameters"; }

  template <typename Piece>
  void Step(std::string_view buf, size_t i, bool only_first, const Piece& piece) {
    const char c = buf[i];
    if (in_string_) {
      if (escape_) {
        escape_ = false;
      } else if (c == '\\') {
        escape_ = true;
      } else if (c == '"') {
        in_string_ = false;
        if (reading_key_) {
          reading_key_ = false;
          key_ = std::string(buf.substr(string_start_ + 1, i - string_start_ - 1));
          expect_ = Expect::kColon;
        } else if (reading_name_) {
          reading_name_ = false;
          absl::StatusOr<Json> name =
              ParseJson(buf.substr(string_start_, i + 1 - string_start_), "tool call name");
          if (name.ok() && name->is_string()) name_ = name->get<std::string>();
          expect_ = Expect::kComma;
        } else if (in_call_ && depth_ == base_ + 1) {
          expect_ = Expect::kComma;
        }
      }
      return;
    }
    const bool top = in_call_ && depth_ == base_ + 1;  // at the call object's own level
    if (!in_call_ && depth_ == 0 && !absl::ascii_isspace(static_cast<unsigned char>(c))) {
      // Between calls: what the format's parser accepts there, or no more calls.
      if (layout_ == Layout::kObjects) {
        if (c == ';' && after_call_) {
          after_call_ = false;
          return;
        }
        if (c != '{') {
          done_ = true;
          return;
        }
      } else if (layout_ == Layout::kOneValue) {
        if (value_closed_ || (c != '[' && c != '{')) {
          done_ = true;
          return;
        }
      }
    }
    switch (c) {
      case '"':
        in_string_ = true;
        string_start_ = i;
        if (top && expect_ == Expect::kKey) {
          reading_key_ = true;
        } else if (top && expect_ == Expect::kValue) {
          if (key_ == "name") reading_name_ = true;
          if (IsArgsKey(key_)) args_seen_ = true;  // a string holding the object: not streamed
        }
        return;
      case '{':
      case '[':
        if (!in_call_) {
          if (array_ && !base_known_ && depth_ == 0) {
            base_ = c == '[' ? 1 : 0;
            base_known_ = true;
          }
          const bool hermes_call =
              layout_ != Layout::kHermes || AfterHermesMarker(buf, i);
          if (c == '{' && depth_ == base_ && (!array_ || base_known_) && hermes_call) {
            in_call_ = true;
            ++call_;
            expect_ = Expect::kKey;
            name_.reset();
            key_.clear();
            args_seen_ = false;
          }
        } else if (top && expect_ == Expect::kValue) {
          if (IsArgsKey(key_) && !args_seen_) {
            args_seen_ = true;
            if (c == '{' && name_ && !name_->empty() && (!only_first || call_ == 0)) {
              streaming_ = true;
              args_depth_ = depth_;
              emit_from_ = i;
            }
          }
          expect_ = Expect::kComma;
        }
        ++depth_;
        return;
      case '}':
      case ']':
        --depth_;
        if (streaming_ && depth_ == args_depth_) {
          piece(call_, *name_, buf.substr(emit_from_, i + 1 - emit_from_));
          streaming_ = false;
        }
        if (in_call_ && depth_ == base_) {
          in_call_ = false;
          after_call_ = true;
        }
        if (depth_ == 0) value_closed_ = true;
        return;
      case ':':
        if (top && expect_ == Expect::kColon) expect_ = Expect::kValue;
        return;
      case ',':
        if (top) expect_ = Expect::kKey;
        return;
      default:
        if (top && expect_ == Expect::kValue && !absl::ascii_isspace(static_cast<unsigned char>(c))) {
          if (IsArgsKey(key_)) args_seen_ = true;  // a scalar: not an object, not streamed
          expect_ = Expect::kComma;
        }
        return;
    }
  }

  // Whether `buf` before `i` ends, past space, with <tool_call>: Hermes' call object starts
  // there and nowhere else (ParseHermes reads each block's body).
  static bool AfterHermesMarker(std::string_view buf, size_t i) {
    size_t j = i;
    while (j > 0 && absl::ascii_isspace(static_cast<unsigned char>(buf[j - 1]))) --j;
    return j >= kHermesStart.size() && buf.substr(j - kHermesStart.size(), kHermesStart.size()) ==
                                           kHermesStart;
  }

  const Layout layout_;
  const bool array_ = layout_ == Layout::kOneValue;
  std::string_view skip_;
  bool done_ = false;          // past where the parser looks for calls
  bool after_call_ = false;    // kObjects: a call just closed (one ";" may follow)
  bool value_closed_ = false;  // a top-level value closed (kOneValue: the only one)
  bool base_known_ = false;
  int base_ = 0;
  size_t pos_ = 0;
  int depth_ = 0;
  bool in_string_ = false, escape_ = false;
  size_t string_start_ = 0;
  bool reading_key_ = false, reading_name_ = false;
  // The current call object.
  bool in_call_ = false;
  int call_ = -1;
  Expect expect_ = Expect::kKey;
  std::string key_;
  std::optional<std::string> name_;
  bool args_seen_ = false;  // its arguments value began (streamed or not)
  bool streaming_ = false;
  int args_depth_ = 0;      // depth_ outside the arguments object
  size_t emit_from_ = 0;    // the arguments' text before this was given out
};

ToolCallStream::~ToolCallStream() = default;

std::vector<ToolCallDelta> ToolCallStream::TakeDeltas() {
  std::vector<ToolCallDelta> out;
  out.swap(deltas_);
  return out;
}

void ToolCallStream::AddPiece(int index, const std::string& name, std::string_view text) {
  if (text.empty()) return;
  if (streamed_.size() <= static_cast<size_t>(index)) streamed_.resize(index + 1);
  Streamed& call = streamed_[index];
  call.arguments.append(text);
  if (call.id.empty()) {
    call.id = NewToolCallId();
    call.name = name;
    deltas_.push_back({index, call.id, name, std::string(text)});
  } else if (!deltas_.empty() && deltas_.back().index == index) {
    deltas_.back().arguments.append(text);
  } else {
    deltas_.push_back({index, "", "", std::string(text)});
  }
}

struct ToolCallStream::MarkupState {
  size_t read = 0;  // held_'s bytes read so far
  // A JSON object the model is writing (the last call's arguments in deepseek_v3, kimi_k2 and
  // Mistral's v11 form; a call object in minimax) and its bracket depth: new text that does not
  // close it changes nothing but its length, so the reply is not read again until it does. For
  // streamed arguments (index >= 0) that text is their next piece.
  struct Open {
    int index = -1;
    std::string name;
    tool_markup::JsonDepth depth;
  };
  std::optional<Open> open;
};

void ToolCallStream::ScanMarkup() {
  if (markup_ == nullptr) markup_ = std::make_unique<MarkupState>();
  MarkupState& st = *markup_;
  const size_t from = st.read;
  st.read = held_.size();
  if (st.open) {
    const std::string_view fresh = std::string_view(held_).substr(from);
    bool closed = false;
    for (char c : fresh) closed = closed || st.open->depth.Step(c);
    if (!closed) {
      if (st.open->index >= 0) AddPiece(st.open->index, st.open->name, fresh);
      return;
    }
    st.open.reset();  // they closed: the reply is read again below, once
  } else if (!tool_markup::MayChange(syntax_->format, held_, from)) {
    return;
  }
  // The held text read as far as it goes; the reading is repeated only when the text gained
  // can change it (MayChange), and never while JSON arguments are being written.
  absl::StatusOr<tool_markup::Calls> m =
      tool_markup::Parse(syntax_->format, held_, types_, /*partial=*/true);
  if (!m.ok()) return;
  int streaming = -1;  // the call whose open arguments were just streamed
  for (size_t i = 0; i < m->calls.size() && !(single_call_ && i > 0); ++i) {
    const tool_markup::Call& c = m->calls[i];
    // Arguments given as a JSON string holding the object are not streamed.
    if (c.name.empty() || c.arguments.empty() || c.arguments[0] != '{') continue;
    std::string_view sent;
    if (i < streamed_.size() && !streamed_[i].id.empty()) {
      // What was sent is fixed: a call read differently now (a parameter given twice) is
      // streamed no further and comes whole with Finish.
      if (streamed_[i].name != c.name ||
          c.arguments.compare(0, streamed_[i].arguments.size(), streamed_[i].arguments) != 0) {
        continue;
      }
      sent = streamed_[i].arguments;
    }
    AddPiece(static_cast<int>(i), c.name, std::string_view(c.arguments).substr(sent.size()));
    if (!c.closed) streaming = static_cast<int>(i);
  }
  if (m->open_json != std::string_view::npos) {
    MarkupState::Open open;
    const std::string_view json = std::string_view(held_).substr(m->open_json);
    // The open arguments streamed are this object's text (the model's own, to the end).
    if (streaming >= 0 && m->calls[streaming].arguments == json) {
      open.index = streaming;
      open.name = m->calls[streaming].name;
    }
    for (char ch : json) open.depth.Step(ch);
    st.open = std::move(open);
  }
}

// Where ScanPythonic is in the list of calls: the bytes of held_ read, bracket depth (the list
// is depth 1, a call's arguments 2), a Python string being read (its quote, whether tripled, a
// run of closing quotes, an escape), quotes that may open one (two are an empty string, three
// open a triple-quoted one), where the current call began, and the calls given out.
struct ToolCallStream::PythonicState {
  size_t read = 0;
  int depth = 0;
  char quote = 0;  // inside a string: its quote character
  bool triple = false;
  int closing = 0;  // triple: closing quotes in a row
  bool escape = false;
  char opening = 0;  // outside: a quote just seen, `opened` of them
  int opened = 0;
  size_t call_start = std::string::npos;
  int calls = 0;
  bool stopped = false;  // a call did not parse, or single_call's first went out
};

void ToolCallStream::ScanPythonic() {
  if (pythonic_ == nullptr) pythonic_ = std::make_unique<PythonicState>();
  PythonicState& st = *pythonic_;
  while (st.read < held_.size() && !st.stopped) {
    const char c = held_[st.read];
    if (st.opening != 0) {  // one or two quotes seen: a string, an empty one, or a triple?
      if (c == st.opening && st.opened == 1) {
        st.opened = 2;
        ++st.read;
        continue;
      }
      const bool triple = c == st.opening && st.opened == 2;
      const bool empty = st.opened == 2 && !triple;
      st.quote = empty ? 0 : st.opening;
      st.triple = triple;
      st.closing = 0;
      st.escape = false;
      st.opening = 0;
      if (triple) ++st.read;
      continue;  // (otherwise `c` is the string's first character, or follows the empty one)
    }
    ++st.read;
    if (st.quote != 0) {
      if (st.escape) {
        st.escape = false;
      } else if (c == '\\') {
        st.escape = true;
        st.closing = 0;
      } else if (c != st.quote) {
        st.closing = 0;
      } else if (!st.triple || ++st.closing == 3) {
        st.quote = 0;
      }
      continue;
    }
    if (c == '\'' || c == '"') {
      st.opening = c;
      st.opened = 1;
      continue;
    }
    const bool space = c == ' ' || c == '\n' || c == '\t' || c == '\r';
    if (st.depth == 1 && st.call_start == std::string::npos && !space && c != ',' && c != ']') {
      st.call_start = st.read - 1;
    }
    if (c == '(' || c == '[' || c == '{') {
      ++st.depth;
    } else if (c == ')' || c == ']' || c == '}') {
      --st.depth;
      if (c == ')' && st.depth == 1 && st.call_start != std::string::npos) {
        const std::string one =
            absl::StrCat("[", held_.substr(st.call_start, st.read - st.call_start), "]");
        absl::StatusOr<std::vector<pythonic::Call>> calls = pythonic::ParseCalls(one);
        if (!calls.ok() || calls->size() != 1) {
          st.stopped = true;  // (Finish reads the whole reply and says what is wrong)
          break;
        }
        AddPiece(st.calls++, (*calls)[0].name, (*calls)[0].arguments);
        st.call_start = std::string::npos;
        st.stopped = single_call_;
      }
    }
  }
}

void ToolCallStream::Scan() {
  const auto piece = [this](int index, const std::string& name, std::string_view text) {
    AddPiece(index, name, text);
  };
  if (mode_ == Mode::kAuto && (tool_markup::Handles(syntax_->format) ||
                               (syntax_->format == ToolCallFormat::kMistral &&
                                tool_markup::MistralNamedForm(held_).value_or(false)))) {
    ScanMarkup();
    return;
  }
  if (mode_ == Mode::kAuto && syntax_->format == ToolCallFormat::kPythonic) {
    ScanPythonic();
    return;
  }
  if (mode_ == Mode::kNamed) {
    // The whole reply is the arguments object.
    piece(0, function_, std::string_view(held_).substr(named_emitted_));
    named_emitted_ = held_.size();
    return;
  }
  if (scanner_ == nullptr) {
    using Layout = Scanner::Layout;
    const ToolCallFormat format = mode_ == Mode::kAuto ? syntax_->format : ToolCallFormat::kNone;
    scanner_ =
        std::make_unique<Scanner>(format == ToolCallFormat::kHermes       ? Layout::kHermes
                                  : format == ToolCallFormat::kLlama3Json ? Layout::kObjects
                                                                          : Layout::kOneValue,
                                  format == ToolCallFormat::kMistral      ? kMistralStart
                                  : format == ToolCallFormat::kGranite    ? kGraniteStart
                                  : format == ToolCallFormat::kLlama3Json ? kPythonTag
                                                                          : std::string_view());
  }
  scanner_->Scan(held_, single_call_, piece);
}

ToolCallStream::ToolCallStream(Mode mode, const ToolCallSyntax* syntax, std::string function,
                               bool single_call, absl::Span<const ToolSpec> tools)
    : mode_(mode),
      syntax_(syntax),
      function_(std::move(function)),
      single_call_(single_call),
      types_(mode == Mode::kAuto && syntax != nullptr && tool_markup::Handles(syntax->format)
                 ? ToolParamTypes(tools)
                 : ToolParamTypes()),
      // Llama 3's and pythonic calls are the whole reply: whether one begins is known at its
      // first non-space character.
      state_(mode == Mode::kAuto && (syntax->format == ToolCallFormat::kLlama3Json ||
                                     syntax->format == ToolCallFormat::kPythonic)
                 ? State::kLeading
                 : State::kContent) {}

std::string ToolCallStream::Feed(std::string_view text) {
  std::string out = FeedText(text);
  if (mode_ != Mode::kAuto || state_ == State::kCall) Scan();
  return out;
}

std::string ToolCallStream::FeedText(std::string_view text) {
  if (mode_ != Mode::kAuto || state_ == State::kCall) {
    held_.append(text);
    return "";
  }
  pending_.append(text);
  const std::string_view start = syntax_->start;
  if (state_ == State::kLeading) {
    const std::string_view lead = Strip(pending_);
    if (lead.empty()) return "";
    // Llama 3's calls begin with "{"; pythonic ones with "[name(" (so that a "[1]" citation
    // streams at once).
    const pythonic::Begins begins = syntax_->format == ToolCallFormat::kPythonic
                                        ? pythonic::BeginsCalls(lead)
                                    : lead[0] == '{' ? pythonic::Begins::kYes
                                                     : pythonic::Begins::kNo;
    if (begins == pythonic::Begins::kYes || absl::StartsWith(AV(lead), AV(start))) {
      held_ = std::move(pending_);
      pending_.clear();
      state_ = State::kCall;
      return "";
    }
    if (begins == pythonic::Begins::kUndecided) return "";
    if (lead.size() < start.size() && absl::StartsWith(AV(start), AV(lead))) return "";
    state_ = State::kContent;
  }
  // The first marker that begins calls: the format's start, or one it also begins with.
  size_t at = pending_.find(start);
  for (const std::string& also : syntax_->also_starts) at = std::min(at, pending_.find(also));
  if (at != std::string::npos) {
    std::string out = pending_.substr(0, at);
    held_ = pending_.substr(at);
    pending_.clear();
    state_ = State::kCall;
    return out;
  }
  // Hold back the longest tail that could begin a marker.
  size_t keep = 0;
  const auto hold = [&](std::string_view marker) {
    size_t k = std::min(pending_.size(), marker.size() - 1);
    while (k > keep && !absl::EndsWith(AV(pending_), AV(marker.substr(0, k)))) --k;
    keep = std::max(keep, k);
  };
  hold(start);
  for (const std::string& also : syntax_->also_starts) hold(also);
  std::string out = pending_.substr(0, pending_.size() - keep);
  pending_.erase(0, pending_.size() - keep);
  return out;
}

ToolCallStream::Result ToolCallStream::Finish(bool parse) {
  Result r = Parse(parse);
  // A streamed call keeps the id its deltas carried (clients match the two), when it is the call
  // that was streamed: the same name, and the arguments its pieces spelled (a duplicated key
  // parses to the last one, say). Otherwise it keeps a fresh id and goes out whole at the end.
  for (size_t i = 0; i < r.calls.size() && i < streamed_.size(); ++i) {
    const Streamed& s = streamed_[i];
    if (s.id.empty() || s.name != r.calls[i].name) continue;
    const std::string& final_args = r.calls[i].arguments;
    absl::StatusOr<OrderedJson> args = ParseOrderedJson(s.arguments, "streamed arguments");
    if (args.ok() && args->dump() == final_args) {
      r.calls[i].id = s.id;
    } else if (final_args.size() > s.arguments.size() &&
               final_args.compare(0, s.arguments.size(), s.arguments) == 0) {
      // What was streamed begins the call's arguments (an XML-like call the reply's end closed,
      // with no end tag to close it while it streamed): the rest is its last delta.
      const std::string id = s.id;
      AddPiece(static_cast<int>(i), r.calls[i].name,
               std::string_view(final_args).substr(s.arguments.size()));
      r.calls[i].id = id;
    }
  }
  if (single_call_ && r.calls.size() > 1) {
    r.dropped = static_cast<int32_t>(r.calls.size() - 1);
    r.calls.resize(1);
  }
  return r;
}

ToolCallStream::Result ToolCallStream::Parse(bool parse) {
  Result r;
  if (parse) {
    switch (mode_) {
      case Mode::kRequired:
        if (absl::StatusOr<std::vector<ToolCall>> calls = ParseRequiredToolCalls(held_);
            calls.ok()) {
          r.calls = *std::move(calls);
          return r;
        }
        break;
      case Mode::kNamed:
        if (absl::StatusOr<ToolCall> call = ParseNamedToolCall(function_, held_); call.ok()) {
          r.calls.push_back(*std::move(call));
          return r;
        }
        break;
      case Mode::kAuto:
        if (state_ == State::kCall) {
          if (absl::StatusOr<ParsedToolCalls> p = ParseToolCalls(syntax_->format, held_, &types_);
              p.ok()) {
            r.calls = std::move(p->calls);
            r.text = std::move(p->text);
            return r;
          }
        }
        break;
    }
    r.malformed = mode_ != Mode::kAuto || state_ == State::kCall;
  }
  r.text = pending_ + held_;
  pending_.clear();
  held_.clear();
  return r;
}

}  // namespace kvrm
