// Read-only, memory-mapped access to GGUF files (llama.cpp's model format, versions 2 and 3).
//
// Layout (little-endian): "GGUF", u32 version, u64 tensor count, u64 metadata count; the
// metadata as (string key, u32 value type, value); the tensor infos as (string name, u32 dims,
// u64 ne[dims], u32 ggml type, u64 offset); then, at the next multiple of general.alignment
// (default 32), the data section, which the offsets are relative to. A string is a u64 length
// and that many bytes; an array is a u32 element type, a u64 count and the elements. ne[0] is
// the innermost dimension: a [rows][cols] matrix is ne = {cols, rows}.
//
// Files are untrusted: Open() checks every count against the bytes left before it allocates,
// every tensor's type, shape, size, alignment and bounds, and that no two tensors overlap, so a
// GgufTensor it returns always lies inside the mapping and has exactly the bytes its type and
// shape need. Errors are INVALID_ARGUMENT naming the file and the key or tensor.
#ifndef KVRM_MODEL_GGUF_H_
#define KVRM_MODEL_GGUF_H_

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/mapped_file.h"

namespace kvrm {

enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// The ggml tensor types this loader reads (ids as in ggml.h; the gaps are types it refuses).
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kBF16 = 30,
  kMxfp4 = 39,  // OCP MXFP4 (gpt-oss's experts): an E8M0 byte, then 16 bytes of FP4 E2M1 codes
};

// A type's block: `block_elems` consecutive elements of a row stored in `block_bytes` bytes.
struct GgmlTypeTraits {
  GgmlType type;
  const char* name;  // as llama.cpp prints it: "f32", "q4_K", ...
  int64_t block_elems;
  int64_t block_bytes;
};

// The traits of ggml type id `id`, or null for a type this loader does not read.
const GgmlTypeTraits* FindGgmlType(uint32_t id);
const GgmlTypeTraits& GgmlTraits(GgmlType type);

struct GgufValue {
  GgufValueType type = GgufValueType::kUint8;
  // Scalars, widened: integers in `i` (signed types) or `u` (unsigned types and bool), floats
  // in `f`.
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0;
  absl::string_view str;  // kString: into the mapping
  // kArray: the element type and count; numbers and bools packed in the mapping at `elems`,
  // strings in `strs` (into the mapping). Arrays of arrays are refused.
  GgufValueType elem = GgufValueType::kUint8;
  uint64_t count = 0;
  const std::byte* elems = nullptr;
  std::vector<absl::string_view> strs;
};

struct GgufTensor {
  std::string name;
  GgmlType type = GgmlType::kF32;
  std::vector<int64_t> ne;          // ggml order: ne[0] innermost
  const std::byte* data = nullptr;  // into the mapping
  size_t nbytes = 0;
  int64_t numel() const;
  int64_t cols() const { return ne.empty() ? 1 : ne[0]; }  // elements per row
  int64_t rows() const { return cols() == 0 ? 0 : numel() / cols(); }
  // Bytes of one row (a whole number of blocks).
  size_t row_bytes() const;
};

class GgufReader;  // a bounds-checked cursor over a file's header (gguf.cc)

class GgufFile {
 public:
  // NOT_FOUND when the file does not exist; INVALID_ARGUMENT naming the file (and key or tensor)
  // for malformed content; UNIMPLEMENTED naming the tensor for a ggml type this loader does not
  // read.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);

  const std::string& path() const { return file_->path(); }
  uint32_t version() const { return version_; }
  size_t file_size() const { return file_->size(); }

  const GgufValue* Find(absl::string_view key) const;          // null when absent
  const GgufTensor* FindTensor(absl::string_view name) const;  // null when absent
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  // Metadata keys in file order.
  const std::vector<std::string>& keys() const { return keys_; }

  // Typed reads; NOT_FOUND naming the key when absent, INVALID_ARGUMENT naming it when the value
  // has another type (or, for GetUint, is negative; for GetFloat, is not a number).
  absl::StatusOr<uint64_t> GetUint(absl::string_view key) const;  // any integer type
  absl::StatusOr<double> GetFloat(absl::string_view key) const;   // a float or an integer
  absl::StatusOr<bool> GetBool(absl::string_view key) const;
  absl::StatusOr<absl::string_view> GetString(absl::string_view key) const;
  absl::StatusOr<absl::Span<const absl::string_view>> GetStringArray(absl::string_view key) const;
  // An array of numbers (any integer or float type, or bools as 0 and 1), widened to double.
  absl::StatusOr<std::vector<double>> GetNumberArray(absl::string_view key) const;

  // "<path>: <key>: <problem>" as INVALID_ARGUMENT (malformed) or UNIMPLEMENTED (not supported).
  absl::Status Invalid(absl::string_view key, absl::string_view problem) const;
  absl::Status Unimplemented(absl::string_view key, absl::string_view problem) const;

 private:
  explicit GgufFile(std::unique_ptr<MappedFile> file) : file_(std::move(file)) {}

  struct TensorInfo {
    uint32_t type = 0;
    uint64_t offset = 0;
  };
  absl::Status Parse();
  absl::Status ParseMetadata(GgufReader& r, uint64_t kv_count);
  absl::Status ParseTensorInfos(GgufReader& r, uint64_t tensor_count,
                                std::vector<TensorInfo>* infos);
  // Checks each tensor's type, size, alignment and bounds in the data section at `data_start`,
  // and that no two overlap, and points it into the mapping.
  absl::Status PlaceTensors(uint64_t data_start, uint64_t alignment,
                            const std::vector<TensorInfo>& infos);

  std::unique_ptr<MappedFile> file_;
  uint32_t version_ = 0;
  std::vector<std::string> keys_;
  std::map<std::string, GgufValue, std::less<>> values_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

// "q4_K" for messages ("type 17" for an id this loader does not read).
std::string GgmlTypeName(uint32_t id);

}  // namespace kvrm

#endif  // KVRM_MODEL_GGUF_H_
