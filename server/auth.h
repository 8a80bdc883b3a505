// Bearer-token authentication for the kvrm.v1.Kvrm service.
//
// Tokens come from a file (one per line; '#' starts a comment; blank lines are skipped). A call
// is let in when its `authorization` metadata is "Bearer <token>" for one of them. The check
// hashes the presented token with SHA-256 and compares the digest with every stored digest in
// constant time, without stopping at the first match, so neither the timing of a comparison nor
// which token matched reveals anything about the stored tokens (their lengths included).
#ifndef KVRM_SERVER_AUTH_H_
#define KVRM_SERVER_AUTH_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvrm {

class TokenAuthenticator {
 public:
  // INVALID_ARGUMENT when `tokens` is empty or a token is empty or holds whitespace.
  static absl::StatusOr<std::unique_ptr<TokenAuthenticator>> FromTokens(
      const std::vector<std::string>& tokens);
  // Reads the token file; errors name the path (and line for a malformed token).
  static absl::StatusOr<std::unique_ptr<TokenAuthenticator>> FromFile(const std::string& path);

  // OK when `authorization` (the metadata value) is "Bearer <one of the tokens>"; otherwise
  // UNAUTHENTICATED with a message that says what was wrong with the header, never which token
  // came close.
  absl::Status Check(absl::string_view authorization) const;

  int num_tokens() const { return static_cast<int>(digests_.size()); }

 private:
  using Digest = std::array<uint8_t, 32>;
  explicit TokenAuthenticator(std::vector<Digest> digests) : digests_(std::move(digests)) {}
  static Digest Hash(absl::string_view token);

  std::vector<Digest> digests_;
};

}  // namespace kvrm

#endif  // KVRM_SERVER_AUTH_H_
