#include "model/reasoning.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "model/harmony.h"

namespace kvrm {
namespace {

bool IsSpace(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

// The length of the longest suffix of `text` that is a proper prefix of `marker`: text that may
// begin the marker once more arrives.
size_t PartialMarkerSuffix(std::string_view text, std::string_view marker) {
  for (size_t n = std::min(text.size(), marker.size() - 1); n > 0; --n) {
    if (text.substr(text.size() - n) == marker.substr(0, n)) return n;
  }
  return 0;
}

}  // namespace

absl::StatusOr<ReasoningFormat> ReasoningFormatFromName(std::string_view name) {
  if (name == "none") return ReasoningFormat::kNone;
  if (name == "think" || name == "deepseek_r1" || name == "qwen3") return ReasoningFormat::kThink;
  if (name == "harmony" || name == "openai_gptoss") return ReasoningFormat::kHarmony;
  return absl::InvalidArgumentError(
      absl::StrCat("reasoning parser \"", std::string(name),
                   "\": expected none, think, deepseek_r1, qwen3, harmony or openai_gptoss"));
}

std::string_view ReasoningFormatName(ReasoningFormat format) {
  return format == ReasoningFormat::kThink     ? "think"
         : format == ReasoningFormat::kHarmony ? "harmony"
                                               : "none";
}

ReasoningFormat DetectReasoningFormat(std::string_view template_source) {
  if (IsHarmonyTemplate(template_source)) return ReasoningFormat::kHarmony;
  return template_source.find(kThinkEnd) != std::string_view::npos ? ReasoningFormat::kThink
                                                                   : ReasoningFormat::kNone;
}

bool PromptOpensReasoning(std::string_view prompt_tail) {
  const size_t start = prompt_tail.rfind(kThinkStart);
  if (start == std::string_view::npos) return false;
  const size_t end = prompt_tail.rfind(kThinkEnd);
  return end == std::string_view::npos || end < start;
}

ReasoningStream::ReasoningStream(bool starts_inside)
    : state_(starts_inside ? State::kReasoning : State::kStart) {}

ReasoningStream::Split ReasoningStream::Feed(std::string_view text) {
  pending_.append(text);
  Split out;
  switch (state_) {
    case State::kStart:
      FeedStart(out);
      break;
    case State::kReasoning:
      FeedReasoning(out);
      break;
    case State::kContent:
      FeedContent(out);
      break;
  }
  return out;
}

void ReasoningStream::FeedStart(Split& out) {
  const size_t first =
      std::find_if_not(pending_.begin(), pending_.end(), IsSpace) - pending_.begin();
  if (first == pending_.size()) return;  // whitespace so far: the reply has not begun
  const std::string_view rest = std::string_view(pending_).substr(first);
  if (rest.substr(0, kThinkStart.size()) == kThinkStart) {
    pending_.erase(0, first + kThinkStart.size());
    state_ = State::kReasoning;
    FeedReasoning(out);
    return;
  }
  if (rest.size() < kThinkStart.size() && kThinkStart.substr(0, rest.size()) == rest) return;
  // No thinking: the reply is all answer, as written.
  state_ = State::kContent;
  content_begun_ = true;
  FeedContent(out);
}

void ReasoningStream::EmitThinking(std::string_view text, bool last, Split& out) {
  // Newlines next to the markers are not part of the thinking: leading ones are dropped, and
  // trailing ones held until text follows them, or dropped at the end of the block.
  if (!reasoning_begun_) {
    const size_t first = text.find_first_not_of('\n');
    text = first == std::string_view::npos ? std::string_view() : text.substr(first);
  }
  if (text.empty()) return;
  const size_t keep = text.find_last_not_of('\n') + 1;  // npos + 1 == 0: all newlines
  if (keep > 0) {
    out.reasoning += newlines_;
    out.reasoning.append(text.substr(0, keep));
    newlines_.clear();
    reasoning_begun_ = true;
  }
  if (!last) newlines_.append(text.substr(keep));
}

void ReasoningStream::FeedReasoning(Split& out) {
  const size_t end = pending_.find(kThinkEnd);
  if (end == std::string::npos) {
    const size_t held = PartialMarkerSuffix(pending_, kThinkEnd);
    EmitThinking(std::string_view(pending_).substr(0, pending_.size() - held), /*last=*/false, out);
    pending_.erase(0, pending_.size() - held);
    return;
  }
  EmitThinking(std::string_view(pending_).substr(0, end), /*last=*/true, out);
  pending_.erase(0, end + kThinkEnd.size());
  newlines_.clear();
  state_ = State::kContent;
  FeedContent(out);
}

void ReasoningStream::FeedContent(Split& out) {
  if (!content_begun_) {
    const size_t first = pending_.find_first_not_of('\n');
    if (first == std::string::npos) {
      pending_.clear();
      return;
    }
    pending_.erase(0, first);
    content_begun_ = true;
  }
  out.content += pending_;
  pending_.clear();
}

ReasoningStream::Split ReasoningStream::Finish() {
  Split out;
  switch (state_) {
    case State::kStart:
      out.content = std::move(pending_);  // whitespace, or the beginning of "<think>"
      break;
    case State::kReasoning:
      EmitThinking(pending_, /*last=*/true, out);  // a marker cut off at the end is thinking
      break;
    case State::kContent:
      break;
  }
  pending_.clear();
  newlines_.clear();
  return out;
}

}  // namespace kvrm
