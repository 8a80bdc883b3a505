#include "model/chat_config.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace kvrm {
namespace {

namespace fs = std::filesystem;

// A fresh model directory holding the given files.
std::string ModelDir(const std::string& name,
                     const std::vector<std::pair<std::string, std::string>>& files) {
  const char* base = std::getenv("TEST_TMPDIR");
  const fs::path dir = fs::path(base != nullptr ? base : "/tmp") / ("chat_config_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& [file, text] : files) std::ofstream(dir / file) << text;
  return dir.string();
}

ChatTemplateInputs Turns() {
  ChatTemplateInputs in;
  in.messages = {{"user", "Hi"}};
  return in;
}

TEST(ChatConfigTest, ReadsTheTemplateAndTokenStringsOfTokenizerConfig) {
  const std::string dir = ModelDir(
      "string", {{"tokenizer_config.json",
                  R"({"bos_token": "<s>", "eos_token": {"content": "</s>", "lstrip": false},
                      "chat_template": "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{{ eos_token }}{% endfor %}"})"}});
  absl::StatusOr<ChatConfig> c = LoadChatConfig(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->status.ok());
  EXPECT_EQ(c->bos_token, "<s>");
  EXPECT_EQ(c->eos_token, "</s>");
  EXPECT_EQ(c->source, "tokenizer_config.json");
  absl::StatusOr<std::string> text = c->Render(Turns());
  ASSERT_TRUE(text.ok()) << text.status();
  EXPECT_EQ(*text, "<s>[user]Hi</s>");
}

TEST(ChatConfigTest, AListOfNamedTemplatesUsesTheDefaultOne) {
  const std::string dir = ModelDir(
      "list", {{"tokenizer_config.json",
                R"({"chat_template": [{"name": "tool_use", "template": "TOOLS"},
                                      {"name": "default", "template": "DEFAULT {{ messages | length }}"}]})"}});
  absl::StatusOr<ChatConfig> c = LoadChatConfig(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(*c->Render(Turns()), "DEFAULT 1");
}

TEST(ChatConfigTest, ChatTemplateJinjaWinsOverTokenizerConfig) {
  const std::string dir =
      ModelDir("jinja", {{"tokenizer_config.json", R"({"chat_template": "OLD"})"},
                         {"chat_template.jinja", "NEW {{ messages[0]['content'] }}"}});
  absl::StatusOr<ChatConfig> c = LoadChatConfig(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->source, "chat_template.jinja");
  EXPECT_EQ(*c->Render(Turns()), "NEW Hi");
}

TEST(ChatConfigTest, NoTemplateOrABrokenOneLoadsButRefusesChat) {
  absl::StatusOr<ChatConfig> none = LoadChatConfig(ModelDir("none", {}));
  ASSERT_TRUE(none.ok()) << none.status();
  EXPECT_EQ(none->chat_template, nullptr);
  absl::StatusOr<std::string> r = none->Render(Turns());
  EXPECT_TRUE(absl::IsInvalidArgument(r.status()));
  EXPECT_EQ(r.status().message(), "chat: the model has no chat template");

  absl::StatusOr<ChatConfig> broken = LoadChatConfig(
      ModelDir("broken", {{"tokenizer_config.json", R"({"chat_template": "{% for m in messages %}"})"}}));
  ASSERT_TRUE(broken.ok()) << broken.status();
  EXPECT_EQ(broken->chat_template, nullptr);
  r = broken->Render(Turns());
  EXPECT_TRUE(absl::IsInvalidArgument(r.status()));
  EXPECT_TRUE(absl::StartsWith(r.status().message(),
                               "chat: the model's chat template (tokenizer_config.json) is not "
                               "usable: "))
      << r.status();
}

TEST(ChatConfigTest, MalformedTokenizerConfigIsAnErrorNamingTheFileAndKey) {
  absl::StatusOr<ChatConfig> c =
      LoadChatConfig(ModelDir("malformed", {{"tokenizer_config.json", "{\"chat_template\": "}}));
  EXPECT_FALSE(c.ok());
  EXPECT_TRUE(absl::StrContains(c.status().message(), "tokenizer_config.json")) << c.status();
  c = LoadChatConfig(ModelDir("wrong_type", {{"tokenizer_config.json", R"({"chat_template": 7})"}}));
  EXPECT_FALSE(c.ok());
  EXPECT_TRUE(absl::StrContains(c.status().message(), "tokenizer_config.json: chat_template"))
      << c.status();
  c = LoadChatConfig(ModelDir("wrong_bos", {{"tokenizer_config.json", R"({"bos_token": [1]})"}}));
  EXPECT_FALSE(c.ok());
  EXPECT_TRUE(absl::StrContains(c.status().message(), "tokenizer_config.json: bos_token"))
      << c.status();
}

TEST(ChatConfigTest, TheTemplatesErrorComesBackAsInvalidArgument) {
  absl::StatusOr<ChatConfig> c = LoadChatConfig(ModelDir(
      "raise", {{"tokenizer_config.json",
                 R"({"chat_template": "{% if messages[0]['role'] != 'system' %}{{ raise_exception('first turn must be system') }}{% endif %}ok"})"}}));
  ASSERT_TRUE(c.ok()) << c.status();
  absl::StatusOr<std::string> r = c->Render(Turns());
  EXPECT_TRUE(absl::IsInvalidArgument(r.status()));
  EXPECT_EQ(r.status().message(), "chat: first turn must be system");
}

TEST(ChatConfigTest, OverrideReplacesTheTemplateAndRefusesABadFile) {
  const std::string dir = ModelDir("override", {{"tokenizer_config.json", R"({"bos_token": "<s>"})"},
                                                {"mine.jinja", "{{ bos_token }}MINE"},
                                                {"bad.jinja", "{{ unclosed"}});
  absl::StatusOr<ChatConfig> c = LoadChatConfig(dir);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->chat_template, nullptr);
  absl::Status st = OverrideChatTemplate(dir + "/missing.jinja", &*c);
  EXPECT_TRUE(absl::StartsWith(st.message(), "--chat_template=" + dir + "/missing.jinja: ")) << st;
  st = OverrideChatTemplate(dir + "/bad.jinja", &*c);
  EXPECT_TRUE(absl::StartsWith(st.message(), "--chat_template=" + dir + "/bad.jinja: ")) << st;
  EXPECT_EQ(c->chat_template, nullptr);
  ASSERT_TRUE(OverrideChatTemplate(dir + "/mine.jinja", &*c).ok());
  EXPECT_EQ(*c->Render(Turns()), "<s>MINE");
}

}  // namespace
}  // namespace kvrm
