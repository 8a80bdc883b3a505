// The GGUF tokenizer against llama.cpp's own vocabulary files: ggml-vocab-*.gguf as llama.cpp's
// converter wrote them (tokenizer.ggml.* only, no tensors), each with the texts llama.cpp's
// tokenizer tests run (.inp, separated by "\n__ggml_vocab_test__\n") and the ids Hugging Face's
// tokenizer gives for them without special tokens (.out, a line each), as llama.cpp's
// tests/test-tokenizer-0 reads them. Where the files come from: testdata/gguf_vocab/README.md.
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/json.h"
#include "gtest/gtest.h"
#include "model/gguf.h"
#include "model/gguf_tokenizer.h"
#include "model/tokenizer_testdata.h"

namespace kvrm {
namespace {

std::string Dir() {
  if (const char* d = std::getenv("KVRM_GGUF_VOCAB_DIR")) return d;  // other files, by hand
  return "model/testdata/gguf_vocab";
}

struct Case {
  std::string text;
  std::vector<int32_t> ids;
};

// test-tokenizer-0's reading: the texts split on the separator, the ids a line each.
std::vector<Case> ReadCases(const std::string& vocab) {
  const absl::StatusOr<std::string> inp_file = ReadFileToString(vocab + ".inp");
  const absl::StatusOr<std::string> out_file = ReadFileToString(vocab + ".out");
  EXPECT_TRUE(inp_file.ok()) << inp_file.status();
  EXPECT_TRUE(out_file.ok()) << out_file.status();
  const std::string inp = inp_file.ok() ? *inp_file : "", out = out_file.ok() ? *out_file : "";
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<std::string> texts;
  for (size_t pos = 0; pos < inp.size();) {
    const size_t next = inp.find(sep, pos);
    if (next == std::string::npos) {
      texts.push_back(inp.substr(pos));
      break;
    }
    texts.push_back(inp.substr(pos, next - pos));
    pos = next + sep.size();
  }
  std::vector<std::string> lines = absl::StrSplit(out, '\n');
  if (!lines.empty() && lines.back().empty()) lines.pop_back();
  EXPECT_EQ(texts.size(), lines.size()) << vocab;
  std::vector<Case> cases;
  for (size_t i = 0; i < texts.size() && i < lines.size(); ++i) {
    Case c{texts[i], {}};
    for (absl::string_view id :
         absl::StrSplit(absl::StripAsciiWhitespace(lines[i]), ' ', absl::SkipEmpty())) {
      int32_t v = 0;
      EXPECT_TRUE(absl::SimpleAtoi(id, &v)) << vocab << " line " << i;
      c.ids.push_back(v);
    }
    cases.push_back(std::move(c));
  }
  return cases;
}

class GgufVocabTest : public testing::TestWithParam<std::string> {};

// The vocabulary file, inflated into the test's temporary directory when it is stored gzipped.
std::string VocabFile(const std::string& vocab) {
  if (std::filesystem::exists(vocab)) return vocab;
  const std::string gz = vocab + ".gz";
  if (!std::filesystem::exists(gz)) return "";
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string out = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/",
                                       std::filesystem::path(vocab).filename().string());
  std::ofstream(out, std::ios::binary) << ReadMaybeGzipped(gz);
  return out;
}

TEST_P(GgufVocabTest, EncodesLlamaCppsTestTextsAsHuggingFaceDoes) {
  const std::string vocab = absl::StrCat(Dir(), "/ggml-vocab-", GetParam(), ".gguf");
  const std::string path = VocabFile(vocab);
  ASSERT_FALSE(path.empty()) << vocab << "(.gz) is not here";
  auto file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  auto tokenizer = LoadGgufTokenizer(**file);
  ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
  const std::vector<Case> cases = ReadCases(vocab);
  ASSERT_GE(cases.size(), 30u);
  int wrong = 0;
  for (const Case& c : cases) {
    auto ids = (*tokenizer)->Encode(c.text, /*add_special_tokens=*/false);
    ASSERT_TRUE(ids.ok()) << ids.status();
    if (*ids != c.ids) {
      ++wrong;
      ADD_FAILURE() << GetParam() << ": \"" << absl::CHexEscape(c.text) << "\"\n  want "
                    << absl::StrJoin(c.ids, " ") << "\n  got  " << absl::StrJoin(*ids, " ");
    }
  }
  EXPECT_EQ(wrong, 0) << "of " << cases.size();
}

std::vector<std::string> Vocabs() {
  std::vector<std::string> names;
  if (const char* d = std::getenv("KVRM_GGUF_VOCAB_DIR")) {
    for (const auto& e : std::filesystem::directory_iterator(d)) {
      const std::string f = e.path().filename().string();
      if (absl::StartsWith(f, "ggml-vocab-") && absl::EndsWith(f, ".gguf") &&
          std::filesystem::exists(e.path().string() + ".out")) {
        names.push_back(f.substr(11, f.size() - 16));
      }
    }
    std::sort(names.begin(), names.end());
    return names;
  }
  // The files kept here (README.md): SentencePiece (Llama 2, Phi-3) and byte-level BPE with the
  // GPT-2, StarCoder, Llama 3 and Qwen2 pre-tokenizers.
  return {"llama-spm", "phi-3", "gpt-2", "starcoder", "llama-bpe", "qwen2"};
}

INSTANTIATE_TEST_SUITE_P(LlamaCpp, GgufVocabTest, testing::ValuesIn(Vocabs()),
                         [](const testing::TestParamInfo<std::string>& i) {
                           std::string n = i.param;
                           for (char& ch : n) {
                             if (!isalnum(static_cast<unsigned char>(ch))) ch = '_';
                           }
                           return n;
                         });

}  // namespace
}  // namespace kvrm
