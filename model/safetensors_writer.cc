#include "model/safetensors_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>
#include <string_view>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/json.h"
#include "common/status_macros.h"

namespace kvrm {
namespace {

// write(2) moves at most ~2 GiB per call on Linux; stay well below.
constexpr size_t kMaxWriteChunk = size_t{1} << 30;

const char* SafetensorsDTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kF8E4M3:
      return "F8_E4M3";
    case DType::kF8E5M2:
      return "F8_E5M2";
  }
  return "?";
}

// Strict UTF-8 (no overlongs, surrogates, or code points past U+10FFFF): the reader's JSON parser
// rejects anything else, so a bad name must fail here rather than produce an unreadable file.
bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const uint8_t c = static_cast<uint8_t>(s[i]);
    int len;
    uint32_t cp;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xe0) == 0xc0) {
      len = 2, cp = c & 0x1f;
    } else if ((c & 0xf0) == 0xe0) {
      len = 3, cp = c & 0x0f;
    } else if ((c & 0xf8) == 0xf0) {
      len = 4, cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    for (int k = 1; k < len; ++k) {
      const uint8_t cc = static_cast<uint8_t>(s[i + k]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    static constexpr uint32_t kMinForLength[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMinForLength[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += len;
  }
  return true;
}

absl::Status CheckTensor(const TensorToWrite& t, std::set<std::string_view>* seen) {
  if (t.name.empty() || t.name == "__metadata__" || !IsValidUtf8(t.name)) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors writer: invalid tensor name \"", t.name, "\""));
  }
  if (!seen->insert(t.name).second) {
    return absl::InvalidArgumentError(
        absl::StrCat("safetensors writer: duplicate tensor name \"", t.name, "\""));
  }
  uint64_t numel = 1;
  for (int64_t d : t.shape) {
    if (d < 0 || __builtin_mul_overflow(numel, static_cast<uint64_t>(d), &numel)) {
      return absl::InvalidArgumentError(
          absl::StrCat("safetensors writer: tensor \"", t.name, "\" has an invalid shape"));
    }
  }
  uint64_t nbytes;
  const size_t element = t.type ? StorageTypeSize(*t.type) : DTypeSize(t.dtype);
  const std::string type_name =
      t.type ? std::string(StorageTypeName(*t.type)) : SafetensorsDTypeName(t.dtype);
  if (__builtin_mul_overflow(numel, element, &nbytes) || nbytes != t.data.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "safetensors writer: tensor \"", t.name, "\" has ", t.data.size(), " bytes of data, but ",
        type_name, " with ", numel, " elements needs ", numel * element));
  }
  return absl::OkStatus();
}

// The 8-byte length prefix and the space-padded JSON header, for tensors packed in order.
absl::StatusOr<std::string> BuildHeader(absl::Span<const TensorToWrite> tensors,
                                        const std::map<std::string, std::string>& metadata) {
  Json header = Json::object();
  if (!metadata.empty()) {
    Json meta = Json::object();
    for (const auto& [key, value] : metadata) {
      if (!IsValidUtf8(key) || !IsValidUtf8(value)) {
        return absl::InvalidArgumentError(
            absl::StrCat("safetensors writer: metadata \"", key, "\" is not valid UTF-8"));
      }
      meta[key] = value;
    }
    header["__metadata__"] = std::move(meta);
  }
  std::set<std::string_view> seen;
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    RETURN_IF_ERROR(CheckTensor(t, &seen));
    const uint64_t end = offset + t.data.size();
    header[t.name] = {{"dtype", t.type ? std::string(StorageTypeName(*t.type))
                                       : std::string(SafetensorsDTypeName(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, end}}};
    offset = end;
  }
  // Everything was validated as UTF-8 above, so `replace` never fires; it only rules out a throw.
  std::string json = header.dump(-1, ' ', false, Json::error_handler_t::replace);
  json.append((8 - json.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((json.size() >> (8 * i)) & 0xff);
  return out + json;
}

absl::Status WriteAll(int fd, const std::string& path, absl::Span<const std::byte> bytes) {
  const std::byte* p = bytes.data();
  size_t left = bytes.size();
  while (left > 0) {
    const ssize_t n = ::write(fd, p, std::min(left, kMaxWriteChunk));
    if (n < 0) {
      if (errno == EINTR) continue;
      return absl::InternalError(absl::StrCat(path, ": write failed: ", std::strerror(errno)));
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

// Writes `pieces` to path.tmp, fsyncs, and renames it over `path`; removes the temporary on error.
absl::Status WriteAtomically(const std::string& path,
                             absl::Span<const absl::Span<const std::byte>> pieces) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(tmp, ": cannot create: ", std::strerror(errno)));
  }
  absl::Status status;
  for (absl::Span<const std::byte> piece : pieces) {
    status = WriteAll(fd, tmp, piece);
    if (!status.ok()) break;
  }
  if (status.ok() && ::fsync(fd) != 0) {
    status = absl::InternalError(absl::StrCat(tmp, ": fsync failed: ", std::strerror(errno)));
  }
  if (::close(fd) != 0 && status.ok()) {
    status = absl::InternalError(absl::StrCat(tmp, ": close failed: ", std::strerror(errno)));
  }
  if (status.ok() && std::rename(tmp.c_str(), path.c_str()) != 0) {
    status = absl::InternalError(
        absl::StrCat("rename ", tmp, " -> ", path, " failed: ", std::strerror(errno)));
  }
  if (!status.ok()) ::unlink(tmp.c_str());
  return status;
}

absl::Span<const std::byte> AsBytes(const std::string& s) {
  return {reinterpret_cast<const std::byte*>(s.data()), s.size()};
}

// shard index per tensor: a new shard starts once the running total passes the next 1/N mark,
// or when only as many tensors remain as shards still to fill.
std::vector<int> AssignShards(absl::Span<const TensorToWrite> tensors, int num_shards,
                              uint64_t total) {
  std::vector<int> shard_of(tensors.size());
  int shard = 0;
  uint64_t cumulative = 0;
  bool shard_empty = true;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const size_t remaining = tensors.size() - i;
    const int shards_after = num_shards - 1 - shard;
    const bool reached_mark = static_cast<long double>(cumulative) * num_shards >=
                              static_cast<long double>(total) * (shard + 1);
    if (!shard_empty && shards_after > 0 &&
        (reached_mark || remaining <= static_cast<size_t>(shards_after))) {
      ++shard;
      shard_empty = true;
    }
    shard_of[i] = shard;
    shard_empty = false;
    cumulative += tensors[i].data.size();
  }
  return shard_of;
}

}  // namespace

absl::Status WriteSafetensors(const std::string& path, absl::Span<const TensorToWrite> tensors,
                              const std::map<std::string, std::string>& metadata) {
  ASSIGN_OR_RETURN(const std::string header, BuildHeader(tensors, metadata));
  std::vector<absl::Span<const std::byte>> pieces;
  pieces.reserve(tensors.size() + 1);
  pieces.push_back(AsBytes(header));
  for (const TensorToWrite& t : tensors) pieces.push_back(t.data);
  return WriteAtomically(path, pieces);
}

absl::Status AppendToSafetensors(const std::string& path, absl::Span<const TensorToWrite> extra) {
  ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(path));
  std::vector<TensorToWrite> all;
  for (const std::string& name : file->TensorNames()) {
    const TensorView* t = file->Find(name);
    TensorToWrite w{name, t->dtype, t->shape, absl::MakeConstSpan(t->data, t->nbytes)};
    if (!t->is_float()) w.type = t->type;
    all.push_back(std::move(w));
  }
  all.insert(all.end(), extra.begin(), extra.end());
  return WriteSafetensors(path, all, file->metadata());
}

absl::Status WriteSafetensorsSharded(const std::string& dir,
                                     absl::Span<const TensorToWrite> tensors, int num_shards) {
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  if (num_shards < 1 || static_cast<size_t>(num_shards) > std::max<size_t>(tensors.size(), 1)) {
    return absl::InvalidArgumentError(absl::StrCat("safetensors writer: cannot split ",
                                                   tensors.size(), " tensors into ", num_shards,
                                                   " shards"));
  }
  if (num_shards == 1) return WriteSafetensors(dir + "/model.safetensors", tensors, metadata);
  // Each shard checks its own tensors; names must also be unique across shards.
  std::set<std::string_view> seen;
  for (const TensorToWrite& t : tensors) RETURN_IF_ERROR(CheckTensor(t, &seen));

  uint64_t total = 0;
  for (const TensorToWrite& t : tensors) total += t.data.size();
  const std::vector<int> shard_of = AssignShards(tensors, num_shards, total);
  Json weight_map = Json::object();
  size_t begin = 0;
  for (int shard = 0; shard < num_shards; ++shard) {
    size_t end = begin;
    while (end < tensors.size() && shard_of[end] == shard) ++end;
    const std::string file =
        absl::StrFormat("model-%05d-of-%05d.safetensors", shard + 1, num_shards);
    RETURN_IF_ERROR(
        WriteSafetensors(dir + "/" + file, tensors.subspan(begin, end - begin), metadata));
    for (size_t i = begin; i < end; ++i) weight_map[tensors[i].name] = file;
    begin = end;
  }
  const Json index = {{"metadata", {{"total_size", total}}}, {"weight_map", std::move(weight_map)}};
  const std::string text = index.dump(2, ' ', false, Json::error_handler_t::replace) + "\n";
  const absl::Span<const std::byte> piece = AsBytes(text);
  return WriteAtomically(dir + "/model.safetensors.index.json", {&piece, 1});
}

}  // namespace kvrm
