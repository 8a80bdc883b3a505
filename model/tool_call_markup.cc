#include "model/tool_call_markup.h"

#include <optional>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/json.h"
#include "common/status_macros.h"

namespace kvrm::tool_markup {
namespace {

constexpr size_t npos = std::string_view::npos;

constexpr std::string_view kToolCall = "<tool_call>";
constexpr std::string_view kToolCallEnd = "</tool_call>";
// qwen3_coder
constexpr std::string_view kFunction = "<function=";
constexpr std::string_view kFunctionEnd = "</function>";
constexpr std::string_view kParameter = "<parameter=";
constexpr std::string_view kParameterEnd = "</parameter>";
// glm45
constexpr std::string_view kArgKey = "<arg_key>";
constexpr std::string_view kArgKeyEnd = "</arg_key>";
constexpr std::string_view kArgValue = "<arg_value>";
constexpr std::string_view kArgValueEnd = "</arg_value>";
// minimax_m2
constexpr std::string_view kMinimaxCall = "<minimax:tool_call>";
constexpr std::string_view kMinimaxCallEnd = "</minimax:tool_call>";
constexpr std::string_view kInvoke = "<invoke name=";
constexpr std::string_view kInvokeEnd = "</invoke>";
constexpr std::string_view kNamedParameter = "<parameter name=";
// deepseek_v3
constexpr std::string_view kDsCallsBegin = "<｜tool▁calls▁begin｜>";
constexpr std::string_view kDsCallsEnd = "<｜tool▁calls▁end｜>";
constexpr std::string_view kDsCallBegin = "<｜tool▁call▁begin｜>";
constexpr std::string_view kDsCallEnd = "<｜tool▁call▁end｜>";
constexpr std::string_view kDsSep = "<｜tool▁sep｜>";
constexpr std::string_view kFence = "```";
// deepseek_v32 (DSML: V3.2's function_calls block, V4's tool_calls block)
constexpr std::string_view kDsml = "<｜DSML｜";
constexpr std::string_view kDsmlFunctionCalls = "<｜DSML｜function_calls>";
constexpr std::string_view kDsmlFunctionCallsEnd = "</｜DSML｜function_calls>";
constexpr std::string_view kDsmlToolCalls = "<｜DSML｜tool_calls>";
constexpr std::string_view kDsmlToolCallsEnd = "</｜DSML｜tool_calls>";
constexpr std::string_view kDsmlInvoke = "<｜DSML｜invoke name=";
constexpr std::string_view kDsmlInvokeEnd = "</｜DSML｜invoke>";
constexpr std::string_view kDsmlParameter = "<｜DSML｜parameter name=";
constexpr std::string_view kDsmlParameterEnd = "</｜DSML｜parameter>";
// minimax (M1) / Apriel
constexpr std::string_view kToolCalls = "<tool_calls>";
constexpr std::string_view kToolCallsEnd = "</tool_calls>";
// mistral (v11+)
constexpr std::string_view kMistralCalls = "[TOOL_CALLS]";
constexpr std::string_view kMistralArgs = "[ARGS]";
constexpr std::string_view kMistralCallId = "[CALL_ID]";
// kimi_k2
constexpr std::string_view kKimiSection = "<|tool_calls_section_begin|>";
constexpr std::string_view kKimiSectionEnd = "<|tool_calls_section_end|>";
constexpr std::string_view kKimiCall = "<|tool_call_begin|>";
constexpr std::string_view kKimiArgs = "<|tool_call_argument_begin|>";
constexpr std::string_view kKimiCallEnd = "<|tool_call_end|>";

absl::string_view AV(std::string_view s) { return absl::string_view(s.data(), s.size()); }

bool StartsWith(std::string_view s, size_t i, std::string_view prefix) {
  return s.substr(i, prefix.size()) == prefix;
}

// Whether s[i..] is a proper beginning of `marker` (the rest of it may still come).
bool BeginsMarker(std::string_view s, size_t i, std::string_view marker) {
  const std::string_view rest = s.substr(i);
  return rest.size() < marker.size() && marker.substr(0, rest.size()) == rest;
}

// What stops a reading: the text ends before the construct does (`partial`: wait for more; a
// whole reply: malformed), or the text is malformed.
absl::Status Unfinished(std::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat(AV(what)));
}

std::string CallWhat(const Calls& out) { return absl::StrCat("tool call ", out.calls.size()); }

// Python's str() of a value, as the templates write non-string values with `| string`, reads
// back: True / False / None.
std::optional<OrderedJson> PythonLiteral(std::string_view t) {
  if (t == "True") return OrderedJson(true);
  if (t == "False") return OrderedJson(false);
  if (t == "None") return OrderedJson(nullptr);
  return std::nullopt;
}

// The value of a parameter written as text, read by its schema type.
OrderedJson ValueOf(std::string_view type, std::string_view text) {
  if (type == "string") return OrderedJson(std::string(text));
  const std::string_view t = Strip(text);
  if (type == "boolean") {
    const std::string lower = absl::AsciiStrToLower(AV(t));
    if (lower == "true") return OrderedJson(true);
    if (lower == "false") return OrderedJson(false);
  }
  if (std::optional<OrderedJson> py = PythonLiteral(t); py && type != "") return *py;
  if (absl::StatusOr<OrderedJson> j = ParseOrderedJson(t, "value"); j.ok()) {
    const bool numeric = type == "integer" || type == "number";
    if (!numeric || j->is_number()) return *std::move(j);
  }
  return OrderedJson(std::string(text));
}

std::string Dump(const OrderedJson& j) {
  return j.dump(-1, ' ', false, OrderedJson::error_handler_t::replace);
}

// The call with `args` read so far: whole when `closed`, else without its closing brace.
Call MakeCall(std::string name, const OrderedJson& args, bool closed) {
  Call call{std::move(name), Dump(args), closed};
  if (!closed) call.arguments.pop_back();
  return call;
}

// One newline off each end of a value, as the XML-like formats put the value on lines of its
// own (vLLM's parsers take the same one off).
std::string_view TrimNewline(std::string_view v) {
  if (!v.empty() && v.front() == '\n') v.remove_prefix(1);
  if (!v.empty() && v.back() == '\n') v.remove_suffix(1);
  return v;
}

// A tag's name after its prefix ("<function=" NAME ">", "<invoke name=" "NAME" ">"): quoted or
// not; a quoted name may be followed by more attributes (DSML's string="true"). The name, the
// position after the tag's ">" (`second`) and the attributes' text; nullopt when the tag is not
// finished.
struct Tag {
  std::string first;  // the name
  size_t second = 0;  // after the tag
  std::string_view attributes;
};
std::optional<Tag> TagName(std::string_view s, size_t i) {
  if (i < s.size() && (s[i] == '"' || s[i] == '\'')) {
    const size_t close = s.find(s[i], i + 1);
    if (close == npos) return std::nullopt;
    const size_t gt = s.find('>', close + 1);
    if (gt == npos) return std::nullopt;
    return Tag{std::string(s.substr(i + 1, close - i - 1)), gt + 1,
               s.substr(close + 1, gt - close - 1)};
  }
  const size_t gt = s.find('>', i);
  if (gt == npos) return std::nullopt;
  return Tag{std::string(Strip(s.substr(i, gt - i))), gt + 1, {}};
}

// The type a parameter tag's attributes give its value: DeepSeek's DSML writes string="true"
// on strings and string="false" on values written as JSON; "" when they say nothing.
std::string_view AttributeType(std::string_view attributes) {
  if (attributes.find("string=\"true\"") != npos) return "string";
  if (attributes.find("string=\"false\"") != npos) return "json";
  return "";
}

// The blocks of `text` between `open` and `close`; the text around them is leftover. A last
// block without `close` runs to the end (`closed` false).
template <typename Block>
absl::Status ForEachBlock(std::string_view text, std::string_view open, std::string_view close,
                          Calls* out, const Block& block) {
  size_t pos = 0;
  while (true) {
    const size_t at = text.find(open, pos);
    if (at == npos) {
      AppendLeftover(text.substr(pos), &out->text);
      return absl::OkStatus();
    }
    AppendLeftover(text.substr(pos, at - pos), &out->text);
    const size_t body = at + open.size();
    const size_t end = text.find(close, body);
    RETURN_IF_ERROR(block(text.substr(body, end == npos ? npos : end - body), end != npos));
    if (end == npos) return absl::OkStatus();
    pos = end + close.size();
  }
}

// The XML-like calls in one block: `function` NAME> then `param` NAME> VALUE `param_end` ...
// `function_end` (qwen3_coder's <function=f><parameter=k>, minimax_m2's <invoke name="f">
// <parameter name="k">). A value without its end tag runs to the next parameter or the
// function's end, as vLLM reads it.
absl::Status XmlFunctions(std::string_view block, bool block_closed, std::string_view function,
                          std::string_view function_end, std::string_view param,
                          std::string_view param_end, bool trim_newline,
                          const ToolParamTypes& types, bool partial, Calls* out) {
  size_t i = 0;
  bool any = false;
  while (true) {
    const size_t f = block.find(function, i);
    if (f == npos) break;
    any = true;
    const std::string what = CallWhat(*out);
    std::optional<Tag> name = TagName(block, f + function.size());
    if (!name) return Unfinished(absl::StrCat(what, ": ", AV(function), " not closed by '>'"));
    if (name->first.empty()) return Unfinished(absl::StrCat(what, ": no function name"));
    const size_t fend = block.find(function_end, name->second);
    const bool closed = fend != npos;
    const std::string_view body = block.substr(name->second, closed ? fend - name->second : npos);
    OrderedJson args = OrderedJson::object();
    size_t j = 0;
    bool whole = true;
    while (true) {
      const size_t p = body.find(param, j);
      if (p == npos) break;
      std::optional<Tag> key = TagName(body, p + param.size());
      if (!key) {
        whole = false;
        break;
      }
      if (key->first.empty()) return Unfinished(absl::StrCat(what, ": a parameter without a name"));
      // The value ends at its end tag or at the next parameter's tag, whichever comes first (a
      // later end tag is the next parameter's), as vLLM reads it; or at the function's end.
      size_t vend = body.find(param_end, key->second);
      size_t next = vend == npos ? npos : vend + param_end.size();
      if (const size_t np = body.find(param, key->second); np < vend) vend = next = np;
      if (vend == npos) {
        if (!closed && !block_closed) {
          whole = false;
          break;
        }
        vend = next = body.size();
      }
      std::string_view value = body.substr(key->second, vend - key->second);
      if (trim_newline) value = TrimNewline(value);
      std::string_view type = AttributeType(key->attributes);
      if (type.empty()) type = types.Type(name->first, key->first);
      args[key->first] = ValueOf(type, value);
      j = next;
    }
    if (!whole && !partial) {
      return Unfinished(absl::StrCat(what, ": parameter not finished"));
    }
    // A whole reply may end (EOS) where the function's end tag would be.
    out->calls.push_back(
        MakeCall(std::move(name->first), args, closed || block_closed || !partial));
    if (!closed) return absl::OkStatus();
    i = fend + function_end.size();
  }
  if (!any && (block_closed || !partial)) {
    return Unfinished(absl::StrCat(CallWhat(*out), ": no ", AV(function), "...> in the block"));
  }
  return absl::OkStatus();
}

// glm45: NAME then <arg_key>K</arg_key><arg_value>V</arg_value> pairs, one call a block.
absl::Status GlmCall(std::string_view block, bool block_closed, const ToolParamTypes& types,
                     bool partial, Calls* out) {
  const std::string what = CallWhat(*out);
  size_t first = block.find(kArgKey);
  std::string_view name_text = block.substr(0, first);
  // While it streams, the name is known at the first <arg_key> (or the block's end): GLM-4.7
  // runs the name on into it, and a tag's '>' is what MayChange waits for.
  if (first == npos && !block_closed && partial) return absl::OkStatus();
  std::string name(Strip(name_text));
  if (name.empty()) return Unfinished(absl::StrCat(what, ": no function name"));
  OrderedJson args = OrderedJson::object();
  size_t i = first == npos ? block.size() : first;
  while (true) {
    i = SkipSpace(block, i);
    if (i >= block.size()) break;
    const auto stop = [&](std::string_view why) -> absl::Status {
      if (partial) {
        out->calls.push_back(MakeCall(std::move(name), args, false));
        return absl::OkStatus();
      }
      return Unfinished(absl::StrCat(what, ": ", AV(why)));
    };
    if (!StartsWith(block, i, kArgKey)) {
      if (partial && BeginsMarker(block, i, kArgKey)) return stop("");
      return Unfinished(absl::StrCat(what, ": expected <arg_key>"));
    }
    const size_t key_end = block.find(kArgKeyEnd, i + kArgKey.size());
    if (key_end == npos) return stop("<arg_key> not closed");
    const std::string key(Strip(block.substr(i + kArgKey.size(), key_end - i - kArgKey.size())));
    if (key.empty()) return Unfinished(absl::StrCat(what, ": an empty <arg_key>"));
    i = SkipSpace(block, key_end + kArgKeyEnd.size());
    if (!StartsWith(block, i, kArgValue)) {
      if (i >= block.size() || BeginsMarker(block, i, kArgValue)) {
        return stop("<arg_key> without <arg_value>");
      }
      return Unfinished(absl::StrCat(what, ": expected <arg_value>"));
    }
    const size_t value_end = block.find(kArgValueEnd, i + kArgValue.size());
    if (value_end == npos) return stop("<arg_value> not closed");
    args[key] = ValueOf(types.Type(name, key),
                        block.substr(i + kArgValue.size(), value_end - i - kArgValue.size()));
    i = value_end + kArgValueEnd.size();
  }
  out->calls.push_back(MakeCall(std::move(name), args, block_closed || !partial));
  return absl::OkStatus();
}

// The arguments of deepseek_v3 and kimi_k2 at text[i] (after space): a JSON object (or a JSON
// string holding one) as the model wrote it. Sets the call's arguments (so far) and returns
// the position after them; npos when the text ends inside them.
absl::StatusOr<size_t> JsonArguments(std::string_view text, size_t i, const std::string& what,
                                     Call* call, Calls* out) {
  i = SkipSpace(text, i);
  if (i >= text.size()) return npos;
  size_t end = npos;
  if (text[i] == '{') {
    end = JsonValueEnd(text, i);
    call->arguments = std::string(text.substr(i, end == npos ? npos : end - i));
    if (end == npos) out->open_json = i;
  } else if (text[i] == '"') {
    // A string holding the object: given whole or not at all (its text is not the object's).
    for (size_t k = i + 1; k < text.size(); ++k) {
      if (text[k] == '\\') {
        ++k;
      } else if (text[k] == '"') {
        end = k + 1;
        break;
      }
    }
    if (end != npos) call->arguments = std::string(text.substr(i, end - i));
  } else {
    return Unfinished(absl::StrCat(what, ": arguments are not a JSON object"));
  }
  call->closed = end != npos;
  return end;
}

// After a JSON-arguments call: space, then `end` (or the text's end, for a whole reply).
// Whether the call is over; false when the text stops first (partial), an error when something
// else follows.
absl::StatusOr<size_t> CallEnd(std::string_view text, size_t i, std::string_view end,
                               const std::string& what, bool partial) {
  i = SkipSpace(text, i);
  if (StartsWith(text, i, end)) return i + end.size();
  if (i >= text.size() || BeginsMarker(text, i, end)) {
    if (partial) return npos;
    return text.size();  // a whole reply may end (EOS) where the end marker would be
  }
  return Unfinished(absl::StrCat(what, ": expected ", AV(end)));
}

// deepseek_v3: <｜tool▁calls▁begin｜> then calls <｜tool▁call▁begin｜>HEAD<｜tool▁sep｜>..., where
// V3.1 writes the function's name as HEAD and the arguments right after the separator, and
// R1 / V3 write "function" as HEAD, then the name on its line, then the arguments in a ```json
// fence; then <｜tool▁call▁end｜>, and <｜tool▁calls▁end｜> after the last.
absl::Status DeepSeekCalls(std::string_view text, bool partial, Calls* out) {
  size_t i = SkipSpace(text, 0);
  if (StartsWith(text, i, kDsCallsBegin)) i += kDsCallsBegin.size();
  while (true) {
    i = SkipSpace(text, i);
    if (StartsWith(text, i, kDsCallsEnd)) {
      AppendLeftover(text.substr(i + kDsCallsEnd.size()), &out->text);
      return absl::OkStatus();
    }
    if (i >= text.size() || (partial && BeginsMarker(text, i, kDsCallBegin)) ||
        (partial && BeginsMarker(text, i, kDsCallsEnd))) {
      return absl::OkStatus();
    }
    const std::string what = CallWhat(*out);
    if (!StartsWith(text, i, kDsCallBegin)) {
      if (out->calls.empty()) return Unfinished(absl::StrCat(what, ": expected a call"));
      AppendLeftover(text.substr(i), &out->text);  // the model went on without the end marker
      return absl::OkStatus();
    }
    i += kDsCallBegin.size();
    const size_t sep = text.find(kDsSep, i);
    if (sep == npos) return Unfinished(absl::StrCat(what, ": no <｜tool▁sep｜>"));
    const std::string_view head = Strip(text.substr(i, sep - i));
    size_t j = sep + kDsSep.size();
    Call call;
    bool fenced = false;
    const size_t after = SkipSpace(text, j);
    if (head == "function" && after < text.size() && text[after] != '{' && text[after] != '"') {
      const size_t nl = text.find('\n', j);
      if (nl == npos) return Unfinished(absl::StrCat(what, ": the name's line not finished"));
      call.name = std::string(Strip(text.substr(j, nl - j)));
      j = SkipSpace(text, nl);
      if (StartsWith(text, j, kFence)) {
        const size_t fence_nl = text.find('\n', j);
        if (fence_nl == npos) return Unfinished(absl::StrCat(what, ": the fence not finished"));
        j = fence_nl + 1;
        fenced = true;
      } else if (j >= text.size() || BeginsMarker(text, j, kFence)) {
        return Unfinished(absl::StrCat(what, ": the arguments not begun"));
      }
    } else if (head == "function" && after >= text.size()) {
      return Unfinished(absl::StrCat(what, ": the arguments not begun"));
    } else {
      call.name = std::string(head);
    }
    if (call.name.empty()) return Unfinished(absl::StrCat(what, ": no function name"));
    ASSIGN_OR_RETURN(size_t end, JsonArguments(text, j, what, &call, out));
    out->calls.push_back(call);
    if (end == npos) return Unfinished(absl::StrCat(what, ": arguments not finished"));
    if (fenced) {
      const size_t k = SkipSpace(text, end);
      if (StartsWith(text, k, kFence)) end = k + kFence.size();
    }
    ASSIGN_OR_RETURN(i, CallEnd(text, end, kDsCallEnd, what, partial));
    if (i == npos) return absl::OkStatus();
  }
}

// minimax (MiniMax-M1's and Apriel's): <tool_calls>, then call objects {"name": ..., "arguments":
// {...}}, one a line (MiniMax-M1) or as one JSON array (Apriel), then </tool_calls>. A call is
// given whole once its object closes.
absl::Status ToolCallsBlock(std::string_view text, bool partial, Calls* out) {
  size_t i = SkipSpace(text, 0);
  if (StartsWith(text, i, kToolCalls)) i += kToolCalls.size();
  i = SkipSpace(text, i);
  bool in_array = i < text.size() && text[i] == '[';
  if (in_array) ++i;
  while (true) {
    i = SkipSpace(text, i);
    if (in_array && i < text.size() && (text[i] == ']' || text[i] == ',')) {
      in_array = text[i] == ',';
      ++i;
      continue;
    }
    if (StartsWith(text, i, kToolCallsEnd)) {
      if (out->calls.empty()) return Unfinished(absl::StrCat(CallWhat(*out), ": no calls"));
      AppendLeftover(text.substr(i + kToolCallsEnd.size()), &out->text);
      return absl::OkStatus();
    }
    const std::string what = CallWhat(*out);
    if (i >= text.size() || (partial && BeginsMarker(text, i, kToolCallsEnd))) {
      // A whole reply may end (EOS) where </tool_calls> would be.
      if (partial || !out->calls.empty()) return absl::OkStatus();
      return Unfinished(absl::StrCat(what, ": no calls"));
    }
    if (text[i] != '{') return Unfinished(absl::StrCat(what, ": expected a call object"));
    const size_t end = JsonValueEnd(text, i);
    if (end == npos) {
      out->open_json = i;
      return Unfinished(absl::StrCat(what, ": unterminated JSON"));
    }
    ASSIGN_OR_RETURN(const OrderedJson j, ParseOrderedJson(text.substr(i, end - i), what));
    const auto name = j.find("name");
    if (!j.is_object() || name == j.end() || !name->is_string() ||
        name->get<std::string>().empty()) {
      return Unfinished(absl::StrCat(what, ": no \"name\" string"));
    }
    auto args = j.find("arguments");
    if (args == j.end()) args = j.find("parameters");
    out->calls.push_back(
        Call{name->get<std::string>(), args == j.end() ? "{}" : Dump(*args), true});
    i = end;
  }
}

// mistral, as Mistral's v11+ tokenizers write it (Mistral Small 3.2, Devstral, Ministral 3,
// Magistral): [TOOL_CALLS]NAME[ARGS]{...} for each call ([TOOL_CALLS]NAME[CALL_ID]ID[ARGS] in
// some versions), where the older form is one JSON array after the marker.
absl::Status MistralNamedCalls(std::string_view text, bool partial, Calls* out) {
  size_t i = 0;
  while (true) {
    i = SkipSpace(text, i);
    if (!StartsWith(text, i, kMistralCalls)) {
      if (i >= text.size() || (partial && BeginsMarker(text, i, kMistralCalls))) {
        return absl::OkStatus();
      }
      if (out->calls.empty()) return Unfinished(absl::StrCat(CallWhat(*out), ": expected a call"));
      AppendLeftover(text.substr(i), &out->text);
      return absl::OkStatus();
    }
    i += kMistralCalls.size();
    const std::string what = CallWhat(*out);
    const size_t args = text.find(kMistralArgs, i);
    if (args == npos) return Unfinished(absl::StrCat(what, ": no [ARGS]"));
    std::string_view head = text.substr(i, args - i);
    if (const size_t id = head.find(kMistralCallId); id != npos) head = head.substr(0, id);
    Call call;
    call.name = std::string(Strip(head));
    if (call.name.empty()) return Unfinished(absl::StrCat(what, ": no function name"));
    ASSIGN_OR_RETURN(size_t end, JsonArguments(text, args + kMistralArgs.size(), what, &call, out));
    out->calls.push_back(call);
    if (end == npos) return Unfinished(absl::StrCat(what, ": arguments not finished"));
    i = end;
  }
}

// kimi_k2: <|tool_calls_section_begin|> then calls <|tool_call_begin|>functions.NAME:INDEX
// <|tool_call_argument_begin|>{...}<|tool_call_end|>, <|tool_calls_section_end|> after the last.
absl::Status KimiCalls(std::string_view text, bool partial, Calls* out) {
  size_t i = SkipSpace(text, 0);
  if (StartsWith(text, i, kKimiSection)) i += kKimiSection.size();
  while (true) {
    i = SkipSpace(text, i);
    if (StartsWith(text, i, kKimiSectionEnd)) {
      AppendLeftover(text.substr(i + kKimiSectionEnd.size()), &out->text);
      return absl::OkStatus();
    }
    if (i >= text.size() || (partial && BeginsMarker(text, i, kKimiCall)) ||
        (partial && BeginsMarker(text, i, kKimiSectionEnd))) {
      return absl::OkStatus();
    }
    const std::string what = CallWhat(*out);
    if (!StartsWith(text, i, kKimiCall)) {
      if (out->calls.empty()) return Unfinished(absl::StrCat(what, ": expected a call"));
      AppendLeftover(text.substr(i), &out->text);
      return absl::OkStatus();
    }
    i += kKimiCall.size();
    const size_t args = text.find(kKimiArgs, i);
    if (args == npos) return Unfinished(absl::StrCat(what, ": no <|tool_call_argument_begin|>"));
    // The call's id: "functions." NAME ":" INDEX.
    std::string_view id = Strip(text.substr(i, args - i));
    if (id.substr(0, 10) == "functions.") id.remove_prefix(10);
    if (const size_t colon = id.rfind(':'); colon != npos) id = id.substr(0, colon);
    Call call;
    call.name = std::string(id);
    if (call.name.empty()) return Unfinished(absl::StrCat(what, ": no function name"));
    ASSIGN_OR_RETURN(size_t end, JsonArguments(text, args + kKimiArgs.size(), what, &call, out));
    out->calls.push_back(call);
    if (end == npos) return Unfinished(absl::StrCat(what, ": arguments not finished"));
    ASSIGN_OR_RETURN(i, CallEnd(text, end, kKimiCallEnd, what, partial));
    if (i == npos) return absl::OkStatus();
  }
}

}  // namespace

std::string_view Strip(std::string_view s) {
  const absl::string_view t = absl::StripAsciiWhitespace(AV(s));
  return std::string_view(t.data(), t.size());
}

size_t SkipSpace(std::string_view s, size_t i) {
  while (i < s.size() && absl::ascii_isspace(static_cast<unsigned char>(s[i]))) ++i;
  return i;
}

bool JsonDepth::Step(char c) {
  if (escape) {
    escape = false;
  } else if (in_string) {
    if (c == '\\') {
      escape = true;
    } else if (c == '"') {
      in_string = false;
    }
  } else if (c == '"') {
    in_string = true;
  } else if (c == '{' || c == '[') {
    ++depth;
  } else if (c == '}' || c == ']') {
    return --depth == 0;
  }
  return false;
}

size_t JsonValueEnd(std::string_view s, size_t i) {
  JsonDepth d;
  for (; i < s.size(); ++i) {
    if (d.Step(s[i])) return i + 1;
  }
  return npos;
}

bool MayChange(ToolCallFormat format, std::string_view text, size_t from) {
  // The XML-like formats' reading changes only when a tag of theirs closes: at a '>' whose
  // nearest '<' before it opens one of their tags ('>' in a value, as code has, changes nothing).
  std::vector<std::string_view> tags;
  switch (format) {
    case ToolCallFormat::kQwen3Coder:
      tags = {kToolCall, kToolCallEnd, kFunction, kFunctionEnd, kParameter, kParameterEnd};
      break;
    case ToolCallFormat::kGlm45:
      tags = {kToolCall, kToolCallEnd, kArgKey, kArgKeyEnd, kArgValue, kArgValueEnd};
      break;
    case ToolCallFormat::kMinimaxM2:
      tags = {kMinimaxCall, kMinimaxCallEnd, kInvoke, kInvokeEnd, kNamedParameter, kParameterEnd};
      break;
    case ToolCallFormat::kDeepSeekV32:
      tags = {kDsmlFunctionCalls, kDsmlFunctionCallsEnd, kDsmlToolCalls, kDsmlToolCallsEnd,
              kDsmlInvoke,        kDsmlInvokeEnd,        kDsmlParameter, kDsmlParameterEnd};
      break;
    default:
      return true;
  }
  // A tag's name (a function's, a parameter's) is short: look back this far for its '<'.
  constexpr size_t kTagLookback = 320;
  for (size_t p = text.find('>', from); p != npos; p = text.find('>', p + 1)) {
    const size_t floor = p > kTagLookback ? p - kTagLookback : 0;
    const size_t back = text.substr(floor, p - floor).rfind('<');
    if (back == npos) continue;
    const size_t lt = floor + back;
    for (std::string_view tag : tags) {
      // The tag without its '>' ("<tool_call" of "<tool_call>"): names and attributes follow.
      const std::string_view stem = tag.back() == '>' ? tag.substr(0, tag.size() - 1) : tag;
      if (text.substr(lt, stem.size()) == stem) return true;
    }
  }
  return false;
}

void AppendLeftover(std::string_view piece, std::string* out) {
  const std::string_view t = Strip(piece);
  if (t.empty()) return;
  if (!out->empty()) out->push_back('\n');
  out->append(t);
}

std::optional<bool> MistralNamedForm(std::string_view text) {
  size_t i = SkipSpace(text, 0);
  if (!StartsWith(text, i, kMistralCalls)) return std::nullopt;
  i = SkipSpace(text, i + kMistralCalls.size());
  if (i >= text.size()) return std::nullopt;
  return text[i] != '[' && text[i] != '{';
}

bool Handles(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kQwen3Coder:
    case ToolCallFormat::kGlm45:
    case ToolCallFormat::kMinimaxM2:
    case ToolCallFormat::kDeepSeekV3:
    case ToolCallFormat::kKimiK2:
    case ToolCallFormat::kMinimax:
    case ToolCallFormat::kDeepSeekV32:
      return true;
    default:
      return false;
  }
}

std::string_view StartMarker(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kQwen3Coder:
    case ToolCallFormat::kGlm45:
      return kToolCall;
    case ToolCallFormat::kMinimaxM2:
      return kMinimaxCall;
    case ToolCallFormat::kDeepSeekV3:
      return kDsCallsBegin;
    case ToolCallFormat::kKimiK2:
      return kKimiSection;
    case ToolCallFormat::kMinimax:
      return kToolCalls;
    case ToolCallFormat::kDeepSeekV32:
      return kDsml;  // its block's tag: function_calls (V3.2) or tool_calls (V4)
    default:
      return "";
  }
}

std::vector<std::string_view> Markers(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kQwen3Coder:
      return {kToolCall, kToolCallEnd};
    case ToolCallFormat::kGlm45:
      return {kToolCall, kToolCallEnd, kArgKey, kArgKeyEnd, kArgValue, kArgValueEnd};
    case ToolCallFormat::kMinimaxM2:
      return {kMinimaxCall, kMinimaxCallEnd};
    case ToolCallFormat::kDeepSeekV3:
      return {kDsCallsBegin, kDsCallsEnd, kDsCallBegin, kDsCallEnd, kDsSep};
    case ToolCallFormat::kKimiK2:
      return {kKimiSection, kKimiSectionEnd, kKimiCall, kKimiArgs, kKimiCallEnd};
    case ToolCallFormat::kMinimax:
      return {kToolCalls, kToolCallsEnd};
    case ToolCallFormat::kDeepSeekV32:
      return {kDsmlFunctionCalls, kDsmlFunctionCallsEnd, kDsmlToolCalls, kDsmlToolCallsEnd};
    default:
      return {};
  }
}

absl::StatusOr<Calls> Parse(ToolCallFormat format, std::string_view text,
                            const ToolParamTypes& types, bool partial) {
  Calls out;
  absl::Status st;
  switch (format) {
    case ToolCallFormat::kQwen3Coder: {
      // The functions of one block (Qwen3-Coder's templates put each value on lines of its own).
      const auto functions = [&](std::string_view block, bool closed) {
        return XmlFunctions(block, closed, kFunction, kFunctionEnd, kParameter, kParameterEnd,
                            /*trim_newline=*/true, types, partial, &out);
      };
      // Qwen3-Coder sometimes leaves <tool_call> out: functions that begin the text are read as
      // a block of their own, up to the first <tool_call>, as vLLM reads them.
      const size_t lead = SkipSpace(text, 0);
      if (StartsWith(text, lead, kFunction)) {
        const size_t block_end = text.find(kToolCall, lead);
        st = functions(text.substr(lead, block_end == npos ? npos : block_end - lead),
                       /*closed=*/block_end != npos);
        if (!st.ok() || block_end == npos) break;
        text = text.substr(block_end);
      }
      st = ForEachBlock(text, kToolCall, kToolCallEnd, &out, functions);
      break;
    }
    case ToolCallFormat::kGlm45:
      st = ForEachBlock(text, kToolCall, kToolCallEnd, &out, [&](std::string_view b, bool c) {
        return GlmCall(b, c, types, partial, &out);
      });
      break;
    case ToolCallFormat::kMinimaxM2:
      st = ForEachBlock(text, kMinimaxCall, kMinimaxCallEnd, &out, [&](std::string_view b, bool c) {
        // MiniMax-M2's writes each value right between its tags: a newline there is the value's.
        return XmlFunctions(b, c, kInvoke, kInvokeEnd, kNamedParameter, kParameterEnd,
                            /*trim_newline=*/false, types, partial, &out);
      });
      break;
    case ToolCallFormat::kDeepSeekV3:
      st = DeepSeekCalls(text, partial, &out);
      break;
    case ToolCallFormat::kDeepSeekV32: {
      // V3.2 writes a function_calls block, V4 a tool_calls block: the one the reply opens.
      const bool v4 = text.find(kDsmlToolCalls) < text.find(kDsmlFunctionCalls);
      st = ForEachBlock(
          text, v4 ? kDsmlToolCalls : kDsmlFunctionCalls,
          v4 ? kDsmlToolCallsEnd : kDsmlFunctionCallsEnd, &out, [&](std::string_view b, bool c) {
            return XmlFunctions(b, c, kDsmlInvoke, kDsmlInvokeEnd, kDsmlParameter,
                                kDsmlParameterEnd, /*trim_newline=*/false, types, partial, &out);
          });
      break;
    }
    case ToolCallFormat::kKimiK2:
      st = KimiCalls(text, partial, &out);
      break;
    case ToolCallFormat::kMistral:
      st = MistralNamedCalls(text, partial, &out);
      break;
    case ToolCallFormat::kMinimax:
      st = ToolCallsBlock(text, partial, &out);
      break;
    default:
      return absl::InvalidArgumentError("tool calls: not a markup format");
  }
  // A partial reply is read as far as it goes: what stopped the reading is its end (or text
  // that is already malformed, which the whole reply's reading reports).
  if (!st.ok() && !partial) return st;
  return out;
}

}  // namespace kvrm::tool_markup
