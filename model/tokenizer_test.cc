#include "model/tokenizer.h"

#include <zlib.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/tokenizer_text.h"
#include "unicode/normalizer2.h"
#include "unicode/unistr.h"

namespace kvrm {
namespace {

using ::testing::HasSubstr;

constexpr char kTestdata[] = "model/testdata/tokenizers/";

std::string ReadMaybeGzipped(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");  // reads plain files unchanged
  if (f == nullptr) return "";
  std::string out;
  char buf[1 << 16];
  int n;
  while ((n = gzread(f, buf, sizeof(buf))) > 0) out.append(buf, n);
  gzclose(f);
  return out;
}

std::string TokenizerJson(const std::string& family) {
  const std::string base = absl::StrCat(kTestdata, family, "/tokenizer.json");
  std::string text = ReadMaybeGzipped(base);
  if (text.empty()) text = ReadMaybeGzipped(base + ".gz");
  return text;
}

// llama3_template is llama3/tokenizer.json with its post_processor replaced; synthetic/* are a
// real file with the components in their patch.json replaced (see tools/tokenizer_vectors).
std::string FamilyJson(const std::string& family) {
  if (family == "llama3_template") {
    absl::StatusOr<Json> j = ParseJson(TokenizerJson("llama3"), "llama3");
    absl::StatusOr<Json> patch =
        ReadJsonFile(absl::StrCat(kTestdata, "llama3_template/post_processor.json"));
    if (!j.ok() || !patch.ok()) return "";
    (*j)["post_processor"] = *patch;
    return j->dump();
  }
  if (family.rfind("synthetic/", 0) == 0) {
    absl::StatusOr<Json> patch = ReadJsonFile(absl::StrCat(kTestdata, family, "/patch.json"));
    if (!patch.ok()) return "";
    absl::StatusOr<Json> j = ParseJson(TokenizerJson((*patch)["base"]), family);
    if (!j.ok()) return "";
    for (const auto& [key, value] : patch->items()) {
      if (key != "base") (*j)[key] = value;
    }
    return j->dump();
  }
  return TokenizerJson(family);
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
  std::ifstream in(absl::StrCat(kTestdata, GetParam(), "/vectors.jsonl"));
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

std::string Nfc(const std::string& s) {
  UErrorCode err = U_ZERO_ERROR;
  const icu::Normalizer2* n = icu::Normalizer2::getNFCInstance(err);
  std::string out;
  n->normalize(icu::UnicodeString::fromUTF8(s), err).toUTF8String(out);
  return out;
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
