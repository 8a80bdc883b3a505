// Fuzzes GGUF reading on arbitrary file contents: GgufFile::Open, then everything the loader
// does with what it opened. Every tensor it returns must lie inside the file with exactly the
// bytes its type and shape need (each row is dequantized: every byte is read, and every bit
// pattern of a block must dequantize without undefined behaviour); every metadata value must
// read back through the typed getters; the config, tokenizer and weight translations
// (GgufLlamaConfig, ReadGgufSpecialTokens, LoadGgufTokenizer, LoadGgufModel) may refuse the file
// but never crash.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "model/gguf.h"
#include "model/gguf_model.h"
#include "model/gguf_quants.h"
#include "model/gguf_tokenizer.h"
#include "model/tokenizer.h"

namespace {

int TestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = kvrm::fuzz::WriteInputFile(data, size, ".gguf");
  absl::StatusOr<std::unique_ptr<kvrm::GgufFile>> file = kvrm::GgufFile::Open(path);
  if (!file.ok()) return 0;
  const kvrm::GgufFile& f = **file;
  FUZZ_CHECK(f.file_size() == size);
  double sum = 0;
  for (const kvrm::GgufTensor& t : f.tensors()) {
    FUZZ_CHECK(t.numel() > 0 && t.cols() > 0);
    FUZZ_CHECK(t.nbytes == static_cast<size_t>(t.rows()) * t.row_bytes());
    FUZZ_CHECK(t.nbytes <= size);
    FUZZ_CHECK(f.FindTensor(t.name) == &t);
    std::vector<float> row(t.cols());
    for (int64_t r = 0; r < t.rows(); ++r) {
      kvrm::DequantizeRow(t.type, t.data + r * t.row_bytes(), t.cols(), row.data());
      sum += row[0];
    }
  }
  for (const std::string& key : f.keys()) {
    FUZZ_CHECK(f.Find(key) != nullptr);
    // Each getter either reads the value or names the key; none may crash on another type.
    (void)f.GetUint(key);
    (void)f.GetFloat(key);
    (void)f.GetBool(key);
    (void)f.GetString(key);
    (void)f.GetStringArray(key);
    absl::StatusOr<std::vector<double>> numbers = f.GetNumberArray(key);
    if (numbers.ok()) FUZZ_CHECK(numbers->size() == f.Find(key)->count);
  }
  (void)kvrm::GgufLlamaConfig(f);
  absl::StatusOr<kvrm::GgufSpecialTokens> special = kvrm::ReadGgufSpecialTokens(f);
  absl::StatusOr<std::unique_ptr<kvrm::Tokenizer>> tok = kvrm::LoadGgufTokenizer(f);
  if (tok.ok()) {
    FUZZ_CHECK(special.ok());
    for (int32_t id : special->end_of_generation) {
      FUZZ_CHECK(id >= 0 && static_cast<size_t>(id) < f.Find("tokenizer.ggml.tokens")->count);
    }
    absl::StatusOr<std::vector<int32_t>> ids = (*tok)->Encode("Hello, world! 123 ", true);
    if (ids.ok()) (void)(*tok)->Decode(*ids, false);
  }
  absl::StatusOr<std::unique_ptr<kvrm::GgufModel>> model = kvrm::LoadGgufModel(path);
  if (model.ok()) {
    FUZZ_CHECK((*model)->weights.layers.size() ==
               static_cast<size_t>((*model)->config.num_hidden_layers));
  }
  static volatile double sink;  // keeps the reads from being optimised away
  sink = sum;
  return 0;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return kvrm::fuzz::RunWithKnownIssues([&] { TestOneInput(data, size); });
}
