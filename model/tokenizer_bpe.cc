#include "model/tokenizer_bpe.h"

#include <queue>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace kvrm::tok {
namespace {

absl::string_view AsAbsl(std::string_view s) { return absl::string_view(s.data(), s.size()); }

// Splits one merges entry: "a b" (legacy) or ["a", "b"].
absl::StatusOr<std::pair<std::string, std::string>> MergePair(const Json& m, const JsonPath& at) {
  if (m.is_string()) {
    const std::string& s = m.get_ref<const std::string&>();
    const size_t space = s.find(' ');
    if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
      return at.Invalid("expected \"left right\"");
    }
    return std::make_pair(s.substr(0, space), s.substr(space + 1));
  }
  if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
    return std::make_pair(m[0].get<std::string>(), m[1].get<std::string>());
  }
  return at.Invalid("expected \"left right\" or [\"left\", \"right\"]");
}

}  // namespace

absl::StatusOr<std::unique_ptr<BpeModel>> BpeModel::Parse(const Json& model, const JsonPath& at) {
  auto bpe = std::unique_ptr<BpeModel>(new BpeModel);
  const Json* vocab = Member(model, "vocab");
  if (vocab == nullptr || !vocab->is_object()) return at.Key("vocab").Invalid("expected an object");
  bpe->vocab_.reserve(vocab->size());
  for (const auto& [token, id] : vocab->items()) {
    const JsonPath here = at.Key("vocab").Key(absl::StrCat("\"", token, "\""));
    if (!id.is_number_integer()) return here.Invalid("expected an integer id");
    const bool huge = id.is_number_unsigned() && id.get<uint64_t>() >= uint64_t{kMaxTokenId};
    const int64_t v = huge ? kMaxTokenId : id.get<int64_t>();
    if (v < 0 || v >= kMaxTokenId) {
      return here.Invalid(absl::StrCat("id ", id.dump(), " out of range [0, ", kMaxTokenId, ")"));
    }
    bpe->vocab_.emplace(token, static_cast<int32_t>(v));
  }

  ASSIGN_OR_RETURN(std::string unk, OptionalString(model, "unk_token", at, ""));
  if (Member(model, "unk_token") != nullptr) bpe->unk_token_ = std::move(unk);
  ASSIGN_OR_RETURN(bpe->continuing_subword_prefix_,
                   OptionalString(model, "continuing_subword_prefix", at, ""));
  ASSIGN_OR_RETURN(bpe->end_of_word_suffix_, OptionalString(model, "end_of_word_suffix", at, ""));
  ASSIGN_OR_RETURN(bpe->fuse_unk_, OptionalBool(model, "fuse_unk", at, false));
  ASSIGN_OR_RETURN(bpe->byte_fallback_, OptionalBool(model, "byte_fallback", at, false));
  ASSIGN_OR_RETURN(bpe->ignore_merges_, OptionalBool(model, "ignore_merges", at, false));
  // "dropout" only randomizes merging for training-time augmentation; serving always merges
  // fully, which is what HF does with dropout null or 0.

  for (int b = 0; b < 256; ++b) {
    auto id = bpe->TokenToId(absl::StrFormat("<0x%02X>", b));
    bpe->byte_ids_[b] = id.value_or(-1);
  }

  const Json* merges = Member(model, "merges");
  static const Json* const kNoMerges = new Json(Json::array());
  if (merges == nullptr) merges = kNoMerges;  // a vocab-only BPE is valid
  if (!merges->is_array()) return at.Key("merges").Invalid("expected an array");
  const size_t prefix_len = bpe->continuing_subword_prefix_.size();
  bpe->merges_.reserve(merges->size());
  for (size_t i = 0; i < merges->size(); ++i) {
    const JsonPath here = at.Key("merges").Index(i);
    ASSIGN_OR_RETURN(const auto pair, MergePair((*merges)[i], here));
    const auto a = bpe->TokenToId(pair.first);
    const auto b = bpe->TokenToId(pair.second);
    if (!a) return here.Invalid(absl::StrCat("token \"", pair.first, "\" is not in model.vocab"));
    if (!b) return here.Invalid(absl::StrCat("token \"", pair.second, "\" is not in model.vocab"));
    if (pair.second.size() < prefix_len) return here.Invalid("right token shorter than the prefix");
    const std::string merged = pair.first + pair.second.substr(prefix_len);
    const auto merged_id = bpe->TokenToId(merged);
    if (!merged_id) return here.Invalid(absl::StrCat("merged token \"", merged, "\" is not in model.vocab"));
    // A repeated pair keeps its last rank, as HF's map insertion does.
    bpe->merges_[PairKey(*a, *b)] = Merge{static_cast<int32_t>(i), *merged_id};
  }
  return bpe;
}

std::optional<int32_t> BpeModel::TokenToId(std::string_view token) const {
  auto it = vocab_.find(AsAbsl(token));
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

absl::Status BpeModel::InitialSymbols(std::string_view piece, std::vector<int32_t>* symbols,
                                      std::vector<uint32_t>* lens) const {
  // Pending unknown run, fused when fuse_unk. Mirrors HF's merge_word, including that a pending
  // unk is not flushed before byte-fallback tokens.
  bool have_unk = false;
  int32_t unk_id = -1;
  uint32_t unk_len = 0;
  std::string buf;
  for (size_t i = 0; i < piece.size();) {
    const size_t len = Utf8Len(static_cast<unsigned char>(piece[i]));
    const bool is_first = i == 0;
    const bool is_last = i + len >= piece.size();
    std::string_view s = piece.substr(i, len);
    if ((!is_first && !continuing_subword_prefix_.empty()) ||
        (is_last && !end_of_word_suffix_.empty())) {
      buf.clear();
      if (!is_first) buf += continuing_subword_prefix_;
      buf.append(s);
      if (is_last) buf += end_of_word_suffix_;
      s = buf;
    }
    i += len;
    if (auto id = TokenToId(s)) {
      if (have_unk) {
        symbols->push_back(unk_id);
        lens->push_back(unk_len);
        have_unk = false;
      }
      symbols->push_back(*id);
      lens->push_back(static_cast<uint32_t>(len));
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char c : s) all = all && byte_ids_[static_cast<unsigned char>(c)] >= 0;
      if (all) {
        for (char c : s) {
          symbols->push_back(byte_ids_[static_cast<unsigned char>(c)]);
          lens->push_back(1);
        }
        continue;
      }
    }
    if (!unk_token_) continue;  // no unk token: HF drops the character
    const auto unk = TokenToId(*unk_token_);
    if (!unk) {
      return absl::FailedPreconditionError(
          absl::StrCat("tokenizer model.unk_token \"", *unk_token_, "\" is not in model.vocab"));
    }
    if (have_unk && fuse_unk_) {
      unk_len += static_cast<uint32_t>(len);
      continue;
    }
    if (have_unk) {
      symbols->push_back(unk_id);
      lens->push_back(unk_len);
    }
    have_unk = true;
    unk_id = *unk;
    unk_len = static_cast<uint32_t>(len);
  }
  if (have_unk) {
    symbols->push_back(unk_id);
    lens->push_back(unk_len);
  }
  return absl::OkStatus();
}

void BpeModel::MergeAll(std::vector<int32_t>* symbols, std::vector<uint32_t>* lens) const {
  const int n = static_cast<int>(symbols->size());
  if (n < 2) return;
  std::vector<int32_t>& c = *symbols;
  std::vector<uint32_t>& len = *lens;
  std::vector<int> prev(n), next(n);
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  // Min-heap on (rank, pos): the lowest-ranked merge first, leftmost among equal ranks, exactly
  // HF's Word::merge_all.
  struct Candidate {
    int32_t rank;
    int pos;
    int32_t new_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : pos > o.pos;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
  auto push = [&](int pos) {
    if (pos < 0 || next[pos] < 0) return;
    auto it = merges_.find(PairKey(c[pos], c[next[pos]]));
    if (it != merges_.end()) queue.push({it->second.rank, pos, it->second.new_id});
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!queue.empty()) {
    const Candidate top = queue.top();
    queue.pop();
    if (len[top.pos] == 0 || next[top.pos] < 0) continue;
    const int right = next[top.pos];
    // Skip stale entries: the pair at pos changed since this one was queued.
    auto it = merges_.find(PairKey(c[top.pos], c[right]));
    if (it == merges_.end() || it->second.new_id != top.new_id) continue;
    c[top.pos] = top.new_id;
    len[top.pos] += len[right];
    len[right] = 0;
    next[top.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = top.pos;
    push(prev[top.pos]);
    push(top.pos);
  }
  int out = 0;
  for (int i = 0; i < n; ++i) {
    if (len[i] != 0) {
      c[out] = c[i];
      len[out] = len[i];
      ++out;
    }
  }
  c.resize(out);
  len.resize(out);
}

absl::Status BpeModel::Tokenize(std::string_view piece, std::vector<int32_t>* ids) const {
  if (piece.empty()) return absl::OkStatus();
  if (ignore_merges_) {
    if (auto id = TokenToId(piece)) {
      ids->push_back(*id);
      return absl::OkStatus();
    }
  }
  std::vector<int32_t> symbols;
  std::vector<uint32_t> lens;
  symbols.reserve(piece.size());
  lens.reserve(piece.size());
  RETURN_IF_ERROR(InitialSymbols(piece, &symbols, &lens));
  MergeAll(&symbols, &lens);
  ids->insert(ids->end(), symbols.begin(), symbols.end());
  return absl::OkStatus();
}

}  // namespace kvrm::tok
