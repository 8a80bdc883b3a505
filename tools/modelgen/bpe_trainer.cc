#include "tools/modelgen/bpe_trainer.h"

#include <algorithm>
#include <queue>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"

namespace kvrm::modelgen {
namespace {

using PairKey = uint64_t;  // (left id << 32) | right id

PairKey Key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}
int32_t Left(PairKey k) { return static_cast<int32_t>(k >> 32); }
int32_t Right(PairKey k) { return static_cast<int32_t>(k & 0xffffffffu); }

struct Word {
  std::vector<int32_t> symbols;
  int64_t count;
};

struct HeapEntry {
  int64_t count;
  PairKey pair;
};

// Training state. Pair counts are kept exact and incrementally updated; the heap holds possibly
// stale counts and is corrected lazily on pop (counts of existing pairs only ever decrease, so
// a stale entry is an over-estimate and re-pushing it with the true count is sound).
class Trainer {
 public:
  Trainer(std::vector<Word> words, const BpeTrainerOptions& options)
      : words_(std::move(words)), options_(options) {
    tokens_.reserve(256 + options.num_merges);
    for (int b = 0; b < 256; ++b) {
      tokens_.emplace_back(1, static_cast<char>(b));
      token_ids_[tokens_.back()] = b;
    }
  }

  absl::StatusOr<BpeModel> Run() {
    for (int32_t w = 0; w < static_cast<int32_t>(words_.size()); ++w) {
      const std::vector<int32_t>& s = words_[w].symbols;
      for (size_t i = 0; i + 1 < s.size(); ++i) {
        const PairKey p = Key(s[i], s[i + 1]);
        pair_counts_[p] += words_[w].count;
        AddWhere(p, w);
      }
    }
    std::vector<HeapEntry> initial;
    initial.reserve(pair_counts_.size());
    for (const auto& [pair, count] : pair_counts_) initial.push_back({count, pair});
    heap_ = Heap(Less{&tokens_}, std::move(initial));

    BpeModel model;
    while (static_cast<int>(model.merges.size()) < options_.num_merges) {
      if (heap_.empty()) break;
      const HeapEntry top = heap_.top();
      heap_.pop();
      const int64_t actual = pair_counts_[top.pair];
      if (actual != top.count) {  // stale: re-queue with the true count
        if (actual > 0) heap_.push({actual, top.pair});
        continue;
      }
      if (actual < options_.min_frequency) break;
      std::string merged = tokens_[Left(top.pair)] + tokens_[Right(top.pair)];
      if (token_ids_.contains(merged)) continue;  // duplicate string: skip (see header)
      const int32_t id = static_cast<int32_t>(tokens_.size());
      token_ids_[merged] = id;
      tokens_.push_back(std::move(merged));
      model.merges.emplace_back(Left(top.pair), Right(top.pair));
      ApplyMerge(top.pair, id);
    }
    if (static_cast<int>(model.merges.size()) < options_.num_merges) {
      return absl::FailedPreconditionError(
          absl::StrCat("BPE training found only ", model.merges.size(), " of ",
                       options_.num_merges, " merges with frequency >= ", options_.min_frequency,
                       ": enlarge the corpus"));
    }
    model.tokens = std::move(tokens_);
    return model;
  }

 private:
  // Max-heap order: higher count first; on ties the lexicographically smaller (left, right).
  struct Less {
    const std::vector<std::string>* tokens;
    bool operator()(const HeapEntry& x, const HeapEntry& y) const {
      if (x.count != y.count) return x.count < y.count;
      const std::string& xl = (*tokens)[Left(x.pair)];
      const std::string& yl = (*tokens)[Left(y.pair)];
      if (xl != yl) return xl > yl;
      return (*tokens)[Right(x.pair)] > (*tokens)[Right(y.pair)];
    }
  };
  using Heap = std::priority_queue<HeapEntry, std::vector<HeapEntry>, Less>;

  void AddWhere(PairKey p, int32_t w) {
    std::vector<int32_t>& where = where_[p];
    if (where.empty() || where.back() != w) where.push_back(w);
  }

  // Rewrites every word containing `pair`, updating pair counts by the difference between each
  // word's old and new adjacent pairs (words are short, so recounting them is cheap).
  void ApplyMerge(PairKey pair, int32_t new_id) {
    const int32_t a = Left(pair), b = Right(pair);
    std::vector<int32_t> where = std::move(where_[pair]);
    where_.erase(pair);
    std::vector<int32_t> merged;
    std::vector<PairKey> fresh;  // pairs containing new_id, in first-seen order
    absl::flat_hash_map<PairKey, int64_t> fresh_counts;
    for (const int32_t w : where) {
      Word& word = words_[w];
      std::vector<int32_t>& s = word.symbols;
      merged.clear();
      for (size_t i = 0; i < s.size(); ++i) {
        if (i + 1 < s.size() && s[i] == a && s[i + 1] == b) {
          merged.push_back(new_id);
          ++i;
        } else {
          merged.push_back(s[i]);
        }
      }
      if (merged.size() == s.size()) continue;  // stale entry: pair no longer in this word
      for (size_t i = 0; i + 1 < s.size(); ++i) pair_counts_[Key(s[i], s[i + 1])] -= word.count;
      for (size_t i = 0; i + 1 < merged.size(); ++i) {
        const PairKey p = Key(merged[i], merged[i + 1]);
        pair_counts_[p] += word.count;
        if (merged[i] == new_id || merged[i + 1] == new_id) {
          auto [it, inserted] = fresh_counts.try_emplace(p, 0);
          if (inserted) fresh.push_back(p);
          it->second += word.count;
          AddWhere(p, w);
        }
      }
      s.swap(merged);
    }
    pair_counts_.erase(pair);
    for (const PairKey p : fresh) heap_.push({pair_counts_[p], p});
  }

  std::vector<Word> words_;
  BpeTrainerOptions options_;
  std::vector<std::string> tokens_;
  absl::flat_hash_map<std::string, int32_t> token_ids_;
  absl::flat_hash_map<PairKey, int64_t> pair_counts_;
  absl::flat_hash_map<PairKey, std::vector<int32_t>> where_;  // word indices, ascending
  Heap heap_{Less{nullptr}};
};

}  // namespace

absl::StatusOr<BpeModel> TrainBpe(const WordCounts& words, const BpeTrainerOptions& options) {
  if (options.num_merges < 0 || options.min_frequency < 1) {
    return absl::InvalidArgumentError("num_merges must be >= 0 and min_frequency >= 1");
  }
  // Sort so the result (and the word order inside each pair's index) is input-order free.
  std::vector<const std::pair<std::string, int64_t>*> sorted;
  sorted.reserve(words.size());
  for (const auto& wc : words) {
    if (wc.second <= 0) {
      return absl::InvalidArgumentError(absl::StrCat("non-positive count for pre-token \"",
                                                     wc.first, "\""));
    }
    sorted.push_back(&wc);
  }
  std::sort(sorted.begin(), sorted.end(), [](const auto* x, const auto* y) {
    return x->first != y->first ? x->first < y->first : x->second < y->second;
  });
  std::vector<Word> prepared;
  prepared.reserve(sorted.size());
  const std::pair<std::string, int64_t>* prev = nullptr;
  for (const auto* wc : sorted) {
    if (wc->first.empty()) continue;
    if (!prepared.empty() && wc->first == prev->first) {  // repeated pre-token: sum counts
      prepared.back().count += wc->second;
      continue;
    }
    prev = wc;
    Word word;
    word.count = wc->second;
    for (unsigned char c : wc->first) word.symbols.push_back(c);
    prepared.push_back(std::move(word));
  }
  return Trainer(std::move(prepared), options).Run();
}

const std::array<std::string, 256>& ByteLevelAlphabet() {
  static const auto* alphabet = [] {
    auto* a = new std::array<std::string, 256>;
    // Printable bytes map to themselves; the rest to code points 256, 257, ... in byte order.
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      const int cp = printable ? b : next++;
      std::string& s = (*a)[b];
      if (cp < 0x80) {
        s.push_back(static_cast<char>(cp));
      } else {  // all code points here are < 0x800: two UTF-8 bytes
        s.push_back(static_cast<char>(0xC0 | (cp >> 6)));
        s.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
      }
    }
    return a;
  }();
  return *alphabet;
}

std::string ToByteLevel(std::string_view bytes) {
  const auto& alphabet = ByteLevelAlphabet();
  std::string out;
  out.reserve(bytes.size() * 2);
  for (unsigned char c : bytes) out += alphabet[c];
  return out;
}

}  // namespace kvrm::modelgen
