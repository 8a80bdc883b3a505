#include "runtime/structured/grammar.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <numeric>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"

namespace kvrm::structured {
namespace {

// Tokens longer than this are never allowed (depths are 16-bit; no real vocabulary comes near).
constexpr size_t kMaxTokenBytes = 4096;

}  // namespace

TokenTrie::TokenTrie(absl::Span<const std::optional<std::string>> token_bytes)
    : vocab_size_(static_cast<int32_t>(token_bytes.size())) {
  byte_begin_.resize(vocab_size_ + 1);
  std::vector<int32_t> usable;
  for (int32_t id = 0; id < vocab_size_; ++id) {
    byte_begin_[id] = static_cast<int64_t>(bytes_.size());
    const std::optional<std::string>& b = token_bytes[id];
    if (!b || b->empty() || b->size() > kMaxTokenBytes) continue;
    bytes_ += *b;
    usable.push_back(id);
  }
  byte_begin_[vocab_size_] = static_cast<int64_t>(bytes_.size());

  // Sorted by bytes, consecutive tokens share their longest common prefix as a path: the trie
  // comes out in preorder, and every token's node is created (or is still the deepest) when
  // the token is reached, so tokens come in node order.
  std::sort(usable.begin(), usable.end(), [&](int32_t a, int32_t b) {
    const std::string_view x = bytes(a), y = bytes(b);
    return x != y ? x < y : a < b;
  });
  std::vector<int32_t> path;  // node index at each depth - 1
  std::vector<int32_t> node_of;  // per usable token, in order
  std::string_view prev;
  for (int32_t id : usable) {
    const std::string_view b = bytes(id);
    size_t lcp = 0;
    while (lcp < prev.size() && lcp < b.size() && prev[lcp] == b[lcp]) ++lcp;
    while (path.size() > lcp) {
      subtree_end_[path.back()] = static_cast<int32_t>(node_byte_.size());
      path.pop_back();
    }
    for (size_t k = lcp; k < b.size(); ++k) {
      path.push_back(static_cast<int32_t>(node_byte_.size()));
      node_byte_.push_back(static_cast<uint8_t>(b[k]));
      node_depth_.push_back(static_cast<uint16_t>(k + 1));
      subtree_end_.push_back(0);
    }
    max_depth_ = std::max(max_depth_, static_cast<int32_t>(b.size()));
    node_of.push_back(path.back());
    prev = b;
  }
  while (!path.empty()) {
    subtree_end_[path.back()] = static_cast<int32_t>(node_byte_.size());
    path.pop_back();
  }
  token_begin_.assign(node_byte_.size() + 1, 0);
  for (int32_t node : node_of) ++token_begin_[node + 1];
  std::partial_sum(token_begin_.begin(), token_begin_.end(), token_begin_.begin());
  tokens_ = usable;  // already in node order
}

int64_t TokenTrie::memory_bytes() const {
  return static_cast<int64_t>(bytes_.size() + byte_begin_.size() * 8 + node_byte_.size() +
                              node_depth_.size() * 2 + subtree_end_.size() * 4 +
                              token_begin_.size() * 4 + tokens_.size() * 4);
}

Grammar::Grammar(Dfa dfa, std::shared_ptr<const TokenTrie> trie)
    : dfa_(std::move(dfa)), trie_(std::move(trie)), words_((trie_->vocab_size() + 63) / 64) {
  for (int b = 255; b >= 0; --b) {
    const uint8_t c = dfa_.class_of()[b];
    first_byte_of_class_[c] = static_cast<uint8_t>(b);
    ++class_size_[c];
  }
}

absl::StatusOr<std::shared_ptr<const Grammar>> Grammar::Compile(
    const Regex& regex, std::shared_ptr<const TokenTrie> trie, const GrammarLimits& limits) {
  CHECK(trie != nullptr);
  auto dfa = Dfa::Compile(regex, limits.dfa);
  if (!dfa.ok()) return dfa.status();
  std::shared_ptr<Grammar> g(new Grammar(*std::move(dfa), std::move(trie)));
  absl::Status masks = g->ComputeMasks(limits);
  if (!masks.ok()) return masks;
  return std::shared_ptr<const Grammar>(std::move(g));
}

absl::Status Grammar::ComputeMasks(const GrammarLimits& limits) {
  const TokenTrie& t = *trie_;
  const int32_t states = dfa_.num_states();
  const int64_t nodes = t.num_nodes();
  std::vector<uint8_t> node_class(nodes);
  for (int64_t i = 0; i < nodes; ++i) node_class[i] = dfa_.class_of()[t.node_byte_[i]];

  // States are walked in batches, each batch split over the threads (every walk reads only
  // the trie and the automaton, and writes its own mask), then its masks are de-duplicated in
  // order, so the result does not depend on the thread count.
  const int32_t threads = std::max(1, std::min(limits.threads, 64));
  constexpr int32_t kBatch = 256;
  std::vector<uint64_t> batch(static_cast<size_t>(kBatch) * words_);
  std::vector<int32_t> batch_count(kBatch);
  std::vector<std::vector<int32_t>> at(threads, std::vector<int32_t>(t.max_depth_ + 1));
  // Trie nodes walked, per thread: states times the vocabulary's nodes they reach, which a small
  // automaton over a large vocabulary can make billions of (checked after each batch).
  std::vector<int64_t> visited(threads, 0);
  // States where no token can go on and the match is not complete: tokens must not lead there
  // (possible when the vocabulary cannot spell some byte). Found by iterating to a fixpoint;
  // with a vocabulary that has every byte the first pass finds none and the loop ends.
  std::vector<uint8_t> stuck(states, 0);
  while (true) {
    masks_.clear();
    mask_of_.assign(states, 0);
    allowed_count_.assign(states, 0);
    absl::flat_hash_map<uint64_t, std::vector<int32_t>> by_hash;
    for (int32_t first = 0; first < states; first += kBatch) {
      const int32_t n = std::min(kBatch, states - first);
      auto walk = [&](int32_t worker) {
        for (int32_t k = worker; k < n; k += threads) {
          uint64_t* mask = batch.data() + static_cast<size_t>(k) * words_;
          batch_count[k] = WalkState(first + k, node_class, stuck, at[worker].data(), mask,
                                     &visited[worker]);
        }
      };
      std::vector<std::thread> helpers;
      for (int32_t w = 1; w < threads && w < n; ++w) helpers.emplace_back(walk, w);
      walk(0);
      for (std::thread& h : helpers) h.join();
      int64_t walked = 0;
      for (int64_t v : visited) walked += v;
      if (walked > limits.max_mask_work) {
        return absl::InvalidArgumentError(absl::StrCat(
            "the constraint takes too much work to compile against the vocabulary (", states,
            " automaton states, each reaching most of its ", t.vocab_size(),
            " tokens); simplify it (shorter bounded repeats)"));
      }
      for (int32_t k = 0; k < n; ++k) {
        const int32_t s = first + k;
        allowed_count_[s] = batch_count[k];
        ASSIGN_OR_RETURN(mask_of_[s],
                         InternMask(batch.data() + static_cast<size_t>(k) * words_, limits,
                                    &by_hash));
      }
    }
    bool grew = false;
    for (int32_t s = 0; s < states; ++s) {
      if (!stuck[s] && allowed_count_[s] == 0 && !dfa_.accepting(s)) {
        stuck[s] = 1;
        grew = true;
      }
    }
    if (!grew) break;
  }
  if (stuck[start()]) {
    return absl::InvalidArgumentError(
        "no text the model's vocabulary can write matches the constraint");
  }
  return absl::OkStatus();
}

int32_t Grammar::WalkState(int32_t s, const std::vector<uint8_t>& node_class,
                           const std::vector<uint8_t>& stuck, int32_t* at, uint64_t* mask,
                           int64_t* visited) const {
  const TokenTrie& t = *trie_;
  const int64_t nodes = t.num_nodes();
  std::fill(mask, mask + words_, 0);
  int32_t count = 0;
  int64_t walked = 0;  // local: *visited may alias the mask words
  at[0] = s;  // at[d]: the automaton state after the path's first d bytes
  for (int64_t i = 0; i < nodes;) {
    ++walked;
    const int32_t q = dfa_.NextByClass(at[t.node_depth_[i] - 1], node_class[i]);
    if (q == kDead) {
      i = t.subtree_end_[i];
      continue;
    }
    at[t.node_depth_[i]] = q;
    if (!stuck[q]) {
      for (int32_t k = t.token_begin_[i]; k < t.token_begin_[i + 1]; ++k) {
        const int32_t token = t.tokens_[k];
        mask[token >> 6] |= uint64_t{1} << (token & 63);
        ++count;
      }
    }
    ++i;
  }
  *visited += walked;
  return count;
}

absl::StatusOr<int32_t> Grammar::InternMask(
    const uint64_t* mask, const GrammarLimits& limits,
    absl::flat_hash_map<uint64_t, std::vector<int32_t>>* by_hash) {
  const uint64_t h = absl::HashOf(
      std::string_view(reinterpret_cast<const char*>(mask), words_ * sizeof(uint64_t)));
  std::vector<int32_t>& same = (*by_hash)[h];
  for (int32_t m : same) {
    if (std::memcmp(masks_.data() + static_cast<size_t>(m) * words_, mask,
                    words_ * sizeof(uint64_t)) == 0) {
      return m;
    }
  }
  const int32_t id = num_distinct_masks();
  if (static_cast<int64_t>(masks_.size() + words_) * 8 > limits.max_mask_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the constraint needs more than ", limits.max_mask_bytes >> 20,
                     " MiB of token masks (", num_states(), " automaton states); simplify it"));
  }
  masks_.insert(masks_.end(), mask, mask + words_);
  same.push_back(id);
  return id;
}

int32_t Grammar::ForcedByte(int32_t state, bool allow_end) const {
  if (state == kDead || (allow_end && accepting(state))) return -1;
  int32_t forced = -1;
  for (int32_t c = 0; c < dfa_.num_classes(); ++c) {
    if (dfa_.NextByClass(state, c) == kDead) continue;
    if (forced >= 0 || class_size_[c] != 1) return -1;  // a choice of bytes
    forced = first_byte_of_class_[c];
  }
  return forced;
}

int32_t Grammar::ForcedTokens(int32_t state, bool allow_end, int32_t max_tokens,
                              int32_t* out) const {
  const TokenTrie& t = *trie_;
  int32_t n = 0;
  while (n < max_tokens) {
    // Descend the vocabulary trie along the forced bytes, keeping the deepest allowed token.
    int32_t best = -1;
    int32_t s = state;
    int64_t begin = 0, end = t.num_nodes();
    for (int32_t depth = 1; begin < end && depth <= t.max_depth_; ++depth) {
      const int32_t b = ForcedByte(s, allow_end);
      if (b < 0) break;
      int64_t node = begin;
      while (node < end && t.node_byte_[node] != b) node = t.subtree_end_[node];  // siblings
      if (node >= end) break;
      for (int32_t k = t.token_begin_[node]; k < t.token_begin_[node + 1]; ++k) {
        if (Allows(state, t.tokens_[k])) {
          best = t.tokens_[k];
          break;
        }
      }
      s = dfa_.Next(s, static_cast<uint8_t>(b));
      begin = node + 1;
      end = t.subtree_end_[node];
    }
    if (best < 0) break;
    out[n++] = best;
    state = Next(state, best);
  }
  return n;
}

int32_t Grammar::Next(int32_t state, int32_t token) const {
  if (token < 0 || token >= vocab_size() || !Allows(state, token)) return kDead;
  int32_t s = state;
  for (char c : trie_->bytes(token)) s = dfa_.Next(s, static_cast<uint8_t>(c));
  return s;
}

void Grammar::MaskLogits(int32_t state, absl::Span<float> logits,
                         absl::Span<const int32_t> end_ids, bool allow_end) const {
  CHECK(static_cast<int32_t>(logits.size()) == vocab_size())
      << "logits " << logits.size() << " vocab " << vocab_size();
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  // The end tokens are never in a mask (they add no text): keep theirs aside.
  constexpr int kMaxEnd = 16;
  float kept[kMaxEnd];
  const bool keep_end = allow_end && accepting(state);
  const size_t n_end = std::min<size_t>(end_ids.size(), kMaxEnd);
  if (keep_end) {
    for (size_t k = 0; k < n_end; ++k) {
      kept[k] = end_ids[k] >= 0 && end_ids[k] < vocab_size() ? logits[end_ids[k]] : kNegInf;
    }
  }
  const uint64_t* m = mask(state);
  const int32_t vocab = vocab_size();
  float* out = logits.data();
  for (int32_t w = 0; w < words_; ++w) {
    uint64_t off = ~m[w];
    if (w == words_ - 1 && vocab % 64 != 0) off &= (uint64_t{1} << (vocab % 64)) - 1;
    if (off == ~uint64_t{0}) {
      std::fill(out + static_cast<size_t>(w) * 64, out + static_cast<size_t>(w) * 64 + 64,
                kNegInf);
      continue;
    }
    while (off != 0) {
      out[w * 64 + std::countr_zero(off)] = kNegInf;
      off &= off - 1;
    }
  }
  for (size_t k = 0; k < n_end; ++k) {
    if (end_ids[k] >= 0 && end_ids[k] < vocab) out[end_ids[k]] = keep_end ? kept[k] : kNegInf;
  }
}

int64_t Grammar::memory_bytes() const {
  return static_cast<int64_t>(masks_.size() * 8 + mask_of_.size() * 4 +
                              allowed_count_.size() * 4) +
         static_cast<int64_t>(dfa_.num_states()) * dfa_.num_classes() * 4;
}

}  // namespace kvrm::structured
