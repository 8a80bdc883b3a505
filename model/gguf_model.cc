#include "model/gguf_model.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string_view>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/json.h"
#include "common/status_macros.h"
#include "model/gguf_quants.h"
#include "model/tokenizer_text.h"

namespace kvrm {
namespace {

// llama.h's llama_token_type.
enum TokenType : int {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6,
};

constexpr char kPrefix[] = "llama.";  // the metadata of general.architecture "llama"

absl::Status Unimplemented(const GgufFile& f, absl::string_view key, absl::string_view problem) {
  return absl::UnimplementedError(absl::StrCat(f.path(), ": ", key, ": ", problem));
}
absl::Status Invalid(const GgufFile& f, absl::string_view key, absl::string_view problem) {
  return absl::InvalidArgumentError(absl::StrCat(f.path(), ": ", key, ": ", problem));
}

// A per-layer integer hyperparameter: a scalar, or an array whose entries all agree (llama.cpp
// allows them to differ; the engine's layers are all alike).
absl::StatusOr<uint64_t> LayerUint(const GgufFile& f, const std::string& key) {
  const GgufValue* v = f.Find(key);
  if (v == nullptr || v->type != GgufValueType::kArray) return f.GetUint(key);
  ASSIGN_OR_RETURN(std::vector<double> all, f.GetNumberArray(key));
  // (Range first: converting a double past uint64_t's range is undefined.)
  if (all.empty() || !(all[0] >= 0 && all[0] < 0x1p63) || all[0] != std::floor(all[0])) {
    return Invalid(f, key, "expected non-negative integers, one per layer");
  }
  for (double x : all) {
    if (x != all[0]) return Unimplemented(f, key, "differs between layers");
  }
  return static_cast<uint64_t>(all[0]);
}

// An optional token id key, checked against the vocabulary (-1 when absent).
absl::StatusOr<int64_t> TokenId(const GgufFile& f, const std::string& key, size_t vocab) {
  if (f.Find(key) == nullptr) return -1;
  ASSIGN_OR_RETURN(uint64_t id, f.GetUint(key));
  if (id >= vocab) {
    return Invalid(f, key, absl::StrCat(id, " is outside the vocabulary (", vocab, " tokens)"));
  }
  return static_cast<int64_t>(id);
}

absl::StatusOr<bool> OptionalBool(const GgufFile& f, const std::string& key, bool fallback) {
  if (f.Find(key) == nullptr) return fallback;
  return f.GetBool(key);
}

// ---- tokenizer ----------------------------------------------------------------------------

// llama.cpp's pre-tokenizers (llama-vocab.cpp), by tokenizer.ggml.pre: the regexes applied in
// turn before the byte-level encoding, and whether a word that is a whole token is taken as it
// is (Llama 3's ignore_merges).
struct PreTokenizerSpec {
  std::vector<absl::string_view> names;
  std::vector<absl::string_view> regexes;
  bool ignore_merges = false;
  bool add_bos = false;  // llama.cpp's default for add_bos_token
};

// The GPT-2 split, also the last of "default" and "smollm".
constexpr absl::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";

const std::vector<PreTokenizerSpec>& PreTokenizers() {
  static const auto* specs = new std::vector<PreTokenizerSpec>{
      {{"llama3", "llama-v3", "llama-bpe", "falcon3"},
       {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
       /*ignore_merges=*/true,
       /*add_bos=*/true},
      {{"qwen2", "stablelm2", "megrez"},
       {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}},
      {{"gpt-2", "phi-2", "roberta-bpe", "mpt", "olmo", "jais", "gigachat"}, {kGpt2Regex}},
      {{"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"},
       {R"(\p{N})", kGpt2Regex}},
      {{"default"}, {R"([\p{P}\$\+<=>\^~\|]+)", kGpt2Regex, R"(\p{N}+)", "[0-9][0-9][0-9]"}},
  };
  return *specs;
}

Json ReplaceJson(absl::string_view from, absl::string_view to) {
  return Json{{"type", "Replace"},
              {"pattern", {{"String", std::string(from)}}},
              {"content", std::string(to)}};
}

// TemplateProcessing that adds BOS and/or EOS (null when neither).
Json SpecialTokensTemplate(const std::string* bos, int64_t bos_id, const std::string* eos,
                           int64_t eos_id) {
  if (bos == nullptr && eos == nullptr) return nullptr;
  Json single = Json::array(), pair = Json::array(), specials = Json::object();
  auto special = [&](const std::string& text, int64_t id, int type_id, Json* seq) {
    seq->push_back({{"SpecialToken", {{"id", text}, {"type_id", type_id}}}});
    specials[text] = {{"id", text}, {"ids", {id}}, {"tokens", {text}}};
  };
  auto sequence = [](const char* which, int type_id, Json* seq) {
    seq->push_back({{"Sequence", {{"id", which}, {"type_id", type_id}}}});
  };
  for (int part = 0; part < 2; ++part) {
    Json* seq = part == 0 ? &single : &pair;
    for (int s = 0; s <= part; ++s) {
      if (bos != nullptr) special(*bos, bos_id, s, seq);
      sequence(s == 0 ? "A" : "B", s, seq);
      if (eos != nullptr) special(*eos, eos_id, s, seq);
    }
  }
  return Json{{"type", "TemplateProcessing"},
              {"single", single},
              {"pair", pair},
              {"special_tokens", specials}};
}

// Transformers' generate_merges for SentencePiece BPE: every split of a piece into two pieces
// of the vocabulary is a merge; merges go by the merged piece's score, highest first (pieces in
// id order on ties), and one piece's splits by the ids of their halves.
std::vector<std::string> MergesFromScores(absl::Span<const absl::string_view> tokens,
                                          const std::vector<int>& types,
                                          const std::vector<double>& scores) {
  absl::flat_hash_map<absl::string_view, int32_t> ids;
  for (size_t i = 0; i < tokens.size(); ++i) ids.emplace(tokens[i], static_cast<int32_t>(i));
  struct Merge {
    double score;
    int32_t piece, left, right;
    size_t split;
  };
  std::vector<Merge> merges;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (types[i] != kNormal && types[i] != kUserDefined) continue;
    const absl::string_view piece = tokens[i];
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
  std::vector<std::string> out;
  out.reserve(merges.size());
  for (const Merge& m : merges) {
    const absl::string_view piece = tokens[m.piece];
    out.push_back(absl::StrCat(piece.substr(0, m.split), " ", piece.substr(m.split)));
  }
  return out;
}

}  // namespace

int64_t GgufRopeRowToHf(int64_t row, int64_t head_dim) {
  const int64_t h = row / head_dim, w = row % head_dim;
  return h * head_dim + (w % 2) * (head_dim / 2) + w / 2;
}

absl::StatusOr<std::string> GgufTokenizerJson(const GgufFile& f) {
  ASSIGN_OR_RETURN(const absl::string_view model, f.GetString("tokenizer.ggml.model"));
  if (model != "gpt2" && model != "llama") {
    return Unimplemented(f, "tokenizer.ggml.model",
                         absl::StrCat("\"", model, "\" is not supported (gpt2, llama)"));
  }
  const bool spm = model == "llama";
  ASSIGN_OR_RETURN(const absl::Span<const absl::string_view> tokens,
                   f.GetStringArray("tokenizer.ggml.tokens"));
  if (tokens.empty()) return Invalid(f, "tokenizer.ggml.tokens", "is empty");
  const size_t n = tokens.size();
  // Token texts are UTF-8 in every tokenizer llama.cpp converts (byte-level symbols, or <0xXX>
  // for SentencePiece bytes), and tokenizer.json cannot hold anything else.
  for (size_t i = 0; i < n; ++i) {
    if (!tok::IsValidUtf8(std::string_view(tokens[i].data(), tokens[i].size()))) {
      return Invalid(f, "tokenizer.ggml.tokens", absl::StrCat("token ", i, " is not UTF-8"));
    }
  }
  std::vector<int> types(n, kNormal);
  if (f.Find("tokenizer.ggml.token_type") != nullptr) {
    ASSIGN_OR_RETURN(std::vector<double> t, f.GetNumberArray("tokenizer.ggml.token_type"));
    if (t.size() != n) {
      return Invalid(f, "tokenizer.ggml.token_type",
                     absl::StrCat(t.size(), " entries for ", n, " tokens"));
    }
    for (size_t i = 0; i < n; ++i) {
      if (!(t[i] >= 0 && t[i] <= kByte) || t[i] != std::floor(t[i])) {
        return Invalid(f, "tokenizer.ggml.token_type",
                       absl::StrCat("entry ", i, " (", t[i], ") is not a token type (0 to 6)"));
      }
      types[i] = static_cast<int>(t[i]);
    }
  }
  std::vector<double> scores(n, 0.0);
  if (f.Find("tokenizer.ggml.scores") != nullptr) {
    ASSIGN_OR_RETURN(scores, f.GetNumberArray("tokenizer.ggml.scores"));
    if (scores.size() != n) {
      return Invalid(f, "tokenizer.ggml.scores",
                     absl::StrCat(scores.size(), " entries for ", n, " tokens"));
    }
  }
  // llama.cpp's defaults for a SentencePiece vocabulary; a byte-level one has none.
  ASSIGN_OR_RETURN(int64_t bos, TokenId(f, "tokenizer.ggml.bos_token_id", n));
  ASSIGN_OR_RETURN(int64_t eos, TokenId(f, "tokenizer.ggml.eos_token_id", n));
  ASSIGN_OR_RETURN(int64_t unk, TokenId(f, "tokenizer.ggml.unknown_token_id", n));
  if (spm) {
    if (bos < 0 && n > 1) bos = 1;
    if (eos < 0 && n > 2) eos = 2;
    if (unk < 0) unk = 0;
  }

  Json vocab = Json::object();
  Json added = Json::array();
  for (size_t i = 0; i < n; ++i) {
    const std::string text(tokens[i]);
    if (text.empty()) continue;  // nothing can produce it, and JSON cannot key it twice
    if (!vocab.contains(text)) vocab[text] = i;
    if (types[i] == kControl || types[i] == kUserDefined || types[i] == kUnknown ||
        (spm && static_cast<int64_t>(i) == unk)) {
      added.push_back({{"id", i},
                       {"content", text},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", types[i] != kUserDefined}});
    }
  }
  Json j = Json::object();
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = std::move(added);
  Json bpe = {{"type", "BPE"},
              {"dropout", nullptr},
              {"continuing_subword_prefix", nullptr},
              {"end_of_word_suffix", nullptr}};
  bool add_bos;
  if (spm) {
    ASSIGN_OR_RETURN(const bool space_prefix,
                     OptionalBool(f, "tokenizer.ggml.add_space_prefix", true));
    Json normalizers = Json::array();
    if (space_prefix) normalizers.push_back({{"type", "Prepend"}, {"prepend", "\u2581"}});
    normalizers.push_back(ReplaceJson(" ", "\u2581"));
    j["normalizer"] = {{"type", "Sequence"}, {"normalizers", normalizers}};
    j["pre_tokenizer"] = nullptr;
    Json decoders = {ReplaceJson("\u2581", " "), {{"type", "ByteFallback"}}, {{"type", "Fuse"}}};
    if (space_prefix) {
      decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
    }
    j["decoder"] = {{"type", "Sequence"}, {"decoders", decoders}};
    bpe["unk_token"] = unk >= 0 ? Json(std::string(tokens[unk])) : Json(nullptr);
    bpe["fuse_unk"] = true;
    bpe["byte_fallback"] = true;
    bpe["ignore_merges"] = false;
    bpe["merges"] = MergesFromScores(tokens, types, scores);
    add_bos = true;
  } else {
    absl::string_view pre = "default";
    if (f.Find("tokenizer.ggml.pre") != nullptr) {
      ASSIGN_OR_RETURN(pre, f.GetString("tokenizer.ggml.pre"));
    }
    const PreTokenizerSpec* spec = nullptr;
    for (const PreTokenizerSpec& s : PreTokenizers()) {
      if (std::find(s.names.begin(), s.names.end(), pre) != s.names.end()) spec = &s;
    }
    if (spec == nullptr) {
      return Unimplemented(
          f, "tokenizer.ggml.pre",
          absl::StrCat("\"", pre,
                       "\" is not supported (llama-bpe, qwen2, gpt-2, smollm, default and their "
                       "aliases)"));
    }
    Json pretokenizers = Json::array();
    for (absl::string_view regex : spec->regexes) {
      pretokenizers.push_back({{"type", "Split"},
                               {"pattern", {{"Regex", std::string(regex)}}},
                               {"behavior", "Isolated"},
                               {"invert", false}});
    }
    pretokenizers.push_back({{"type", "ByteLevel"},
                             {"add_prefix_space", false},
                             {"trim_offsets", false},
                             {"use_regex", false}});
    j["normalizer"] = nullptr;
    j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", pretokenizers}};
    j["decoder"] = {{"type", "ByteLevel"},
                    {"add_prefix_space", false},
                    {"trim_offsets", false},
                    {"use_regex", false}};
    ASSIGN_OR_RETURN(const absl::Span<const absl::string_view> merges,
                     f.GetStringArray("tokenizer.ggml.merges"));
    bpe["unk_token"] = nullptr;
    bpe["fuse_unk"] = false;
    bpe["byte_fallback"] = false;
    bpe["ignore_merges"] = spec->ignore_merges;
    Json m = Json::array();
    for (size_t i = 0; i < merges.size(); ++i) {
      if (!tok::IsValidUtf8(std::string_view(merges[i].data(), merges[i].size()))) {
        return Invalid(f, "tokenizer.ggml.merges", absl::StrCat("merge ", i, " is not UTF-8"));
      }
      m.push_back(std::string(merges[i]));
    }
    bpe["merges"] = std::move(m);
    add_bos = spec->add_bos;
  }
  bpe["vocab"] = std::move(vocab);
  j["model"] = std::move(bpe);
  ASSIGN_OR_RETURN(add_bos, OptionalBool(f, "tokenizer.ggml.add_bos_token", add_bos));
  ASSIGN_OR_RETURN(const bool add_eos, OptionalBool(f, "tokenizer.ggml.add_eos_token", false));
  const std::string bos_text = bos >= 0 ? std::string(tokens[bos]) : "";
  const std::string eos_text = eos >= 0 ? std::string(tokens[eos]) : "";
  j["post_processor"] = SpecialTokensTemplate(add_bos && bos >= 0 ? &bos_text : nullptr, bos,
                                              add_eos && eos >= 0 ? &eos_text : nullptr, eos);
  return j.dump();
}

absl::StatusOr<LlamaConfig> GgufLlamaConfig(const GgufFile& f) {
  ASSIGN_OR_RETURN(const absl::string_view arch, f.GetString("general.architecture"));
  if (arch != "llama") {
    return Unimplemented(f, "general.architecture",
                         absl::StrCat("\"", arch, "\" is not supported (llama)"));
  }
  const std::string p = kPrefix;
  if (f.Find(p + "expert_count") != nullptr) {
    ASSIGN_OR_RETURN(uint64_t experts, f.GetUint(p + "expert_count"));
    if (experts > 0) return Unimplemented(f, p + "expert_count", "mixture of experts");
  }
  Json c = Json::object();
  c["model_type"] = "llama";
  for (const auto& [key, hf] : {std::pair{"context_length", "max_position_embeddings"},
                                std::pair{"embedding_length", "hidden_size"},
                                std::pair{"block_count", "num_hidden_layers"}}) {
    ASSIGN_OR_RETURN(c[hf], f.GetUint(p + key));
  }
  ASSIGN_OR_RETURN(c["intermediate_size"], LayerUint(f, p + "feed_forward_length"));
  ASSIGN_OR_RETURN(const uint64_t heads, LayerUint(f, p + "attention.head_count"));
  c["num_attention_heads"] = heads;
  if (f.Find(p + "attention.head_count_kv") != nullptr) {
    ASSIGN_OR_RETURN(c["num_key_value_heads"], LayerUint(f, p + "attention.head_count_kv"));
  }
  ASSIGN_OR_RETURN(c["rms_norm_eps"], f.GetFloat(p + "attention.layer_norm_rms_epsilon"));
  if (f.Find(p + "rope.freq_base") != nullptr) {
    ASSIGN_OR_RETURN(c["rope_theta"], f.GetFloat(p + "rope.freq_base"));
  }
  // The head size: key_length (= value_length), else hidden / heads as in Transformers.
  uint64_t head_dim = heads > 0 ? c["hidden_size"].get<uint64_t>() / heads : 0;
  if (f.Find(p + "attention.key_length") != nullptr) {
    ASSIGN_OR_RETURN(head_dim, f.GetUint(p + "attention.key_length"));
    c["head_dim"] = head_dim;
  }
  if (f.Find(p + "attention.value_length") != nullptr) {
    ASSIGN_OR_RETURN(const uint64_t v, f.GetUint(p + "attention.value_length"));
    if (v != head_dim) {
      return Unimplemented(f, p + "attention.value_length",
                           absl::StrCat(v, " differs from the key length ", head_dim));
    }
  }
  if (f.Find(p + "rope.dimension_count") != nullptr) {
    ASSIGN_OR_RETURN(const uint64_t rot, f.GetUint(p + "rope.dimension_count"));
    if (rot != head_dim) {
      return Unimplemented(f, p + "rope.dimension_count",
                           absl::StrCat("RoPE over ", rot, " of the head's ", head_dim,
                                        " dimensions (partial rotary)"));
    }
  }
  ASSIGN_OR_RETURN(const absl::Span<const absl::string_view> tokens,
                   f.GetStringArray("tokenizer.ggml.tokens"));
  c["vocab_size"] = tokens.size();
  if (f.Find(p + "vocab_size") != nullptr) {
    ASSIGN_OR_RETURN(c["vocab_size"], f.GetUint(p + "vocab_size"));
  }
  c["tie_word_embeddings"] = f.FindTensor("output.weight") == nullptr;
  // RoPE scaling: linear (rope.scaling.type, or the older rope.scale_linear), or none.
  double linear = 0;
  if (f.Find(p + "rope.scaling.type") != nullptr) {
    ASSIGN_OR_RETURN(const absl::string_view type, f.GetString(p + "rope.scaling.type"));
    if (type != "none" && type != "linear") {
      return Unimplemented(f, p + "rope.scaling.type",
                           absl::StrCat("\"", type, "\" is not supported (none, linear)"));
    }
    if (type == "linear" && f.Find(p + "rope.scaling.factor") != nullptr) {
      ASSIGN_OR_RETURN(linear, f.GetFloat(p + "rope.scaling.factor"));
    }
  } else if (f.Find(p + "rope.scale_linear") != nullptr) {
    ASSIGN_OR_RETURN(linear, f.GetFloat(p + "rope.scale_linear"));
  }
  if (linear > 0 && linear != 1) c["rope_scaling"] = {{"type", "linear"}, {"factor", linear}};
  // BOS, and every end-of-generation id llama.cpp keeps as such.
  ASSIGN_OR_RETURN(const int64_t bos, TokenId(f, "tokenizer.ggml.bos_token_id", tokens.size()));
  if (bos >= 0) c["bos_token_id"] = bos;
  Json eos = Json::array();
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                          "tokenizer.ggml.eom_token_id"}) {
    ASSIGN_OR_RETURN(const int64_t id, TokenId(f, key, tokens.size()));
    if (id >= 0 && std::find(eos.begin(), eos.end(), Json(id)) == eos.end()) eos.push_back(id);
  }
  if (!eos.empty()) c["eos_token_id"] = eos;

  ASSIGN_OR_RETURN(LlamaConfig config,
                   ParseLlamaConfig(c.dump(), absl::StrCat(f.path(), " (as config.json)")));
  if (const GgufTensor* t = f.FindTensor("rope_freqs.weight")) {
    if (config.rope_scaling.type == "linear") {
      return Unimplemented(f, "rope_freqs.weight", "with linear RoPE scaling as well");
    }
    if (t->type != GgmlType::kF32 || t->numel() != config.head_dim / 2) {
      return Invalid(f, "rope_freqs.weight",
                     absl::StrCat("expected ", config.head_dim / 2, " f32 factors"));
    }
    std::vector<float> factors(t->numel());
    std::memcpy(factors.data(), t->data, t->nbytes);
    config.rope_scaling.type = "freq_factors";
    for (float x : factors) {
      if (!(x > 0)) return Invalid(f, "rope_freqs.weight", "factors must be positive");
      config.rope_scaling.freq_factors.push_back(x);
    }
  }
  return config;
}

namespace {

// The GGUF tensor that holds HF tensor `hf`, and whether its rows were reordered for RoPE
// (attn_q over the query heads, attn_k over the KV heads).
struct GgufName {
  std::string name;
  bool rope_rows = false;
};

absl::StatusOr<GgufName> ToGgufName(const std::string& hf) {
  static const auto* kTop = new std::vector<std::pair<absl::string_view, absl::string_view>>{
      {"model.embed_tokens.weight", "token_embd.weight"},
      {"model.norm.weight", "output_norm.weight"},
      {"lm_head.weight", "output.weight"}};
  static const auto* kLayer = new std::vector<std::pair<absl::string_view, absl::string_view>>{
      {"input_layernorm.weight", "attn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"}};
  for (const auto& [from, to] : *kTop) {
    if (hf == from) return GgufName{std::string(to)};
  }
  const std::vector<absl::string_view> parts = absl::StrSplit(hf, absl::MaxSplits('.', 3));
  int layer;
  if (parts.size() == 4 && parts[0] == "model" && parts[1] == "layers" &&
      absl::SimpleAtoi(parts[2], &layer)) {
    for (const auto& [from, to] : *kLayer) {
      if (parts[3] == from) {
        return GgufName{absl::StrCat("blk.", layer, ".", to),
                        to == "attn_q.weight" || to == "attn_k.weight"};
      }
    }
  }
  return absl::InternalError(absl::StrCat("no GGUF name for tensor ", hf));
}

std::string NeString(absl::Span<const int64_t> ne) {
  std::string s = "{";
  for (size_t i = 0; i < ne.size(); ++i) absl::StrAppend(&s, i ? ", " : "", ne[i]);
  return s + "}";
}

DType StoredDType(GgmlType t) {
  return t == GgmlType::kF16 ? DType::kF16 : t == GgmlType::kBF16 ? DType::kBF16 : DType::kF32;
}
bool Unquantized(GgmlType t) {
  return t == GgmlType::kF32 || t == GgmlType::kF16 || t == GgmlType::kBF16;
}

// Binds one tensor: in place when it can be, else converted into `converted`.
absl::StatusOr<WeightMatrix> BindTensor(const GgufFile& f, const LlamaConfig& config,
                                        const GgufLoadOptions& options, const std::string& hf,
                                        const std::vector<int64_t>& shape,
                                        std::vector<std::vector<std::byte>>* converted) {
  ASSIGN_OR_RETURN(const GgufName name, ToGgufName(hf));
  const GgufTensor* t = f.FindTensor(name.name);
  if (t == nullptr) {
    return absl::NotFoundError(absl::StrCat(f.path(), ": tensor \"", name.name, "\" is missing"));
  }
  const std::vector<int64_t> ne(shape.rbegin(), shape.rend());
  if (t->ne != ne) {
    return absl::InvalidArgumentError(absl::StrCat(f.path(), ": tensor \"", name.name, "\": ne ",
                                                   NeString(t->ne), ", the config needs ",
                                                   NeString(ne)));
  }
  const int64_t rows = t->rows(), cols = t->cols();
  if (Unquantized(t->type) && !name.rope_rows) {
    return WeightMatrix{StoredDType(t->type), t->data, rows, cols, cols};
  }
  const DType out = Unquantized(t->type) ? StoredDType(t->type) : options.dequantized;
  const size_t out_row = static_cast<size_t>(cols) * DTypeSize(out);
  std::vector<std::byte>& buffer = converted->emplace_back(out_row * rows);
  std::vector<float> row(Unquantized(t->type) ? 0 : cols);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t dst = name.rope_rows ? GgufRopeRowToHf(r, config.head_dim) : r;
    const std::byte* src = t->data + r * t->row_bytes();
    std::byte* to = buffer.data() + dst * out_row;
    if (Unquantized(t->type)) {
      std::memcpy(to, src, out_row);
      continue;
    }
    DequantizeRow(t->type, src, cols, row.data());
    if (out == DType::kF32) {
      std::memcpy(to, row.data(), out_row);
    } else {
      for (int64_t c = 0; c < cols; ++c) {
        const uint16_t h = FloatToBf16(row[c]);
        std::memcpy(to + c * 2, &h, 2);
      }
    }
  }
  return WeightMatrix{out, buffer.data(), rows, cols, cols};
}

}  // namespace

absl::StatusOr<std::unique_ptr<GgufModel>> LoadGgufModel(const std::string& path,
                                                         const GgufLoadOptions& options) {
  if (options.dequantized != DType::kF32 && options.dequantized != DType::kBF16) {
    return absl::InvalidArgumentError("GGUF: quantized tensors dequantize to f32 or bf16");
  }
  auto m = std::make_unique<GgufModel>();
  ASSIGN_OR_RETURN(m->file, GgufFile::Open(path));
  const GgufFile& f = *m->file;
  ASSIGN_OR_RETURN(m->config, GgufLlamaConfig(f));
  for (const GgufTensor& t : f.tensors()) {
    if (absl::EndsWith(t.name, ".bias") || absl::StrContains(t.name, "_exps")) {
      return Unimplemented(f, absl::StrCat("tensor \"", t.name, "\""),
                           "biases and experts are not supported");
    }
  }
  ASSIGN_OR_RETURN(m->tokenizer_json, GgufTokenizerJson(f));
  if (f.Find("tokenizer.chat_template") != nullptr) {
    ASSIGN_OR_RETURN(const absl::string_view t, f.GetString("tokenizer.chat_template"));
    m->chat_template = std::string(t);
  }
  ASSIGN_OR_RETURN(const absl::Span<const absl::string_view> tokens,
                   f.GetStringArray("tokenizer.ggml.tokens"));
  if (m->config.bos_token_id) m->bos_token = std::string(tokens[*m->config.bos_token_id]);
  if (!m->config.eos_token_ids.empty()) {
    m->eos_token = std::string(tokens[m->config.eos_token_ids[0]]);
  }
  const LlamaConfig& config = m->config;
  auto* converted = &m->converted;
  ASSIGN_OR_RETURN(m->weights, BindLlamaWeights(config, [&](const std::string& hf,
                                                            const std::vector<int64_t>& shape) {
                     return BindTensor(f, config, options, hf, shape, converted);
                   }));
  return m;
}

}  // namespace kvrm
