// Writes GGUF files (version 3) as llama.cpp's writers lay them out: the metadata in the order
// added, the tensor infos, then each tensor's data at a multiple of the alignment (32), in the
// order added. tools/gguf's converter and the tests use it.
#ifndef KVRM_MODEL_GGUF_WRITER_H_
#define KVRM_MODEL_GGUF_WRITER_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "model/gguf.h"

namespace kvrm {

class GgufWriter {
 public:
  // Metadata, with the types llama.cpp's converter writes them with.
  void AddString(absl::string_view key, absl::string_view value);
  void AddUint32(absl::string_view key, uint32_t value);
  void AddFloat32(absl::string_view key, float value);
  void AddBool(absl::string_view key, bool value);
  void AddStringArray(absl::string_view key, absl::Span<const std::string> values);
  void AddInt32Array(absl::string_view key, absl::Span<const int32_t> values);
  void AddFloat32Array(absl::string_view key, absl::Span<const float> values);
  // A metadata entry written as given (tests of malformed files): the key, the type, and the
  // value's bytes.
  void AddRaw(absl::string_view key, uint32_t type, absl::string_view value_bytes);

  // A tensor of `type` with `ne` (ne[0] innermost) whose encoded bytes are `data`. Use
  // QuantizeRow to encode.
  void AddTensor(absl::string_view name, GgmlType type, std::vector<int64_t> ne,
                 std::vector<std::byte> data);

  // The whole file's bytes (tests).
  std::string Serialize() const;
  // Streams the file to `path` (the tensors are not copied again).
  absl::Status WriteFile(const std::string& path) const;

 private:
  struct Tensor {
    std::string name;
    GgmlType type;
    std::vector<int64_t> ne;
    std::vector<std::byte> data;
  };
  void Key(absl::string_view key, uint32_t type);
  // Everything before the first tensor's data, padded to the alignment.
  std::string Header() const;

  std::string metadata_;  // encoded entries
  uint64_t entries_ = 0;
  std::vector<Tensor> tensors_;
};

}  // namespace kvrm

#endif  // KVRM_MODEL_GGUF_WRITER_H_
