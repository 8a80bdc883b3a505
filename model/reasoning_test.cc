#include "model/reasoning.h"

#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace kvrm {
namespace {

struct Parts {
  std::string reasoning, content;
  bool operator==(const Parts& o) const { return reasoning == o.reasoning && content == o.content; }
};

std::ostream& operator<<(std::ostream& os, const Parts& p) {
  return os << "{reasoning \"" << p.reasoning << "\", content \"" << p.content << "\"}";
}

// The stream fed `text` in pieces of the given sizes (the rest in one), then finished.
Parts Stream(const std::string& text, bool starts_inside, const std::vector<size_t>& pieces = {}) {
  ReasoningStream s(starts_inside);
  Parts out;
  size_t at = 0;
  auto take = [&](const ReasoningStream::Split& split) {
    out.reasoning += split.reasoning;
    out.content += split.content;
  };
  for (size_t n : pieces) {
    if (at >= text.size()) break;
    n = std::min(n, text.size() - at);
    take(s.Feed(std::string_view(text).substr(at, n)));
    at += n;
  }
  take(s.Feed(std::string_view(text).substr(at)));
  take(s.Finish());
  return out;
}

// The whole-text reading the stream must agree with, written from the header's definition.
Parts Reference(std::string s, bool starts_inside) {
  if (!starts_inside) {
    const size_t p = s.find_first_not_of(" \n\t\r");
    if (p == std::string::npos || s.compare(p, 7, "<think>") != 0) return {"", s};
    s = s.substr(p + 7);
  }
  const size_t e = s.find("</think>");
  std::string r = e == std::string::npos ? s : s.substr(0, e);
  std::string c = e == std::string::npos ? "" : s.substr(e + 8);
  r.erase(0, std::min(r.size(), r.find_first_not_of('\n')));
  r.erase(r.find_last_not_of('\n') + 1);
  c.erase(0, std::min(c.size(), c.find_first_not_of('\n')));
  return {r, c};
}

TEST(ReasoningTest, Qwen3ReplyWritesItsOwnThinkBlock) {
  const std::string reply = "<think>\nThe user wants 2 + 2.\nThat is 4.\n</think>\n\nIt is 4.";
  const Parts want{"The user wants 2 + 2.\nThat is 4.", "It is 4."};
  EXPECT_EQ(Stream(reply, false), want);
  // Every way of cutting it into two pieces, and one byte at a time.
  for (size_t cut = 0; cut <= reply.size(); ++cut) {
    EXPECT_EQ(Stream(reply, false, {cut}), want) << "cut at " << cut;
  }
  EXPECT_EQ(Stream(reply, false, std::vector<size_t>(reply.size(), 1)), want);
}

TEST(ReasoningTest, PromptOpenedThinkingAsDeepSeekR1) {
  EXPECT_EQ(Stream("Okay, so 6 x 7.\n\n42.\n</think>\n\n**42**", true),
            (Parts{"Okay, so 6 x 7.\n\n42.", "**42**"}));
  // No closing marker (cut by the length limit): all of it is thinking.
  EXPECT_EQ(Stream("\nStill thinking\n\n", true), (Parts{"Still thinking", ""}));
  // A closing marker cut off at the end is thinking text.
  EXPECT_EQ(Stream("hmm </thi", true), (Parts{"hmm </thi", ""}));
}

TEST(ReasoningTest, ReplyWithoutThinkingIsAnswerAsWritten) {
  EXPECT_EQ(Stream("  Hello <think> there </think> you", false),
            (Parts{"", "  Hello <think> there </think> you"}));
  EXPECT_EQ(Stream("\n\n", false), (Parts{"", "\n\n"}));
  EXPECT_EQ(Stream("<thi", false), (Parts{"", "<thi"}));  // ended before the marker completed
  EXPECT_EQ(Stream("<thing>", false, {3}), (Parts{"", "<thing>"}));
  // Qwen3 with enable_thinking false: the empty block was in the prompt.
  EXPECT_FALSE(PromptOpensReasoning("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
}

TEST(ReasoningTest, EmptyThinkingAndASecondClosingMarker) {
  EXPECT_EQ(Stream("<think>\n\n</think>\n\nHi", false), (Parts{"", "Hi"}));
  EXPECT_EQ(Stream("<think>a</think>b</think>c", false), (Parts{"a", "b</think>c"}));
  EXPECT_EQ(Stream("<think>a</think>", false), (Parts{"a", ""}));
}

TEST(ReasoningTest, HoldsBackAtMostAMarker) {
  ReasoningStream s(false);
  EXPECT_EQ(s.Feed("  <th").content, "");
  ReasoningStream::Split split = s.Feed("ink>one two");
  EXPECT_EQ(split.reasoning, "one two");
  EXPECT_TRUE(s.reasoning());
  split = s.Feed(" three\n\n</");
  EXPECT_EQ(split.reasoning, " three");  // the newlines and "</" wait
  split = s.Feed("think>\n");
  EXPECT_EQ(split.reasoning, "");
  EXPECT_EQ(split.content, "");
  EXPECT_FALSE(s.reasoning());
  split = s.Feed("\nAnswer\n");
  EXPECT_EQ(split.content, "Answer\n");
  EXPECT_EQ(s.Finish().content, "");
}

// Random texts from marker fragments, fed in random pieces: the stream agrees with the
// whole-text reading.
TEST(ReasoningTest, RandomPiecesAgreeWithTheWholeText) {
  const std::vector<std::string> fragments = {"<think>", "</think>", "\n", "\n\n", "a",    "bc",
                                              " ",       "<",        "/",  "th",   "ink>", "<t"};
  std::mt19937 rng(7);
  for (int trial = 0; trial < 3000; ++trial) {
    std::string text;
    const int n = std::uniform_int_distribution<int>(0, 12)(rng);
    for (int i = 0; i < n; ++i) {
      text += fragments[std::uniform_int_distribution<size_t>(0, fragments.size() - 1)(rng)];
    }
    std::vector<size_t> pieces;
    for (size_t at = 0; at < text.size();) {
      pieces.push_back(std::uniform_int_distribution<size_t>(0, 5)(rng));
      at += pieces.back();
    }
    const bool inside = trial % 2 == 1;
    EXPECT_EQ(Stream(text, inside, pieces), Reference(text, inside))
        << "text \"" << text << "\" inside " << inside;
  }
}

TEST(ReasoningTest, PromptOpensReasoning) {
  EXPECT_TRUE(PromptOpensReasoning("<|Assistant|><think>\n"));
  EXPECT_TRUE(PromptOpensReasoning("</think>past turn<|im_start|>assistant\n<think>\n"));
  EXPECT_FALSE(PromptOpensReasoning("<|im_start|>assistant\n"));
  EXPECT_FALSE(PromptOpensReasoning("<think>\n\n</think>\n\n"));
}

TEST(ReasoningTest, FormatNamesAndDetection) {
  for (const char* name : {"think", "qwen3", "deepseek_r1"}) {
    absl::StatusOr<ReasoningFormat> f = ReasoningFormatFromName(name);
    ASSERT_TRUE(f.ok()) << name;
    EXPECT_EQ(*f, ReasoningFormat::kThink);
  }
  EXPECT_EQ(*ReasoningFormatFromName("none"), ReasoningFormat::kNone);
  const absl::Status bad = ReasoningFormatFromName("o1").status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.message().find("none, think, deepseek_r1, qwen3, harmony or openai_gptoss"),
            std::string::npos);
  for (const char* name : {"harmony", "openai_gptoss"}) {
    EXPECT_EQ(*ReasoningFormatFromName(name), ReasoningFormat::kHarmony) << name;
  }
  EXPECT_EQ(ReasoningFormatName(ReasoningFormat::kHarmony), "harmony");
  EXPECT_EQ(DetectReasoningFormat("{{ '<|start|>assistant<|channel|>final<|message|>' }}"),
            ReasoningFormat::kHarmony);
  EXPECT_EQ(DetectReasoningFormat("{{ content.split('</think>')[-1] }}"), ReasoningFormat::kThink);
  EXPECT_EQ(DetectReasoningFormat("{{ '<|im_start|>' + message.content }}"),
            ReasoningFormat::kNone);
}

}  // namespace
}  // namespace kvrm
