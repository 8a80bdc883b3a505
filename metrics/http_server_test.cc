#include "metrics/http_server.h"

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "gtest/gtest.h"
#include "metrics/http_get.h"

namespace kvrm {
namespace {

class HttpServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    registry_.AddCounter("kvrm:test_total", "A test counter.").WithLabels({}).Add(5);
    HttpServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    absl::StatusOr<std::unique_ptr<MetricsHttpServer>> s = MetricsHttpServer::Start(&registry_, o);
    ASSERT_TRUE(s.ok()) << s.status();
    server_ = std::move(*s);
    ASSERT_GT(server_->port(), 0);
  }
  HttpResponse Get(const std::string& path, const std::string& method = "GET") {
    absl::StatusOr<HttpResponse> r =
        HttpGet("127.0.0.1", server_->port(), path, absl::Seconds(5), method);
    EXPECT_TRUE(r.ok()) << r.status();
    return r.ok() ? *r : HttpResponse{};
  }

  MetricRegistry registry_;
  std::unique_ptr<MetricsHttpServer> server_;
};

TEST_F(HttpServerTest, ServesTheExpositionWithItsContentType) {
  HttpResponse r = Get("/metrics");
  EXPECT_EQ(r.code, 200);
  EXPECT_EQ(r.body, registry_.Render());
  EXPECT_TRUE(absl::StrContains(r.body, "kvrm:test_total 5\n"));
  EXPECT_TRUE(absl::StrContains(r.headers, "text/plain; version=0.0.4")) << r.headers;
  // A later scrape sees later values.
  registry_.AddGauge("kvrm:late", "Registered after start.").WithLabels({}).Set(2);
  EXPECT_TRUE(absl::StrContains(Get("/metrics").body, "kvrm:late 2\n"));
}

TEST_F(HttpServerTest, HealthIsAlwaysOkAndReadinessFollowsSetReady) {
  EXPECT_EQ(Get("/healthz").code, 200);
  EXPECT_EQ(Get("/readyz").code, 503);  // not ready until told
  server_->SetReady(true);
  EXPECT_EQ(Get("/readyz").code, 200);
  server_->SetReady(false);  // draining
  EXPECT_EQ(Get("/readyz").code, 503);
  EXPECT_EQ(Get("/healthz").code, 200);
}

TEST_F(HttpServerTest, UnknownPathsAndMethods) {
  EXPECT_EQ(Get("/").code, 404);
  EXPECT_EQ(Get("/metrics/extra").code, 404);
  HttpResponse post = Get("/metrics", "POST");
  EXPECT_EQ(post.code, 405);
  EXPECT_TRUE(absl::StrContains(post.headers, "Allow: GET, HEAD")) << post.headers;
  HttpResponse head = Get("/metrics", "HEAD");
  EXPECT_EQ(head.code, 200);
  EXPECT_TRUE(head.body.empty());
}

TEST_F(HttpServerTest, ManySequentialScrapes) {
  for (int i = 0; i < 200; ++i) ASSERT_EQ(Get("/metrics").code, 200) << i;
}

TEST(HttpServerStartTest, BusyPortAndBadHostFail) {
  MetricRegistry registry;
  HttpServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  auto first = MetricsHttpServer::Start(&registry, o);
  ASSERT_TRUE(first.ok());
  o.port = (*first)->port();
  auto second = MetricsHttpServer::Start(&registry, o);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  o.host = "not a host name";
  o.port = 0;
  EXPECT_FALSE(MetricsHttpServer::Start(&registry, o).ok());
  o.host = "127.0.0.1";
  o.port = 70000;
  EXPECT_EQ(MetricsHttpServer::Start(&registry, o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace kvrm
