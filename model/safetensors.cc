#include "model/safetensors.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/json.h"
#include "common/logging.h"
#include "common/mapped_file.h"
#include "common/status_macros.h"

namespace kvrm {
namespace {

// The reference implementation's limit; bounds what a hostile file can make us parse.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr char kIndexFile[] = "model.safetensors.index.json";
constexpr char kSingleFile[] = "model.safetensors";

absl::Status FileError(const std::string& path, std::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(path, ": ", std::string(problem)));
}

absl::Status TensorError(const std::string& path, const std::string& name,
                         std::string_view problem) {
  return absl::InvalidArgumentError(
      absl::StrCat(path, ": tensor \"", name, "\": ", std::string(problem)));
}

constexpr std::pair<std::string_view, StorageType> kStorageTypes[] = {
    {"F32", StorageType::kF32},        {"F16", StorageType::kF16},
    {"BF16", StorageType::kBF16},      {"F64", StorageType::kF64},
    {"F8_E4M3", StorageType::kF8E4M3}, {"F8_E5M2", StorageType::kF8E5M2},
    {"I8", StorageType::kI8},          {"U8", StorageType::kU8},
    {"I16", StorageType::kI16},        {"U16", StorageType::kU16},
    {"I32", StorageType::kI32},        {"U32", StorageType::kU32},
    {"I64", StorageType::kI64},        {"U64", StorageType::kU64},
    {"BOOL", StorageType::kBool}};

bool ParseStorageType(std::string_view s, StorageType* out) {
  for (const auto& [name, type] : kStorageTypes) {
    if (s == name) {
      *out = type;
      return true;
    }
  }
  return false;
}

// A non-negative JSON integer; false for negatives, floats and non-numbers.
bool AsUint(const Json& v, uint64_t* out) {
  if (!v.is_number_unsigned()) return false;
  *out = v.get<uint64_t>();
  return true;
}

struct Range {
  uint64_t begin, end;
  const std::string* name;
};

// Fills `view` (dtype, shape, nbytes) and `range` from one header entry, checking it against the
// data section's size. `view->data` is left for the caller.
absl::Status ParseEntry(const std::string& path, const std::string& name, const Json& entry,
                        uint64_t data_size, TensorView* view, Range* range) {
  if (!entry.is_object()) return TensorError(path, name, "header entry is not an object");
  const auto dtype_it = entry.find("dtype");
  if (dtype_it == entry.end() || !dtype_it->is_string()) {
    return TensorError(path, name, "missing or non-string \"dtype\"");
  }
  const std::string& dtype = dtype_it->get_ref<const std::string&>();
  if (!ParseStorageType(dtype, &view->type)) {
    return TensorError(path, name,
                       absl::StrCat("unsupported dtype \"", dtype,
                                    "\" (supported: F32, F16, BF16, F64, F8_E4M3, F8_E5M2, I8, "
                                    "U8, I16, U16, I32, U32, I64, U64, BOOL)"));
  }
  view->dtype = view->type == StorageType::kF16    ? DType::kF16
                : view->type == StorageType::kBF16 ? DType::kBF16
                                                   : DType::kF32;
  const auto shape_it = entry.find("shape");
  if (shape_it == entry.end() || !shape_it->is_array()) {
    return TensorError(path, name, "missing or non-array \"shape\"");
  }
  uint64_t numel = 1;
  for (const Json& d : *shape_it) {
    uint64_t dim;
    if (!AsUint(d, &dim)) {
      return TensorError(
          path, name, absl::StrCat("shape dimension ", d.dump(), " is not a non-negative integer"));
    }
    if (dim > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(numel, dim, &numel)) {
      return TensorError(path, name, absl::StrCat("shape ", shape_it->dump(), " overflows"));
    }
    view->shape.push_back(static_cast<int64_t>(dim));
  }
  uint64_t nbytes;
  if (numel > static_cast<uint64_t>(INT64_MAX) ||
      __builtin_mul_overflow(numel, StorageTypeSize(view->type), &nbytes)) {
    return TensorError(path, name, absl::StrCat("shape ", shape_it->dump(), " overflows"));
  }
  const auto off_it = entry.find("data_offsets");
  if (off_it == entry.end() || !off_it->is_array() || off_it->size() != 2 ||
      !AsUint((*off_it)[0], &range->begin) || !AsUint((*off_it)[1], &range->end) ||
      range->begin > range->end) {
    return TensorError(path, name, "\"data_offsets\" must be [begin, end] with 0 <= begin <= end");
  }
  if (range->end - range->begin != nbytes) {
    return TensorError(path, name,
                       absl::StrCat("shape mismatch: ", dtype, " ", ShapeToString(view->shape),
                                    " needs ", nbytes, " bytes but data_offsets ", off_it->dump(),
                                    " span ", range->end - range->begin));
  }
  if (range->end > data_size) {
    return TensorError(
        path, name,
        absl::StrCat("data_offsets ", off_it->dump(), " run past the end of the data section (",
                     data_size, " bytes)"));
  }
  view->nbytes = nbytes;
  return absl::OkStatus();
}

absl::Status ParseMetadata(const std::string& path, const Json& v,
                           std::map<std::string, std::string>* out) {
  if (!v.is_object()) return FileError(path, "__metadata__ must be an object");
  for (const auto& [key, value] : v.items()) {
    if (!value.is_string()) {
      return FileError(path, absl::StrCat("__metadata__ value for \"", key, "\" is not a string"));
    }
    (*out)[key] = value.get_ref<const std::string&>();
  }
  return absl::OkStatus();
}

// Zero-length tensors occupy no bytes, so they cannot overlap anything.
absl::Status CheckNoOverlap(const std::string& path, std::vector<Range> ranges) {
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin < b.begin; });
  const Range* furthest = nullptr;  // the non-empty range ending last so far
  for (const Range& r : ranges) {
    if (r.begin == r.end) continue;
    if (furthest != nullptr && r.begin < furthest->end) {
      return TensorError(
          path, *r.name,
          absl::StrCat("data_offsets [", r.begin, ", ", r.end, "] overlap tensor \"",
                       *furthest->name, "\" [", furthest->begin, ", ", furthest->end, "]"));
    }
    if (furthest == nullptr || r.end > furthest->end) furthest = &r;
  }
  return absl::OkStatus();
}

bool IsPlainFileName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}

}  // namespace

std::string_view StorageTypeName(StorageType t) {
  for (const auto& [name, type] : kStorageTypes) {
    if (type == t) return name;
  }
  return "?";
}

size_t StorageTypeSize(StorageType t) {
  switch (t) {
    case StorageType::kF64:
    case StorageType::kI64:
    case StorageType::kU64:
      return 8;
    case StorageType::kF32:
    case StorageType::kI32:
    case StorageType::kU32:
      return 4;
    case StorageType::kF16:
    case StorageType::kBF16:
    case StorageType::kI16:
    case StorageType::kU16:
      return 2;
    default:
      return 1;
  }
}

float FloatElement(const TensorView& t, int64_t i) {
  const std::byte* p = t.data + i * static_cast<int64_t>(DTypeSize(t.dtype));
  if (t.dtype == DType::kF32) {
    float v;
    std::memcpy(&v, p, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return t.dtype == DType::kBF16 ? Bf16ToFloat(h) : F16ToFloat(h);
}

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::string ShapeToString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// ---- SafetensorsFile ----------------------------------------------------------------------

SafetensorsFile::SafetensorsFile(std::unique_ptr<MappedFile> file)
    : path_(file->path()), file_(std::move(file)), base_(file_->data()), size_(file_->size()) {}

SafetensorsFile::~SafetensorsFile() = default;

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> mapped, MappedFile::Open(path));
  if (mapped->size() < 8) {
    return FileError(path, absl::StrCat("truncated header: file has ", mapped->size(),
                                        " bytes, fewer than the 8-byte header length"));
  }
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile(std::move(mapped)));
  RETURN_IF_ERROR(file->ParseHeader());
  return file;
}

absl::Status SafetensorsFile::ParseHeader() {
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) {
    header_len = (header_len << 8) | static_cast<uint8_t>(base_[i]);
  }
  if (header_len > kMaxHeaderBytes) {
    return FileError(path_, absl::StrCat("header length ", header_len, " exceeds the ",
                                         kMaxHeaderBytes, "-byte limit"));
  }
  if (header_len > size_ - 8) {
    return FileError(path_, absl::StrCat("header length ", header_len,
                                         " runs past the end of the file (", size_, " bytes)"));
  }
  const std::string_view text(reinterpret_cast<const char*>(base_) + 8, header_len);
  ASSIGN_OR_RETURN(Json header, ParseJson(text, path_));
  if (!header.is_object()) return FileError(path_, "header is not a JSON object");

  const std::byte* data = base_ + 8 + header_len;
  const uint64_t data_size = size_ - 8 - header_len;
  std::vector<Range> ranges;
  ranges.reserve(header.size());
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      RETURN_IF_ERROR(ParseMetadata(path_, entry, &metadata_));
      continue;
    }
    TensorView view;
    Range range;
    RETURN_IF_ERROR(ParseEntry(path_, name, entry, data_size, &view, &range));
    view.name = name;
    view.file = path_;
    view.data = data + range.begin;
    auto [it, inserted] = tensors_.emplace(name, std::move(view));
    CHECK(inserted);  // JSON object keys are unique after parsing
    range.name = &it->first;
    ranges.push_back(range);
  }
  return CheckNoOverlap(path_, std::move(ranges));
}

std::vector<std::string> SafetensorsFile::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, view] : tensors_) names.push_back(name);
  return names;
}

const TensorView* SafetensorsFile::Find(std::string_view name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

// ---- SafetensorsSet -----------------------------------------------------------------------

absl::StatusOr<std::unique_ptr<SafetensorsSet>> SafetensorsSet::OpenDirectory(
    const std::string& dir) {
  struct stat st;
  if (::stat(dir.c_str(), &st) != 0) return ErrnoStatus(dir, errno);
  if (!S_ISDIR(st.st_mode)) return FileError(dir, "not a directory");
  std::unique_ptr<SafetensorsSet> set(new SafetensorsSet());
  set->dir_ = dir;
  const std::string index_path = absl::StrCat(dir, "/", kIndexFile);
  const std::string single_path = absl::StrCat(dir, "/", kSingleFile);
  // The single file first, as Transformers' from_pretrained looks for it before the index.
  if (Exists(single_path)) {
    if (Exists(index_path)) {
      LOG(WARNING) << dir << ": both " << kSingleFile << " and " << kIndexFile << ": loading "
                   << kSingleFile << " (as Transformers does); the shards are ignored";
    }
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(single_path));
    for (const std::string& name : file->TensorNames()) {
      const TensorView* view = file->Find(name);
      set->tensors_.emplace(name, view);
      set->total_bytes_ += static_cast<int64_t>(view->nbytes);
    }
    set->files_.push_back(std::move(file));
  } else if (Exists(index_path)) {
    RETURN_IF_ERROR(set->LoadIndex(index_path));
  } else {
    return absl::NotFoundError(
        absl::StrCat(dir, ": no ", kSingleFile, " or ", kIndexFile, " in the directory"));
  }
  if (set->tensors_.empty()) {
    return absl::NotFoundError(absl::StrCat(dir, ": the safetensors files hold no tensors"));
  }
  return set;
}

absl::Status SafetensorsSet::LoadIndex(const std::string& index_path) {
  ASSIGN_OR_RETURN(Json index, ReadJsonFile(index_path));
  if (!index.is_object()) return FileError(index_path, "not a JSON object");
  const auto map_it = index.find("weight_map");
  if (map_it == index.end() || !map_it->is_object()) {
    return FileError(index_path, "missing or non-object \"weight_map\"");
  }
  // shard file name -> tensors the index places in it
  std::map<std::string, std::vector<std::string>> by_shard;
  for (const auto& [tensor, shard] : map_it->items()) {
    if (!shard.is_string() || !IsPlainFileName(shard.get_ref<const std::string&>())) {
      // A path ("../x", "/etc/passwd") would let the index reach outside the model directory.
      return FileError(index_path,
                       absl::StrCat("weight_map entry for tensor \"", tensor,
                                    "\" must be a file name in the directory, not ", shard.dump()));
    }
    by_shard[shard.get_ref<const std::string&>()].push_back(tensor);
  }
  for (const auto& [shard, names] : by_shard) {
    const std::string shard_path = absl::StrCat(dir_, "/", shard);
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(shard_path);
    if (absl::IsNotFound(file.status())) {
      return absl::NotFoundError(absl::StrCat(index_path, ": shard \"", shard, "\" (listed for \"",
                                              names.front(), "\") not found: ", shard_path));
    }
    if (!file.ok()) return file.status();
    for (const std::string& name : names) {
      const TensorView* view = (*file)->Find(name);
      if (view == nullptr) {
        return absl::InvalidArgumentError(
            absl::StrCat(index_path, ": tensor \"", name,
                         "\" is listed in weight_map but absent from ", shard_path));
      }
      tensors_.emplace(name, view);
      total_bytes_ += static_cast<int64_t>(view->nbytes);
    }
    files_.push_back(*std::move(file));
  }
  return absl::OkStatus();
}

absl::StatusOr<TensorView> SafetensorsSet::Get(std::string_view name,
                                               absl::Span<const int64_t> expected_shape) const {
  ASSIGN_OR_RETURN(TensorView view, GetAny(name, expected_shape));
  if (!view.is_float()) {
    return absl::InvalidArgumentError(absl::StrCat(
        view.file, ": tensor \"", view.name, "\" has dtype ",
        std::string(StorageTypeName(view.type)), ", not a float one (F32, F16, BF16)"));
  }
  return view;
}

absl::StatusOr<TensorView> SafetensorsSet::GetAny(std::string_view name,
                                                  absl::Span<const int64_t> expected_shape) const {
  auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(
        absl::StrCat("tensor \"", std::string(name), "\" not found in ", dir_));
  }
  const TensorView& view = *it->second;
  if (!expected_shape.empty() && absl::MakeConstSpan(view.shape) != expected_shape) {
    return absl::InvalidArgumentError(absl::StrCat(view.file, ": tensor \"", view.name,
                                                   "\" has shape ", ShapeToString(view.shape),
                                                   ", expected ", ShapeToString(expected_shape)));
  }
  return view;
}

std::vector<std::string> SafetensorsSet::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, view] : tensors_) names.push_back(name);
  return names;
}

}  // namespace kvrm
