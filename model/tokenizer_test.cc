#include "model/tokenizer.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/tokenizer_testdata.h"
#include "model/tokenizer_text.h"

namespace kvrm {
namespace {

using ::testing::HasSubstr;

// llama3_template is llama3/tokenizer.json with its post_processor replaced; synthetic/* are a
// real file with the components in their patch.json replaced (see tools/tokenizer_vectors).
std::string FamilyJson(const std::string& family) {
  if (family == "llama3_template") {
    absl::StatusOr<Json> j = ParseJson(TestdataTokenizerJson("llama3"), "llama3");
    absl::StatusOr<Json> patch =
        ReadJsonFile(absl::StrCat(kTokenizerTestdata, "llama3_template/post_processor.json"));
    if (!j.ok() || !patch.ok()) return "";
    (*j)["post_processor"] = *patch;
    return j->dump();
  }
  if (family.rfind("synthetic/", 0) == 0) {
    absl::StatusOr<Json> patch =
        ReadJsonFile(absl::StrCat(kTokenizerTestdata, family, "/patch.json"));
    if (!patch.ok()) return "";
    absl::StatusOr<Json> j = ParseJson(TestdataTokenizerJson((*patch)["base"]), family);
    if (!j.ok()) return "";
    for (const auto& [key, value] : patch->items()) {
      if (key != "base") (*j)[key] = value;
    }
    return j->dump();
  }
  return TestdataTokenizerJson(family);
}

// Loading the large files takes a while; each is loaded once for the whole test binary.
const Tokenizer& Get(const std::string& family) {
  static std::mutex mu;
  static auto* cache = new std::map<std::string, std::unique_ptr<Tokenizer>>;
  std::lock_guard<std::mutex> lock(mu);
  auto& slot = (*cache)[family];
  if (slot == nullptr) {
    const std::string json = FamilyJson(family);
    EXPECT_FALSE(json.empty()) << family;
    auto t = Tokenizer::FromJson(json, family);
    EXPECT_TRUE(t.ok()) << t.status();
    if (t.ok()) slot = std::move(*t);
  }
  if (slot == nullptr) {
    std::cerr << "cannot load tokenizer " << family << "\n";
    std::abort();
  }
  return *slot;
}

std::vector<int32_t> Ids(const Json& j) { return j.get<std::vector<int32_t>>(); }

class VectorsTest : public ::testing::TestWithParam<std::string> {};

TEST_P(VectorsTest, MatchesHuggingFace) {
  const Tokenizer& tok = Get(GetParam());
  std::ifstream in(absl::StrCat(kTokenizerTestdata, GetParam(), "/vectors.jsonl"));
  ASSERT_TRUE(in) << GetParam();
  std::string line;
  int lines = 0, failures = 0;
  while (std::getline(in, line)) {
    auto v = ParseJson(line, "vectors.jsonl");
    ASSERT_TRUE(v.ok()) << v.status();
    ++lines;
    auto check = [&](bool ok, const std::string& what) {
      if (ok) return;
      if (++failures <= 15) ADD_FAILURE() << GetParam() << " line " << lines << ": " << what;
    };
    std::vector<int32_t> ids_special;
    if (v->contains("text")) {
      const std::string text = (*v)["text"].get<std::string>();
      auto plain = tok.Encode(text, false);
      auto special = tok.Encode(text, true);
      ASSERT_TRUE(plain.ok() && special.ok()) << plain.status() << special.status();
      check(*plain == Ids((*v)["ids"]),
            absl::StrCat("encode(", (*v)["text"].dump(), ") = ", Json(*plain).dump(),
                         " want ", (*v)["ids"].dump()));
      check(*special == Ids((*v)["ids_special"]),
            absl::StrCat("encode(", (*v)["text"].dump(), ", special) = ", Json(*special).dump(),
                         " want ", (*v)["ids_special"].dump()));
      ids_special = Ids((*v)["ids_special"]);
    } else {
      ids_special = Ids((*v)["decode_ids"]);
    }
    const std::string decoded = tok.Decode(ids_special, false);
    const std::string decoded_skip = tok.Decode(ids_special, true);
    check(decoded == (*v)["decoded"].get<std::string>(),
          absl::StrCat("decode(", Json(ids_special).dump(), ") = ", Json(decoded).dump(), " want ",
                       (*v)["decoded"].dump()));
    check(decoded_skip == (*v)["decoded_skip"].get<std::string>(),
          absl::StrCat("decode(", Json(ids_special).dump(), ", skip) = ", Json(decoded_skip).dump(),
                       " want ", (*v)["decoded_skip"].dump()));
    // DecodeBytes differs from HF's decode only where HF had to repair bytes.
    for (const bool skip : {false, true}) {
      const std::string raw = tok.DecodeBytes(ids_special, skip);
      const std::string& want = skip ? decoded_skip : decoded;
      check(tok::IsValidUtf8(raw) ? raw == want : want.find("\xEF\xBF\xBD") != std::string::npos,
            absl::StrCat("decode_bytes(", Json(ids_special).dump(), ", ", skip, ") = ",
                         Json(tok::Utf8Lossy(raw)).dump(), " (lossy) vs ", Json(want).dump()));
    }
  }
  EXPECT_GT(lines, 80);
  EXPECT_EQ(failures, 0) << "of " << lines << " vectors";
}

INSTANTIATE_TEST_SUITE_P(Families, VectorsTest,
                         ::testing::Values("llama3", "llama2", "gpt2", "qwen3", "llama3_template",
                                           "synthetic/metaspace", "synthetic/metaspace_split",
                                           "synthetic/splits", "synthetic/inverted"));

// Random code points from the ranges real text mixes: ASCII (controls and whitespace included),
// Latin-1, combining marks, CJK, emoji.
std::string RandomText(std::mt19937* rng) {
  static const std::pair<uint32_t, uint32_t> kRanges[] = {
      {0x01, 0x7F}, {0x20, 0x7E}, {0x20, 0x7E}, {0xA0, 0xFF}, {0x300, 0x36F},
      {0x4E00, 0x9FFF}, {0x1F300, 0x1F64F}, {0x0A, 0x0A}, {0x20, 0x20},
  };
  std::uniform_int_distribution<int> len_dist(0, 24);
  std::uniform_int_distribution<size_t> range_dist(0, std::size(kRanges) - 1);
  std::string s;
  const int len = len_dist(*rng);
  for (int i = 0; i < len; ++i) {
    const auto& [lo, hi] = kRanges[range_dist(*rng)];
    tok::AppendUtf8(std::uniform_int_distribution<uint32_t>(lo, hi)(*rng), &s);
  }
  return s;
}

class RoundTripTest : public ::testing::TestWithParam<std::string> {};

TEST_P(RoundTripTest, DecodeInvertsEncodeOnRandomText) {
  const Tokenizer& tok = Get(GetParam());
  // Qwen normalizes to NFC first, so only the NFC form can come back.
  const bool nfc = GetParam() == "qwen3";
  std::mt19937 rng(1234);
  int failures = 0;
  for (int i = 0; i < 3000; ++i) {
    const std::string s = RandomText(&rng);
    auto ids = tok.Encode(s, false);
    ASSERT_TRUE(ids.ok()) << ids.status();
    const std::string back = tok.Decode(*ids, false);
    const std::string want = nfc ? Nfc(s) : s;
    if (back != want && ++failures <= 5) {
      ADD_FAILURE() << GetParam() << ": " << Json(want).dump() << " came back as "
                    << Json(back).dump() << " via " << Json(*ids).dump();
    }
    ASSERT_TRUE(tok::IsValidUtf8(back));
  }
  EXPECT_EQ(failures, 0);
}

INSTANTIATE_TEST_SUITE_P(Families, RoundTripTest,
                         ::testing::Values("llama3", "llama2", "gpt2", "qwen3"));

TEST(TokenizerTest, RejectsInvalidUtf8) {
  for (const std::string family : {"llama3", "llama2"}) {
    const Tokenizer& tok = Get(family);
    for (const std::string& bad : {std::string("\xff"), std::string("abc\xc3"),
                                  std::string("\xed\xa0\x80 surrogate"),
                                  std::string("\xc0\xaf overlong"), std::string("a\x80z")}) {
      auto ids = tok.Encode(bad, true);
      ASSERT_FALSE(ids.ok()) << family;
      EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(std::string(ids.status().message()), HasSubstr("text"));
    }
    std::mt19937 rng(7);
    std::uniform_int_distribution<int> byte(0, 255);
    for (int i = 0; i < 500; ++i) {
      std::string s(16, '\0');
      for (char& c : s) c = static_cast<char>(byte(rng));
      auto ids = tok.Encode(s, false);  // must not crash; valid or not
      if (ids.ok()) {
        EXPECT_EQ(tok.Decode(*ids, false), s);
      }
    }
  }
}

TEST(TokenizerTest, DecodeSkipsUnknownIdsAndRepairsBytes) {
  const Tokenizer& tok = Get("llama3");
  const int32_t n = tok.vocab_size();
  EXPECT_EQ(tok.Decode({-1, n, n + 100, 1}, false), tok.Decode({1}, false));
  // "Ã" is byte 0xC3 on its own: an incomplete sequence, shown as U+FFFD.
  const auto c3 = tok.TokenToId("Ã");
  ASSERT_TRUE(c3.has_value());
  EXPECT_EQ(tok.Decode({*c3}, false), "\xEF\xBF\xBD");
}

// Llama 3.1 names 128010 <|python_tag|>; the 3.0 vocabulary here has a reserved token there.
TEST(TokenizerTest, DecodeKeepingKeepsOnlyTheNamedSpecialTokens) {
  const Tokenizer& tok = Get("llama3");
  const std::optional<int32_t> marker = tok.TokenToId("<|reserved_special_token_5|>");
  ASSERT_TRUE(marker.has_value());
  ASSERT_TRUE(tok.IsSpecial(*marker));
  absl::StatusOr<std::vector<int32_t>> ids =
      tok.Encode("Hi<|reserved_special_token_5|>{\"a\": 1}<|eot_id|>", /*add_special_tokens=*/true);
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_EQ(tok.Decode(*ids, true), "Hi{\"a\": 1}");
  EXPECT_EQ(tok.DecodeKeeping(*ids, {*marker}), "Hi<|reserved_special_token_5|>{\"a\": 1}");
  EXPECT_EQ(tok.DecodeKeeping(*ids, {}), tok.Decode(*ids, true));
  // Keeping an ordinary token changes nothing: only special tokens are ever skipped.
  const std::optional<int32_t> hi = tok.TokenToId("Hi");
  ASSERT_TRUE(hi.has_value());
  EXPECT_EQ(tok.DecodeKeeping(*ids, {*hi}), tok.Decode(*ids, true));
}

// ---- DecodeBytes and TokenContinuationBytes ----

constexpr char kReplacementChar[] = "\xEF\xBF\xBD";

TEST(DecodeBytesTest, KeepsRawBytesWhereDecodeRepairs) {
  const Tokenizer& llama3 = Get("llama3");
  const int32_t c3 = *llama3.TokenToId("Ã");  // byte 0xC3: the lead of a two-byte character
  const int32_t a9 = *llama3.TokenToId("©");  // byte 0xA9: "é" is C3 A9
  EXPECT_EQ(llama3.Decode({c3}, false), kReplacementChar);
  EXPECT_EQ(llama3.DecodeBytes({c3}, false), "\xC3");
  EXPECT_EQ(llama3.Decode({c3, a9}, false), "é");
  EXPECT_EQ(llama3.DecodeBytes({c3, a9}, false), "é");
  const int32_t n = llama3.vocab_size();
  EXPECT_EQ(llama3.DecodeBytes({-1, c3, n}, false), "\xC3");  // unknown ids skipped, as in Decode
  const int32_t eot = *llama3.TokenToId("<|eot_id|>");
  EXPECT_EQ(llama3.DecodeBytes({c3, eot}, false), "\xC3<|eot_id|>");
  EXPECT_EQ(llama3.DecodeBytes({c3, eot}, true), "\xC3");

  // Byte fallback: HF writes one U+FFFD per byte of a run that is not valid UTF-8.
  const Tokenizer& llama2 = Get("llama2");
  const int32_t e4 = *llama2.TokenToId("<0xE4>"), b8 = *llama2.TokenToId("<0xB8>"),
                ad = *llama2.TokenToId("<0xAD>"), the = *llama2.TokenToId("▁the");
  EXPECT_EQ(llama2.Decode({e4, b8}, false), absl::StrCat(kReplacementChar, kReplacementChar));
  EXPECT_EQ(llama2.DecodeBytes({e4, b8}, false), "\xE4\xB8");
  EXPECT_EQ(llama2.Decode({e4, b8, ad}, false), "中");
  EXPECT_EQ(llama2.DecodeBytes({e4, b8, ad}, false), "中");
  EXPECT_EQ(llama2.Decode({the, e4, the}, false), absl::StrCat("the", kReplacementChar, " the"));
  EXPECT_EQ(llama2.DecodeBytes({the, e4, the}, false), "the\xE4 the");  // Strip still applies
  EXPECT_EQ(llama2.DecodeBytes({1, the}, true), "the");
  EXPECT_EQ(llama2.DecodeBytes({1, the}, false), "<s> the");

  const Tokenizer& metaspace = Get("synthetic/metaspace");  // ByteFallback, then Metaspace
  EXPECT_EQ(metaspace.Decode({the, e4, the}, false), absl::StrCat("the", kReplacementChar, " the"));
  EXPECT_EQ(metaspace.DecodeBytes({the, e4, the}, false), "the\xE4 the");
  // E2 96 81 is "▁", but E2 96 81 FF is not valid UTF-8: Decode gives four U+FFFD, so the bytes
  // stay four separate bytes in DecodeBytes too, and Metaspace never sees a "▁" to turn into " ".
  std::vector<int32_t> run = {the};
  for (const char* b : {"<0xE2>", "<0x96>", "<0x81>", "<0xFF>"}) {
    run.push_back(*llama2.TokenToId(b));
  }
  EXPECT_EQ(metaspace.Decode(run, false),
            absl::StrCat("the", kReplacementChar, kReplacementChar, kReplacementChar,
                         kReplacementChar));
  EXPECT_EQ(metaspace.DecodeBytes(run, false), "the\xE2\x96\x81\xFF");
}

// Replace and Strip after the bytes are joined see ill-formed UTF-8 in non-lossy mode: they must
// keep those bytes and still do their work on the text around them.
TEST(DecodeBytesTest, LaterStepsKeepIllFormedBytes) {
  auto tok = Tokenizer::FromJson(R"({
    "added_tokens": [{"id": 9, "content": "<s>", "special": true}],
    "decoder": {"type": "Sequence", "decoders": [
      {"type": "ByteFallback"}, {"type": "Fuse"},
      {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
      {"type": "Strip", "content": " ", "start": 1, "stop": 1}]},
    "model": {"type": "BPE", "vocab": {"<0xE4>": 0, "<0x20>": 1, "▁a": 2, "a": 3, "▁": 4},
              "merges": []}})",
                                 "raw.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  const Tokenizer& t = **tok;
  EXPECT_EQ(t.Decode({2, 0, 2, 4}, false), absl::StrCat("a", kReplacementChar, " a"));
  EXPECT_EQ(t.DecodeBytes({2, 0, 2, 4}, false), "a\xE4 a");
  // The trailing space right after the ill-formed byte is still a character of its own.
  EXPECT_EQ(t.Decode({2, 0, 4}, false), absl::StrCat("a", kReplacementChar));
  EXPECT_EQ(t.DecodeBytes({2, 0, 4}, false), "a\xE4");
  // A run of " " and 0xE4 is not valid UTF-8: HF turns both bytes into U+FFFD.
  EXPECT_EQ(t.Decode({1, 0, 2}, false), absl::StrCat(kReplacementChar, kReplacementChar, " a"));
  EXPECT_EQ(t.DecodeBytes({1, 0, 2}, false), "\xE4 a");
  const auto cont = t.TokenContinuationBytes();
  ASSERT_EQ(cont.size(), 10u);
  EXPECT_EQ(cont[0], "\xE4");
  EXPECT_EQ(cont[2], " a");
  EXPECT_EQ(cont[3], "a");
  // Strip's stop=1 takes the space off the end of "a" + " ", so nothing of "▁" is left: the
  // context "a" is still a prefix, and the token adds "" there (not nullopt).
  EXPECT_EQ(cont[4], "");
  EXPECT_FALSE(cont[9].has_value());
  for (int id = 5; id < 9; ++id) EXPECT_FALSE(cont[id].has_value()) << id;  // holes
}

TEST(TokenContinuationBytesTest, KnownTokens) {
  const Tokenizer& llama3 = Get("llama3");
  const auto l3 = llama3.TokenContinuationBytes();
  ASSERT_EQ(l3.size(), static_cast<size_t>(llama3.vocab_size()));
  EXPECT_EQ(l3[*llama3.TokenToId("Ġthe")], " the");
  EXPECT_EQ(l3[*llama3.TokenToId("the")], "the");
  EXPECT_EQ(l3[*llama3.TokenToId("Ã")], "\xC3");  // partial UTF-8: the raw lead byte
  EXPECT_EQ(l3[*llama3.TokenToId("©")], "\xA9");
  EXPECT_EQ(l3[*llama3.TokenToId("Ċ")], "\n");
  int specials = 0;
  for (int32_t id = 0; id < llama3.vocab_size(); ++id) {
    if (llama3.IsSpecial(id)) {
      ++specials;
      EXPECT_FALSE(l3[id].has_value()) << id;
    } else {
      EXPECT_TRUE(l3[id].has_value()) << id;
    }
  }
  EXPECT_EQ(specials, 256);

  const Tokenizer& gpt2 = Get("gpt2");
  const auto g2 = gpt2.TokenContinuationBytes();
  EXPECT_EQ(g2[*gpt2.TokenToId("Ġthe")], " the");
  EXPECT_FALSE(g2[*gpt2.TokenToId("<|endoftext|>")].has_value());

  const Tokenizer& qwen3 = Get("qwen3");
  const auto q3 = qwen3.TokenContinuationBytes();
  EXPECT_EQ(q3[*qwen3.TokenToId("Ġthe")], " the");
  EXPECT_EQ(q3[*qwen3.TokenToId("<think>")], "<think>");  // added but not special
  EXPECT_FALSE(q3[*qwen3.TokenToId("<|im_end|>")].has_value());
  EXPECT_FALSE(q3[*qwen3.TokenToId("<|endoftext|>")].has_value());

  // Llama 2 / Mistral: the decoder strips the text's first space, so "▁the" decodes to "the" on
  // its own but adds " the" after other text.
  const Tokenizer& llama2 = Get("llama2");
  const auto l2 = llama2.TokenContinuationBytes();
  const int32_t the = *llama2.TokenToId("▁the");
  EXPECT_EQ(llama2.Decode({the}, false), "the");
  EXPECT_EQ(l2[the], " the");
  EXPECT_EQ(l2[*llama2.TokenToId("▁")], " ");
  EXPECT_EQ(l2[*llama2.TokenToId("<0xE4>")], "\xE4");
  EXPECT_EQ(l2[*llama2.TokenToId("<0x0A>")], "\n");
  EXPECT_EQ(l2[*llama2.TokenToId("<0x20>")], " ");
  for (const char* special : {"<unk>", "<s>", "</s>"}) {
    EXPECT_FALSE(l2[*llama2.TokenToId(special)].has_value()) << special;
  }
  // Every one of the 256 byte tokens adds exactly its byte.
  for (int b = 0; b < 256; ++b) {
    char name[8];
    snprintf(name, sizeof(name), "<0x%02X>", b);
    EXPECT_EQ(l2[*llama2.TokenToId(name)], std::string(1, static_cast<char>(b))) << name;
  }

  // Metaspace drops the replacement character only in the first token.
  const Tokenizer& metaspace = Get("synthetic/metaspace");
  const auto ms = metaspace.TokenContinuationBytes();
  EXPECT_EQ(metaspace.Decode({the}, false), "the");
  EXPECT_EQ(ms[the], " the");
  EXPECT_EQ(ms[*metaspace.TokenToId("<0xE4>")], "\xE4");
}

TEST(TokenContinuationBytesTest, HolesAndNoDecoder) {
  // No decoder: HF joins the tokens with spaces, so a token after other text adds " " + itself.
  // Ids 5 and 7 name no token; 8 is special; 6 is added but not special.
  auto tok = Tokenizer::FromJson(R"({
    "added_tokens": [{"id": 8, "content": "<s>", "special": true},
                     {"id": 6, "content": "<x>", "special": false}],
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "c": 3, "abc": 4},
              "merges": ["a b", "ab c"]}})",
                                 "holes.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  const auto cont = (*tok)->TokenContinuationBytes();
  ASSERT_EQ(cont.size(), 9u);
  EXPECT_EQ(cont[0], " a");
  EXPECT_EQ(cont[4], " abc");
  EXPECT_FALSE(cont[5].has_value());
  EXPECT_EQ(cont[6], " <x>");
  EXPECT_FALSE(cont[7].has_value());
  EXPECT_FALSE(cont[8].has_value());
  EXPECT_EQ((*tok)->DecodeBytes({0, 4, 6}, false), "a abc <x>");
}

TEST(TokenContinuationBytesTest, NulloptWhenContextIsNotAPrefix) {
  // The decoder rewrites "ab" after fusing, so after the context "a" the token "b" turns the
  // context's own bytes into something else: what "b" adds is not defined.
  auto tok = Tokenizer::FromJson(R"({
    "decoder": {"type": "Sequence", "decoders": [
      {"type": "Fuse"}, {"type": "Replace", "pattern": {"String": "ab"}, "content": "X"}]},
    "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "c": 2, "ab": 3}, "merges": ["a b"]}})",
                                 "rewrite.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  const auto cont = (*tok)->TokenContinuationBytes();
  ASSERT_EQ(cont.size(), 4u);
  EXPECT_EQ(cont[0], "a");
  EXPECT_FALSE(cont[1].has_value());
  EXPECT_EQ(cont[2], "c");
  EXPECT_EQ(cont[3], "X");  // "aab" -> "aX"
}

TEST(TokenContinuationBytesTest, ContextWithoutAsciiLetters) {
  // No ASCII letter anywhere: the context falls back to another non-space token ("é").
  auto tok = Tokenizer::FromJson(R"({
    "decoder": {"type": "Sequence", "decoders": [
      {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
      {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
    "model": {"type": "BPE", "vocab": {"▁": 0, "é": 1, "▁é": 2}, "merges": ["▁ é"]}})",
                                 "accents.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  const auto cont = (*tok)->TokenContinuationBytes();
  ASSERT_EQ(cont.size(), 3u);
  EXPECT_EQ((*tok)->DecodeBytes({2}, false), "é");
  EXPECT_EQ(cont[0], " ");
  EXPECT_EQ(cont[1], "é");
  EXPECT_EQ(cont[2], " é");
}

TEST(TokenContinuationBytesTest, FastOnLargeVocabularies) {
  for (const std::string family : {"llama3", "qwen3"}) {
    const Tokenizer& tok = Get(family);
    const auto start = std::chrono::steady_clock::now();
    const auto cont = tok.TokenContinuationBytes();
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    std::cout << family << " TokenContinuationBytes (" << cont.size() << " ids): " << ms << " ms\n";
    // The target is well under a second; the bound leaves room for a loaded CI machine.
    EXPECT_LT(ms, 2000.0) << family;
  }
}

class ContinuationTest : public ::testing::TestWithParam<std::string> {};

// Random id sequences: the first token's own bytes plus the continuation bytes of the rest must be
// the sequence's bytes. A third of the ids are single-byte tokens (byte-level characters or
// "<0xAB>") and some runs spell a whole multi-byte character in byte tokens, so both ill-formed
// and valid non-ASCII byte sequences come up.
TEST_P(ContinuationTest, ConcatenationMatchesDecodeBytes) {
  const Tokenizer& tok = Get(GetParam());
  const auto cont = tok.TokenContinuationBytes();
  ASSERT_EQ(cont.size(), static_cast<size_t>(tok.vocab_size()));
  std::vector<int32_t> pool;
  std::vector<int32_t> byte_token(256, -1);  // a token adding exactly that byte
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    if (tok.IsSpecial(id)) {
      EXPECT_FALSE(cont[id].has_value()) << id;
      continue;
    }
    if (!cont[id].has_value()) continue;
    pool.push_back(id);
    if (cont[id]->size() == 1) {
      int32_t& slot = byte_token[static_cast<unsigned char>((*cont[id])[0])];
      if (slot < 0) slot = id;
    }
  }
  // Every non-special token of these vocabularies has a well-defined continuation.
  ASSERT_GT(pool.size(), static_cast<size_t>(tok.vocab_size()) * 99 / 100);
  for (int b = 0x80; b < 0x100; ++b) {
    ASSERT_GE(byte_token[b], 0) << GetParam() << " has no token for byte " << b;
  }

  const bool byte_level =
      GetParam() != "llama2" && GetParam().find("metaspace") == std::string::npos;
  std::mt19937 rng(4242);
  std::uniform_int_distribution<size_t> pick(0, pool.size() - 1);
  std::uniform_int_distribution<int> kind(0, 5);
  std::uniform_int_distribution<int> len_dist(2, 12);
  std::uniform_int_distribution<int> high_byte(0x80, 0xFF);
  std::uniform_int_distribution<uint32_t> cjk(0x4E00, 0x9FFF);
  int failures = 0, ill_formed = 0, valid_non_ascii = 0, mid_text_differs = 0;
  for (int i = 0; i < 3000; ++i) {
    std::vector<int32_t> ids;
    // The first token must add something of its own: a Strip decoder strips the text's first
    // space, which would otherwise be the second token's.
    do {
      ids.assign(1, pool[pick(rng)]);
    } while (tok.DecodeBytes(ids, false).empty());
    const int len = len_dist(rng);
    while (static_cast<int>(ids.size()) < len) {
      const int k = kind(rng);
      if (k <= 3) {
        ids.push_back(pool[pick(rng)]);
      } else if (k == 4) {
        ids.push_back(byte_token[high_byte(rng)]);
      } else {
        std::string ch;
        tok::AppendUtf8(cjk(rng), &ch);
        for (const char c : ch) ids.push_back(byte_token[static_cast<unsigned char>(c)]);
      }
    }
    std::string got = tok.DecodeBytes({ids[0]}, false);
    for (size_t k = 1; k < ids.size(); ++k) {
      got += *cont[ids[k]];
      if (*cont[ids[k]] != tok.DecodeBytes({ids[k]}, false)) ++mid_text_differs;
    }
    const std::string want = tok.DecodeBytes(ids, false);
    if (got != want && ++failures <= 5) {
      ADD_FAILURE() << GetParam() << ": " << Json(ids).dump() << " pieces give "
                    << Json(tok::Utf8Lossy(got)).dump() << " (lossy), DecodeBytes "
                    << Json(tok::Utf8Lossy(want)).dump() << " (lossy)";
    }
    const std::string decoded = tok.Decode(ids, false);
    if (tok::IsValidUtf8(want)) {
      EXPECT_EQ(decoded, want) << Json(ids).dump();
      for (const char c : want) {
        if (static_cast<unsigned char>(c) >= 0x80) {
          ++valid_non_ascii;
          break;
        }
      }
    } else {
      ++ill_formed;
      EXPECT_TRUE(tok::IsValidUtf8(decoded));
      // A byte-level decoder's only repair is from_utf8_lossy of the joined bytes.
      if (byte_level) {
        EXPECT_EQ(decoded, tok::Utf8Lossy(want)) << Json(ids).dump();
      }
    }
  }
  EXPECT_EQ(failures, 0);
  // Both kinds of text came up often enough to mean something.
  EXPECT_GT(ill_formed, 300) << GetParam();
  EXPECT_GT(valid_non_ascii, 300) << GetParam();
  std::cout << GetParam() << ": " << ill_formed << " ill-formed, " << valid_non_ascii
            << " valid non-ASCII, " << mid_text_differs
            << " mid-text pieces unlike their own decode\n";
}

INSTANTIATE_TEST_SUITE_P(Families, ContinuationTest,
                         ::testing::Values("llama3", "llama2", "gpt2", "qwen3", "llama3_template",
                                           "synthetic/metaspace", "synthetic/metaspace_split",
                                           "synthetic/splits", "synthetic/inverted"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (c == '/') c = '_';
                           }
                           return name;
                         });

TEST(TokenizerTest, Accessors) {
  const Tokenizer& llama3 = Get("llama3");
  EXPECT_EQ(llama3.vocab_size(), 128256);
  EXPECT_EQ(llama3.TokenToId("<|begin_of_text|>"), 128000);
  EXPECT_EQ(llama3.IdToToken(128000), "<|begin_of_text|>");
  EXPECT_EQ(llama3.IdToToken(-1), "");
  EXPECT_EQ(llama3.IdToToken(128256), "");
  EXPECT_TRUE(llama3.IsSpecial(128009));
  EXPECT_FALSE(llama3.IsSpecial(9906));
  EXPECT_FALSE(llama3.bos_id().has_value());  // this file's post-processor is ByteLevel only
  EXPECT_EQ(Get("llama3_template").bos_id(), 128000);

  const Tokenizer& llama2 = Get("llama2");
  EXPECT_EQ(llama2.vocab_size(), 32000);
  EXPECT_EQ(llama2.bos_id(), 1);
  EXPECT_EQ(llama2.TokenToId("<0x0A>"), 13);
  EXPECT_FALSE(llama2.TokenToId("no such token").has_value());

  const Tokenizer& qwen3 = Get("qwen3");
  EXPECT_FALSE(qwen3.bos_id().has_value());
  const auto think = qwen3.TokenToId("<think>");
  ASSERT_TRUE(think.has_value());
  EXPECT_FALSE(qwen3.IsSpecial(*think));  // an added token that is not special
  EXPECT_TRUE(qwen3.IsSpecial(*qwen3.TokenToId("<|im_end|>")));
}

TEST(TokenizerTest, ConcurrentEncodeMatchesSerial) {
  const Tokenizer& tok = Get("llama3");
  std::mt19937 rng(99);
  std::vector<std::string> texts;
  std::vector<std::vector<int32_t>> want;
  for (int i = 0; i < 200; ++i) {
    texts.push_back(RandomText(&rng) + " hello<|eot_id|>world " + RandomText(&rng));
    want.push_back(*tok.Encode(texts.back(), true));
  }
  std::atomic<int> mismatches{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 5; ++round) {
        for (size_t i = t; i < texts.size(); i += 2) {
          auto ids = tok.Encode(texts[i], true);
          if (!ids.ok() || *ids != want[i]) ++mismatches;
          if (tok.Decode(want[i], true).empty() && !want[i].empty() && texts[i].empty()) ++mismatches;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatches.load(), 0);
}

TEST(TokenizerTest, EncodesTenKilobytesQuickly) {
  const Tokenizer& tok = Get("llama3");
  const std::string para =
      "The quick brown fox jumps over the lazy dog. It's 2024, and we've seen 1,234 foxes; "
      "they'll keep jumping!\n";
  std::string text;
  while (text.size() < 10 * 1024) text += para;
  auto ids = tok.Encode(text, true);  // warm-up
  ASSERT_TRUE(ids.ok());
  const auto start = std::chrono::steady_clock::now();
  constexpr int kRuns = 10;
  for (int i = 0; i < kRuns; ++i) ids = tok.Encode(text, true);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count() /
      kRuns;
  std::cout << "encode 10 KB: " << ms << " ms, " << ids->size() << " tokens\n";
  // The target is well under 10 ms; the bound leaves room for a loaded CI machine.
  EXPECT_LT(ms, 50.0);
}

// ---- malformed tokenizer.json ----

constexpr char kTinyJson[] = R"({
  "added_tokens": [{"id": 5, "content": "<s>", "special": true}],
  "normalizer": null, "pre_tokenizer": null, "post_processor": null, "decoder": null,
  "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2, "c": 3, "abc": 4},
            "merges": ["a b", ["ab", "c"]]}
})";

absl::Status LoadTiny(const std::function<void(Json&)>& edit) {
  Json j = *ParseJson(kTinyJson, "tiny");
  edit(j);
  return Tokenizer::FromJson(j.dump(), "tiny.json").status();
}

TEST(TokenizerTest, TinyTokenizerWorks) {
  auto tok = Tokenizer::FromJson(kTinyJson, "tiny.json");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(*(*tok)->Encode("abcab<s>c", false), (std::vector<int32_t>{4, 2, 5, 3}));
  EXPECT_EQ((*tok)->vocab_size(), 6);
  EXPECT_EQ((*tok)->Decode({4, 5, 3}, true), "abc c");  // no decoder: tokens joined by spaces
}

// Pairs (a cross-encoder's query and document) as HF's tokenizer(a, b) joins them: each side
// encoded without special tokens, then the post-processor's pair template.
TEST(TokenizerTest, PairsAreJoinedByThePostProcessorsPairTemplate) {
  auto with = [](const char* post_processor) {
    Json j = *ParseJson(kTinyJson, "tiny");
    if (post_processor != nullptr) j["post_processor"] = Json::parse(post_processor);
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromJson(j.dump(), "tiny.json");
    if (!tok.ok()) {
      std::fprintf(stderr, "%s\n", tok.status().ToString().c_str());
      std::abort();
    }
    return *std::move(tok);
  };
  const std::vector<int32_t> a = {4, 0}, b = {1, 3};  // "abca", "bc"
  // No post-processor, or ByteLevel's (ids unchanged): A B.
  EXPECT_EQ(with(nullptr)->JoinPair(a, b, true), (std::vector<int32_t>{4, 0, 1, 3}));
  EXPECT_EQ(with(R"({"type": "ByteLevel"})")->JoinPair(a, b, true),
            (std::vector<int32_t>{4, 0, 1, 3}));
  // Bert: [CLS] A [SEP] B [SEP]; Roberta: <s> A </s> </s> B </s> (cls 5, sep 2 here).
  EXPECT_EQ(with(R"({"type": "BertProcessing", "cls": ["<s>", 5], "sep": ["ab", 2]})")
                ->JoinPair(a, b, true),
            (std::vector<int32_t>{5, 4, 0, 2, 1, 3, 2}));
  EXPECT_EQ(with(R"({"type": "RobertaProcessing", "cls": ["<s>", 5], "sep": ["ab", 2]})")
                ->JoinPair(a, b, true),
            (std::vector<int32_t>{5, 4, 0, 2, 2, 1, 3, 2}));
  // A template's "pair", through a Sequence whose ByteLevel step keeps the two apart (Llama 3's
  // <|begin_of_text|> A <|begin_of_text|> B); a template without one joins them as HF's builder
  // defaults to, A B.
  constexpr char kPair[] = R"({"type": "Sequence", "processors": [{"type": "ByteLevel"},
      {"type": "TemplateProcessing",
       "single": [{"SpecialToken": {"id": "<s>"}}, {"Sequence": {"id": "A"}}],
       "pair": [{"SpecialToken": {"id": "<s>"}}, {"Sequence": {"id": "A"}},
                {"SpecialToken": {"id": "c"}}, {"Sequence": {"id": "B"}},
                {"SpecialToken": {"id": "<s>"}}],
       "special_tokens": {"<s>": {"id": "<s>", "ids": [5]}, "c": {"id": "c", "ids": [3]}}}]})";
  const std::unique_ptr<Tokenizer> paired = with(kPair);
  EXPECT_EQ(paired->JoinPair(a, b, true), (std::vector<int32_t>{5, 4, 0, 3, 1, 3, 5}));
  EXPECT_EQ(*paired->Encode("abca", true), (std::vector<int32_t>{5, 4, 0}));
  EXPECT_EQ(paired->JoinPair(a, b, false), (std::vector<int32_t>{4, 0, 1, 3}));
  EXPECT_EQ(with(R"({"type": "TemplateProcessing",
                     "single": [{"SpecialToken": {"id": "<s>"}}, {"Sequence": {"id": "A"}},
                                {"SpecialToken": {"id": "c"}}],
                     "special_tokens": {"<s>": {"id": "<s>", "ids": [5]},
                                        "c": {"id": "c", "ids": [3]}}})")
                ->JoinPair(a, b, true),
            (std::vector<int32_t>{4, 0, 1, 3}));
  // Transformers' Llama tokenizers (add_bos_token / add_eos_token): bos A eos bos B eos.
  std::unique_ptr<Tokenizer> llama = with(nullptr);
  ASSERT_TRUE(llama->SetSpecialTokensTemplate("<s>", "c").ok());
  EXPECT_EQ(llama->JoinPair(a, b, true), (std::vector<int32_t>{5, 4, 0, 3, 5, 1, 3, 3}));
  // A template naming a sequence other than A or B is refused, naming it.
  const absl::Status bad = LoadTiny([](Json& j) {
    j["post_processor"] = Json::parse(R"({"type": "TemplateProcessing",
        "single": [{"Sequence": {"id": "A"}}], "pair": [{"Sequence": {"id": "C"}}],
        "special_tokens": {}})");
  });
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
  EXPECT_THAT(std::string(bad.message()), HasSubstr("post_processor.pair[0].Sequence.id")) << bad;
}

TEST(TokenizerTest, MalformedFilesNameTheKey) {
  struct Case {
    std::string name;
    std::function<void(Json&)> edit;
    std::string want;  // substring of the error
  };
  const std::vector<Case> cases = {
      {"missing model", [](Json& j) { j.erase("model"); }, "tiny.json: model"},
      {"model not object", [](Json& j) { j["model"] = 3; }, "tiny.json: model"},
      {"unknown model type", [](Json& j) { j["model"]["type"] = "Magic"; }, "model.type"},
      {"merge unknown token", [](Json& j) { j["model"]["merges"][0] = "a z"; }, "model.merges[0]"},
      {"merge bad form", [](Json& j) { j["model"]["merges"][1] = Json::array({"ab"}); },
       "model.merges[1]"},
      {"merge result missing", [](Json& j) { j["model"]["merges"].push_back("b c"); },
       "model.merges[2]"},
      {"vocab id negative", [](Json& j) { j["model"]["vocab"]["b"] = -1; }, "model.vocab"},
      {"vocab id huge", [](Json& j) { j["model"]["vocab"]["b"] = 1ull << 40; }, "out of range"},
      {"vocab id not int", [](Json& j) { j["model"]["vocab"]["b"] = "1"; }, "model.vocab"},
      {"added id out of range", [](Json& j) { j["added_tokens"][0]["id"] = 1 << 30; },
       "added_tokens[0].id"},
      {"added no content", [](Json& j) { j["added_tokens"][0].erase("content"); },
       "added_tokens[0].content"},
      {"bad regex",
       [](Json& j) {
         j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "(unclosed"}}},
                               {"behavior", "Isolated"}, {"invert", false}};
       },
       "pre_tokenizer.pattern.Regex"},
      {"bad behavior",
       [](Json& j) {
         j["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"String", " "}}},
                               {"behavior", "Sideways"}, {"invert", false}};
       },
       "pre_tokenizer.behavior"},
      {"template missing special",
       [](Json& j) {
         j["post_processor"] = Json::parse(
             R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}},
                 {"Sequence": {"id": "A"}}], "special_tokens": {}})");
       },
       "post_processor.special_tokens.<s>"},
      {"template id beyond the vocabulary",
       [](Json& j) {
         j["post_processor"] = Json::parse(
             R"({"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>"}},
                 {"Sequence": {"id": "A"}}],
                 "special_tokens": {"<s>": {"id": "<s>", "ids": [200000], "tokens": ["<s>"]}}})");
       },
       "post_processor: id 200000 names no token"},
      {"bert cls in a gap of the ids",
       [](Json& j) {
         j["model"]["vocab"].erase("c");  // id 3 is now no token
         j["model"]["merges"] = Json::array({"a b"});
         j["model"]["vocab"].erase("abc");
         j["post_processor"] = {{"type", "BertProcessing"},
                                {"cls", {"<s>", 3}},
                                {"sep", {"<s>", 5}}};
       },
       "post_processor: id 3 names no token"},
      {"strip content two chars",
       [](Json& j) { j["decoder"] = {{"type", "Strip"}, {"content", "ab"}, {"start", 1}}; },
       "decoder.content"},
      {"nested sequence entry not object",
       [](Json& j) { j["normalizer"] = {{"type", "Sequence"}, {"normalizers", {1}}}; },
       "normalizer.normalizers[0]"},
  };
  for (const Case& c : cases) {
    const absl::Status s = LoadTiny(c.edit);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.name << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.want)) << c.name;
    EXPECT_THAT(std::string(s.message()), HasSubstr("tiny.json")) << c.name;
  }
}

TEST(TokenizerTest, IdsBeyondTheModelsVocabularyAreRefusedBeforeTablesAreSized) {
  // The model's vocab_size bounds every id (an added token at 16M would otherwise size the id
  // tables at 16M entries before anything else could refuse it).
  Json j = *ParseJson(kTinyJson, "tiny");
  EXPECT_TRUE(Tokenizer::FromJson(j.dump(), "tiny.json", 6).ok());
  absl::Status s = Tokenizer::FromJson(j.dump(), "tiny.json", 5).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("token id 5 is outside the model's vocabulary of 5"));
  j["added_tokens"][0]["id"] = (1 << 24) - 1;
  s = Tokenizer::FromJson(j.dump(), "tiny.json", 32000).status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("token id 16777215 is outside"));
}

TEST(TokenizerTest, UnsupportedComponentsAreUnimplemented) {
  const std::vector<std::pair<std::string, Json>> cases = {
      {"normalizer", {{"type", "BertNormalizer"}}},
      {"pre_tokenizer", {{"type", "Punctuation"}}},
      {"decoder", {{"type", "CTC"}}},
      {"post_processor", {{"type", "Fancy"}}},
  };
  for (const auto& [key, value] : cases) {
    const absl::Status s = LoadTiny([&](Json& j) { j[key] = value; });
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << key << ": " << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(value["type"].get<std::string>()));
    EXPECT_THAT(std::string(s.message()), HasSubstr(key + ".type"));
  }
  const absl::Status wp = LoadTiny([](Json& j) { j["model"]["type"] = "WordPiece"; });
  EXPECT_EQ(wp.code(), absl::StatusCode::kUnimplemented) << wp;
}

TEST(TokenizerTest, InvalidJsonAndDeepNesting) {
  absl::Status s = Tokenizer::FromJson("{\"model\": ", "broken.json").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("broken.json"));

  s = Tokenizer::FromJson("[1, 2]", "array.json").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);

  std::string deep = R"({"model": {"type": "BPE", "vocab": {}, "merges": [], "x": )";
  deep += std::string(5000, '[') + std::string(5000, ']') + "}}";
  s = Tokenizer::FromJson(deep, "deep.json").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("deep.json"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("nested"));

  s = Tokenizer::FromFile("/nonexistent/tokenizer.json").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), HasSubstr("/nonexistent/tokenizer.json"));
}

}  // namespace
}  // namespace kvrm
