#include "model/gguf_tokenizer.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <string_view>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/json.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "model/gguf_vocab.h"
#include "model/tokenizer_text.h"

namespace kvrm {
namespace {

using namespace gguf_vocab;  // NOLINT: the token types and splits

// llama.cpp's pre-tokenizers (llama-vocab.cpp), by tokenizer.ggml.pre: the regexes applied in
// turn before the byte-level encoding, whether a word that is a whole token is taken as it is
// (Llama 3's ignore_merges), and whether BOS is added by default.
struct PreTokenizerSpec {
  std::vector<absl::string_view> names;
  std::vector<absl::string_view> regexes;
  bool ignore_merges = false;
  bool add_bos = false;
};

const std::vector<PreTokenizerSpec>& PreTokenizers() {
  static const auto* specs = new std::vector<PreTokenizerSpec>{
      {{"llama3", "llama-v3", "llama-bpe", "falcon3"}, {kLlama3Split}, true, true},
      {{"qwen2", "stablelm2", "megrez"}, {kQwen2Split}},
      {{"gpt-4o", "llama4"}, {kGpt4oSplit}},
      {{"gpt-2", "phi-2", "roberta-bpe", "mpt", "olmo", "jais", "gigachat"}, {kGpt2Split}},
      {{"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"},
       {R"(\p{N})", kGpt2Split}},
      {{"default"}, {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2Split, R"(\p{N}+)", "[0-9][0-9][0-9]"}},
  };
  return *specs;
}

// Texts llama.cpp takes as an end of generation whatever the id keys say (llama-vocab.cpp).
constexpr absl::string_view kEndOfGenerationTexts[] = {
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<EOT>",
    "_<EOT>",
    "<end_of_utterance>",
    "<\xef\xbd\x9c"
    "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>"};

// SentencePiece pieces longer than this make no merges (finding a piece's splits costs its length
// squared; sentencepiece's own limit is 16 characters, and a hostile file could hold megabytes).
constexpr size_t kMaxMergePieceBytes = 128;

// The vocabulary as llama.cpp reads it.
struct Vocab {
  bool spm = false;  // "llama"; else "gpt2"
  absl::Span<const absl::string_view> tokens;
  std::vector<int> types;
  const PreTokenizerSpec* pre = nullptr;  // gpt2 only
  int64_t unk = -1;
  GgufSpecialTokens special;
};

// An optional id key: -1 when absent; one outside the vocabulary is ignored, as llama.cpp does.
absl::StatusOr<int64_t> OptionalId(const GgufFile& f, const std::string& key, size_t vocab) {
  if (f.Find(key) == nullptr) return -1;
  ASSIGN_OR_RETURN(uint64_t id, f.GetUint(key));
  if (id >= vocab) {
    LOG(WARNING) << f.path() << ": " << key << " " << id << " is outside the vocabulary (" << vocab
                 << " tokens): ignored";
    return -1;
  }
  return static_cast<int64_t>(id);
}

absl::StatusOr<bool> OptionalBool(const GgufFile& f, const std::string& key, bool fallback) {
  if (f.Find(key) == nullptr) return fallback;
  return f.GetBool(key);
}

// A numeric array key that must have one entry per token (its length checked before it is read).
absl::StatusOr<std::vector<double>> PerToken(const GgufFile& f, const std::string& key, size_t n) {
  if (const GgufValue* v = f.Find(key); v != nullptr && v->count != n) {
    return f.Invalid(key, absl::StrCat(v->count, " entries for ", n, " tokens"));
  }
  return f.GetNumberArray(key);
}

absl::StatusOr<Vocab> ReadVocab(const GgufFile& f) {
  Vocab v;
  ASSIGN_OR_RETURN(const absl::string_view model, f.GetString("tokenizer.ggml.model"));
  if (model != "gpt2" && model != "llama") {
    return f.Unimplemented("tokenizer.ggml.model",
                           absl::StrCat("\"", model, "\" is not supported (gpt2, llama)"));
  }
  v.spm = model == "llama";
  ASSIGN_OR_RETURN(v.tokens, f.GetStringArray("tokenizer.ggml.tokens"));
  const size_t n = v.tokens.size();
  if (n == 0) return f.Invalid("tokenizer.ggml.tokens", "is empty");
  // Token texts are UTF-8 in every tokenizer llama.cpp converts (byte-level symbols, or <0xXX>
  // for SentencePiece bytes), and tokenizer.json cannot hold anything else.
  for (size_t i = 0; i < n; ++i) {
    if (!tok::IsValidUtf8(std::string_view(v.tokens[i].data(), v.tokens[i].size()))) {
      return f.Invalid("tokenizer.ggml.tokens", absl::StrCat("token ", i, " is not UTF-8"));
    }
  }
  v.types.assign(n, kNormal);
  if (f.Find("tokenizer.ggml.token_type") != nullptr) {
    ASSIGN_OR_RETURN(const std::vector<double> t, PerToken(f, "tokenizer.ggml.token_type", n));
    for (size_t i = 0; i < n; ++i) {
      if (!(t[i] >= 0 && t[i] <= kByte) || t[i] != std::floor(t[i])) {
        return f.Invalid("tokenizer.ggml.token_type",
                         absl::StrCat("entry ", i, " (", t[i], ") is not a token type (0 to 6)"));
      }
      v.types[i] = static_cast<int>(t[i]);
    }
  }
  if (!v.spm) {
    absl::string_view pre = "default";
    if (f.Find("tokenizer.ggml.pre") != nullptr) {
      ASSIGN_OR_RETURN(pre, f.GetString("tokenizer.ggml.pre"));
    }
    for (const PreTokenizerSpec& s : PreTokenizers()) {
      if (std::find(s.names.begin(), s.names.end(), pre) != s.names.end()) v.pre = &s;
    }
    if (v.pre == nullptr) {
      return f.Unimplemented(
          "tokenizer.ggml.pre",
          absl::StrCat("\"", pre,
                       "\" is not supported (llama-bpe, qwen2, gpt-4o, gpt-2, smollm, default and "
                       "their aliases)"));
    }
  }
  GgufSpecialTokens& s = v.special;
  ASSIGN_OR_RETURN(s.bos, OptionalId(f, "tokenizer.ggml.bos_token_id", n));
  ASSIGN_OR_RETURN(s.eos, OptionalId(f, "tokenizer.ggml.eos_token_id", n));
  ASSIGN_OR_RETURN(v.unk, OptionalId(f, "tokenizer.ggml.unknown_token_id", n));
  if (v.spm) {  // llama.cpp's defaults for a SentencePiece vocabulary
    if (s.bos < 0 && n > 1) s.bos = 1;
    if (s.eos < 0 && n > 2) s.eos = 2;
    if (v.unk < 0) v.unk = 0;
  }
  auto end = [&](int64_t id) {
    if (id >= 0 && std::find(s.end_of_generation.begin(), s.end_of_generation.end(), id) ==
                       s.end_of_generation.end()) {
      s.end_of_generation.push_back(static_cast<int32_t>(id));
    }
  };
  end(s.eos);
  for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    ASSIGN_OR_RETURN(const int64_t id, OptionalId(f, key, n));
    end(id);
  }
  for (size_t i = 0; i < n; ++i) {
    if (std::find(std::begin(kEndOfGenerationTexts), std::end(kEndOfGenerationTexts),
                  v.tokens[i]) != std::end(kEndOfGenerationTexts)) {
      end(static_cast<int64_t>(i));
    }
  }
  // o200k_harmony (gpt-oss): <|end|> closes every message, the analysis one included; a reply
  // ends at <|return|> or <|call|>. As llama.cpp: with both of those, <|end|> ends nothing.
  auto text_ends = [&](absl::string_view text) {
    return std::any_of(s.end_of_generation.begin(), s.end_of_generation.end(),
                       [&](int32_t id) { return v.tokens[id] == text; });
  };
  if (text_ends("<|return|>") && text_ends("<|call|>")) {
    s.end_of_generation.erase(std::remove_if(s.end_of_generation.begin(), s.end_of_generation.end(),
                                             [&](int32_t id) { return v.tokens[id] == "<|end|>"; }),
                              s.end_of_generation.end());
  }
  ASSIGN_OR_RETURN(s.add_bos,
                   OptionalBool(f, "tokenizer.ggml.add_bos_token", v.spm || v.pre->add_bos));
  ASSIGN_OR_RETURN(s.add_eos, OptionalBool(f, "tokenizer.ggml.add_eos_token", false));
  return v;
}

Json ReplaceJson(absl::string_view from, absl::string_view to) {
  return Json{{"type", "Replace"},
              {"pattern", {{"String", std::string(from)}}},
              {"content", std::string(to)}};
}

// Transformers' generate_merges for SentencePiece BPE: every split of a piece into two pieces of
// the vocabulary is a merge; merges go by the merged piece's score, highest first (pieces in id
// order on ties), and one piece's splits by the ids of their halves. [left, right] pairs (a
// user-defined piece may hold a space).
Json MergesFromScores(const Vocab& v, const std::vector<double>& scores) {
  absl::flat_hash_map<absl::string_view, int32_t> ids;
  for (size_t i = 0; i < v.tokens.size(); ++i) ids[v.tokens[i]] = static_cast<int32_t>(i);
  struct Merge {
    double score;
    int32_t piece, left, right;
    size_t split;
  };
  std::vector<Merge> merges;
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    const absl::string_view piece = v.tokens[i];
    if ((v.types[i] != kNormal && v.types[i] != kUserDefined) ||
        piece.size() > kMaxMergePieceBytes) {
      continue;
    }
    const size_t first = merges.size();
    for (size_t k = 1; k < piece.size(); ++k) {
      auto l = ids.find(piece.substr(0, k));
      auto r = ids.find(piece.substr(k));
      if (l == ids.end() || r == ids.end()) continue;
      merges.push_back(Merge{scores[i], static_cast<int32_t>(i), l->second, r->second, k});
    }
    std::sort(merges.begin() + first, merges.end(), [](const Merge& a, const Merge& b) {
      return std::pair(a.left, a.right) < std::pair(b.left, b.right);
    });
  }
  std::stable_sort(merges.begin(), merges.end(),
                   [](const Merge& a, const Merge& b) { return a.score > b.score; });
  Json out = Json::array();
  for (const Merge& m : merges) {
    const absl::string_view piece = v.tokens[m.piece];
    out.push_back({std::string(piece.substr(0, m.split)), std::string(piece.substr(m.split))});
  }
  return out;
}

// The BPE model and the components around it of a SentencePiece vocabulary.
absl::Status SpmJson(const GgufFile& f, const Vocab& v, Json* j) {
  std::vector<double> scores(v.tokens.size(), 0.0);
  if (f.Find("tokenizer.ggml.scores") != nullptr) {
    ASSIGN_OR_RETURN(scores, PerToken(f, "tokenizer.ggml.scores", v.tokens.size()));
    for (size_t i = 0; i < scores.size(); ++i) {
      if (!std::isfinite(scores[i])) {
        return f.Invalid("tokenizer.ggml.scores", absl::StrCat("entry ", i, " is not finite"));
      }
    }
  }
  ASSIGN_OR_RETURN(const bool space_prefix,
                   OptionalBool(f, "tokenizer.ggml.add_space_prefix", true));
  Json normalizers = Json::array();
  if (space_prefix) normalizers.push_back({{"type", "Prepend"}, {"prepend", "\u2581"}});
  normalizers.push_back(ReplaceJson(" ", "\u2581"));
  (*j)["normalizer"] = {{"type", "Sequence"}, {"normalizers", normalizers}};
  (*j)["pre_tokenizer"] = nullptr;
  Json decoders = {ReplaceJson("\u2581", " "), {{"type", "ByteFallback"}}, {{"type", "Fuse"}}};
  if (space_prefix) {
    decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  }
  (*j)["decoder"] = {{"type", "Sequence"}, {"decoders", decoders}};
  Json& bpe = (*j)["model"];
  bpe["unk_token"] = v.unk >= 0 ? Json(std::string(v.tokens[v.unk])) : Json(nullptr);
  bpe["fuse_unk"] = true;
  bpe["byte_fallback"] = true;
  bpe["ignore_merges"] = false;
  bpe["merges"] = MergesFromScores(v, scores);
  return absl::OkStatus();
}

// The same for a byte-level BPE.
absl::Status BpeJson(const GgufFile& f, const Vocab& v, Json* j) {
  Json pretokenizers = Json::array();
  for (absl::string_view regex : v.pre->regexes) {
    pretokenizers.push_back({{"type", "Split"},
                             {"pattern", {{"Regex", std::string(regex)}}},
                             {"behavior", "Isolated"},
                             {"invert", false}});
  }
  const Json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", false},
                           {"use_regex", false}};
  pretokenizers.push_back(byte_level);
  (*j)["normalizer"] = nullptr;
  (*j)["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", pretokenizers}};
  (*j)["decoder"] = byte_level;
  ASSIGN_OR_RETURN(const absl::Span<const absl::string_view> merges,
                   f.GetStringArray("tokenizer.ggml.merges"));
  Json pairs = Json::array();
  for (size_t i = 0; i < merges.size(); ++i) {
    const absl::string_view m = merges[i];
    // Split at the first space after the first byte, as llama.cpp does.
    const size_t space = m.size() > 1 ? m.find(' ', 1) : absl::string_view::npos;
    if (space == absl::string_view::npos ||
        !tok::IsValidUtf8(std::string_view(m.data(), m.size()))) {
      return f.Invalid("tokenizer.ggml.merges",
                       absl::StrCat("merge ", i, " is not two UTF-8 texts and a space"));
    }
    pairs.push_back({std::string(m.substr(0, space)), std::string(m.substr(space + 1))});
  }
  Json& bpe = (*j)["model"];
  bpe["unk_token"] = nullptr;
  bpe["fuse_unk"] = false;
  bpe["byte_fallback"] = false;
  bpe["ignore_merges"] = v.pre->ignore_merges;
  bpe["merges"] = std::move(pairs);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<GgufSpecialTokens> ReadGgufSpecialTokens(const GgufFile& file) {
  ASSIGN_OR_RETURN(Vocab v, ReadVocab(file));
  return std::move(v.special);
}

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadGgufTokenizer(const GgufFile& f,
                                                             int32_t vocab_limit) {
  ASSIGN_OR_RETURN(const Vocab v, ReadVocab(f));
  Json vocab = Json::object();
  Json added = Json::array();
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    const std::string text(v.tokens[i]);
    if (text.empty()) continue;  // nothing can produce it, and JSON cannot key it twice
    vocab[text] = i;             // a text given twice is the later id's, as in llama.cpp
    if (v.types[i] == kControl || v.types[i] == kUserDefined || v.types[i] == kUnknown ||
        static_cast<int64_t>(i) == v.unk) {
      added.push_back({{"id", i},
                       {"content", text},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", v.types[i] != kUserDefined}});
    }
  }
  Json j = {{"version", "1.0"},
            {"truncation", nullptr},
            {"padding", nullptr},
            {"added_tokens", std::move(added)},
            {"post_processor", nullptr},
            {"model",
             {{"type", "BPE"},
              {"dropout", nullptr},
              {"continuing_subword_prefix", nullptr},
              {"end_of_word_suffix", nullptr},
              {"vocab", std::move(vocab)}}}};
  RETURN_IF_ERROR(v.spm ? SpmJson(f, v, &j) : BpeJson(f, v, &j));
  ASSIGN_OR_RETURN(
      std::unique_ptr<Tokenizer> tokenizer,
      Tokenizer::FromJson(j.dump(), absl::StrCat(f.path(), " (tokenizer)"), vocab_limit));
  const GgufSpecialTokens& s = v.special;
  auto text = [&](bool add, int64_t id) -> std::optional<std::string_view> {
    if (!add || id < 0) return std::nullopt;
    return std::string_view(v.tokens[id].data(), v.tokens[id].size());
  };
  RETURN_IF_ERROR(
      tokenizer->SetSpecialTokensTemplate(text(s.add_bos, s.bos), text(s.add_eos, s.eos)));
  return tokenizer;
}

}  // namespace kvrm
