#include "tests/http_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

namespace kvrm {
namespace {

int Connect(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

bool SendAll(int fd, const std::string& data) {
  size_t sent = 0;
  while (sent < data.size()) {
    const ssize_t n = send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) return false;
    sent += static_cast<size_t>(n);
  }
  return true;
}

std::string RequestText(int port, const std::string& method, const std::string& path,
                        const std::string& body, const HttpHeaders& headers) {
  std::string r = absl::StrCat(method, " ", path, " HTTP/1.1\r\nHost: 127.0.0.1:", port,
                               "\r\nConnection: close\r\n");
  bool content_type = false;
  for (const auto& [name, value] : headers) {
    absl::StrAppend(&r, name, ": ", value, "\r\n");
    content_type |= absl::EqualsIgnoreCase(name, "content-type");
  }
  if (!body.empty() || method == "POST") {
    if (!content_type) r += "Content-Type: application/json\r\n";
    absl::StrAppend(&r, "Content-Length: ", body.size(), "\r\n");
  }
  absl::StrAppend(&r, "\r\n", body);
  return r;
}

std::string Dechunk(const std::string& raw) {
  std::string out;
  size_t pos = 0;
  while (pos < raw.size()) {
    const size_t eol = raw.find("\r\n", pos);
    if (eol == std::string::npos) break;
    size_t size = 0;
    const std::string hex(raw.substr(pos, eol - pos));
    if (!absl::SimpleHexAtoi(std::string(absl::StripAsciiWhitespace(hex.substr(0, hex.find(';')))),
                             &size)) {
      break;
    }
    if (size == 0) break;
    out += raw.substr(eol + 2, size);
    pos = eol + 2 + size + 2;
  }
  return out;
}

}  // namespace

HttpReply HttpCall(int port, const std::string& method, const std::string& path,
                   const std::string& body, const HttpHeaders& headers) {
  HttpReply reply;
  const int fd = Connect(port);
  if (fd < 0) return reply;
  std::string raw;
  if (SendAll(fd, RequestText(port, method, path, body, headers))) {
    char buf[16384];
    for (;;) {
      const ssize_t n = recv(fd, buf, sizeof(buf), 0);
      if (n <= 0) break;
      raw.append(buf, static_cast<size_t>(n));
    }
  }
  close(fd);
  const size_t end = raw.find("\r\n\r\n");
  if (end == std::string::npos) return reply;
  std::vector<std::string> lines = absl::StrSplit(raw.substr(0, end), "\r\n");
  std::vector<std::string> status = absl::StrSplit(lines[0], ' ');
  if (status.size() < 2 || !absl::SimpleAtoi(status[1], &reply.status)) return reply;
  for (size_t i = 1; i < lines.size(); ++i) {
    const size_t colon = lines[i].find(':');
    if (colon == std::string::npos) continue;
    reply.headers[absl::AsciiStrToLower(lines[i].substr(0, colon))] =
        std::string(absl::StripAsciiWhitespace(lines[i].substr(colon + 1)));
  }
  const std::string payload = raw.substr(end + 4);
  auto te = reply.headers.find("transfer-encoding");
  reply.body = te != reply.headers.end() && absl::StrContains(te->second, "chunked")
                   ? Dechunk(payload)
                   : payload;
  return reply;
}

HttpConnection::HttpConnection(int port, const std::string& method, const std::string& path,
                               const std::string& body, const HttpHeaders& headers) {
  fd_ = Connect(port);
  if (fd_ >= 0 && !SendAll(fd_, RequestText(port, method, path, body, headers))) {
    close(fd_);
    fd_ = -1;
  }
}

HttpConnection::~HttpConnection() {
  if (fd_ >= 0) close(fd_);
}

std::string HttpConnection::Read(int timeout_ms) {
  if (fd_ < 0) return "";
  pollfd p{fd_, POLLIN, 0};
  if (poll(&p, 1, timeout_ms) <= 0) return "";
  char buf[16384];
  const ssize_t n = recv(fd_, buf, sizeof(buf), 0);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

std::vector<std::string> SseData(const std::string& body) {
  std::vector<std::string> data;
  for (absl::string_view event : absl::StrSplit(body, "\n\n", absl::SkipEmpty())) {
    // An event's data line (after an `event:` line where the stream names its events).
    for (absl::string_view line : absl::StrSplit(event, '\n')) {
      if (absl::ConsumePrefix(&line, "data: ")) data.emplace_back(line);
    }
  }
  return data;
}

}  // namespace kvrm
