// A small blocking HTTP/1.1 client for tests of kvrmd's HTTP endpoints: one request per
// connection (Connection: close), chunked replies decoded, and a raw stream for tests that read
// part of a reply and hang up.
#ifndef KVRM_TESTS_HTTP_CLIENT_H_
#define KVRM_TESTS_HTTP_CLIENT_H_

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace kvrm {

struct HttpReply {
  int status = 0;  // 0: no reply (connection refused or closed early)
  std::map<std::string, std::string> headers;  // names lower-cased
  std::string body;  // de-chunked
};

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

HttpReply HttpCall(int port, const std::string& method, const std::string& path,
                   const std::string& body = "", const HttpHeaders& headers = {});

// A connection with a request sent; Read() returns what arrived since (raw, chunk framing
// included), blocking up to `timeout_ms` for at least one byte; "" on EOF or timeout.
class HttpConnection {
 public:
  HttpConnection(int port, const std::string& method, const std::string& path,
                 const std::string& body, const HttpHeaders& headers = {});
  ~HttpConnection();  // closes the socket: the client hangs up
  HttpConnection(const HttpConnection&) = delete;
  HttpConnection& operator=(const HttpConnection&) = delete;

  bool connected() const { return fd_ >= 0; }
  std::string Read(int timeout_ms);

 private:
  int fd_ = -1;
};

// The `data:` payloads of a server-sent-event stream, in order.
std::vector<std::string> SseData(const std::string& body);

}  // namespace kvrm

#endif  // KVRM_TESTS_HTTP_CLIENT_H_
