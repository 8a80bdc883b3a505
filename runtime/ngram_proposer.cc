#include "runtime/ngram_proposer.h"

#include <algorithm>

namespace kvrm {

int32_t ProposeNgramDraft(absl::Span<const int32_t> history, int32_t last,
                          const NgramDraftOptions& options, int32_t max_draft, int32_t* draft) {
  const int64_t len = static_cast<int64_t>(history.size()) + 1;
  const auto at = [&](int64_t i) { return i + 1 == len ? last : history[i]; };
  const int64_t min_n = std::max<int32_t>(1, options.min_ngram);
  const int64_t max_n = std::min<int64_t>(options.max_ngram, len - 1);
  if (max_draft <= 0 || max_n < min_n) return 0;
  // Candidate occurrences end at e < len - 1 (the suffix itself ends at len - 1), most recent
  // first. The match length at e is how many tokens before and at e equal the suffix's, up to
  // max_n; the first e reaching max_n wins, else the most recent of the longest.
  int64_t best_end = -1, best_n = min_n - 1;
  for (int64_t e = len - 2; e >= 0; --e) {
    if (at(e) != last) continue;
    int64_t n = 1;
    while (n < max_n && e - n >= 0 && at(e - n) == at(len - 1 - n)) ++n;
    if (n > best_n) {
      best_n = n;
      best_end = e;
      if (n == max_n) break;
    }
  }
  if (best_end < 0) return 0;
  // What followed the occurrence predicts what follows the suffix, period = len - 1 - best_end
  // tokens apart; past the sequence's end the draft continues with itself (a loop of that period).
  const int64_t period = len - 1 - best_end;
  for (int32_t i = 0; i < max_draft; ++i) {
    draft[i] = i < period ? at(best_end + 1 + i) : draft[i - period];
  }
  return max_draft;
}

}  // namespace kvrm
