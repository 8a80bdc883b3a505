#include "model/gguf_writer.h"

#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"

namespace kvrm {
namespace {

constexpr uint64_t kAlignment = 32;

template <typename T>
void Put(std::string* out, T v) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &v, sizeof(T));
  out->append(bytes, sizeof(T));
}

void PutString(std::string* out, absl::string_view s) {
  Put<uint64_t>(out, s.size());
  out->append(s.data(), s.size());
}

uint64_t Pad(uint64_t n) { return (n + kAlignment - 1) / kAlignment * kAlignment; }

}  // namespace

void GgufWriter::Key(absl::string_view key, uint32_t type) {
  PutString(&metadata_, key);
  Put<uint32_t>(&metadata_, type);
  ++entries_;
}

void GgufWriter::AddString(absl::string_view key, absl::string_view value) {
  Key(key, static_cast<uint32_t>(GgufValueType::kString));
  PutString(&metadata_, value);
}

void GgufWriter::AddUint32(absl::string_view key, uint32_t value) {
  Key(key, static_cast<uint32_t>(GgufValueType::kUint32));
  Put(&metadata_, value);
}

void GgufWriter::AddFloat32(absl::string_view key, float value) {
  Key(key, static_cast<uint32_t>(GgufValueType::kFloat32));
  Put(&metadata_, value);
}

void GgufWriter::AddBool(absl::string_view key, bool value) {
  Key(key, static_cast<uint32_t>(GgufValueType::kBool));
  Put<uint8_t>(&metadata_, value ? 1 : 0);
}

void GgufWriter::AddStringArray(absl::string_view key, absl::Span<const std::string> values) {
  Key(key, static_cast<uint32_t>(GgufValueType::kArray));
  Put<uint32_t>(&metadata_, static_cast<uint32_t>(GgufValueType::kString));
  Put<uint64_t>(&metadata_, values.size());
  for (const std::string& v : values) PutString(&metadata_, v);
}

void GgufWriter::AddInt32Array(absl::string_view key, absl::Span<const int32_t> values) {
  Key(key, static_cast<uint32_t>(GgufValueType::kArray));
  Put<uint32_t>(&metadata_, static_cast<uint32_t>(GgufValueType::kInt32));
  Put<uint64_t>(&metadata_, values.size());
  for (int32_t v : values) Put(&metadata_, v);
}

void GgufWriter::AddFloat32Array(absl::string_view key, absl::Span<const float> values) {
  Key(key, static_cast<uint32_t>(GgufValueType::kArray));
  Put<uint32_t>(&metadata_, static_cast<uint32_t>(GgufValueType::kFloat32));
  Put<uint64_t>(&metadata_, values.size());
  for (float v : values) Put(&metadata_, v);
}

void GgufWriter::AddRaw(absl::string_view key, uint32_t type, absl::string_view value_bytes) {
  Key(key, type);
  metadata_.append(value_bytes.data(), value_bytes.size());
}

void GgufWriter::AddTensor(absl::string_view name, GgmlType type, std::vector<int64_t> ne,
                           std::vector<std::byte> data) {
  tensors_.push_back(Tensor{std::string(name), type, std::move(ne), std::move(data)});
}

std::string GgufWriter::Header() const {
  std::string out;
  out.append("GGUF", 4);
  Put<uint32_t>(&out, 3);
  Put<uint64_t>(&out, tensors_.size());
  Put<uint64_t>(&out, entries_);
  out.append(metadata_);
  uint64_t offset = 0;
  for (const Tensor& t : tensors_) {
    PutString(&out, t.name);
    Put<uint32_t>(&out, static_cast<uint32_t>(t.ne.size()));
    for (int64_t n : t.ne) Put<int64_t>(&out, n);
    Put<uint32_t>(&out, static_cast<uint32_t>(t.type));
    Put<uint64_t>(&out, offset);
    offset += Pad(t.data.size());
  }
  out.resize(Pad(out.size()), '\0');
  return out;
}

std::string GgufWriter::Serialize() const {
  std::string out = Header();
  for (const Tensor& t : tensors_) {
    out.append(reinterpret_cast<const char*>(t.data.data()), t.data.size());
    out.resize(Pad(out.size()), '\0');
  }
  return out;
}

absl::Status GgufWriter::WriteFile(const std::string& path) const {
  std::ofstream file(path, std::ios::binary | std::ios::trunc);
  const std::string header = Header();
  file.write(header.data(), static_cast<std::streamsize>(header.size()));
  const char zeros[kAlignment] = {};
  for (const Tensor& t : tensors_) {
    file.write(reinterpret_cast<const char*>(t.data.data()),
               static_cast<std::streamsize>(t.data.size()));
    file.write(zeros, static_cast<std::streamsize>(Pad(t.data.size()) - t.data.size()));
  }
  file.close();
  if (!file) return absl::InternalError(absl::StrCat(path, ": write failed"));
  return absl::OkStatus();
}

}  // namespace kvrm
