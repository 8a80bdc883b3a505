#include "runtime/text_stream.h"

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace kvrm {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";

// Like Python's bytes.decode("utf-8", errors="replace"): each maximal invalid subpart (including
// a truncated sequence at the end) becomes one U+FFFD.
std::string Utf8Lossy(const std::string& in) {
  std::string out;
  size_t i = 0;
  while (i < in.size()) {
    const unsigned char c = in[i];
    if (c < 0x80) {
      out += in[i++];
      continue;
    }
    int need = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte (Unicode table 3-7)
    if (c >= 0xC2 && c <= 0xDF) {
      need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      need = 2;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      need = 3;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      out += kReplacement;
      ++i;
      continue;
    }
    size_t j = i + 1;
    int got = 0;
    while (got < need && j < in.size()) {
      const unsigned char d = in[j];
      if (d < (got == 0 ? lo : 0x80) || d > (got == 0 ? hi : 0xBF)) break;
      ++j;
      ++got;
    }
    if (got == need) {
      out.append(in, i, j - i);
    } else {
      out += kReplacement;
    }
    i = j;
  }
  return out;
}

bool IsValidUtf8(const std::string& s) { return Utf8Lossy(s) == s; }

// Byte-level table: whole words, the 4 bytes of U+1F600 as 4 tokens, é as 2 tokens, € as 2+1
// bytes, and a special token that decodes to nothing (skip_special_tokens).
const std::vector<std::string>& ByteTable() {
  // clang-format off
  static const auto* table = new std::vector<std::string>{
      "Hello", " world", "!", " ",                   // 0-3
      "\xF0", "\x9F", "\x98", "\x80",                // 4-7: U+1F600
      "\xC3", "\xA9",                                // 8-9: é
      "\xE2\x82", "\xAC",                            // 10-11: €
      "ab", "c", "abc", "",                          // 12-15 (15: special)
      "\n", "\xC3\xA9", "x", " peace", "wor", "ld",  // 16-21
  };
  // clang-format on
  return *table;
}

std::string ByteDecode(absl::Span<const int32_t> ids) {
  std::string bytes;
  for (int32_t id : ids) bytes += ByteTable()[id];
  return Utf8Lossy(bytes);
}

// SentencePiece-like table: "▁" is a space and the decoded text drops one leading space; byte
// fallback tokens carry raw bytes.
const std::vector<std::string>& PieceTable() {
  // clang-format off
  static const auto* table = new std::vector<std::string>{
      "\xE2\x96\x81Hello", "\xE2\x96\x81world", "!", "\xE2\x96\x81",  // 0-3
      "ing", "\xE2\x96\x81the", "\xF0", "\x9F", "\x98", "\x80",       // 4-9
      "\xE2\x96\x81Say",                                              // 10
  };
  // clang-format on
  return *table;
}

std::string PieceDecode(absl::Span<const int32_t> ids) {
  std::string bytes;
  for (int32_t id : ids) bytes += PieceTable()[id];
  std::string out;
  const std::string space = "\xE2\x96\x81";
  for (size_t i = 0; i < bytes.size();) {
    if (bytes.compare(i, space.size(), space) == 0) {
      out += ' ';
      i += space.size();
    } else {
      out += bytes[i++];
    }
  }
  if (!out.empty() && out[0] == ' ') out.erase(0, 1);
  return Utf8Lossy(out);
}

struct StreamRun {
  std::vector<std::string> deltas;
  std::string finish;
  std::string all;  // deltas + finish
  bool stopped = false;
  std::string matched_stop;
};

// The first `unmatched` ids are pushed with match_stops = false (a request's min_tokens).
StreamRun Stream(TextStream::DecodeFn decode, const std::vector<int32_t>& ids,
                 std::vector<std::string> stops, std::vector<int32_t> context = {},
                 size_t unmatched = 0, bool include_stops = false) {
  TextStream stream(std::move(decode), std::move(stops), std::move(context), include_stops);
  StreamRun run;
  for (size_t i = 0; i < ids.size(); ++i) {
    TextStream::Delta d = stream.Push(ids[i], /*match_stops=*/i >= unmatched);
    EXPECT_TRUE(IsValidUtf8(d.text)) << "delta splits a character";
    run.deltas.push_back(d.text);
    run.all += d.text;
    if (d.stopped) {
      run.stopped = true;
      run.matched_stop = d.matched_stop;
      break;
    }
  }
  run.finish = stream.Finish();
  EXPECT_TRUE(IsValidUtf8(run.finish));
  run.all += run.finish;
  if (stream.stopped()) {
    run.stopped = true;
    run.matched_stop = stream.matched_stop();
  }
  EXPECT_EQ(stream.text(), run.all);
  EXPECT_EQ(stream.Finish(), "");  // idempotent
  return run;
}

// The prompt context may end inside a character (random token-id prompts do): the generated
// bytes that complete it must not make a delta start in the middle of a character.
TEST(TextStreamTest, ContextEndingInsideACharacter) {
  // Context ends with 0xF0 0x9F (half of U+1F600); generation brings 0x98 0x80, then "x".
  const StreamRun run = Stream(ByteDecode, {6, 7, 18}, {}, /*context=*/{0, 4, 5});
  for (const std::string& d : run.deltas) EXPECT_TRUE(IsValidUtf8(d)) << d;
  EXPECT_TRUE(IsValidUtf8(run.all));
  EXPECT_TRUE(absl::StrContains(run.all, "x"));
  // Context ends with 0xC3 (half of é) and generation is plain text.
  const StreamRun plain = Stream(ByteDecode, {0, 18}, {}, /*context=*/{8});
  EXPECT_TRUE(IsValidUtf8(plain.all));
  EXPECT_EQ(plain.all, "Hellox");
}

TEST(TextStreamTest, EmojiInFourByteTokensComesOutWhole) {
  const StreamRun run = Stream(ByteDecode, {0, 3, 4, 5, 6, 7, 2}, {});
  EXPECT_EQ(run.deltas,
            (std::vector<std::string>{"Hello", " ", "", "", "", "\xF0\x9F\x98\x80", "!"}));
  EXPECT_EQ(run.finish, "");
  EXPECT_EQ(run.all, ByteDecode(std::vector<int32_t>{0, 3, 4, 5, 6, 7, 2}));
}

TEST(TextStreamTest, SplitCharactersAndSpecialTokens) {
  const std::vector<int32_t> ids = {18, 8, 9, 15, 10, 11, 15, 16};
  const StreamRun run = Stream(ByteDecode, ids, {});
  EXPECT_EQ(run.deltas,
            (std::vector<std::string>{"x", "", "\xC3\xA9", "", "", "\xE2\x82\xAC", "", "\n"}));
  EXPECT_EQ(run.all, ByteDecode(ids));
}

TEST(TextStreamTest, IncompleteCharacterAtTheEndIsReleasedByFinish) {
  const std::vector<int32_t> ids = {0, 4, 5};  // "Hello" + 2 of the emoji's 4 bytes
  const StreamRun run = Stream(ByteDecode, ids, {});
  EXPECT_EQ(run.all, std::string("Hello") + kReplacement);
  EXPECT_EQ(run.finish, kReplacement);
  EXPECT_EQ(run.all, ByteDecode(ids));
}

TEST(TextStreamTest, LoneLeadBytesAreReleasedWithoutReDecodingAGrowingWindow) {
  // 300 tokens that are each the lead byte of a 4-byte character: no character ever completes.
  // The text is what the whole decode gives; each token costs a bounded decode, not one over
  // everything since the first lead byte.
  int64_t decoded = 0;
  auto counting = [&decoded](absl::Span<const int32_t> ids) {
    decoded += static_cast<int64_t>(ids.size());
    return ByteDecode(ids);
  };
  const std::vector<int32_t> ids(300, 4);
  const StreamRun run = Stream(counting, ids, {});
  EXPECT_EQ(run.all, ByteDecode(ids));
  EXPECT_LT(decoded, 300 * 40) << "quadratic: the held window kept growing";
  // A character split over tokens still comes out whole.
  EXPECT_EQ(Stream(ByteDecode, {0, 4, 5, 6, 7}, {}).all, "Hello\xF0\x9F\x98\x80");
}

TEST(TextStreamTest, SentencePieceSpacesSurvive) {
  const std::vector<int32_t> ids = {0, 1, 2, 3, 5, 6, 7, 8, 9};
  const StreamRun run = Stream(PieceDecode, ids, {});
  EXPECT_EQ(run.deltas, (std::vector<std::string>{"Hello", " world", "!", " ", " the", "", "", "",
                                                  "\xF0\x9F\x98\x80"}));
  EXPECT_EQ(run.all, PieceDecode(ids));
  // A bare "▁" after the first token is an ordinary space; as the first token it is stripped.
  EXPECT_EQ(Stream(PieceDecode, {0, 3, 4}, {}).all, "Hello ing");
  EXPECT_EQ(Stream(PieceDecode, {3, 0}, {}).deltas, (std::vector<std::string>{"", " Hello"}));
  // With prompt context the first token keeps its leading space, as in the full text.
  const StreamRun with_context = Stream(PieceDecode, {0, 1}, {}, /*context=*/{10});
  EXPECT_EQ(with_context.deltas, (std::vector<std::string>{" Hello", " world"}));
}

TEST(TextStreamTest, StopInsideOneToken) {
  const StreamRun run = Stream(ByteDecode, {18, 0, 1}, {"ll"});
  EXPECT_TRUE(run.stopped);
  EXPECT_EQ(run.matched_stop, "ll");
  EXPECT_EQ(run.all, "xHe");
  EXPECT_EQ(run.deltas.size(), 2u);  // generation ends at the token that completed the stop
  EXPECT_EQ(run.finish, "");
}

TEST(TextStreamTest, IncludedStopEndsTheTextAndWhatFollowsItIsDropped) {
  // "xHe" + "ll" inside one token: the stop is released, the token's "o" after it is not.
  const StreamRun inside = Stream(ByteDecode, {18, 0, 1}, {"ll"}, {}, 0, /*include_stops=*/true);
  EXPECT_TRUE(inside.stopped);
  EXPECT_EQ(inside.matched_stop, "ll");
  EXPECT_EQ(inside.all, "xHell");
  EXPECT_EQ(inside.deltas.size(), 2u);
  // Spanning tokens: the held-back start of the stop is released with its end.
  const StreamRun spanning = Stream(ByteDecode, {0, 1, 2}, {"o w"}, {}, 0, true);
  const StreamRun cut = Stream(ByteDecode, {0, 1, 2}, {"o w"});
  EXPECT_TRUE(spanning.stopped);
  EXPECT_EQ(spanning.all, cut.all + "o w");
  // No match: the same text as without the option.
  EXPECT_EQ(Stream(ByteDecode, {0, 1, 2}, {"zz"}, {}, 0, true).all,
            Stream(ByteDecode, {0, 1, 2}, {"zz"}).all);
}

TEST(TextStreamTest, StopSpanningTwoTokens) {
  const StreamRun run = Stream(ByteDecode, {0, 1, 2}, {"o w"});
  EXPECT_EQ(run.deltas, (std::vector<std::string>{"Hell", ""}));  // "o" held back, then the stop
  EXPECT_TRUE(run.stopped);
  EXPECT_EQ(run.all, "Hell");
}

TEST(TextStreamTest, StopSpanningAMultiByteCharacter) {
  // "x" + é as two byte tokens + "!" with stop "é!".
  const StreamRun run = Stream(ByteDecode, {18, 8, 9, 2, 0}, {"\xC3\xA9!"});
  EXPECT_EQ(run.deltas, (std::vector<std::string>{"x", "", "", ""}));
  EXPECT_TRUE(run.stopped);
  EXPECT_EQ(run.all, "x");
  // A stop that starts with the tail bytes of a character is found in the decoded text too.
  const StreamRun emoji = Stream(ByteDecode, {0, 4, 5, 6, 7, 2, 1}, {"\xF0\x9F\x98\x80!"});
  EXPECT_TRUE(emoji.stopped);
  EXPECT_EQ(emoji.all, "Hello");
}

TEST(TextStreamTest, PartialStopThenDivergeReleasesHeldText) {
  const StreamRun run = Stream(ByteDecode, {18, 12, 13, 2}, {"abd"});
  EXPECT_EQ(run.deltas, (std::vector<std::string>{"x", "", "abc", "!"}));
  EXPECT_FALSE(run.stopped);
  // Held text at the end of generation comes out of Finish.
  const StreamRun held = Stream(ByteDecode, {18, 12}, {"abd"});
  EXPECT_EQ(held.deltas, (std::vector<std::string>{"x", ""}));
  EXPECT_EQ(held.finish, "ab");
  EXPECT_FALSE(held.stopped);
}

TEST(TextStreamTest, TextBeforeMinTokensIsNeverPartOfAStop) {
  // "x", "Hello", " world", "!". "ll" would stop inside "Hello"; pushed unmatched, it comes out
  // whole at once (nothing held back) and the stream goes on.
  EXPECT_TRUE(Stream(ByteDecode, {18, 0, 1}, {"ll"}).stopped);
  const StreamRun held = Stream(ByteDecode, {18, 0, 1}, {"ll"}, {}, /*unmatched=*/2);
  EXPECT_EQ(held.deltas, (std::vector<std::string>{"x", "Hello", " world"}));
  EXPECT_FALSE(held.stopped);
  // A stop straddling the boundary is not matched either ("o w": "o" is unmatched text).
  EXPECT_FALSE(Stream(ByteDecode, {18, 0, 1}, {"o w"}, {}, 2).stopped);
  // One wholly after it is.
  const StreamRun after = Stream(ByteDecode, {18, 0, 1, 2}, {"d!"}, {}, 2);
  EXPECT_TRUE(after.stopped);
  EXPECT_EQ(after.all, "xHello worl");
}

TEST(TextStreamTest, ShorterStopThatCompletesFirstWins) {
  // " world" completes "wor" before "world peace" could complete.
  const StreamRun run = Stream(ByteDecode, {0, 1, 19}, {"world peace", "wor"});
  EXPECT_TRUE(run.stopped);
  EXPECT_EQ(run.matched_stop, "wor");
  EXPECT_EQ(run.all, "Hello ");
  // Two stops completing at the same byte: the longer (earlier starting) one.
  const StreamRun same_end = Stream(ByteDecode, {18, 14}, {"bc", "abc"});
  EXPECT_EQ(same_end.matched_stop, "abc");
  EXPECT_EQ(same_end.all, "x");
  // Spread over tokens, the longer stop still loses to one completing earlier.
  const StreamRun spread = Stream(ByteDecode, {0, 3, 20, 21, 19}, {"world peace", "orl"});
  EXPECT_EQ(spread.matched_stop, "orl");
  EXPECT_EQ(spread.all, "Hello w");
}

TEST(TextStreamTest, StopCompletedByTheFinalText) {
  // The trailing incomplete character becomes U+FFFD only at Finish, which completes the stop.
  const StreamRun run = Stream(ByteDecode, {0, 4}, {std::string("o") + kReplacement});
  EXPECT_EQ(run.deltas, (std::vector<std::string>{"Hell", ""}));
  EXPECT_EQ(run.finish, "");
  EXPECT_TRUE(run.stopped);
  EXPECT_EQ(run.all, "Hell");
}

TEST(TextStreamTest, EmptyStopIsIgnoredAndPushAfterStopIsInert) {
  TextStream stream(ByteDecode, {"", "!"});
  EXPECT_EQ(stream.Push(0).text, "Hello");
  const TextStream::Delta stop = stream.Push(2);
  EXPECT_TRUE(stop.stopped);
  const TextStream::Delta after = stream.Push(1);
  EXPECT_TRUE(after.stopped);
  EXPECT_EQ(after.text, "");
  EXPECT_EQ(stream.text(), "Hello");
}

TEST(TextStreamTest, LongStreamsCompactTheirTokenWindow) {
  std::vector<int32_t> ids;
  for (int i = 0; i < 2000; ++i) ids.push_back(i % 7 == 0 ? 15 : (i % 3 == 0 ? 17 : 12));
  const StreamRun run = Stream(ByteDecode, ids, {});
  EXPECT_EQ(run.all, ByteDecode(ids));
}

// ---- property test ---------------------------------------------------------------------------

// Full text truncated at the stop that completes first (ties: the longer one).
struct Expected {
  std::string text;
  bool stopped;
};
Expected Reference(const std::string& full, const std::vector<std::string>& stops) {
  size_t best_start = std::string::npos, best_end = std::string::npos;
  for (const std::string& s : stops) {
    if (s.empty()) continue;
    const size_t pos = full.find(s);
    if (pos == std::string::npos) continue;
    const size_t end = pos + s.size();
    if (best_end == std::string::npos || end < best_end || (end == best_end && pos < best_start)) {
      best_start = pos;
      best_end = end;
    }
  }
  if (best_end == std::string::npos) return {full, false};
  return {full.substr(0, best_start), true};
}

// Start offsets of the characters of valid UTF-8 `s`, plus s.size().
std::vector<size_t> CharBoundaries(const std::string& s) {
  std::vector<size_t> b;
  for (size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) b.push_back(i);
  }
  b.push_back(s.size());
  return b;
}

TEST(TextStreamTest, PropertyMatchesTruncatedFullDecode) {
  std::mt19937_64 rng(12345);  // fully specified engine; values used through % only
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  int stopped_runs = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    const bool pieces = iter % 4 == 3;
    const TextStream::DecodeFn decode = pieces ? PieceDecode : ByteDecode;
    const size_t table = pieces ? PieceTable().size() : ByteTable().size();
    std::vector<int32_t> ids(pick(25));
    for (int32_t& id : ids) id = pick(table);
    const std::string full = decode(ids);

    // Stops: substrings of this text at character boundaries (they will match), substrings of an
    // unrelated sequence's text, and matching prefixes that then diverge.
    std::vector<std::string> stops;
    std::vector<int32_t> other(pick(10));
    for (int32_t& id : other) id = pick(table);
    const std::string other_text = decode(other);
    for (size_t k = pick(4); k > 0; --k) {
      const std::string& src = pick(2) ? full : other_text;
      const std::vector<size_t> b = CharBoundaries(src);
      if (b.size() < 2) continue;
      const size_t i = pick(b.size() - 1);
      const size_t j = std::min(b.size() - 1, i + 1 + pick(4));
      std::string s = src.substr(b[i], b[j] - b[i]);
      if (pick(4) == 0) s += "#";  // a prefix of it may match, the whole never does
      stops.push_back(s);
    }
    const Expected want = Reference(full, stops);
    SCOPED_TRACE(::testing::Message() << "iter " << iter);
    const StreamRun run = Stream(decode, ids, stops);
    ASSERT_EQ(run.all, want.text);
    ASSERT_EQ(run.stopped, want.stopped);
    if (run.stopped) ++stopped_runs;
    // Without stops the deltas reassemble the full decode exactly.
    if (iter % 10 == 0) {
      ASSERT_EQ(Stream(decode, ids, {}).all, full);
    }
  }
  EXPECT_GT(stopped_runs, 500);  // the generator exercises stops, not only plain streaming
}

}  // namespace
}  // namespace kvrm
