// What reading a streamed reply for tool calls costs, per format: a call that writes a file (a
// `content` argument of --kb KB of code, '<' and '>' in it) is fed to ToolCallStream in pieces of
// --piece bytes (about a token's text), as the server feeds each completion's text, and set
// beside one read of the whole reply (ParseToolCalls) in the same run. A stream that re-read the
// reply at every piece would cost pieces/2 whole reads (hundreds at 40 KB); one that reads each
// byte a bounded number of times costs a small multiple of one, whatever the size.
//
//   bazel run -c opt //bench:tool_call_stream_bench -- [--kb=40] [--piece=4] [--json=FILE]
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "model/tool_calls.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(int32_t, kb, 40, "size of the call's content argument, in KB");
ABSL_FLAG(int32_t, piece, 4, "bytes fed at a time");
ABSL_FLAG(int32_t, repeats, 3, "runs of each measurement; the fastest is kept");
ABSL_FLAG(std::string, json, "", "also write the results to this JSON file");

namespace kvrm {
namespace {

using Clock = std::chrono::steady_clock;

std::string Code(int kb) {
  std::string code;
  const char* lines[] = {"def area(w, h):\n", "    if w > 0 and h < 100:\n",
                         "        return w * h  # <b>bold</b> -> fine\n", "    return None\n"};
  for (int i = 0; code.size() < static_cast<size_t>(kb) * 1024; ++i) code += lines[i % 4];
  return code;
}

std::string JsonString(const std::string& s) { return nlohmann::json(s).dump(); }

// The reply that calls write_file(path, content) in `format`, after a line of text.
std::string Reply(ToolCallFormat format, const std::string& code) {
  const std::string args = "{\"path\": \"shapes.py\", \"content\": " + JsonString(code) + "}";
  const std::string lead = "I'll write the file.\n";
  switch (format) {
    case ToolCallFormat::kHermes:
      return lead + "<tool_call>\n{\"name\": \"write_file\", \"arguments\": " + args +
             "}\n</tool_call>";
    case ToolCallFormat::kLlama3Json:  // its calls are the whole reply
      return "<|python_tag|>{\"name\": \"write_file\", \"parameters\": " + args + "}";
    case ToolCallFormat::kMistral:
      return lead + "[TOOL_CALLS]write_file[ARGS]" + args;
    case ToolCallFormat::kGranite:
      return lead + "<|tool_call|>[{\"name\": \"write_file\", \"arguments\": " + args + "}]";
    case ToolCallFormat::kQwen3Coder:
      return lead +
             "<tool_call>\n<function=write_file>\n<parameter=path>\nshapes.py\n"
             "</parameter>\n<parameter=content>\n" +
             code + "\n</parameter>\n</function>\n</tool_call>";
    case ToolCallFormat::kGlm45:
      return lead +
             "<tool_call>write_file\n<arg_key>path</arg_key>\n<arg_value>shapes.py"
             "</arg_value>\n<arg_key>content</arg_key>\n<arg_value>" +
             code + "</arg_value>\n</tool_call>";
    case ToolCallFormat::kMinimaxM2:
      return lead +
             "<minimax:tool_call>\n<invoke name=\"write_file\">\n<parameter name=\"path\">"
             "shapes.py</parameter>\n<parameter name=\"content\">" +
             code + "</parameter>\n</invoke>\n</minimax:tool_call>";
    case ToolCallFormat::kMinimax:
      return lead + "<tool_calls>\n{\"name\": \"write_file\", \"arguments\": " + args +
             "}\n</tool_calls>";
    case ToolCallFormat::kDeepSeekV3:
      return lead + "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>write_file<｜tool▁sep｜>" + args +
             "<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
    case ToolCallFormat::kKimiK2:
      return lead +
             "<|tool_calls_section_begin|><|tool_call_begin|>functions.write_file:0"
             "<|tool_call_argument_begin|>" +
             args + "<|tool_call_end|><|tool_calls_section_end|>";
    case ToolCallFormat::kDeepSeekV32:
      return lead +
             "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"write_file\">\n"
             "<｜DSML｜parameter name=\"path\" string=\"true\">shapes.py</｜DSML｜parameter>\n"
             "<｜DSML｜parameter name=\"content\" string=\"true\">" +
             code + "</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>";
    case ToolCallFormat::kPythonic:  // (a JSON string is a Python string literal too)
      return lead + "<|python_start|>[write_file(path='shapes.py', content=" + JsonString(code) +
             ")]<|python_end|>";
    case ToolCallFormat::kNone:
      break;
  }
  return "";
}

double Ms(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

int Run() {
  const int kb = absl::GetFlag(FLAGS_kb);
  const size_t piece = static_cast<size_t>(std::max(1, absl::GetFlag(FLAGS_piece)));
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  const std::string code = Code(kb);
  const std::vector<ToolSpec> tools = {
      {"write_file", "",
       R"({"type": "object", "properties": {"path": {"type": "string"}, "content": {"type": )"
       R"("string"}}})"}};
  const ToolParamTypes types(tools);
  std::printf("a write_file call with %d KB of content, fed %zu bytes at a time (best of %d)\n\n",
              kb, piece, repeats);
  std::printf("%-12s %8s %7s %7s %10s %9s %10s %9s\n", "format", "bytes", "pieces", "deltas",
              "stream ms", "us/piece", "1 read ms", "stream/1");
  nlohmann::json rows = nlohmann::json::array();
  bool ok = true;
  for (ToolCallFormat f :
       {ToolCallFormat::kHermes, ToolCallFormat::kLlama3Json, ToolCallFormat::kMistral,
        ToolCallFormat::kGranite, ToolCallFormat::kQwen3Coder, ToolCallFormat::kGlm45,
        ToolCallFormat::kMinimaxM2, ToolCallFormat::kMinimax, ToolCallFormat::kDeepSeekV3,
        ToolCallFormat::kKimiK2, ToolCallFormat::kDeepSeekV32, ToolCallFormat::kPythonic}) {
    const std::string reply = Reply(f, code);
    const ToolCallSyntax syntax = MakeToolCallSyntax(f);
    double stream_ms = 1e300, read_ms = 1e300;
    size_t pieces = 0, deltas = 0;
    bool right = true;
    for (int r = 0; r < repeats; ++r) {
      const Clock::time_point t0 = Clock::now();
      ToolCallStream s(ToolCallStream::Mode::kAuto, &syntax, "", false, tools);
      pieces = deltas = 0;
      std::string args;
      for (size_t i = 0; i < reply.size(); i += piece) {
        s.Feed(std::string_view(reply).substr(i, piece));
        for (const ToolCallDelta& d : s.TakeDeltas()) {
          ++deltas;
          args += d.arguments;
        }
        ++pieces;
      }
      const ToolCallStream::Result result = s.Finish(true);
      const Clock::time_point t1 = Clock::now();
      // What the stream holds and parses: the reply from the format's start marker on.
      const std::string_view held = std::string_view(reply).substr(reply.find(syntax.start));
      absl::StatusOr<ParsedToolCalls> once = ParseToolCalls(f, held, &types);
      const Clock::time_point t2 = Clock::now();
      stream_ms = std::min(stream_ms, Ms(t0, t1));
      read_ms = std::min(read_ms, Ms(t1, t2));
      // Both readings give the one call, its content whole.
      right = right && result.calls.size() == 1 && once.ok() && once->calls.size() == 1 &&
              result.calls[0].arguments == once->calls[0].arguments &&
              nlohmann::json::parse(once->calls[0].arguments).at("content") == code;
    }
    ok = ok && right;
    const std::string name(ToolCallFormatName(f));
    std::printf("%-12s %8zu %7zu %7zu %10.2f %9.3f %10.3f %8.1fx%s\n", name.c_str(), reply.size(),
                pieces, deltas, stream_ms, stream_ms * 1000 / pieces, read_ms, stream_ms / read_ms,
                right ? "" : "  WRONG CALL");
    rows.push_back({{"format", name},
                    {"bytes", reply.size()},
                    {"pieces", pieces},
                    {"deltas", deltas},
                    {"stream_ms", stream_ms},
                    {"us_per_piece", stream_ms * 1000 / pieces},
                    {"one_read_ms", read_ms},
                    {"stream_over_one_read", stream_ms / read_ms},
                    {"calls_right", right}});
  }
  std::printf("\nstream/1: the whole stream's cost over one read of the finished reply.\n");
  if (!absl::GetFlag(FLAGS_json).empty()) {
    nlohmann::json out = {{"kb", kb}, {"piece_bytes", piece}, {"formats", rows}};
    std::ofstream(absl::GetFlag(FLAGS_json)) << out.dump(2) << "\n";
  }
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace kvrm

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return kvrm::Run();
}
