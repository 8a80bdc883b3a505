// Draft tokens for speculative decoding by prompt lookup (n-gram matching; vLLM's `ngram`
// method, TGI's `--speculate` without a draft model): the history's last n tokens are looked up
// earlier in the same history (its prompt and what it generated), and the tokens that followed
// that occurrence are proposed as the next ones. No model runs: it costs a scan of the history,
// and drafts only where the text repeats itself (quoting the prompt, code edits, lists, loops).
//
// The engine verifies the drafts in the decode pass (Engine, "Speculative decoding"), so a wrong
// draft costs its row of the pass, never a wrong token.
#ifndef KVRM_RUNTIME_NGRAM_PROPOSER_H_
#define KVRM_RUNTIME_NGRAM_PROPOSER_H_

#include <cstdint>

#include "absl/types/span.h"

namespace kvrm {

struct NgramDraftOptions {
  int32_t min_ngram = 2;  // shortest suffix looked up (vLLM's prompt_lookup_min)
  int32_t max_ngram = 4;  // longest (prompt_lookup_max)
};

// The sequence is `history` followed by `last` (the engine's history and its next input
// token). Finds the longest n in [min_ngram, max_ngram] whose last n tokens occur earlier in the
// sequence, takes the most recent such occurrence, and writes to `draft` the `max_draft` tokens
// that followed it, as the continuation of a loop whose period is the distance between the two:
// past the sequence's end the draft repeats itself (an occurrence p tokens back drafts the
// period-p loop). Returns how many were written: max_draft, or 0 (no match, or max_draft <= 0).
// Allocation-free; O(sequence length x max_ngram) at worst, and it stops at the first (most
// recent) occurrence of the longest suffix.
int32_t ProposeNgramDraft(absl::Span<const int32_t> history, int32_t last,
                          const NgramDraftOptions& options, int32_t max_draft, int32_t* draft);

}  // namespace kvrm

#endif  // KVRM_RUNTIME_NGRAM_PROPOSER_H_
