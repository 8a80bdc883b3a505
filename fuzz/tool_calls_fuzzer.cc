// Fuzzes the tool-call parsers and the stream filter (model/tool_calls.h) with what a model can
// write: the input's first byte picks the format (each of model/tool_calls.h's) and the mode
// (AUTO, REQUIRED, a named function); the rest is the reply, cut into chunks at 0x01 bytes, a
// 0x02 byte standing for the format's start marker (a marker token arrives as its text, alone in
// its chunk). Invariants:
//   - without calls, the text streamed plus the text released at the end is exactly the reply;
//   - with calls, what was streamed is a prefix of the reply, no streamed text holds the start
//     marker (AUTO), and every call has a name, a "call_" id and arguments that are one compact
//     JSON object (parsing and printing it again gives the same text);
//   - a returned call carries its index's streamed id exactly when it is the call streamed
//     there, else an id no streamed call has;
//   - the parsers never crash on any text, and bound their nesting.
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/json.h"
#include "fuzz/fuzz_util.h"
#include "model/tool_calls.h"

namespace {

void CheckCall(const kvrm::ToolCall& call) {
  FUZZ_CHECK(!call.name.empty());
  FUZZ_CHECK(call.id.rfind("call_", 0) == 0 && call.id.size() == 29);
  absl::StatusOr<kvrm::OrderedJson> args = kvrm::ParseOrderedJson(call.arguments, "arguments");
  FUZZ_CHECK(args.ok() && args->is_object());
  FUZZ_CHECK(args->dump() == call.arguments);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  using F = kvrm::ToolCallFormat;
  const F formats[] = {F::kHermes,     F::kLlama3Json, F::kMistral,     F::kGranite,
                       F::kQwen3Coder, F::kGlm45,      F::kMinimaxM2,   F::kDeepSeekV3,
                       F::kKimiK2,     F::kMinimax,    F::kDeepSeekV32, F::kPythonic};
  constexpr int kFormats = sizeof(formats) / sizeof(formats[0]);
  const kvrm::ToolCallFormat format = formats[data[0] % kFormats];
  const kvrm::ToolCallStream::Mode modes[] = {kvrm::ToolCallStream::Mode::kAuto,
                                              kvrm::ToolCallStream::Mode::kRequired,
                                              kvrm::ToolCallStream::Mode::kNamed};
  const kvrm::ToolCallStream::Mode mode = modes[(data[0] / kFormats) % 3];
  const bool parse = (data[0] / (3 * kFormats)) % 2 == 0;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  // Typed parameters for the XML-like formats' values.
  const std::vector<kvrm::ToolSpec> tools = {
      {"f", "",
       R"({"properties": {"a": {"type": "string"}, "n": {"type": "integer"}, "b": {"type": )"
       R"("boolean"}, "o": {"type": "object"}}})"}};
  const kvrm::ToolParamTypes types(tools);

  // The parsers alone, on the whole text.
  for (kvrm::ToolCallFormat f : formats) {
    absl::StatusOr<kvrm::ParsedToolCalls> p = kvrm::ParseToolCalls(f, body, &types);
    if (p.ok()) {
      FUZZ_CHECK(!p->calls.empty());
      for (const kvrm::ToolCall& c : p->calls) CheckCall(c);
    }
  }
  if (absl::StatusOr<std::vector<kvrm::ToolCall>> r = kvrm::ParseRequiredToolCalls(body); r.ok()) {
    for (const kvrm::ToolCall& c : *r) CheckCall(c);
  }

  const kvrm::ToolCallSyntax syntax = kvrm::MakeToolCallSyntax(format);
  kvrm::ToolCallStream stream(mode, &syntax, "f", false, tools);
  std::string reply, streamed;
  std::map<int32_t, std::string> delta_ids, delta_names, delta_args;
  size_t start = 0;
  while (start <= body.size()) {
    size_t end = body.find('\x01', start);
    if (end == std::string_view::npos) end = body.size();
    std::string chunk(body.substr(start, end - start));
    if (chunk == "\x02") chunk = syntax.start;
    reply.append(chunk);
    const std::string out = stream.Feed(chunk);
    for (kvrm::ToolCallDelta& d : stream.TakeDeltas()) {
      FUZZ_CHECK(d.index >= 0);
      std::string& id = delta_ids[d.index];
      // A call's first delta names it; later ones carry arguments only.
      FUZZ_CHECK(id.empty() ? !d.id.empty() : d.id.empty() && d.name.empty());
      if (id.empty()) {
        id = d.id;
        delta_names[d.index] = d.name;
      }
      delta_args[d.index] += d.arguments;
    }
    if (mode == kvrm::ToolCallStream::Mode::kAuto) {
      FUZZ_CHECK(out.find(syntax.start) == std::string::npos);
      for (const std::string& also : syntax.also_starts) {
        FUZZ_CHECK(out.find(also) == std::string::npos);
      }
    }
    streamed += out;
    start = end + 1;
  }
  const kvrm::ToolCallStream::Result r = stream.Finish(parse);
  // Finish adds only the last piece of a call it completes, one that was streamed.
  for (kvrm::ToolCallDelta& d : stream.TakeDeltas()) {
    FUZZ_CHECK(d.id.empty() && d.name.empty() && delta_ids.count(d.index) > 0);
    delta_args[d.index] += d.arguments;
  }
  FUZZ_CHECK(reply.compare(0, streamed.size(), streamed) == 0);
  // A call's pieces are the model's own text, in order: one stretch of the reply (except in the
  // XML-like formats, whose arguments object is built from the values they write, and AUTO's
  // pythonic calls, whose one delta is the JSON object of the call's Python literals).
  const bool pythonic_calls =
      format == F::kPythonic && mode == kvrm::ToolCallStream::Mode::kAuto;
  if (format != F::kQwen3Coder && format != F::kGlm45 && format != F::kMinimaxM2 &&
      format != F::kMinimax && format != F::kDeepSeekV32 && !pythonic_calls) {
    for (const auto& [index, args] : delta_args) FUZZ_CHECK(reply.find(args) != std::string::npos);
  }
  if (pythonic_calls) {
    for (const auto& [index, args] : delta_args) {
      absl::StatusOr<kvrm::OrderedJson> object = kvrm::ParseOrderedJson(args, "pythonic delta");
      FUZZ_CHECK(object.ok() && object->is_object() && object->dump() == args);
    }
  }
  // A returned call keeps its index's streamed id exactly when it is the call streamed there:
  // the same name, and arguments whose pieces parse to the same object. Otherwise (a key given
  // twice parses to its last value, "parameters" before "arguments" streams the first but
  // parses as "arguments") it has a fresh id, never one a streamed call holds, so a client
  // cannot take it for the streamed one.
  std::set<std::string> streamed_ids;
  for (const auto& [index, id] : delta_ids) streamed_ids.insert(id);
  for (size_t i = 0; i < r.calls.size(); ++i) {
    const int32_t index = static_cast<int32_t>(i);
    auto it = delta_ids.find(index);
    if (it == delta_ids.end()) {
      FUZZ_CHECK(streamed_ids.count(r.calls[i].id) == 0);
      continue;
    }
    absl::StatusOr<kvrm::OrderedJson> args = kvrm::ParseOrderedJson(delta_args[index], "args");
    const bool same = delta_names[index] == r.calls[i].name && args.ok() &&
                      args->dump() == r.calls[i].arguments;
    FUZZ_CHECK(same ? r.calls[i].id == it->second : streamed_ids.count(r.calls[i].id) == 0);
  }
  if (r.calls.empty()) {
    FUZZ_CHECK(streamed + r.text == reply);
  } else {
    FUZZ_CHECK(parse && !r.malformed);
    for (const kvrm::ToolCall& c : r.calls) CheckCall(c);
    if (mode == kvrm::ToolCallStream::Mode::kNamed) FUZZ_CHECK(r.calls.size() == 1);
  }
  return 0;
}
