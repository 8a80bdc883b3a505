// A minimal blocking HTTP/1.0 GET client for tests (scraping /metrics, probing /readyz, querying
// Prometheus' API). HTTP/1.0 with Connection: close keeps the body unchunked and delimited by
// the server closing the connection.
#ifndef KVRM_METRICS_HTTP_GET_H_
#define KVRM_METRICS_HTTP_GET_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kvrm {

struct HttpResponse {
  int code = 0;
  std::string headers;  // the header block, status line included
  std::string body;
};

// GET http://host:port<path>; `timeout` bounds connecting and each read.
absl::StatusOr<HttpResponse> HttpGet(const std::string& host, int port, const std::string& path,
                                     absl::Duration timeout = absl::Seconds(5),
                                     const std::string& method = "GET");

// Percent-encodes everything but unreserved characters (for query parameters).
std::string UrlEncode(const std::string& text);

}  // namespace kvrm

#endif  // KVRM_METRICS_HTTP_GET_H_
