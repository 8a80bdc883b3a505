#include "model/harmony.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace kvrm {
namespace {

// The whole reply fed in pieces of `piece` bytes (0: at once), then finished.
HarmonyStream::Split Split(std::string_view reply, bool tools, size_t piece = 0) {
  HarmonyStream s(tools);
  HarmonyStream::Split all;
  const size_t step = piece == 0 ? reply.size() : piece;
  for (size_t i = 0; i < reply.size(); i += step) {
    HarmonyStream::Split out = s.Feed(reply.substr(i, step));
    all.reasoning += out.reasoning;
    all.content += out.content;
  }
  HarmonyStream::Split out = s.Finish();
  all.reasoning += out.reasoning;
  all.content += out.content;
  return all;
}

// Every way of cutting the reply into pieces gives the same split.
void ExpectSplit(std::string_view reply, bool tools, const std::string& reasoning,
                 const std::string& content) {
  for (size_t piece : {size_t{0}, size_t{1}, size_t{2}, size_t{3}, size_t{7}, size_t{13}}) {
    const HarmonyStream::Split got = Split(reply, tools, piece);
    EXPECT_EQ(got.reasoning, reasoning) << "pieces of " << piece;
    EXPECT_EQ(got.content, content) << "pieces of " << piece;
  }
}

TEST(HarmonyTest, AnalysisIsReasoningAndFinalIsContent) {
  ExpectSplit(
      "<|channel|>analysis<|message|>The user greets. Reply <b>briefly</b>.<|end|>"
      "<|start|>assistant<|channel|>final<|message|>Hello! How can I help?",
      false, "The user greets. Reply <b>briefly</b>.", "Hello! How can I help?");
}

TEST(HarmonyTest, FunctionCallsBecomeHermesMarkupWithTools) {
  const std::string reply =
      "<|channel|>analysis<|message|>Need weather.<|end|>"
      "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
      "<|message|>{\"city\": \"Oslo\"}";  // <|call|> is the stop token: not in the text
  ExpectSplit(reply, true, "Need weather.",
              "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Oslo\"}}\n"
              "</tool_call>");
  // The recipient may come before the channel, and the call may end with <|call|> in the text.
  ExpectSplit(
      "<|channel|>analysis<|message|>x<|end|><|start|>assistant to=functions.f<|channel|>"
      "commentary json<|message|>{}<|call|>",
      true, "x", "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>");
  // Without tools a call is not for the user: reasoning (a body of its own: a new line).
  ExpectSplit(reply, false, "Need weather.\n{\"city\": \"Oslo\"}", "");
  // A reply whose first message is a call, its recipient first as gpt-oss's template writes
  // it, fed a byte at a time too.
  ExpectSplit(" to=functions.f<|channel|>commentary json<|message|>{}", true, "",
              "<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>");
  // A name that would break the JSON is escaped.
  ExpectSplit("<|channel|>commentary to=functions.a\"b<|message|>{}", true, "",
              "<tool_call>\n{\"name\": \"a\\\"b\", \"arguments\": {}}\n</tool_call>");
}

TEST(HarmonyTest, PreamblesAreContentAndBuiltInToolsReasoning) {
  ExpectSplit(
      "<|channel|>commentary<|message|>Let me look.<|end|>"
      "<|start|>assistant<|channel|>analysis to=browser.search<|message|>{\"q\": 1}<|call|>",
      true, "{\"q\": 1}", "Let me look.");
  // A preamble, then the answer: two bodies of the content, on two lines; two analysis
  // messages likewise.
  ExpectSplit(
      "<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>analysis<|message|>b"
      "<|end|><|start|>assistant<|channel|>commentary<|message|>Looking.<|end|>"
      "<|start|>assistant<|channel|>final<|message|>Done.",
      false, "a\nb", "Looking.\nDone.");
  // Two calls in one reply: both, in order.
  const HarmonyStream::Split two = Split(
      "<|channel|>commentary to=functions.a<|message|>{\"x\":1}<|call|>"
      "<|start|>assistant<|channel|>commentary to=functions.b<|message|>{\"y\":2}<|call|>",
      true);
  EXPECT_EQ(two.content,
            "<tool_call>\n{\"name\": \"a\", \"arguments\": {\"x\":1}}\n</tool_call>"
            "<tool_call>\n{\"name\": \"b\", \"arguments\": {\"y\":2}}\n</tool_call>");
}

TEST(HarmonyTest, RepliesThatIgnoreTheFormatAreContent) {
  ExpectSplit("Hello there <|end|> friend", false, "", "Hello there <|end|> friend");
  ExpectSplit("", false, "", "");
  // A header that never ends: nothing is given out for it; a body cut off: what came.
  ExpectSplit("<|channel|>analysis", false, "", "");
  ExpectSplit("<|channel|>analysis<|message|>thinking about it", false, "thinking about it", "");
  // A header run on past any header's length is text after all.
  const std::string runaway = "<|channel|>" + std::string(1100, 'a');
  EXPECT_EQ(Split(runaway, false).content, runaway);
}

TEST(HarmonyTest, ReasoningStateFollowsTheMessages) {
  HarmonyStream s(false);
  EXPECT_FALSE(s.reasoning());  // before the reply shows it is harmony
  s.Feed("<|chan");
  EXPECT_FALSE(s.reasoning());
  s.Feed("nel|>analysis<|message|>hm");
  EXPECT_TRUE(s.reasoning());
  s.Feed("<|end|><|start|>assistant<|channel|>final<|message|>Hi");
  EXPECT_FALSE(s.reasoning());
  HarmonyStream plain(false);
  plain.Feed("Hi");
  EXPECT_FALSE(plain.reasoning());
}

TEST(HarmonyTest, DetectsTheTemplate) {
  EXPECT_TRUE(IsHarmonyTemplate("{{- '<|start|>assistant<|channel|>final<|message|>' }}"));
  EXPECT_FALSE(IsHarmonyTemplate("{{ '<think>' }}"));
}

}  // namespace
}  // namespace kvrm
