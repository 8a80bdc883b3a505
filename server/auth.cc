#include "server/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/json.h"
#include "common/status_macros.h"

namespace kvrm {
namespace {

constexpr absl::string_view kBearer = "Bearer ";

bool HasWhitespace(absl::string_view s) {
  for (char c : s) {
    if (absl::ascii_isspace(static_cast<unsigned char>(c))) return true;
  }
  return false;
}

}  // namespace

TokenAuthenticator::Digest TokenAuthenticator::Hash(absl::string_view token) {
  Digest d{};
  unsigned int len = 0;
  // EVP_Digest with SHA-256 cannot fail for in-memory input short of allocation failure; the
  // digest then stays all zeros, which matches no stored token (they are hashed the same way
  // at start-up, where a failure would have to repeat identically to collide).
  EVP_Digest(token.data(), token.size(), d.data(), &len, EVP_sha256(), nullptr);
  return d;
}

absl::StatusOr<std::unique_ptr<TokenAuthenticator>> TokenAuthenticator::FromTokens(
    const std::vector<std::string>& tokens) {
  if (tokens.empty()) return absl::InvalidArgumentError("no tokens");
  std::vector<Digest> digests;
  digests.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i].empty() || HasWhitespace(tokens[i])) {
      return absl::InvalidArgumentError(
          absl::StrCat("token ", i + 1, " is empty or contains whitespace"));
    }
    digests.push_back(Hash(tokens[i]));
  }
  return std::unique_ptr<TokenAuthenticator>(new TokenAuthenticator(std::move(digests)));
}

absl::StatusOr<std::unique_ptr<TokenAuthenticator>> TokenAuthenticator::FromFile(
    const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  std::vector<std::string> tokens;
  int line_no = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_no;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || absl::StartsWith(line, "#")) continue;
    if (HasWhitespace(line)) {
      // Never echo the line: it may be a secret with a typo in it.
      return absl::InvalidArgumentError(
          absl::StrCat(path, ":", line_no, ": a token may not contain whitespace"));
    }
    tokens.emplace_back(line);
  }
  if (tokens.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": no tokens (only comments/blanks)"));
  }
  return FromTokens(tokens);
}

absl::Status TokenAuthenticator::Check(absl::string_view authorization) const {
  if (authorization.empty()) {
    return absl::UnauthenticatedError("missing 'authorization: Bearer <token>' metadata");
  }
  if (!absl::StartsWith(authorization, kBearer)) {
    return absl::UnauthenticatedError("authorization metadata is not 'Bearer <token>'");
  }
  const Digest presented = Hash(authorization.substr(kBearer.size()));
  // Every stored digest is compared in full; matches are OR-ed, never branched on per token.
  int matched = 0;
  for (const Digest& d : digests_) {
    matched |= CRYPTO_memcmp(presented.data(), d.data(), d.size()) == 0;
  }
  if (!matched) return absl::UnauthenticatedError("invalid bearer token");
  return absl::OkStatus();
}

}  // namespace kvrm
