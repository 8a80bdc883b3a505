// Fuzzes the tokenizer. The first byte picks what the rest is:
//   0: a tokenizer.json for Tokenizer::FromJson (untrusted model files); a tokenizer that loads
//      then encodes and decodes a fixed text;
//   1: text for Encode with a real tokenizer (gpt2, llama2 or llama3: byte 2 picks; byte 3 bit 0
//      is add_special_tokens), whose ids are decoded again;
//   2: little-endian int32 ids (any value, out of range included) for Decode.
// Invariants: Encode returns ids below vocab_size; Decode's output is valid UTF-8.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "model/tokenizer.h"

namespace {

std::vector<std::unique_ptr<kvrm::Tokenizer>>* tokenizers = nullptr;

// Structural UTF-8: lead bytes followed by the right number of continuation bytes.
bool ValidUtf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const uint8_t c = static_cast<uint8_t>(s[i]);
    const int n = c < 0x80 ? 0 : (c & 0xe0) == 0xc0 ? 1 : (c & 0xf0) == 0xe0 ? 2
                : (c & 0xf8) == 0xf0 ? 3 : -1;
    if (n < 0 || i + n + 1 > s.size()) return false;
    for (int k = 1; k <= n; ++k) {
      if ((static_cast<uint8_t>(s[i + k]) & 0xc0) != 0x80) return false;
    }
    i += n + 1;
  }
  return true;
}

void CheckIds(const kvrm::Tokenizer& tok, const std::vector<int32_t>& ids) {
  for (int32_t id : ids) FUZZ_CHECK(id >= 0 && id < tok.vocab_size());
  FUZZ_CHECK(ValidUtf8(tok.Decode(ids, false)));
  FUZZ_CHECK(ValidUtf8(tok.Decode(ids, true)));
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tokenizers = new std::vector<std::unique_ptr<kvrm::Tokenizer>>();
  for (const char* family : {"gpt2", "llama2", "llama3"}) {
    tokenizers->push_back(kvrm::fuzz::LoadTokenizer(family));
  }
  return 0;
}

namespace {
int TestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const std::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0: {
      absl::StatusOr<std::unique_ptr<kvrm::Tokenizer>> tok =
          kvrm::Tokenizer::FromJson(rest, "fuzz.json");
      if (!tok.ok()) return 0;
      absl::StatusOr<std::vector<int32_t>> ids = (*tok)->Encode("Hello, wörld! 123 <s>", true);
      if (ids.ok()) CheckIds(**tok, *ids);
      return 0;
    }
    case 1: {
      if (rest.size() < 2) return 0;
      const kvrm::Tokenizer& tok = *(*tokenizers)[static_cast<uint8_t>(rest[0]) % 3];
      const bool special = rest[1] & 1;
      absl::StatusOr<std::vector<int32_t>> ids = tok.Encode(rest.substr(2), special);
      if (!ids.ok()) return 0;
      CheckIds(tok, *ids);
      return 0;
    }
    default: {
      if (rest.empty()) return 0;
      const kvrm::Tokenizer& tok = *(*tokenizers)[static_cast<uint8_t>(rest[0]) % 3];
      std::vector<int32_t> ids((rest.size() - 1) / 4);
      if (!ids.empty()) std::memcpy(ids.data(), rest.data() + 1, ids.size() * 4);
      FUZZ_CHECK(ValidUtf8(tok.Decode(ids, false)));
      FUZZ_CHECK(ValidUtf8(tok.Decode(ids, true)));
      return 0;
    }
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return kvrm::fuzz::RunWithKnownIssues([&] { TestOneInput(data, size); });
}
