// The real vocabularies in model/testdata/tokenizers/ (Llama 2 / 3, GPT-2, Qwen3), for tests.
#ifndef KVRM_MODEL_TOKENIZER_TESTDATA_H_
#define KVRM_MODEL_TOKENIZER_TESTDATA_H_

#include <string>

namespace kvrm {

// Relative to the runfiles root (tests list //model:tokenizer_testdata as data).
inline constexpr char kTokenizerTestdata[] = "model/testdata/tokenizers/";

// The file's contents, inflated when gzipped (plain files are read unchanged); "" if missing.
std::string ReadMaybeGzipped(const std::string& path);

// A family's tokenizer.json (or tokenizer.json.gz, inflated); "" if it has neither.
std::string TestdataTokenizerJson(const std::string& family);

// `s` in Unicode normal form C (what Qwen's normalizer gives back).
std::string Nfc(const std::string& s);

}  // namespace kvrm

#endif  // KVRM_MODEL_TOKENIZER_TESTDATA_H_
