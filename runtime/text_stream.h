// Streaming detokenizer: turns generated token ids into UTF-8 text deltas and applies stop
// sequences.
//
// Owner: one per request, used by a single thread (the engine's scheduler thread, or whoever
// turns step results into responses). Not thread-safe.
//
// Detokenization follows HF TGI / vLLM (prefix offset + read offset): decode tokens[prefix:read]
// and tokens[prefix:]; when the second is longer and does not end in U+FFFD (a character still
// incomplete), the difference is new text and both offsets advance; otherwise hold. Both decodes
// start at the same token, so SentencePiece's "strip the leading space of the first token" cancels
// out and Llama-style word spaces survive.
//
// Stop sequences: a stop matches at the earliest point in the text where any stop sequence is
// complete (ties: the longest, i.e. the earliest starting, one). Text is released up to the match
// and never past it. While no stop has matched, the longest suffix of the pending text that is a
// proper prefix of some stop sequence is held back, so a stop that straddles deltas is still caught
// and no released text ever has to be taken back.
#ifndef KVRM_RUNTIME_TEXT_STREAM_H_
#define KVRM_RUNTIME_TEXT_STREAM_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/types/span.h"

namespace kvrm {

class TextStream {
 public:
  // decode(ids) must behave like HF decode(ids, skip_special_tokens=true): valid UTF-8, U+FFFD for
  // invalid or incomplete bytes.
  using DecodeFn = std::function<std::string(absl::Span<const int32_t>)>;

  // `stop_sequences`: empty strings are ignored. `context_tokens` (optional): the tokens right
  // before the generation, e.g. the last few (vLLM uses 5) prompt tokens. They are decoded only as
  // context, so the first generated token's leading space comes out as it does in the full text;
  // their own text is never emitted or searched for stops.
  // `include_stops`: a matched stop sequence is released too (the text ends right after it).
  TextStream(DecodeFn decode, std::vector<std::string> stop_sequences,
             std::vector<int32_t> context_tokens = {}, bool include_stops = false);

  struct Delta {
    std::string text;      // text safe to send now (whole UTF-8 characters)
    bool stopped = false;  // a stop sequence matched: `text` ends right before it (after it with
                           // include_stops); generation ends
    std::string matched_stop;
  };

  // Adds one generated token. After a stop has matched (or after Finish) it returns an empty delta
  // with the stop state. With `match_stops` false (a request's tokens before its min_tokens-th)
  // the new text is released whole and never searched for stops, nor is it part of a later
  // match: a stop must lie entirely in text pushed with `match_stops`.
  Delta Push(int32_t token, bool match_stops = true);

  // End of generation (length/eos/...): releases any text held back (but never past a stop
  // sequence, which can still complete in this last text; see stopped()). Idempotent.
  std::string Finish();

  const std::string& text() const { return text_; }  // all text released so far
  bool stopped() const { return stopped_; }
  const std::string& matched_stop() const { return matched_stop_; }

 private:
  // Appends the text of tokens_[prefix_offset_:] beyond tokens_[prefix_offset_:read_offset_] to
  // pending_ when `final` or when it is complete; returns whether it appended.
  bool DecodeNew(bool final);
  // Searches pending_ for stops that end after `search_from`, then releases what is safe.
  Delta Release(size_t search_from, bool final);
  size_t LongestHeldSuffix() const;
  void Emit(size_t length, Delta& delta);

  DecodeFn decode_;
  std::vector<std::string> stops_;
  bool include_stops_ = false;
  // Tokens from the last prefix offset on (older ones are dropped as the stream advances).
  std::vector<int32_t> tokens_;
  size_t prefix_offset_ = 0;
  size_t read_offset_ = 0;
  std::string pending_;  // decoded but not released: the start of a possible stop sequence
  std::string text_;
  bool stopped_ = false;
  bool finished_ = false;
  std::string matched_stop_;
};

}  // namespace kvrm

#endif  // KVRM_RUNTIME_TEXT_STREAM_H_
