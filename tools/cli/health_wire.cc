#include "tools/cli/health_wire.h"

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace kvrm::cli {
namespace {

// Protobuf wire types.
constexpr int kVarint = 0;
constexpr int kFixed64 = 1;
constexpr int kLengthDelimited = 2;
constexpr int kFixed32 = 5;

void AppendVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

// Consumes a varint from the front of `bytes`; false when truncated or longer than 10 bytes.
bool ReadVarint(absl::string_view* bytes, uint64_t* value) {
  *value = 0;
  for (int shift = 0; shift < 64 && !bytes->empty(); shift += 7) {
    const uint8_t byte = static_cast<uint8_t>(bytes->front());
    bytes->remove_prefix(1);
    *value |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) return true;
  }
  return false;
}

bool Skip(absl::string_view* bytes, size_t n) {
  if (bytes->size() < n) return false;
  bytes->remove_prefix(n);
  return true;
}

}  // namespace

std::string EncodeHealthCheckRequest(absl::string_view service) {
  std::string out;
  if (service.empty()) return out;  // proto3 omits default values
  out.push_back(static_cast<char>((1 << 3) | kLengthDelimited));
  AppendVarint(service.size(), &out);
  out.append(service.data(), service.size());
  return out;
}

absl::StatusOr<int> DecodeHealthCheckResponse(absl::string_view bytes) {
  const absl::Status malformed =
      absl::InvalidArgumentError("malformed grpc.health.v1.HealthCheckResponse");
  int status = 0;
  while (!bytes.empty()) {
    uint64_t tag = 0;
    if (!ReadVarint(&bytes, &tag) || (tag >> 3) == 0) return malformed;
    const int wire_type = static_cast<int>(tag & 7);
    uint64_t value = 0;
    bool ok = false;
    switch (wire_type) {
      case kVarint:
        ok = ReadVarint(&bytes, &value);
        // Enums are int32 on the wire, sign-extended to 64 bits; keep the low 32 (last wins).
        if (ok && (tag >> 3) == 1) status = static_cast<int32_t>(static_cast<uint32_t>(value));
        break;
      case kFixed64:
        ok = Skip(&bytes, 8);
        break;
      case kLengthDelimited:
        ok = ReadVarint(&bytes, &value) && Skip(&bytes, value);
        break;
      case kFixed32:
        ok = Skip(&bytes, 4);
        break;
      default:  // groups (3, 4) are not valid in proto3; 6 and 7 do not exist
        ok = false;
    }
    if (!ok) return malformed;
  }
  return status;
}

std::string ServingStatusName(int status) {
  switch (static_cast<ServingStatus>(status)) {
    case ServingStatus::kUnknown:
      return "UNKNOWN";
    case ServingStatus::kServing:
      return "SERVING";
    case ServingStatus::kNotServing:
      return "NOT_SERVING";
    case ServingStatus::kServiceUnknown:
      return "SERVICE_UNKNOWN";
  }
  return absl::StrCat("STATUS_", status);
}

}  // namespace kvrm::cli
