// kvrm's chat-template engine on 70 real models' templates (testdata/chat_templates/, as
// llama.cpp keeps them from each model's Hugging Face repository; README there): each must parse,
// render a plain conversation (system, user, assistant, user) and a tool-calling one (tools given,
// an assistant tool call with no content, the tool's answer) with every user message in the
// output, except the failures listed below, each for the reason given (the same template fails
// the same way under transformers' Jinja, or is an engine gap named here). And where llama.cpp's
// own Jinja engine rendered the same conversation (testdata/chat_templates/expected/, made by
// tools/gguf/llama_cpp_reference/render_template.cc), the output must be its text byte for byte:
// 108 renders of 60 templates. Not there: the renders llama.cpp fails or takes more leniently
// than Jinja (str + dict, list.append, none iterated, integer dict keys, its from_json), and
// GLM-4.6, GLM-4.7-Flash and MiniMax-M2 with a tool-call turn, whose content none Jinja (and
// kvrm) write as "None" and llama.cpp as "".
#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include "absl/strings/match.h"
#include "absl/time/time.h"
#include "common/json.h"
#include "gtest/gtest.h"
#include "model/chat_template.h"

namespace kvrm {
namespace {

constexpr char kDir[] = "model/testdata/chat_templates";

// Stage and a substring of the error, per template that does not get through.
struct Expected {
  std::string stage;  // "parse", "plain" or "tools"
  std::string error;
};

const std::map<std::string, Expected>& ExpectedFailures() {
  static const auto* m = new std::map<std::string, Expected>{
      // `from_json`: no such filter in Jinja or transformers' environment; Jinja refuses the
      // template when compiling it, as kvrm does (llama.cpp only if the branch runs).
      {"deepseek-ai-DeepSeek-V3.2.jinja", {"parse", "unknown filter 'from_json'"}},
      {"deepseek-ai-DeepSeek-V4.jinja", {"parse", "unknown filter 'from_json'"}},
      {"deepseek-ai-DeepSeek-V4-Flash-0731.jinja", {"parse", "unknown filter 'from_json'"}},
      // The template's own refusal of a system message.
      {"google-gemma-2-2b-it.jinja", {"plain", "System role not supported"}},
      // Needs `functions`, a variable of Fireworks' own serving code.
      {"fireworks-ai-llama-3-firefunction-v2.jinja", {"plain", "'functions' is undefined"}},
      // Tool-use variants that iterate `tools` unguarded: none without tools, as in Jinja.
      {"CohereForAI-c4ai-command-r-plus-tool_use.jinja", {"plain", "not iterable"}},
      {"NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja", {"plain", "not iterable"}},
      {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", {"plain", "not iterable"}},
      {"meetkai-functionary-medium-v3.1.jinja", {"plain", "not iterable"}},
      // Integer dict keys: an engine gap (dict keys are strings).
      {"ByteDance-Seed-OSS.jinja", {"plain", "dict keys must be strings"}},
      // The template's own check: Mistral's tool call ids are 9 alphanumerics ("call_1" here).
      {"mistralai-Mistral-Nemo-Instruct-2407.jinja", {"tools", "Tool call IDs should be"}},
      {"Mistral-Small-3.2-24B-Instruct-2506.jinja", {"tools", "Tool call IDs should be"}},
      // list.append: transformers' ImmutableSandboxedEnvironment refuses it too.
      {"Kimi-K2-Instruct.jinja", {"tools", "no method 'append'"}},
      {"Kimi-K2-Thinking.jinja", {"tools", "no method 'append'"}},
      // Concatenate the call's arguments as a string; transformers (and vLLM) pass a dict.
      {"deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", {"tools", "'str' and 'dict'"}},
      {"meetkai-functionary-medium-v3.2.jinja", {"tools", "'str' and 'dict'"}},
  };
  return *m;
}

ChatTemplateInputs Plain() {
  ChatTemplateInputs in;
  in.messages = {{"system", "You are helpful."},
                 {"user", "Hi there"},
                 {"assistant", "Hello! How can I help?"},
                 {"user", "What is 2+2?"}};
  in.add_generation_prompt = true;
  in.bos_token = "<s>";
  in.eos_token = "</s>";
  in.now = absl::FromUnixSeconds(1796428800);  // 2026-12-05 00:00 UTC, as the reference renders
  in.time_zone = absl::UTCTimeZone();
  return in;
}

ChatTemplateInputs Tools() {
  ChatTemplateInputs in;
  in.messages = {{"user", "Weather in Lima?"}};
  ChatMessage call;
  call.role = "assistant";
  call.tool_calls = {{"call_1", "get_weather", R"({"city": "Lima"})"}};
  in.messages.push_back(call);
  ChatMessage answer;
  answer.role = "tool";
  answer.content = R"({"temp": 21})";
  answer.tool_call_id = "call_1";
  answer.name = "get_weather";
  in.messages.push_back(answer);
  in.tools = {R"({"type": "function", "function": {"name": "get_weather", "description":
      "Weather of a city", "parameters": {"type": "object", "properties": {"city": {"type":
      "string"}}, "required": ["city"]}}})"};
  in.add_generation_prompt = true;
  in.bos_token = "<s>";
  in.eos_token = "</s>";
  in.now = absl::FromUnixSeconds(1796428800);
  in.time_zone = absl::UTCTimeZone();
  return in;
}

// llama.cpp's render of `name`'s conversation (plain or tools), if there is one.
std::optional<std::string> Reference(const std::string& stem, const std::string& conversation) {
  const std::filesystem::path p =
      std::filesystem::path(kDir) / "expected" / (stem + "." + conversation + ".txt");
  if (!std::filesystem::exists(p)) return std::nullopt;
  absl::StatusOr<std::string> text = ReadFileToString(p.string());
  EXPECT_TRUE(text.ok()) << text.status();
  return text.ok() ? *std::move(text) : "";
}

TEST(ChatTemplateCorpusTest, RealTemplatesRenderOrFailAsListed) {
  int files = 0, plain_ok = 0, tools_ok = 0, compared = 0;
  std::map<std::string, Expected> seen;
  for (const auto& entry : std::filesystem::directory_iterator(kDir)) {
    if (entry.path().extension() != ".jinja") continue;
    ++files;
    const std::string name = entry.path().filename().string();
    const auto expected = ExpectedFailures().find(name);
    const std::string fails_at = expected != ExpectedFailures().end() ? expected->second.stage : "";
    auto check_failure = [&](const std::string& stage, const absl::Status& st) {
      EXPECT_EQ(fails_at, stage) << name << " failed at " << stage << ": " << st.message();
      if (fails_at == stage) {
        EXPECT_TRUE(absl::StrContains(st.message(), expected->second.error))
            << name << ": " << st.message();
        seen[name] = expected->second;
      }
    };
    const absl::StatusOr<std::string> read = ReadFileToString(entry.path().string());
    ASSERT_TRUE(read.ok()) << read.status();
    const std::string& source = *read;
    absl::StatusOr<ChatTemplate> t = ChatTemplate::Parse(source);
    if (!t.ok()) {
      check_failure("parse", t.status());
      continue;
    }
    // Both conversations are rendered whatever the other gave (a tool-use template that needs
    // tools fails the plain one and renders the other).
    const std::string stem = entry.path().stem().string();
    bool failed = false;
    absl::StatusOr<std::string> plain = t->Render(Plain());
    if (!plain.ok()) {
      check_failure("plain", plain.status());
      failed = true;
    } else {
      ++plain_ok;
      if (std::optional<std::string> ref = Reference(stem, "plain")) {
        ++compared;
        EXPECT_EQ(*plain, *ref) << name << ": not llama.cpp's render";
      }
      EXPECT_TRUE(absl::StrContains(*plain, "Hi there")) << name << ":\n" << *plain;
      EXPECT_TRUE(absl::StrContains(*plain, "What is 2+2?")) << name << ":\n" << *plain;
    }
    absl::StatusOr<std::string> tools = t->Render(Tools());
    if (!tools.ok()) {
      // A template that failed the plain conversation may fail this one too, for its reason.
      if (!failed) check_failure("tools", tools.status());
      continue;
    }
    ++tools_ok;
    if (std::optional<std::string> ref = Reference(stem, "tools")) {
      ++compared;
      EXPECT_EQ(*tools, *ref) << name << ": not llama.cpp's render";
    }
    EXPECT_TRUE(absl::StrContains(*tools, "Weather in Lima?")) << name << ":\n" << *tools;
    // A template that reads tools or tool calls at all shows the function's name.
    if (absl::StrContains(source, "tools") || absl::StrContains(source, "tool_calls")) {
      EXPECT_TRUE(absl::StrContains(*tools, "get_weather")) << name << ":\n" << *tools;
    }
    if (!failed) EXPECT_EQ(fails_at, "") << name << " was expected to fail at " << fails_at;
  }
  EXPECT_EQ(files, 70);
  EXPECT_EQ(seen.size(), ExpectedFailures().size()) << "a listed template is missing";
  EXPECT_EQ(compared, 108) << "renders compared with llama.cpp's";
  std::printf(
      "%d templates: %d render the plain conversation, %d the tool-calling one; %d renders equal "
      "to llama.cpp's\n",
      files, plain_ok, tools_ok, compared);
}

}  // namespace
}  // namespace kvrm
