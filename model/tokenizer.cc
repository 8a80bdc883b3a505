#include "model/tokenizer.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/json.h"
#include "common/status_macros.h"
#include "model/tokenizer_added.h"
#include "model/tokenizer_bpe.h"
#include "model/tokenizer_decoder.h"
#include "model/tokenizer_normalizer.h"
#include "model/tokenizer_postprocessor.h"
#include "model/tokenizer_pretokenizer.h"
#include "model/tokenizer_text.h"

namespace kvrm {
namespace {

static_assert(kTokenizerMaxIds == tok::kMaxTokenId);

using tok::JsonPath;

absl::StatusOr<std::vector<tok::AddedToken>> ParseAddedTokens(const Json& root,
                                                              const JsonPath& root_at) {
  std::vector<tok::AddedToken> out;
  const Json* list = tok::Member(root, "added_tokens");
  const JsonPath at = root_at.Key("added_tokens");
  if (list == nullptr) return out;
  if (!list->is_array()) return at.Invalid("expected an array");
  for (size_t i = 0; i < list->size(); ++i) {
    const Json& j = (*list)[i];
    const JsonPath here = at.Index(i);
    if (!j.is_object()) return here.Invalid("expected an object");
    tok::AddedToken t;
    ASSIGN_OR_RETURN(t.content, tok::RequiredString(j, "content", here));
    if (t.content.empty()) return here.Key("content").Invalid("empty");
    const Json* id = tok::Member(j, "id");
    if (id == nullptr || !id->is_number_integer()) return here.Key("id").Invalid("expected an integer");
    if (id->is_number_unsigned() ? id->get<uint64_t>() >= uint64_t{tok::kMaxTokenId}
                                 : (id->get<int64_t>() < 0 || id->get<int64_t>() >= tok::kMaxTokenId)) {
      return here.Key("id").Invalid(
          absl::StrCat("id ", id->dump(), " out of range [0, ", tok::kMaxTokenId, ")"));
    }
    t.id = static_cast<int32_t>(id->get<int64_t>());
    ASSIGN_OR_RETURN(t.special, tok::OptionalBool(j, "special", here, false));
    ASSIGN_OR_RETURN(t.single_word, tok::OptionalBool(j, "single_word", here, false));
    ASSIGN_OR_RETURN(t.lstrip, tok::OptionalBool(j, "lstrip", here, false));
    ASSIGN_OR_RETURN(t.rstrip, tok::OptionalBool(j, "rstrip", here, false));
    ASSIGN_OR_RETURN(t.normalized, tok::OptionalBool(j, "normalized", here, !t.special));
    out.push_back(std::move(t));
  }
  return out;
}

}  // namespace

Tokenizer::Tokenizer() = default;
Tokenizer::~Tokenizer() = default;

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromFile(const std::string& path,
                                                               int32_t vocab_limit) {
  ASSIGN_OR_RETURN(const std::string text, ReadFileToString(path));
  return FromJson(text, path, vocab_limit);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromJson(std::string_view json,
                                                               std::string_view what,
                                                               int32_t vocab_limit) {
  std::unique_ptr<Tokenizer> t(new Tokenizer);
  RETURN_IF_ERROR(t->Load(json, what, vocab_limit));
  return t;
}

absl::Status Tokenizer::Load(std::string_view json, std::string_view what, int32_t vocab_limit) {
  ASSIGN_OR_RETURN(const Json root, ParseJson(json, what));
  const JsonPath at(std::string(what), "");
  if (!root.is_object()) return at.Invalid("expected a JSON object at the top level");

  const Json* model = tok::Member(root, "model");
  const JsonPath model_at = at.Key("model");
  if (model == nullptr || !model->is_object()) return model_at.Invalid("missing or not an object");
  ASSIGN_OR_RETURN(const std::string type, tok::OptionalString(*model, "type", model_at, "BPE"));
  if (type == "WordPiece" || type == "WordLevel" || type == "Unigram") {
    return model_at.Key("type").Unimplemented(absl::StrCat("model type \"", type, "\" is not supported"));
  }
  if (type != "BPE") return model_at.Key("type").Invalid(absl::StrCat("unknown model type \"", type, "\""));
  ASSIGN_OR_RETURN(model_, tok::BpeModel::Parse(*model, model_at));

  if (const Json* j = tok::Member(root, "normalizer")) {
    ASSIGN_OR_RETURN(normalizer_, tok::ParseNormalizer(*j, at.Key("normalizer")));
  }
  if (const Json* j = tok::Member(root, "pre_tokenizer")) {
    ASSIGN_OR_RETURN(pre_tokenizer_, tok::ParsePreTokenizer(*j, at.Key("pre_tokenizer")));
  }
  if (const Json* j = tok::Member(root, "post_processor")) {
    ASSIGN_OR_RETURN(post_processor_, tok::ParsePostProcessor(*j, at.Key("post_processor")));
  }
  if (const Json* j = tok::Member(root, "decoder")) {
    ASSIGN_OR_RETURN(decoder_, tok::ParseDecoder(*j, at.Key("decoder")));
  }
  // "truncation" and "padding" are not applied: the server bounds lengths itself and never
  // pads, and the tokenizer.json files of the supported models leave both null.

  ASSIGN_OR_RETURN(added_tokens_, ParseAddedTokens(root, at));

  // Dense id tables: model vocabulary first, added tokens override (HF looks added tokens up
  // first).
  int32_t max_id = -1;
  for (const auto& [token, id] : model_->vocab()) max_id = std::max(max_id, id);
  for (const auto& t : added_tokens_) max_id = std::max(max_id, t.id);
  if (max_id >= vocab_limit) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(what), ": token id ", max_id, " is outside the model's vocabulary of ",
                     vocab_limit, " (config.json vocab_size)"));
  }
  id_to_token_.assign(max_id + 1, std::string());
  has_token_.assign(max_id + 1, false);
  is_special_.assign(max_id + 1, false);
  for (const auto& [token, id] : model_->vocab()) {
    if (!has_token_[id]) {
      id_to_token_[id] = token;
      has_token_[id] = true;
    }
  }
  std::vector<const tok::AddedToken*> raw, normalized;
  std::vector<std::string> raw_patterns, normalized_patterns;
  // HF matches special tokens ahead of the others when contents collide.
  for (int pass = 0; pass < 2; ++pass) {
    for (const auto& t : added_tokens_) {
      if (t.special != (pass == 0)) continue;
      if (t.normalized) {
        std::string content = t.content;
        if (normalizer_ != nullptr) RETURN_IF_ERROR(normalizer_->Normalize(&content));
        normalized.push_back(&t);
        normalized_patterns.push_back(std::move(content));
      } else {
        raw.push_back(&t);
        raw_patterns.push_back(t.content);
      }
    }
  }
  for (const auto& t : added_tokens_) {
    id_to_token_[t.id] = t.content;
    has_token_[t.id] = true;
    is_special_[t.id] = t.special;
    added_ids_[t.content] = t.id;
    if (t.special) special_contents_.insert(t.content);
  }
  raw_matcher_ = std::make_unique<tok::AddedTokenMatcher>(std::move(raw), raw_patterns);
  normalized_matcher_ =
      std::make_unique<tok::AddedTokenMatcher>(std::move(normalized), normalized_patterns);
  if (post_processor_ != nullptr) {
    // Its ids go into every prompt with special tokens: one naming no token (beyond the
    // vocabulary) would index past the embedding table.
    std::vector<int32_t> inserted;
    post_processor_->InsertedIds(&inserted);
    for (int32_t id : inserted) {
      if (id >= static_cast<int32_t>(has_token_.size()) || !has_token_[id]) {
        return at.Key("post_processor")
            .Invalid(absl::StrCat("id ", id, " names no token of the vocabulary"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Tokenizer::SetSpecialTokensTemplate(std::optional<std::string_view> bos,
                                                 std::optional<std::string_view> eos) {
  std::optional<int32_t> ids[2];
  const std::optional<std::string_view>* tokens[2] = {&bos, &eos};
  for (int k = 0; k < 2; ++k) {
    if (!tokens[k]->has_value()) continue;
    ids[k] = TokenToId(**tokens[k]);
    if (!ids[k]) {
      return absl::InvalidArgumentError(absl::StrCat(
          k == 0 ? "bos_token \"" : "eos_token \"", std::string(**tokens[k]),
          "\" is not a token of the vocabulary"));
    }
  }
  post_processor_ = tok::MakeSingleTemplate(ids[0], ids[1]);
  return absl::OkStatus();
}

absl::Status Tokenizer::EncodeSegment(std::string text, bool at_start,
                                      std::vector<int32_t>* ids) const {
  if (normalizer_ != nullptr) RETURN_IF_ERROR(normalizer_->Normalize(&text));
  for (const tok::AddedSplit& split : normalized_matcher_->Split(text)) {
    if (split.start == split.end) continue;  // HF drops empty splits
    if (split.id >= 0) {
      ids->push_back(split.id);
      continue;
    }
    std::vector<tok::Piece> pieces;
    pieces.push_back({text.substr(split.start, split.end - split.start), at_start && split.start == 0});
    if (pre_tokenizer_ != nullptr) pre_tokenizer_->PreTokenize(&pieces);
    for (const tok::Piece& piece : pieces) RETURN_IF_ERROR(model_->Tokenize(piece.text, ids));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<int32_t>> Tokenizer::Encode(std::string_view text,
                                                       bool add_special_tokens) const {
  if (!tok::IsValidUtf8(text)) return absl::InvalidArgumentError("text: not valid UTF-8");
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 4);
  for (const tok::AddedSplit& split : raw_matcher_->Split(text)) {
    if (split.start == split.end) continue;
    if (split.id >= 0) {
      ids.push_back(split.id);
    } else {
      RETURN_IF_ERROR(EncodeSegment(std::string(text.substr(split.start, split.end - split.start)),
                                    split.start == 0, &ids));
    }
  }
  if (add_special_tokens && post_processor_ != nullptr) post_processor_->Process(&ids);
  return ids;
}

std::vector<int32_t> Tokenizer::JoinPair(const std::vector<int32_t>& a,
                                         const std::vector<int32_t>& b,
                                         bool add_special_tokens) const {
  if (add_special_tokens && post_processor_ != nullptr) return post_processor_->ProcessPair(a, b);
  std::vector<int32_t> out = a;
  out.insert(out.end(), b.begin(), b.end());
  return out;
}

std::vector<std::string> Tokenizer::IdsToTokens(absl::Span<const int32_t> ids,
                                                bool skip_special_tokens,
                                                absl::Span<const int32_t> kept) const {
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (const int32_t id : ids) {
    if (id < 0 || id >= vocab_size() || !has_token_[id]) continue;
    const std::string& token = id_to_token_[id];
    // HF skips by content: any token spelled like a special token.
    if (skip_special_tokens && special_contents_.contains(token) &&
        std::find(kept.begin(), kept.end(), id) == kept.end()) {
      continue;
    }
    tokens.push_back(token);
  }
  return tokens;
}

std::string Tokenizer::DecodeTokens(std::vector<std::string>* tokens, bool lossy) const {
  std::string out;
  if (decoder_ != nullptr) {
    decoder_->DecodeChain(tokens, lossy);
    for (const std::string& t : *tokens) out += t;
  } else {
    for (size_t i = 0; i < tokens->size(); ++i) {
      if (i > 0) out += ' ';
      out += (*tokens)[i];
    }
  }
  return out;
}

std::string Tokenizer::DecodeText(absl::Span<const int32_t> ids, bool skip_special_tokens,
                                  absl::Span<const int32_t> kept) const {
  std::vector<std::string> tokens = IdsToTokens(ids, skip_special_tokens, kept);
  std::string out = DecodeTokens(&tokens, /*lossy=*/true);
  // Decoders only emit valid UTF-8 today; this keeps the promise if one ever does not.
  return tok::IsValidUtf8(out) ? out : tok::Utf8Lossy(out);
}

std::string Tokenizer::Decode(absl::Span<const int32_t> ids, bool skip_special_tokens) const {
  return DecodeText(ids, skip_special_tokens, {});
}

std::string Tokenizer::DecodeKeeping(absl::Span<const int32_t> ids,
                                     absl::Span<const int32_t> kept) const {
  return DecodeText(ids, /*skip_special_tokens=*/true, kept);
}

std::string Tokenizer::DecodeBytes(absl::Span<const int32_t> ids, bool skip_special_tokens) const {
  std::vector<std::string> tokens = IdsToTokens(ids, skip_special_tokens);
  return DecodeTokens(&tokens, /*lossy=*/false);
}

// The context should be plain text that no decoder step rewrites or merges with what follows, so
// the token after it gets the mid-text treatment (Metaspace's rule for later tokens; a Strip of
// the text's first space finds none, since the context does not start with one) and nothing
// else. In order:
//  1. a token that is spelled as, and decodes to, a single ASCII letter ("a" in every supported
//     vocabulary; spelled as itself rules out a byte-fallback "<0x61>", whose run would merge
//     with following byte tokens);
//  2. the first token that decodes to non-empty printable ASCII with no whitespace;
//  3. the first token that decodes to anything non-empty not starting with ASCII whitespace;
//  4. none: each token is decoded alone, so a decoder that drops a first token's leading space
//     makes the entries the text-start forms. Only a vocabulary without any such token gets here.
// Special tokens, and tokens spelled like one, are never the context.
std::optional<int32_t> Tokenizer::ContinuationContext() const {
  auto usable = [&](int32_t id) {
    return id >= 0 && id < vocab_size() && has_token_[id] && !is_special_[id] &&
           !special_contents_.contains(id_to_token_[id]);
  };
  for (const char* letters : {"abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ"}) {
    for (const char* c = letters; *c != '\0'; ++c) {
      const std::string letter(1, *c);
      const std::optional<int32_t> id = TokenToId(letter);
      if (id.has_value() && usable(*id) && DecodeBytes({*id}, false) == letter) return *id;
    }
  }
  std::optional<int32_t> any_text;
  for (int32_t id = 0; id < vocab_size(); ++id) {
    if (!usable(id)) continue;
    const std::string text = DecodeBytes({id}, false);
    if (text.empty() || text[0] == ' ' || (text[0] >= '\t' && text[0] <= '\r')) continue;
    bool printable_ascii = true;
    for (const char c : text) printable_ascii = printable_ascii && c > ' ' && c < 0x7F;
    if (printable_ascii) return id;
    if (!any_text.has_value()) any_text = id;
  }
  return any_text;
}

std::vector<std::optional<std::string>> Tokenizer::TokenContinuationBytes() const {
  std::vector<std::optional<std::string>> out(vocab_size());
  const std::optional<int32_t> context = ContinuationContext();
  const std::string prefix = context.has_value() ? DecodeBytes({*context}, false) : "";
  std::vector<std::string> tokens;
  for (int32_t id = 0; id < vocab_size(); ++id) {
    const std::string& token = id_to_token_[id];
    if (!has_token_[id] || is_special_[id] || special_contents_.contains(token)) continue;
    tokens.clear();
    if (context.has_value()) tokens.push_back(id_to_token_[*context]);
    tokens.push_back(token);
    std::string bytes = DecodeTokens(&tokens, /*lossy=*/false);
    if (bytes.compare(0, prefix.size(), prefix) != 0) continue;  // no well-defined difference
    bytes.erase(0, prefix.size());
    out[id] = std::move(bytes);
  }
  return out;
}

std::optional<int32_t> Tokenizer::TokenToId(std::string_view token) const {
  auto it = added_ids_.find(absl::string_view(token.data(), token.size()));
  if (it != added_ids_.end()) return it->second;
  return model_->TokenToId(token);
}

std::string_view Tokenizer::IdToToken(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return id_to_token_[id];
}

bool Tokenizer::IsSpecial(int32_t id) const {
  return id >= 0 && id < vocab_size() && is_special_[id];
}

std::optional<int32_t> Tokenizer::bos_id() const {
  return post_processor_ == nullptr ? std::nullopt : post_processor_->bos_id();
}

}  // namespace kvrm
