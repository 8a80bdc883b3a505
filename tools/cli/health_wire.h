// grpc.health.v1 messages, encoded by hand.
//
// Debian ships no health.proto, and the two messages are one field each, so kvrm_cli calls
// /grpc.health.v1.Health/Check through grpc::GenericStub with these bytes instead of generating
// code (which could also clash with descriptors registered inside the gRPC libraries).
//   message HealthCheckRequest { string service = 1; }
//   message HealthCheckResponse { ServingStatus status = 1; }
#ifndef KVRM_TOOLS_CLI_HEALTH_WIRE_H_
#define KVRM_TOOLS_CLI_HEALTH_WIRE_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvrm::cli {

inline constexpr char kHealthCheckMethod[] = "/grpc.health.v1.Health/Check";

// HealthCheckResponse.ServingStatus.
enum class ServingStatus { kUnknown = 0, kServing = 1, kNotServing = 2, kServiceUnknown = 3 };

// The serialized HealthCheckRequest for `service` ("" asks about the whole server).
std::string EncodeHealthCheckRequest(absl::string_view service);

// Reads the status from a serialized HealthCheckResponse, skipping unknown fields as protobuf does.
// A missing status is kUnknown (proto3's default); a value outside the enum is returned as is.
// InvalidArgument when the bytes are not a well-formed message.
absl::StatusOr<int> DecodeHealthCheckResponse(absl::string_view bytes);

// "SERVING", "NOT_SERVING", "UNKNOWN", "SERVICE_UNKNOWN", or "STATUS_<n>".
std::string ServingStatusName(int status);

}  // namespace kvrm::cli

#endif  // KVRM_TOOLS_CLI_HEALTH_WIRE_H_
