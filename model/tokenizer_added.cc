#include "model/tokenizer_added.h"

#include <algorithm>
#include <utility>

#include "model/tokenizer_text.h"

namespace kvrm::tok {

AddedTokenMatcher::AddedTokenMatcher(std::vector<const AddedToken*> tokens,
                                     const std::vector<std::string>& patterns)
    : tokens_(std::move(tokens)), nodes_(1) {
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const std::string& p = patterns[i];
    if (p.empty()) continue;
    int32_t node = 0;
    for (char c : p) {
      const auto b = static_cast<unsigned char>(c);
      auto it = nodes_[node].next.find(b);
      if (it == nodes_[node].next.end()) {
        nodes_.emplace_back();
        const auto child = static_cast<int32_t>(nodes_.size() - 1);
        nodes_[node].next.emplace(b, child);
        node = child;
      } else {
        node = it->second;
      }
    }
    // Duplicate patterns: the first one given wins.
    if (nodes_[node].token < 0) nodes_[node].token = static_cast<int32_t>(i);
  }
}

std::pair<size_t, int32_t> AddedTokenMatcher::LongestAt(std::string_view sentence,
                                                        size_t pos) const {
  std::pair<size_t, int32_t> best{0, -1};
  int32_t node = 0;
  for (size_t i = pos; i < sentence.size(); ++i) {
    auto it = nodes_[node].next.find(static_cast<unsigned char>(sentence[i]));
    if (it == nodes_[node].next.end()) break;
    node = it->second;
    if (nodes_[node].token >= 0) best = {i + 1 - pos, nodes_[node].token};
  }
  return best;
}

std::vector<AddedSplit> AddedTokenMatcher::Split(std::string_view sentence) const {
  std::vector<AddedSplit> splits;
  if (sentence.empty()) return {{0, 0, -1}};
  size_t start_offset = 0;
  size_t pos = 0;
  while (!tokens_.empty() && pos < sentence.size()) {
    const auto [len, index] = LongestAt(sentence, pos);
    if (index < 0) {
      ++pos;
      continue;
    }
    size_t start = pos, stop = pos + len;
    pos = stop;  // the scan resumes after the match even if it is discarded below
    const AddedToken& token = *tokens_[index];
    if (token.single_word) {
      const bool word_before = start > 0 && IsWordChar(PrevCodePoint(sentence, start));
      size_t after = stop;
      const bool word_after = stop < sentence.size() && IsWordChar(NextCodePoint(sentence, &after));
      if (word_before || word_after) continue;
    }
    if (token.lstrip) {
      size_t s = start;
      while (s > 0) {
        const uint32_t cp = PrevCodePoint(sentence, s);
        if (!IsWhitespace(cp)) break;
        std::string tmp;
        AppendUtf8(cp, &tmp);
        s -= tmp.size();
      }
      // Whitespace an earlier match already took stays with it.
      start = std::max(s, start_offset);
    }
    if (token.rstrip) {
      while (stop < sentence.size()) {
        size_t next = stop;
        if (!IsWhitespace(NextCodePoint(sentence, &next))) break;
        stop = next;
      }
      pos = std::max(pos, stop);
    }
    if (start_offset < start) splits.push_back({start_offset, start, -1});
    splits.push_back({start, stop, token.id});
    start_offset = stop;
  }
  if (start_offset != sentence.size()) splits.push_back({start_offset, sentence.size(), -1});
  return splits;
}

}  // namespace kvrm::tok
