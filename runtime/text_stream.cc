#include "runtime/text_stream.h"

#include <algorithm>
#include <utility>

namespace kvrm {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD in UTF-8

bool EndsWithReplacement(const std::string& s) {
  return s.size() >= 3 && s.compare(s.size() - 3, 3, kReplacement) == 0;
}

bool IsContinuationByte(char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; }

// Dropping tokens before the prefix offset keeps tokens_ at the size of the decode window; doing it
// only every so often keeps the erase cost amortised O(1) per token.
constexpr size_t kCompactEvery = 256;
// Tokens an incomplete character may wait on before its U+FFFD is released (see DecodeNew).
constexpr size_t kMaxHeldTokens = 8;

}  // namespace

TextStream::TextStream(DecodeFn decode, std::vector<std::string> stop_sequences,
                       std::vector<int32_t> context_tokens, bool include_stops)
    : decode_(std::move(decode)), include_stops_(include_stops), tokens_(std::move(context_tokens)) {
  for (std::string& stop : stop_sequences) {
    if (!stop.empty()) stops_.push_back(std::move(stop));
  }
  read_offset_ = tokens_.size();
}

TextStream::Delta TextStream::Push(int32_t token, bool match_stops) {
  if (stopped_ || finished_) return Delta{"", stopped_, matched_stop_};
  tokens_.push_back(token);
  const size_t search_from = pending_.size();
  if (!DecodeNew(/*final=*/false)) return Delta{};
  if (prefix_offset_ >= kCompactEvery) {
    tokens_.erase(tokens_.begin(), tokens_.begin() + prefix_offset_);
    read_offset_ -= prefix_offset_;
    prefix_offset_ = 0;
  }
  if (!match_stops) {
    Delta delta;
    Emit(pending_.size(), delta);  // pending_ is empty after: nothing held for a later match
    return delta;
  }
  return Release(search_from, /*final=*/false);
}

std::string TextStream::Finish() {
  if (stopped_ || finished_) return "";
  finished_ = true;
  const size_t search_from = pending_.size();
  DecodeNew(/*final=*/true);
  return Release(search_from, /*final=*/true).text;
}

bool TextStream::DecodeNew(bool final) {
  const absl::Span<const int32_t> window = absl::MakeConstSpan(tokens_).subspan(prefix_offset_);
  const std::string prefix_text = decode_(window.subspan(0, read_offset_ - prefix_offset_));
  const std::string new_text = decode_(window);
  // Normally prefix_text is a byte prefix of new_text. It is not when the window's first tokens
  // end inside a UTF-8 character that later bytes complete (possible for the prompt context,
  // whose last tokens may split a character): their U+FFFD turns into the character. Then new
  // text starts at the first difference, moved back to a character boundary of new_text.
  size_t start = prefix_text.size();
  if (new_text.compare(0, start, prefix_text) != 0) {
    start = 0;
    while (start < prefix_text.size() && start < new_text.size() &&
           prefix_text[start] == new_text[start]) {
      ++start;
    }
    while (start > 0 && start < new_text.size() &&
           (static_cast<unsigned char>(new_text[start]) & 0xC0) == 0x80) {
      --start;
    }
  }
  // At the end an incomplete character is final: decode renders it as U+FFFD, as the full decode
  // does. So is one still incomplete after kMaxHeldTokens more tokens (a character is at most
  // 4 bytes): waiting on would re-decode an ever longer window at every token (a model, or
  // allowed_token_ids, writing lone lead bytes over and over).
  const bool held_long = tokens_.size() - read_offset_ > kMaxHeldTokens;
  if (new_text.size() <= start || (!final && !held_long && EndsWithReplacement(new_text))) {
    if (held_long) {  // nothing to send (tokens that decode to nothing): move on all the same
      prefix_offset_ = read_offset_;
      read_offset_ = tokens_.size();
    }
    return false;
  }
  pending_.append(new_text, start, std::string::npos);
  prefix_offset_ = read_offset_;
  read_offset_ = tokens_.size();
  return true;
}

TextStream::Delta TextStream::Release(size_t search_from, bool final) {
  Delta delta;
  // Matches ending at or before search_from were looked for on earlier calls, so only look at
  // occurrences that end in the new text.
  size_t best_start = std::string::npos;
  size_t best_end = std::string::npos;
  const std::string* best = nullptr;
  for (const std::string& stop : stops_) {
    const size_t from = search_from >= stop.size() ? search_from - stop.size() + 1 : 0;
    const size_t pos = pending_.find(stop, from);
    if (pos == std::string::npos) continue;
    const size_t end = pos + stop.size();
    if (best == nullptr || end < best_end || (end == best_end && pos < best_start)) {
      best_start = pos;
      best_end = end;
      best = &stop;
    }
  }
  if (best != nullptr) {
    stopped_ = true;
    matched_stop_ = *best;
    delta.stopped = true;
    delta.matched_stop = *best;
    Emit(include_stops_ ? best_end : best_start, delta);
    pending_.clear();
    return delta;
  }
  Emit(final ? pending_.size() : pending_.size() - LongestHeldSuffix(), delta);
  return delta;
}

size_t TextStream::LongestHeldSuffix() const {
  // Stop sequences are short (a few, tens of bytes), so the quadratic scan per stop is cheaper
  // than building automata for them.
  size_t held = 0;
  for (const std::string& stop : stops_) {
    for (size_t len = std::min(stop.size() - 1, pending_.size()); len > held; --len) {
      if (pending_.compare(pending_.size() - len, len, stop, 0, len) == 0) {
        held = len;
        break;
      }
    }
  }
  return held;
}

void TextStream::Emit(size_t length, Delta& delta) {
  // pending_ is whole characters and a valid UTF-8 stop starts on a character, so this only moves
  // when a stop sequence itself starts mid-character; never send half a character.
  while (length > 0 && length < pending_.size() && IsContinuationByte(pending_[length])) --length;
  delta.text.assign(pending_, 0, length);
  text_ += delta.text;
  pending_.erase(0, length);
}

}  // namespace kvrm
