#include "model/harmony.h"

#include <algorithm>
#include <optional>

namespace kvrm {
namespace {

constexpr std::string_view kFunctions = "functions.";

// A header longer than this is not one (a model writing text where a header belongs): what is
// held is given out as content.
constexpr size_t kMaxHeader = 1024;

// Where the first marker of `markers` starts in `text`, and which one; npos when none does.
std::pair<size_t, std::string_view> FindMarker(std::string_view text,
                                               std::initializer_list<std::string_view> markers) {
  std::pair<size_t, std::string_view> best{std::string_view::npos, {}};
  for (std::string_view m : markers) {
    const size_t at = text.find(m);
    if (at < best.first) best = {at, m};
  }
  return best;
}

// The length of the longest suffix of `text` that may begin a marker ("<|" and on): text held
// back until the next text says whether it is one.
size_t MarkerPrefixSuffix(std::string_view text) {
  size_t longest = 0;
  for (std::string_view m : kHarmonyMarkers) longest = std::max(longest, m.size());
  for (size_t n = std::min(text.size(), longest - 1); n > 0; --n) {
    const std::string_view tail = text.substr(text.size() - n);
    for (std::string_view m : kHarmonyMarkers) {
      if (m.size() > n && m.substr(0, n) == tail) return n;
    }
  }
  return 0;
}

// The word after `key` in `header` (up to a space, '<' or the end); nullopt when absent.
std::optional<std::string_view> WordAfter(std::string_view header, std::string_view key) {
  const size_t at = header.find(key);
  if (at == std::string_view::npos) return std::nullopt;
  std::string_view rest = header.substr(at + key.size());
  return rest.substr(0, std::min(rest.find(' '), rest.find('<')));
}

}  // namespace

std::string HarmonyText(std::initializer_list<std::string_view> parts) {
  std::string out;
  for (std::string_view p : parts) out.append(p);
  return out;
}

bool IsHarmonyTemplate(std::string_view source) {
  return source.find(kHarmonyChannel) != std::string_view::npos &&
         source.find(kHarmonyMessage) != std::string_view::npos;
}

HarmonyStream::HarmonyStream(bool tool_calls) : tool_calls_(tool_calls) {}

HarmonyStream::Split HarmonyStream::Feed(std::string_view text) {
  pending_.append(text);
  Split out;
  Run(out, /*final=*/false);
  return out;
}

HarmonyStream::Split HarmonyStream::Finish() {
  Split out;
  Run(out, /*final=*/true);
  return out;
}

void HarmonyStream::StartBody(std::string_view header, Split& out) {
  const std::optional<std::string_view> channel = WordAfter(header, kHarmonyChannel);
  const std::optional<std::string_view> recipient = WordAfter(header, "to=");
  kind_ = Kind::kContent;
  if (recipient.has_value()) {
    if (tool_calls_ && recipient->substr(0, kFunctions.size()) == kFunctions) {
      kind_ = Kind::kCall;
      ++calls_;
      out.content.append("<tool_call>\n{\"name\": \"");
      for (const char c : recipient->substr(kFunctions.size())) {  // a JSON string's
        if (c == '"' || c == '\\') out.content.push_back('\\');
        if (static_cast<unsigned char>(c) >= 0x20) out.content.push_back(c);
      }
      out.content.append("\", \"arguments\": ");
    } else {
      kind_ = Kind::kReasoning;  // built-in tools, or calls no tool was offered for
    }
  } else if (channel.has_value() && *channel == "analysis") {
    kind_ = Kind::kReasoning;
  }
  state_ = State::kBody;
  // A second body for the same side begins on a new line (its first text writes it).
  separate_ =
      kind_ != Kind::kCall && (kind_ == Kind::kReasoning ? reasoning_given_ : content_given_);
}

void HarmonyStream::Append(std::string_view text, Split& out) {
  if (text.empty()) return;
  std::string& sink = kind_ == Kind::kReasoning ? out.reasoning : out.content;
  if (separate_) sink.push_back('\n');
  separate_ = false;
  sink.append(text);
  if (kind_ == Kind::kReasoning) {
    reasoning_given_ = true;
  } else if (kind_ == Kind::kContent) {
    content_given_ = true;
  }
}

void HarmonyStream::EndBody(Split& out) {
  if (kind_ == Kind::kCall) out.content.append("}\n</tool_call>");
  state_ = State::kBetween;
}

void HarmonyStream::Run(Split& out, bool final) {
  while (true) {
    switch (state_) {
      case State::kFirst: {
        // The reply's first text: a header (the prompt wrote <|start|>assistant), or not harmony.
        if (pending_.empty()) return;
        // A header begins with <|channel|> or <|start|>, or with the recipient (gpt-oss's
        // template writes "<|start|>assistant to=functions.f<|channel|>..."): while the text is
        // a prefix of one of them it may still be.
        const std::string_view p = pending_;
        bool may_be_header = false, known = false;
        for (std::string_view begin :
             {kHarmonyChannel, kHarmonyStart, std::string_view(" to="), std::string_view("to=")}) {
          const size_t n = std::min(p.size(), begin.size());
          if (p.substr(0, n) != begin.substr(0, n)) continue;
          may_be_header = true;
          known = known || p.size() >= begin.size();
        }
        if (!may_be_header) {
          state_ = State::kPlain;
          break;
        }
        if (!known && !final) return;  // not yet known
        state_ = State::kHeader;
        break;
      }
      case State::kPlain:
        out.content.append(pending_);
        pending_.clear();
        return;
      case State::kHeader: {
        const size_t at = pending_.find(kHarmonyMessage);
        if (at == std::string::npos) {
          if (pending_.size() > kMaxHeader) {  // not a header after all
            kind_ = Kind::kContent;
            state_ = State::kPlain;
            break;
          }
          if (final) pending_.clear();  // a header with no body: nothing to give out
          return;
        }
        StartBody(std::string_view(pending_).substr(0, at), out);
        pending_.erase(0, at + kHarmonyMessage.size());
        break;
      }
      case State::kBody: {
        const auto [at, marker] = FindMarker(
            pending_, {kHarmonyEnd, kHarmonyCall, kHarmonyReturn, kHarmonyStart, kHarmonyChannel});
        if (at == std::string::npos) {
          const size_t keep = final ? 0 : MarkerPrefixSuffix(pending_);
          Append(std::string_view(pending_).substr(0, pending_.size() - keep), out);
          pending_.erase(0, pending_.size() - keep);
          if (final) EndBody(out);
          return;
        }
        Append(std::string_view(pending_).substr(0, at), out);
        EndBody(out);
        // <|start|> or <|channel|> without an end: the next message's header begins there.
        const bool header_next = marker == kHarmonyStart || marker == kHarmonyChannel;
        pending_.erase(0, header_next ? at : at + marker.size());
        if (header_next) state_ = State::kHeader;
        break;
      }
      case State::kBetween: {
        // After a body: <|start|> and the next header (anything else before it is dropped:
        // whitespace or stray markers).
        const size_t at = pending_.find(kHarmonyStart);
        const size_t channel = pending_.find(kHarmonyChannel);
        const size_t next = std::min(at, channel);
        if (next == std::string::npos) {
          const size_t keep = final ? 0 : MarkerPrefixSuffix(pending_);
          pending_.erase(0, pending_.size() - keep);
          return;
        }
        pending_.erase(0, next);
        state_ = State::kHeader;
        break;
      }
    }
  }
}

}  // namespace kvrm
