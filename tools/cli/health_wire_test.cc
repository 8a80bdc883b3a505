#include "tools/cli/health_wire.h"

#include <memory>
#include <random>
#include <string>

#include "google/protobuf/descriptor.h"
#include "google/protobuf/descriptor.pb.h"
#include "google/protobuf/dynamic_message.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"

namespace kvrm::cli {
namespace {

// grpc.health.v1's messages built at run time (Debian ships no health.proto), plus an extra field
// of every wire type in the response so that skipping unknown fields is exercised. The package is
// renamed so nothing can clash with descriptors inside the gRPC libraries.
constexpr char kHealthProto[] = R"pb(
  name: "health_test.proto"
  package: "kvrm.test.health"
  syntax: "proto3"
  message_type {
    name: "HealthCheckRequest"
    field { name: "service" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL }
  }
  message_type {
    name: "HealthCheckResponse"
    field { name: "status" number: 1 type: TYPE_INT32 label: LABEL_OPTIONAL }
    field { name: "f64" number: 2 type: TYPE_FIXED64 label: LABEL_OPTIONAL }
    field { name: "str" number: 3 type: TYPE_STRING label: LABEL_OPTIONAL }
    field { name: "f32" number: 4 type: TYPE_FIXED32 label: LABEL_OPTIONAL }
    field { name: "big" number: 1000 type: TYPE_UINT64 label: LABEL_OPTIONAL }
  }
)pb";

class HealthWireTest : public ::testing::Test {
 protected:
  void SetUp() override {
    google::protobuf::FileDescriptorProto file;
    ASSERT_TRUE(google::protobuf::TextFormat::ParseFromString(kHealthProto, &file));
    ASSERT_NE(pool_.BuildFile(file), nullptr);
  }

  std::unique_ptr<google::protobuf::Message> New(const char* name) {
    const google::protobuf::Descriptor* descriptor =
        pool_.FindMessageTypeByName(std::string("kvrm.test.health.") + name);
    return std::unique_ptr<google::protobuf::Message>(factory_.GetPrototype(descriptor)->New());
  }

  google::protobuf::DescriptorPool pool_;
  google::protobuf::DynamicMessageFactory factory_;
};

TEST_F(HealthWireTest, RequestMatchesProtobufEncoding) {
  std::mt19937 rng(7);
  for (size_t length : {0, 1, 12, 127, 128, 300, 20000}) {
    std::string service(length, '\0');
    for (char& c : service) c = static_cast<char>('a' + rng() % 26);
    auto message = New("HealthCheckRequest");
    message->GetReflection()->SetString(
        message.get(), message->GetDescriptor()->FindFieldByName("service"), service);
    EXPECT_EQ(EncodeHealthCheckRequest(service), message->SerializeAsString()) << length;
  }
}

TEST_F(HealthWireTest, DecodesProtobufEncodedResponsesPastUnknownFields) {
  std::mt19937_64 rng(11);
  for (int status : {0, 1, 2, 3, 77, -1}) {
    auto message = New("HealthCheckResponse");
    const google::protobuf::Reflection* r = message->GetReflection();
    const google::protobuf::Descriptor* d = message->GetDescriptor();
    r->SetUInt64(message.get(), d->FindFieldByName("f64"), rng());
    r->SetString(message.get(), d->FindFieldByName("str"), std::string(200, 'x'));
    r->SetUInt32(message.get(), d->FindFieldByName("f32"), static_cast<uint32_t>(rng()));
    r->SetUInt64(message.get(), d->FindFieldByName("big"), rng());
    r->SetInt32(message.get(), d->FindFieldByName("status"), status);
    absl::StatusOr<int> decoded = DecodeHealthCheckResponse(message->SerializeAsString());
    ASSERT_TRUE(decoded.ok()) << decoded.status();
    EXPECT_EQ(*decoded, status);
  }
}

TEST_F(HealthWireTest, EmptyResponseIsUnknown) {
  EXPECT_EQ(*DecodeHealthCheckResponse(""), 0);
  EXPECT_EQ(ServingStatusName(0), "UNKNOWN");
}

TEST(HealthWireMalformedTest, RejectsTruncatedAndInvalidBytes) {
  for (const std::string& bad : {
           std::string("\x08", 1),                  // tag without its varint
           std::string("\x08\x80", 2),              // truncated varint
           std::string("\x1a\x05\x61\x62\x63", 5),  // length past the end
           std::string("\x11\x01\x02", 3),          // fixed64 cut short
           std::string("\x0b", 1),                  // start-group wire type
           std::string("\x00\x01", 2),              // field number 0
           std::string(11, '\xff'),                 // varint longer than 10 bytes
       }) {
    EXPECT_FALSE(DecodeHealthCheckResponse(bad).ok());
  }
}

TEST(ServingStatusNameTest, NamesEveryValue) {
  EXPECT_EQ(ServingStatusName(1), "SERVING");
  EXPECT_EQ(ServingStatusName(2), "NOT_SERVING");
  EXPECT_EQ(ServingStatusName(3), "SERVICE_UNKNOWN");
  EXPECT_EQ(ServingStatusName(9), "STATUS_9");
}

}  // namespace
}  // namespace kvrm::cli
