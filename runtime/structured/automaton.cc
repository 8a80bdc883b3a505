#include "runtime/structured/automaton.h"

#include <algorithm>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/logging.h"
#include "model/tokenizer_text.h"

namespace kvrm::structured {
namespace {

// Thompson NFA over bytes, built back to front: each piece is compiled knowing the state that
// follows it, so no dangling edges need patching.
class Nfa {
 public:
  enum Kind : uint8_t { kByte, kFork, kMatch };
  struct State {
    Kind kind = kMatch;
    uint8_t lo = 0, hi = 0;  // kByte
    int32_t out = -1;        // kByte
    int32_t fork_begin = 0, fork_end = 0;  // kFork: forks_[begin, end)
  };

  int32_t AddMatch() { return Add(State{.kind = kMatch}); }

  int32_t Compile(const Regex& r, int32_t next) {
    switch (r->kind) {
      case RegexNode::Kind::kNothing:
        return AddFork({});  // no way out: matches nothing
      case RegexNode::Kind::kEmpty:
        return next;
      case RegexNode::Kind::kLiteral: {
        int32_t s = next;
        for (size_t i = r->text.size(); i-- > 0;) {
          const uint8_t b = static_cast<uint8_t>(r->text[i]);
          s = AddByte(b, b, s);
        }
        return s;
      }
      case RegexNode::Kind::kClass: {
        std::vector<int32_t> starts;
        for (const CodePointRange& range : r->set.ranges()) {
          for (const std::vector<ByteRange>& seq : Utf8Sequences(range.lo, range.hi)) {
            int32_t s = next;
            for (size_t k = seq.size(); k-- > 0;) s = AddByte(seq[k].lo, seq[k].hi, s);
            starts.push_back(s);
          }
        }
        return starts.size() == 1 ? starts[0] : AddFork(starts);
      }
      case RegexNode::Kind::kConcat: {
        int32_t s = next;
        for (size_t k = r->children.size(); k-- > 0;) s = Compile(r->children[k], s);
        return s;
      }
      case RegexNode::Kind::kAlt: {
        std::vector<int32_t> starts;
        starts.reserve(r->children.size());
        for (const Regex& child : r->children) starts.push_back(Compile(child, next));
        return AddFork(starts);
      }
      case RegexNode::Kind::kRepeat: {
        const Regex& x = r->children[0];
        int32_t s = next;
        if (r->max < 0) {
          // loop: fork{x -> loop, next}
          const int32_t loop = Add(State{.kind = kFork});
          const int32_t body = Compile(x, loop);
          SetFork(loop, {body, next});
          s = loop;
        } else {
          for (int32_t k = r->min; k < r->max; ++k) s = AddFork({Compile(x, s), next});
        }
        for (int32_t k = 0; k < r->min; ++k) s = Compile(x, s);
        return s;
      }
    }
    return next;
  }

  const State& state(int32_t i) const { return states_[i]; }
  int32_t size() const { return static_cast<int32_t>(states_.size()); }
  absl::Span<const int32_t> ForkOuts(const State& s) const {
    return absl::MakeConstSpan(forks_.data() + s.fork_begin, s.fork_end - s.fork_begin);
  }

 private:
  int32_t Add(State s) {
    states_.push_back(s);
    return static_cast<int32_t>(states_.size()) - 1;
  }
  int32_t AddByte(uint8_t lo, uint8_t hi, int32_t out) {
    return Add(State{.kind = kByte, .lo = lo, .hi = hi, .out = out});
  }
  int32_t AddFork(const std::vector<int32_t>& outs) {
    const int32_t id = Add(State{.kind = kFork});
    SetFork(id, outs);
    return id;
  }
  void SetFork(int32_t id, const std::vector<int32_t>& outs) {
    states_[id].fork_begin = static_cast<int32_t>(forks_.size());
    forks_.insert(forks_.end(), outs.begin(), outs.end());
    states_[id].fork_end = static_cast<int32_t>(forks_.size());
  }

  std::vector<State> states_;
  std::vector<int32_t> forks_;
};

// Epsilon closures as sorted sets of the states that matter (kByte and kMatch).
class Closure {
 public:
  // Counts every state it visits into `*work`.
  Closure(const Nfa& nfa, int64_t* work) : nfa_(nfa), mark_(nfa.size(), 0), work_(work) {}

  // Adds the closure of `s` to the set being built.
  void Add(int32_t s) {
    stack_.push_back(s);
    while (!stack_.empty()) {
      const int32_t t = stack_.back();
      stack_.pop_back();
      ++*work_;
      if (mark_[t] == stamp_) continue;
      mark_[t] = stamp_;
      const Nfa::State& st = nfa_.state(t);
      if (st.kind == Nfa::kFork) {
        const auto outs = nfa_.ForkOuts(st);
        for (size_t k = outs.size(); k-- > 0;) stack_.push_back(outs[k]);
      } else {
        set_.push_back(t);
      }
    }
  }
  void Begin() {
    set_.clear();
    if (++stamp_ == 0) {
      std::fill(mark_.begin(), mark_.end(), 0);
      stamp_ = 1;
    }
  }
  std::vector<int32_t> Take() {
    std::sort(set_.begin(), set_.end());
    return set_;
  }

 private:
  const Nfa& nfa_;
  std::vector<uint32_t> mark_;
  int64_t* work_;
  uint32_t stamp_ = 0;
  std::vector<int32_t> stack_;
  std::vector<int32_t> set_;
};

// Hopcroft's partition refinement over a complete automaton: states 0..n-1 and a sink n that
// every missing transition goes to. Returns each state's block; states in one block accept the
// same continuations. O(classes * n log n): each state enters a splitter at most log n times.
std::vector<int32_t> MinimalBlocks(const std::vector<int32_t>& table,
                                   const std::vector<uint8_t>& accepting, int32_t n,
                                   int32_t classes) {
  const int32_t total = n + 1;  // with the sink
  auto next = [&](int32_t s, int32_t c) {
    if (s == n) return n;
    const int32_t t = table[static_cast<size_t>(s) * classes + c];
    return t == Dfa::kDead ? n : t;
  };
  // Predecessors by target, each entry (class, source), grouped by target (CSR).
  std::vector<int32_t> pred_begin(total + 1, 0);
  for (int32_t s = 0; s < total; ++s) {
    for (int32_t c = 0; c < classes; ++c) ++pred_begin[next(s, c) + 1];
  }
  for (int32_t t = 0; t < total; ++t) pred_begin[t + 1] += pred_begin[t];
  std::vector<std::pair<int32_t, int32_t>> preds(pred_begin[total]);
  {
    std::vector<int32_t> fill(pred_begin.begin(), pred_begin.end() - 1);
    for (int32_t s = 0; s < total; ++s) {
      for (int32_t c = 0; c < classes; ++c) preds[fill[next(s, c)]++] = {c, s};
    }
  }

  // The partition: elems_ ordered by block; block b is elems[first[b], end[b]); the states of
  // a block being split are moved to its front ("marked").
  std::vector<int32_t> elems(total), loc(total), block_of(total);
  std::vector<int32_t> first, end, marked;
  std::vector<uint8_t> in_work;
  std::vector<int32_t> work;
  auto new_block = [&](int32_t f, int32_t e) {
    first.push_back(f);
    end.push_back(e);
    marked.push_back(0);
    in_work.push_back(0);
    return static_cast<int32_t>(first.size()) - 1;
  };
  {
    int32_t k = 0;
    for (int32_t s = 0; s < n; ++s) {
      if (accepting[s]) elems[k++] = s;
    }
    const int32_t accepting_end = k;
    for (int32_t s = 0; s <= n; ++s) {
      if (s == n || !accepting[s]) elems[k++] = s;
    }
    for (int32_t i = 0; i < total; ++i) loc[elems[i]] = i;
    const int32_t a = new_block(0, accepting_end);  // never empty: the start is live
    const int32_t r = new_block(accepting_end, total);
    for (int32_t i = 0; i < total; ++i) block_of[elems[i]] = i < accepting_end ? a : r;
    const int32_t smaller = end[a] - first[a] <= end[r] - first[r] ? a : r;
    in_work[smaller] = 1;
    work.push_back(smaller);
  }

  std::vector<std::vector<int32_t>> by_class(classes);
  std::vector<int32_t> touched;
  while (!work.empty()) {
    const int32_t splitter = work.back();
    work.pop_back();
    in_work[splitter] = 0;
    for (auto& v : by_class) v.clear();
    for (int32_t i = first[splitter]; i < end[splitter]; ++i) {
      const int32_t t = elems[i];
      for (int32_t k = pred_begin[t]; k < pred_begin[t + 1]; ++k) {
        by_class[preds[k].first].push_back(preds[k].second);
      }
    }
    for (int32_t c = 0; c < classes; ++c) {
      if (by_class[c].empty()) continue;
      touched.clear();
      for (int32_t s : by_class[c]) {
        const int32_t b = block_of[s];
        const int32_t at = first[b] + marked[b];
        if (loc[s] < at) continue;  // already marked
        if (marked[b] == 0) touched.push_back(b);
        // Swap s into the marked front of its block.
        const int32_t other = elems[at];
        elems[at] = s;
        elems[loc[s]] = other;
        loc[other] = loc[s];
        loc[s] = at;
        ++marked[b];
      }
      for (int32_t b : touched) {
        const int32_t m = marked[b];
        marked[b] = 0;
        if (m == end[b] - first[b]) continue;  // the whole block: no split
        // The marked front becomes a new block.
        const int32_t nb = new_block(first[b], first[b] + m);
        first[b] += m;
        for (int32_t i = first[nb]; i < end[nb]; ++i) block_of[elems[i]] = nb;
        if (in_work[b]) {
          in_work[nb] = 1;
          work.push_back(nb);
        } else {
          const int32_t smaller = end[nb] - first[nb] <= end[b] - first[b] ? nb : b;
          in_work[smaller] = 1;
          work.push_back(smaller);
        }
      }
    }
  }
  return block_of;
}

// The deterministic states' sets, each kept once: the index looks a set up by its contents
// without a second copy as its key.
using StateSets = std::vector<std::vector<int32_t>>;
struct SetHash {
  using is_transparent = void;
  const StateSets* sets;
  size_t operator()(int32_t i) const { return absl::Hash<std::vector<int32_t>>{}((*sets)[i]); }
  size_t operator()(const std::vector<int32_t>& v) const {
    return absl::Hash<std::vector<int32_t>>{}(v);
  }
};
struct SetEq {
  using is_transparent = void;
  const StateSets* sets;
  bool operator()(int32_t a, int32_t b) const { return a == b; }
  bool operator()(int32_t a, const std::vector<int32_t>& v) const { return (*sets)[a] == v; }
  bool operator()(const std::vector<int32_t>& v, int32_t a) const { return (*sets)[a] == v; }
};

}  // namespace

absl::StatusOr<Dfa> Dfa::Compile(const Regex& regex, const DfaLimits& limits) {
  if (regex->size > limits.max_nfa_states) {
    return absl::InvalidArgumentError(
        absl::StrCat("the constraint is too large: about ", regex->size,
                     " automaton states before determinising (limit ", limits.max_nfa_states,
                     "); lower repeat counts or string lengths"));
  }
  Nfa nfa;
  const int32_t match = nfa.AddMatch();
  const int32_t nfa_start = nfa.Compile(regex, match);

  // Byte classes: bytes on the same side of every range boundary behave alike.
  std::array<bool, 257> cut{};
  cut[0] = true;
  for (int32_t i = 0; i < nfa.size(); ++i) {
    const Nfa::State& s = nfa.state(i);
    if (s.kind != Nfa::kByte) continue;
    cut[s.lo] = true;
    cut[s.hi + 1] = true;
  }
  Dfa dfa;
  std::array<uint8_t, 256> class_first{};  // a byte of each class
  int32_t classes = 0;
  for (int b = 0; b < 256; ++b) {
    if (cut[b]) class_first[classes++] = static_cast<uint8_t>(b);
    dfa.class_of_[b] = static_cast<uint8_t>(classes - 1);
  }
  dfa.num_classes_ = classes;

  int64_t own_work = 0;
  int64_t* const work = limits.work != nullptr ? limits.work : &own_work;
  int64_t set_entries = 0;
  Closure closure(nfa, work);
  StateSets sets;
  absl::flat_hash_set<int32_t, SetHash, SetEq> ids(16, SetHash{&sets}, SetEq{&sets});
  const auto too_much = [&]() {
    return absl::InvalidArgumentError(
        "the constraint takes too much work to compile (its automaton's states are too large); "
        "simplify it (fewer optional or nested repeats, shorter bounded repeats)");
  };
  auto intern = [&](std::vector<int32_t> set) -> absl::StatusOr<int32_t> {
    if (*work > limits.max_work) return too_much();
    if (set.empty()) return kDead;
    auto it = ids.find(set);
    if (it != ids.end()) return *it;
    if (static_cast<int32_t>(sets.size()) >= limits.max_states) {
      return absl::InvalidArgumentError(
          absl::StrCat("the constraint needs more than ", limits.max_states,
                       " automaton states; simplify it (fewer alternatives, shorter bounded "
                       "repeats)"));
    }
    set_entries += static_cast<int64_t>(set.size());
    if (set_entries > limits.max_set_entries) return too_much();
    const int32_t id = static_cast<int32_t>(sets.size());
    sets.push_back(std::move(set));
    ids.insert(id);
    return id;
  };
  closure.Begin();
  closure.Add(nfa_start);
  auto start = intern(closure.Take());
  if (!start.ok()) return start.status();
  if (*start == kDead) return absl::InvalidArgumentError("the constraint matches no text at all");

  // Subset construction. Each member's target goes to every class its range covers, then each
  // class's targets are closed once.
  std::vector<std::vector<int32_t>> targets(classes);
  std::vector<int32_t> table;
  std::vector<uint8_t> accepting;
  for (size_t d = 0; d < sets.size(); ++d) {
    for (auto& t : targets) t.clear();
    bool accepts = false;
    *work += static_cast<int64_t>(sets[d].size());
    for (int32_t s : sets[d]) {
      const Nfa::State& st = nfa.state(s);
      if (st.kind == Nfa::kMatch) {
        accepts = true;
        continue;
      }
      for (int32_t c = dfa.class_of_[st.lo]; c < classes && class_first[c] <= st.hi; ++c) {
        targets[c].push_back(st.out);
      }
    }
    accepting.push_back(accepts ? 1 : 0);
    for (int32_t c = 0; c < classes; ++c) {
      closure.Begin();
      for (int32_t t : targets[c]) closure.Add(t);
      auto next = intern(closure.Take());
      if (!next.ok()) return next.status();
      table.push_back(*next);  // sets may have grown: index by d, not by reference
    }
  }

  // Keep only states from which an accepting state is reachable.
  const int32_t n = static_cast<int32_t>(sets.size());
  std::vector<std::vector<int32_t>> preds(n);
  for (int32_t d = 0; d < n; ++d) {
    for (int32_t c = 0; c < classes; ++c) {
      const int32_t t = table[static_cast<size_t>(d) * classes + c];
      if (t != kDead) preds[t].push_back(d);
    }
  }
  std::vector<uint8_t> live(n, 0);
  std::vector<int32_t> stack;
  for (int32_t d = 0; d < n; ++d) {
    if (accepting[d]) {
      live[d] = 1;
      stack.push_back(d);
    }
  }
  while (!stack.empty()) {
    const int32_t d = stack.back();
    stack.pop_back();
    for (int32_t p : preds[d]) {
      if (!live[p]) {
        live[p] = 1;
        stack.push_back(p);
      }
    }
  }
  if (!live[*start]) return absl::InvalidArgumentError("the constraint matches no text at all");
  std::vector<int32_t> renumber(n, kDead);
  int32_t kept = 0;
  for (int32_t d = 0; d < n; ++d) {
    if (live[d]) renumber[d] = kept++;
  }
  dfa.table_.assign(static_cast<size_t>(kept) * classes, kDead);
  dfa.accepting_.assign(kept, 0);
  dfa.has_next_.assign(kept, 0);
  for (int32_t d = 0; d < n; ++d) {
    if (!live[d]) continue;
    const int32_t to = renumber[d];
    dfa.accepting_[to] = accepting[d];
    for (int32_t c = 0; c < classes; ++c) {
      const int32_t t = table[static_cast<size_t>(d) * classes + c];
      const int32_t r = t == kDead ? kDead : renumber[t];
      dfa.table_[static_cast<size_t>(to) * classes + c] = r;
      if (r != kDead) dfa.has_next_[to] = 1;
    }
  }
  dfa.start_ = renumber[*start];
  dfa.Minimize();
  return dfa;
}

void Dfa::Minimize() {
  const int32_t n = num_states();
  const std::vector<int32_t> block = MinimalBlocks(table_, accepting_, n, num_classes_);
  // New ids in order of first appearance from state 0; the sink's block (it holds only the sink:
  // every other state reaches acceptance) stays kDead.
  const int32_t sink_block = block[n];
  std::vector<int32_t> id(*std::max_element(block.begin(), block.end()) + 1, kDead);
  int32_t kept = 0;
  for (int32_t s = 0; s < n; ++s) {
    CHECK(block[s] != sink_block) << "a live state merged with the dead sink";
    if (id[block[s]] == kDead) id[block[s]] = kept++;
  }
  if (kept == n) return;  // already minimal
  std::vector<int32_t> table(static_cast<size_t>(kept) * num_classes_, kDead);
  std::vector<uint8_t> accepting(kept, 0), has_next(kept, 0);
  for (int32_t s = 0; s < n; ++s) {
    const int32_t to = id[block[s]];
    accepting[to] = accepting_[s];
    has_next[to] = has_next_[s];
    for (int32_t c = 0; c < num_classes_; ++c) {
      const int32_t t = table_[static_cast<size_t>(s) * num_classes_ + c];
      table[static_cast<size_t>(to) * num_classes_ + c] = t == kDead ? kDead : id[block[t]];
    }
  }
  table_ = std::move(table);
  accepting_ = std::move(accepting);
  has_next_ = std::move(has_next);
  start_ = id[block[start_]];
}

bool Dfa::Matches(std::string_view text) const {
  int32_t s = start_;
  for (char ch : text) {
    s = Next(s, static_cast<uint8_t>(ch));
    if (s == kDead) return false;
  }
  return accepting(s);
}

}  // namespace kvrm::structured
