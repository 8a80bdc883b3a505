#include "model/gguf.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kvrm {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr int kMaxDims = 4;              // GGML_MAX_DIMS
constexpr uint64_t kDefaultAlignment = 32;

constexpr GgmlTypeTraits kTypes[] = {
    {GgmlType::kF32, "f32", 1, 4},       {GgmlType::kF16, "f16", 1, 2},
    {GgmlType::kQ4_0, "q4_0", 32, 18},   {GgmlType::kQ4_1, "q4_1", 32, 20},
    {GgmlType::kQ5_0, "q5_0", 32, 22},   {GgmlType::kQ5_1, "q5_1", 32, 24},
    {GgmlType::kQ8_0, "q8_0", 32, 34},   {GgmlType::kQ4_K, "q4_K", 256, 144},
    {GgmlType::kQ5_K, "q5_K", 256, 176}, {GgmlType::kQ6_K, "q6_K", 256, 210},
    {GgmlType::kBF16, "bf16", 1, 2},     {GgmlType::kMxfp4, "mxfp4", 32, 17},
};

// Names of the ggml types this loader refuses, for messages (ggml.h's ids).
const char* RefusedTypeName(uint32_t id) {
  switch (id) {
    case 9:
      return "q8_1";
    case 10:
      return "q2_K";
    case 11:
      return "q3_K";
    case 15:
      return "q8_K";
    case 16:
      return "iq2_xxs";
    case 17:
      return "iq2_xs";
    case 18:
      return "iq3_xxs";
    case 19:
      return "iq1_s";
    case 20:
      return "iq4_nl";
    case 21:
      return "iq3_s";
    case 22:
      return "iq2_s";
    case 23:
      return "iq4_xs";
    case 24:
      return "i8";
    case 25:
      return "i16";
    case 26:
      return "i32";
    case 27:
      return "i64";
    case 28:
      return "f64";
    case 29:
      return "iq1_m";
    case 34:
      return "tq1_0";
    case 35:
      return "tq2_0";
    default:
      return nullptr;
  }
}

// Bytes of one scalar of `t` (0 for strings and arrays).
size_t ScalarSize(GgufValueType t) {
  switch (t) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
      return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32:
      return 4;
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
      return 8;
    default:
      return 0;
  }
}

bool KnownValueType(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::kFloat64); }

template <typename T>
T Load(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Widens the scalar of type `t` at `p` into `v`.
void ReadScalar(GgufValueType t, const std::byte* p, GgufValue* v) {
  switch (t) {
    case GgufValueType::kUint8:
      v->u = Load<uint8_t>(p);
      break;
    case GgufValueType::kInt8:
      v->i = Load<int8_t>(p);
      break;
    case GgufValueType::kUint16:
      v->u = Load<uint16_t>(p);
      break;
    case GgufValueType::kInt16:
      v->i = Load<int16_t>(p);
      break;
    case GgufValueType::kUint32:
      v->u = Load<uint32_t>(p);
      break;
    case GgufValueType::kInt32:
      v->i = Load<int32_t>(p);
      break;
    case GgufValueType::kFloat32:
      v->f = Load<float>(p);
      break;
    case GgufValueType::kBool:
      v->u = Load<uint8_t>(p) != 0;
      break;
    case GgufValueType::kUint64:
      v->u = Load<uint64_t>(p);
      break;
    case GgufValueType::kInt64:
      v->i = Load<int64_t>(p);
      break;
    case GgufValueType::kFloat64:
      v->f = Load<double>(p);
      break;
    default:
      break;
  }
}

bool IsSigned(GgufValueType t) {
  return t == GgufValueType::kInt8 || t == GgufValueType::kInt16 || t == GgufValueType::kInt32 ||
         t == GgufValueType::kInt64;
}
bool IsUnsigned(GgufValueType t) {
  return t == GgufValueType::kUint8 || t == GgufValueType::kUint16 || t == GgufValueType::kUint32 ||
         t == GgufValueType::kUint64;
}
bool IsFloat(GgufValueType t) {
  return t == GgufValueType::kFloat32 || t == GgufValueType::kFloat64;
}

}  // namespace

// A cursor over the header that never reads past the mapping: every read checks what is left.
class GgufReader {
 public:
  GgufReader(const std::string& path, const std::byte* base, size_t size)
      : path_(path), base_(base), size_(size) {}
  size_t offset() const { return pos_; }
  size_t left() const { return size_ - pos_; }

  absl::Status Bytes(size_t n, const std::byte** out, absl::string_view what) {
    if (n > left()) {
      return absl::InvalidArgumentError(absl::StrCat(path_, ": truncated at byte ", pos_,
                                                     " reading ", what, " (", n, " bytes, ", left(),
                                                     " left)"));
    }
    *out = base_ + pos_;
    pos_ += n;
    return absl::OkStatus();
  }
  template <typename T>
  absl::Status Scalar(T* out, absl::string_view what) {
    const std::byte* p;
    RETURN_IF_ERROR(Bytes(sizeof(T), &p, what));
    *out = Load<T>(p);
    return absl::OkStatus();
  }
  absl::Status String(absl::string_view* out, absl::string_view what) {
    uint64_t n;
    RETURN_IF_ERROR(Scalar(&n, what));
    const std::byte* p;
    RETURN_IF_ERROR(Bytes(n, &p, what));
    *out = absl::string_view(reinterpret_cast<const char*>(p), n);
    return absl::OkStatus();
  }

 private:
  const std::string& path_;
  const std::byte* base_;
  size_t size_;
  size_t pos_ = 0;
};

namespace {

absl::Status KeyError(const std::string& path, absl::string_view key, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", key, ": ", problem));
}

absl::Status TensorError(const std::string& path, absl::string_view name,
                         absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": tensor \"", name, "\": ", problem));
}

absl::Status ReadValue(GgufReader& r, const std::string& path, absl::string_view key, uint32_t type,
                       GgufValue* v) {
  if (!KnownValueType(type)) {
    return KeyError(path, key, absl::StrCat("unknown value type ", type));
  }
  v->type = static_cast<GgufValueType>(type);
  if (v->type == GgufValueType::kString) return r.String(&v->str, key);
  if (v->type != GgufValueType::kArray) {
    const std::byte* p;
    RETURN_IF_ERROR(r.Bytes(ScalarSize(v->type), &p, key));
    ReadScalar(v->type, p, v);
    return absl::OkStatus();
  }
  uint32_t elem;
  RETURN_IF_ERROR(r.Scalar(&elem, key));
  RETURN_IF_ERROR(r.Scalar(&v->count, key));
  if (!KnownValueType(elem) || elem == static_cast<uint32_t>(GgufValueType::kArray)) {
    return KeyError(path, key, absl::StrCat("array of unsupported element type ", elem));
  }
  v->elem = static_cast<GgufValueType>(elem);
  if (v->elem == GgufValueType::kString) {
    // Each string takes at least its 8-byte length: bound the count before reserving for it.
    if (v->count > r.left() / 8) {
      return KeyError(path, key, absl::StrCat("array of ", v->count, " strings runs past the end"));
    }
    v->strs.resize(v->count);
    for (absl::string_view& s : v->strs) RETURN_IF_ERROR(r.String(&s, key));
    return absl::OkStatus();
  }
  const size_t size = ScalarSize(v->elem);
  if (v->count > r.left() / size) {
    return KeyError(path, key, absl::StrCat("array of ", v->count, " elements runs past the end"));
  }
  return r.Bytes(v->count * size, &v->elems, key);
}

}  // namespace

const GgmlTypeTraits* FindGgmlType(uint32_t id) {
  for (const GgmlTypeTraits& t : kTypes) {
    if (static_cast<uint32_t>(t.type) == id) return &t;
  }
  return nullptr;
}

const GgmlTypeTraits& GgmlTraits(GgmlType type) {
  return *FindGgmlType(static_cast<uint32_t>(type));
}

std::string GgmlTypeName(uint32_t id) {
  if (const GgmlTypeTraits* t = FindGgmlType(id)) return t->name;
  if (const char* name = RefusedTypeName(id)) return name;
  return absl::StrCat("type ", id);
}

int64_t GgufTensor::numel() const {
  int64_t n = 1;
  for (int64_t d : ne) n *= d;
  return n;
}

size_t GgufTensor::row_bytes() const {
  const GgmlTypeTraits& t = GgmlTraits(type);
  return static_cast<size_t>(cols() / t.block_elems * t.block_bytes);
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> mapped, MappedFile::Open(path));
  std::unique_ptr<GgufFile> file(new GgufFile(std::move(mapped)));
  RETURN_IF_ERROR(file->Parse());
  return file;
}

absl::Status GgufFile::Parse() {
  const std::string& p = path();
  GgufReader r(p, file_->data(), file_->size());
  uint32_t magic;
  RETURN_IF_ERROR(r.Scalar(&magic, "the magic"));
  if (magic != kMagic) return absl::InvalidArgumentError(absl::StrCat(p, ": not a GGUF file"));
  RETURN_IF_ERROR(r.Scalar(&version_, "the version"));
  if ((version_ & 0xFFFF) == 0 && version_ != 0) {  // llama.cpp's test: a byte-swapped file
    return absl::UnimplementedError(absl::StrCat(p, ": a big-endian GGUF file"));
  }
  if (version_ != 2 && version_ != 3) {
    return absl::InvalidArgumentError(
        absl::StrCat(p, ": GGUF version ", version_, " (this loader reads versions 2 and 3)"));
  }
  uint64_t tensor_count, kv_count;
  RETURN_IF_ERROR(r.Scalar(&tensor_count, "the tensor count"));
  RETURN_IF_ERROR(r.Scalar(&kv_count, "the metadata count"));
  // Each entry takes at least 12 bytes (an empty key and a type): bound before reserving.
  if (kv_count > r.left() / 12 || tensor_count > r.left() / 24) {
    return absl::InvalidArgumentError(absl::StrCat(p, ": ", kv_count, " metadata entries and ",
                                                   tensor_count, " tensors cannot fit the file"));
  }
  RETURN_IF_ERROR(ParseMetadata(r, kv_count));
  uint64_t alignment = kDefaultAlignment;
  if (Find("general.alignment") != nullptr) {
    ASSIGN_OR_RETURN(alignment, GetUint("general.alignment"));
    if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > (1u << 20)) {
      return KeyError(p, "general.alignment",
                      absl::StrCat(alignment, " is not a power of two up to 1 MiB"));
    }
  }
  std::vector<TensorInfo> infos;
  RETURN_IF_ERROR(ParseTensorInfos(r, tensor_count, &infos));
  uint64_t data_start = (r.offset() + alignment - 1) / alignment * alignment;
  // A file with no tensors (llama.cpp's vocabulary-only files) may end right after the tensor
  // infos, without the padding to the aligned data section: it has no data section at all.
  if (infos.empty()) data_start = std::min<uint64_t>(data_start, file_->size());
  if (data_start > file_->size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(p, ": the data section starts past the end of the file"));
  }
  return PlaceTensors(data_start, alignment, infos);
}

absl::Status GgufFile::ParseMetadata(GgufReader& r, uint64_t kv_count) {
  const std::string& p = path();
  keys_.reserve(kv_count);
  for (uint64_t k = 0; k < kv_count; ++k) {
    absl::string_view key;
    RETURN_IF_ERROR(r.String(&key, absl::StrCat("metadata key ", k)));
    uint32_t type;
    RETURN_IF_ERROR(r.Scalar(&type, key));
    GgufValue value;
    RETURN_IF_ERROR(ReadValue(r, p, key, type, &value));
    auto [it, inserted] = values_.emplace(std::string(key), std::move(value));
    if (!inserted) return KeyError(p, key, "duplicate key");
    keys_.push_back(it->first);
  }
  return absl::OkStatus();
}

absl::Status GgufFile::ParseTensorInfos(GgufReader& r, uint64_t tensor_count,
                                        std::vector<TensorInfo>* infos) {
  const std::string& p = path();
  infos->resize(tensor_count);
  tensors_.resize(tensor_count);
  for (uint64_t t = 0; t < tensor_count; ++t) {
    GgufTensor& tensor = tensors_[t];
    absl::string_view name;
    RETURN_IF_ERROR(r.String(&name, absl::StrCat("tensor name ", t)));
    tensor.name = std::string(name);
    uint32_t dims;
    RETURN_IF_ERROR(r.Scalar(&dims, name));
    if (dims == 0 || dims > kMaxDims) {
      return TensorError(p, name, absl::StrCat(dims, " dimensions (1 to ", kMaxDims, ")"));
    }
    uint64_t numel = 1;
    for (uint32_t d = 0; d < dims; ++d) {
      uint64_t n;
      RETURN_IF_ERROR(r.Scalar(&n, name));
      if (n == 0 || n > static_cast<uint64_t>(INT64_MAX) ||
          __builtin_mul_overflow(numel, n, &numel) || numel > static_cast<uint64_t>(INT64_MAX)) {
        return TensorError(p, name,
                           absl::StrCat("dimension ", d, " (", n, ") is zero or overflows"));
      }
      tensor.ne.push_back(static_cast<int64_t>(n));
    }
    RETURN_IF_ERROR(r.Scalar(&(*infos)[t].type, name));
    RETURN_IF_ERROR(r.Scalar(&(*infos)[t].offset, name));
    if (!tensor_index_.emplace(tensor.name, t).second) {
      return TensorError(p, name, "duplicate tensor name");
    }
  }
  return absl::OkStatus();
}

absl::Status GgufFile::PlaceTensors(uint64_t data_start, uint64_t alignment,
                                    const std::vector<TensorInfo>& infos) {
  const std::string& p = path();
  const uint64_t data_size = file_->size() - data_start;
  struct Range {
    uint64_t begin, end;
    size_t tensor;
  };
  std::vector<Range> ranges;
  ranges.reserve(infos.size());
  for (size_t t = 0; t < infos.size(); ++t) {
    GgufTensor& tensor = tensors_[t];
    const GgmlTypeTraits* traits = FindGgmlType(infos[t].type);
    if (traits == nullptr) {
      return absl::UnimplementedError(absl::StrCat(
          p, ": tensor \"", tensor.name, "\": ggml type ", GgmlTypeName(infos[t].type),
          " is not supported (f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q4_K, q5_K, q6_K)"));
    }
    tensor.type = traits->type;
    if (tensor.ne[0] % traits->block_elems != 0) {
      return TensorError(p, tensor.name,
                         absl::StrCat("rows of ", tensor.ne[0], " elements are not whole ",
                                      traits->name, " blocks of ", traits->block_elems));
    }
    const uint64_t blocks = static_cast<uint64_t>(tensor.numel() / traits->block_elems);
    uint64_t nbytes;
    if (__builtin_mul_overflow(blocks, static_cast<uint64_t>(traits->block_bytes), &nbytes)) {
      return TensorError(p, tensor.name, "size overflows");
    }
    const uint64_t offset = infos[t].offset;
    if (offset % alignment != 0) {
      return TensorError(
          p, tensor.name,
          absl::StrCat("offset ", offset, " is not a multiple of the alignment ", alignment));
    }
    if (offset > data_size || nbytes > data_size - offset) {
      return TensorError(
          p, tensor.name,
          absl::StrCat(nbytes, " bytes at offset ", offset,
                       " run past the end of the data section (", data_size, " bytes)"));
    }
    tensor.data = file_->data() + data_start + offset;
    tensor.nbytes = nbytes;
    ranges.push_back(Range{offset, offset + nbytes, t});
  }
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  for (size_t i = 1; i < ranges.size(); ++i) {
    if (ranges[i].begin < ranges[i - 1].end) {
      return TensorError(
          p, tensors_[ranges[i].tensor].name,
          absl::StrCat("overlaps tensor \"", tensors_[ranges[i - 1].tensor].name, "\""));
    }
  }
  return absl::OkStatus();
}

const GgufValue* GgufFile::Find(absl::string_view key) const {
  auto it = values_.find(key);
  return it == values_.end() ? nullptr : &it->second;
}

const GgufTensor* GgufFile::FindTensor(absl::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

absl::StatusOr<const GgufValue*> Need(const GgufFile& f, absl::string_view key) {
  const GgufValue* v = f.Find(key);
  if (v == nullptr) {
    return absl::NotFoundError(absl::StrCat(f.path(), ": metadata key ", key, " is missing"));
  }
  return v;
}

}  // namespace

absl::Status GgufFile::Invalid(absl::string_view key, absl::string_view problem) const {
  return KeyError(path(), key, problem);
}

absl::Status GgufFile::Unimplemented(absl::string_view key, absl::string_view problem) const {
  return absl::UnimplementedError(absl::StrCat(path(), ": ", key, ": ", problem));
}

absl::StatusOr<uint64_t> GgufFile::GetUint(absl::string_view key) const {
  ASSIGN_OR_RETURN(const GgufValue* v, Need(*this, key));
  if (IsUnsigned(v->type)) return v->u;
  if (IsSigned(v->type) && v->i >= 0) return static_cast<uint64_t>(v->i);
  return KeyError(path(), key, "expected a non-negative integer");
}

absl::StatusOr<double> GgufFile::GetFloat(absl::string_view key) const {
  ASSIGN_OR_RETURN(const GgufValue* v, Need(*this, key));
  if (IsFloat(v->type)) return v->f;
  if (IsUnsigned(v->type)) return static_cast<double>(v->u);
  if (IsSigned(v->type)) return static_cast<double>(v->i);
  return KeyError(path(), key, "expected a number");
}

absl::StatusOr<bool> GgufFile::GetBool(absl::string_view key) const {
  ASSIGN_OR_RETURN(const GgufValue* v, Need(*this, key));
  if (v->type != GgufValueType::kBool) return KeyError(path(), key, "expected a bool");
  return v->u != 0;
}

absl::StatusOr<absl::string_view> GgufFile::GetString(absl::string_view key) const {
  ASSIGN_OR_RETURN(const GgufValue* v, Need(*this, key));
  if (v->type != GgufValueType::kString) return KeyError(path(), key, "expected a string");
  return v->str;
}

absl::StatusOr<absl::Span<const absl::string_view>> GgufFile::GetStringArray(
    absl::string_view key) const {
  ASSIGN_OR_RETURN(const GgufValue* v, Need(*this, key));
  if (v->type != GgufValueType::kArray || v->elem != GgufValueType::kString) {
    return KeyError(path(), key, "expected an array of strings");
  }
  return absl::MakeConstSpan(v->strs);
}

absl::StatusOr<std::vector<double>> GgufFile::GetNumberArray(absl::string_view key) const {
  ASSIGN_OR_RETURN(const GgufValue* v, Need(*this, key));
  if (v->type != GgufValueType::kArray ||
      !(IsFloat(v->elem) || IsSigned(v->elem) || IsUnsigned(v->elem) ||
        v->elem == GgufValueType::kBool)) {
    return KeyError(path(), key, "expected an array of numbers");
  }
  std::vector<double> out(v->count);
  const size_t size = ScalarSize(v->elem);
  for (uint64_t k = 0; k < v->count; ++k) {
    GgufValue e;
    ReadScalar(v->elem, v->elems + k * size, &e);
    out[k] = IsFloat(v->elem)    ? e.f
             : IsSigned(v->elem) ? static_cast<double>(e.i)
                                 : static_cast<double>(e.u);
  }
  return out;
}

}  // namespace kvrm
