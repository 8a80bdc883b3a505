#include "server/auth.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include "gtest/gtest.h"

namespace kvrm {
namespace {

std::string WriteTemp(const std::string& name, const std::string& text) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(tmp ? tmp : "/tmp") + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(TokenAuthenticatorTest, AcceptsEveryListedTokenAndNothingElse) {
  auto auth = TokenAuthenticator::FromTokens({"alpha-123", "beta", "a-much-longer-token-xyz"});
  ASSERT_TRUE(auth.ok()) << auth.status();
  EXPECT_TRUE((*auth)->Check("Bearer alpha-123").ok());
  EXPECT_TRUE((*auth)->Check("Bearer beta").ok());
  EXPECT_TRUE((*auth)->Check("Bearer a-much-longer-token-xyz").ok());
  // Prefixes, extensions, case changes and the wrong scheme are all refused.
  for (const char* bad : {"Bearer alpha-12", "Bearer alpha-1234", "Bearer BETA", "Bearer ",
                          "bearer beta", "Basic beta", "beta", "Bearer  beta", ""}) {
    absl::Status s = (*auth)->Check(bad);
    EXPECT_TRUE(absl::IsUnauthenticated(s)) << "'" << bad << "': " << s;
  }
}

TEST(TokenAuthenticatorTest, MessagesSayWhatIsWrongWithoutEchoingTokens) {
  auto auth = TokenAuthenticator::FromTokens({"secret-token"});
  ASSERT_TRUE(auth.ok());
  EXPECT_NE((*auth)->Check("").message().find("missing"), absl::string_view::npos);
  EXPECT_NE((*auth)->Check("Basic x").message().find("Bearer"), absl::string_view::npos);
  const absl::Status wrong = (*auth)->Check("Bearer secret-tokeN");
  EXPECT_EQ(wrong.message(), "invalid bearer token");
}

TEST(TokenAuthenticatorTest, FileSkipsCommentsAndBlankLines) {
  const std::string path =
      WriteTemp("tokens.txt", "# ops tokens\n\n  tok-one  \n#tok-commented\ntok-two\r\n\n");
  auto auth = TokenAuthenticator::FromFile(path);
  ASSERT_TRUE(auth.ok()) << auth.status();
  EXPECT_EQ((*auth)->num_tokens(), 2);
  EXPECT_TRUE((*auth)->Check("Bearer tok-one").ok());
  EXPECT_TRUE((*auth)->Check("Bearer tok-two").ok());
  EXPECT_FALSE((*auth)->Check("Bearer tok-commented").ok());
  EXPECT_FALSE((*auth)->Check("Bearer # ops tokens").ok());
}

TEST(TokenAuthenticatorTest, BadFilesAreRefusedNamingThePath) {
  auto missing = TokenAuthenticator::FromFile("/nonexistent/tokens.txt");
  EXPECT_FALSE(missing.ok());
  const std::string only_comments = WriteTemp("comments.txt", "# nothing\n\n");
  auto empty = TokenAuthenticator::FromFile(only_comments);
  ASSERT_FALSE(empty.ok());
  EXPECT_NE(empty.status().message().find(only_comments), absl::string_view::npos);
  const std::string spaced = WriteTemp("spaced.txt", "good\nhas space\n");
  auto bad = TokenAuthenticator::FromFile(spaced);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find(spaced + ":2"), absl::string_view::npos);
  EXPECT_EQ(bad.status().message().find("has space"), absl::string_view::npos);
  EXPECT_FALSE(TokenAuthenticator::FromTokens({}).ok());
  EXPECT_FALSE(TokenAuthenticator::FromTokens({""}).ok());
}

}  // namespace
}  // namespace kvrm
