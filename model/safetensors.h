// Read-only, memory-mapped access to safetensors files (github.com/huggingface/safetensors).
//
// Layout: an 8-byte little-endian header length N, N bytes of JSON header
// {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}},
// then the data section; offsets are relative to its start. Files are untrusted: Open() checks
// every entry (dtype, shape, sizes, bounds, overlaps) so a TensorView it returns always lies
// inside the mapping and has exactly numel * DTypeSize(dtype) bytes.
//
// Alignment: data is only as aligned as the file makes it (our writer and the reference writer
// keep tensors aligned to their element size; foreign files may not). Read through memcpy or
// check alignment before casting.
#ifndef KVRM_MODEL_SAFETENSORS_H_
#define KVRM_MODEL_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "common/mapped_file.h"

namespace kvrm {

// The element types a safetensors header may name ("F32", "I32", ...). Weights are one of the
// float DTypes; the others come with quantized checkpoints (AWQ / GPTQ's packed I32 qweight,
// compressed-tensors' I64 weight_shape, FP8 weights) and stray buffers (I64 position ids).
enum class StorageType : uint8_t {
  kF32,
  kF16,
  kBF16,
  kF64,
  kF8E4M3,
  kF8E5M2,
  kI8,
  kU8,
  kI16,
  kU16,
  kI32,
  kU32,
  kI64,
  kU64,
  kBool
};
std::string_view StorageTypeName(StorageType t);  // the header's spelling: "I32"
size_t StorageTypeSize(StorageType t);

struct TensorView {
  std::string name;
  StorageType type = StorageType::kF32;
  DType dtype = DType::kF32;  // the float type, when `type` is F32, F16 or BF16
  bool is_float() const {
    return type == StorageType::kF32 || type == StorageType::kF16 || type == StorageType::kBF16;
  }
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;  // into the read-only mapping; valid while its file/set lives
  size_t nbytes = 0;
  std::string file;  // the file it came from, for messages
  int64_t numel() const;
};

// Element i of a float tensor (F32, F16 or BF16: is_float()) as float, read unaligned.
float FloatElement(const TensorView& t, int64_t i);

// "[2, 3]" for messages.
std::string ShapeToString(absl::Span<const int64_t> shape);

// One memory-mapped .safetensors file. The mapping is PROT_READ / MAP_PRIVATE and is released
// (munmap + close) by the destructor. Immutable after Open(), so safe to read from any thread.
class SafetensorsFile {
 public:
  // NOT_FOUND when the file does not exist; INVALID_ARGUMENT naming the file (and tensor) for
  // any malformed content.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  std::vector<std::string> TensorNames() const;         // sorted
  const TensorView* Find(std::string_view name) const;  // nullptr if absent
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  size_t file_size() const { return size_; }

 private:
  explicit SafetensorsFile(std::unique_ptr<MappedFile> file);
  absl::Status ParseHeader();

  std::string path_;
  std::unique_ptr<MappedFile> file_;
  const std::byte* base_ = nullptr;  // mapping of the whole file
  size_t size_ = 0;
  std::map<std::string, TensorView, std::less<>> tensors_;
  std::map<std::string, std::string> metadata_;
};

// The weights of one model directory: model.safetensors, or the shards listed in
// model.safetensors.index.json's "weight_map" (only tensors the index lists are visible).
class SafetensorsSet {
 public:
  // NOT_FOUND when the directory has neither file, a listed shard is missing, or no tensors.
  static absl::StatusOr<std::unique_ptr<SafetensorsSet>> OpenDirectory(const std::string& dir);

  // NOT_FOUND naming the tensor and directory when absent; INVALID_ARGUMENT naming the tensor,
  // its file, and both shapes when `expected_shape` is non-empty and differs, or the dtype when
  // it is not a float one (F32, F16, BF16).
  absl::StatusOr<TensorView> Get(std::string_view name,
                                 absl::Span<const int64_t> expected_shape = {}) const;
  // As Get, of any element type (the caller checks `type`).
  absl::StatusOr<TensorView> GetAny(std::string_view name,
                                    absl::Span<const int64_t> expected_shape = {}) const;
  bool Contains(std::string_view name) const { return tensors_.find(name) != tensors_.end(); }
  std::vector<std::string> TensorNames() const;  // sorted
  int64_t total_bytes() const { return total_bytes_; }
  const std::string& dir() const { return dir_; }

 private:
  SafetensorsSet() = default;
  absl::Status AddFile(std::unique_ptr<SafetensorsFile> file);
  absl::Status LoadIndex(const std::string& index_path);

  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*, std::less<>> tensors_;  // point into files_
  int64_t total_bytes_ = 0;
};

}  // namespace kvrm

#endif  // KVRM_MODEL_SAFETENSORS_H_
