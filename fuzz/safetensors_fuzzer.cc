// Fuzzes SafetensorsFile::Open on arbitrary file contents: every TensorView it returns must lie
// inside the file and hold exactly numel * its element type's size in bytes (DTypeSize(dtype) for
// the float types), which the loop below reads.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "common/dtype.h"
#include "fuzz/fuzz_util.h"
#include "model/safetensors.h"

namespace {

int TestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = kvrm::fuzz::WriteInputFile(data, size, ".safetensors");
  absl::StatusOr<std::unique_ptr<kvrm::SafetensorsFile>> file =
      kvrm::SafetensorsFile::Open(path);
  if (!file.ok()) return 0;
  FUZZ_CHECK((*file)->file_size() == size);
  uint64_t sum = 0;
  for (const std::string& name : (*file)->TensorNames()) {
    const kvrm::TensorView* t = (*file)->Find(name);
    FUZZ_CHECK(t != nullptr);
    FUZZ_CHECK(t->numel() >= 0);
    // Its element type's size (a quantized checkpoint's I32 / I8 / F64 ... tensors too), and for
    // the float types the dtype kernels read it as.
    FUZZ_CHECK(t->nbytes == static_cast<size_t>(t->numel()) * kvrm::StorageTypeSize(t->type));
    if (t->is_float()) {
      FUZZ_CHECK(t->nbytes == static_cast<size_t>(t->numel()) * kvrm::DTypeSize(t->dtype));
    }
    FUZZ_CHECK(t->nbytes <= size);
    // Touch every byte: a view outside the mapping faults here.
    for (size_t i = 0; i < t->nbytes; ++i) sum += static_cast<uint8_t>(t->data[i]);
  }
  for (const auto& [k, v] : (*file)->metadata()) sum += k.size() + v.size();
  static volatile uint64_t sink;  // keeps the reads from being optimised away
  sink = sum;
  return 0;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return kvrm::fuzz::RunWithKnownIssues([&] { TestOneInput(data, size); });
}
