// A deterministic synthetic training corpus for the BPE trainer.
//
// A made-up language of pronounceable words drawn with a Zipf-like frequency, with
// capitalisation, punctuation, contractions, numbers, newlines and a little code-like text,
// mixed with a few paragraphs of real English, accented Latin words and CJK words, so the
// learned merges cover letters, spaces, digits, punctuation and multi-byte UTF-8.
#ifndef KVRM_TOOLS_MODELGEN_SYNTHETIC_CORPUS_H_
#define KVRM_TOOLS_MODELGEN_SYNTHETIC_CORPUS_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace kvrm::modelgen {

struct CorpusOptions {
  uint64_t seed = 0;
  int lexicon_size = 4000;      // distinct synthetic words
  size_t target_bytes = 1 << 20;  // generation stops at the first paragraph end past this
};

std::string BuildSyntheticCorpus(const CorpusOptions& options);

// Corpus options large enough for `num_merges` merges at frequency >= 2, with margin.
CorpusOptions CorpusOptionsForMerges(uint64_t seed, int num_merges);

}  // namespace kvrm::modelgen

#endif  // KVRM_TOOLS_MODELGEN_SYNTHETIC_CORPUS_H_
