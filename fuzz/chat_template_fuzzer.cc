// Fuzzes the chat-template renderer (model/chat_template): templates come with model directories
// and messages from clients, both untrusted. The input is a template, then after a NUL byte the
// messages: role and content separated by \x01, messages by \x02 (an empty tail: one user
// message). Parse, and when it parses Render with add_generation_prompt from the tail's first
// byte. Invariants: errors are INVALID_ARGUMENT (never a crash, a hang or another code); the
// output stays within the renderer's bound.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_split.h"
#include "fuzz/fuzz_util.h"
#include "model/chat_template.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  const size_t nul = input.find('\0');
  const std::string_view source = input.substr(0, nul);
  const std::string_view tail = nul == std::string_view::npos ? "" : input.substr(nul + 1);
  absl::StatusOr<kvrm::ChatTemplate> t = kvrm::ChatTemplate::Parse(source);
  if (!t.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(t.status()));
    return 0;
  }
  kvrm::ChatTemplateInputs inputs;
  inputs.bos_token = "<s>";
  inputs.eos_token = "</s>";
  inputs.now = absl::FromUnixSeconds(1764633600);
  inputs.add_generation_prompt = tail.empty() || (tail[0] & 1);
  const absl::string_view rest =
      tail.empty() ? absl::string_view() : absl::string_view(tail.data() + 1, tail.size() - 1);
  for (absl::string_view m : absl::StrSplit(rest, '\x02')) {
    const size_t sep = m.find('\x01');
    if (sep == absl::string_view::npos) {
      inputs.messages.push_back({"user", std::string(m)});
    } else {
      inputs.messages.push_back({std::string(m.substr(0, sep)), std::string(m.substr(sep + 1))});
    }
  }
  absl::StatusOr<std::string> out = t->Render(inputs);
  if (!out.ok()) {
    FUZZ_CHECK(absl::IsInvalidArgument(out.status()));
    return 0;
  }
  FUZZ_CHECK(out->size() <= (8u << 20));
  return 0;
}
