// GGUF files made by the converter and read by kvrm's loader: the same model as the safetensors
// directory it came from (config, every weight, tokenizer, chat template), quantized weights
// within their formats' resolution, and the tokenizer.ggml.* translation of real vocabularies
// (Llama 3, GPT-2, Qwen3, Llama 2) encoding and decoding as their tokenizer.json does.
#include "tools/gguf/gguf_convert.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <random>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/json.h"
#include "common/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/weight_matrix.h"
#include "model/gguf.h"
#include "model/gguf_model.h"
#include "model/gguf_quants.h"
#include "model/gguf_tokenizer.h"
#include "model/gguf_vocab.h"
#include "model/gguf_writer.h"
#include "model/tokenizer.h"
#include "model/tokenizer_testdata.h"
#include "runtime/backend.h"
#include "runtime/cpu_backend.h"
#include "runtime/model_bundle.h"
#include "tools/modelgen/model_writer.h"
#include "tools/modelgen/quantized_writer.h"

namespace kvrm {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

std::string TmpDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return tmp != nullptr ? tmp : "/tmp";
}

// Random text over ASCII words, spaces and newlines, digits, punctuation, and some non-ASCII
// letters and symbols (each piece kind the pre-tokenizers split on).
std::string RandomText(std::mt19937* rng) {
  static const std::vector<std::string> pieces = {
      "the",
      " the",
      "The",
      " quick",
      "brown",
      "  ",
      " ",
      "\n",
      "\n\n",
      "\t",
      "123",
      "4567",
      "'s",
      "'ll",
      "don't",
      "!",
      "?!",
      "...",
      "(x)",
      "<tag>",
      "caf\xc3\xa9",
      " na\xc3\xafve",
      "\xe6\x97\xa5\xe6\x9c\xac",
      "\xf0\x9f\x98\x80",
      "\xe2\x96\x81",
      "a",
      "Z",
      "_",
      "-",
      "\xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82"};
  std::string s;
  const int n = std::uniform_int_distribution<int>(0, 12)(*rng);
  for (int i = 0; i < n; ++i) s += pieces[(*rng)() % pieces.size()];
  return s;
}

// The tokenizer a GGUF file made from `family`'s tokenizer.json gives, and the one the
// tokenizer.json itself gives.
struct TokenizerPair {
  std::unique_ptr<Tokenizer> hf, gguf;
};

// "o200k": Llama 3's vocabulary split and merged as gpt-oss's o200k_harmony (kGpt4oSplit: words
// by case, "/" kept with punctuation; every word merged), which a GGUF file names "gpt-4o".
std::string FamilyTokenizerJson(const std::string& family) {
  if (family != "o200k") return TestdataTokenizerJson(family);
  absl::StatusOr<Json> tj = ParseJson(TestdataTokenizerJson("llama3"), "llama3");
  CHECK_OK(tj.status());
  Json& split = (*tj)["pre_tokenizer"]["pretokenizers"][0];
  CHECK(split["pattern"]["Regex"].get<std::string>() == gguf_vocab::kLlama3Split);
  split["pattern"]["Regex"] = std::string(gguf_vocab::kGpt4oSplit);
  (*tj)["model"]["ignore_merges"] = false;  // (llama.cpp's gpt-4o merges every word)
  return tj->dump();
}

TokenizerPair MakePair(const std::string& family) {
  const std::string text = FamilyTokenizerJson(family);
  absl::StatusOr<Json> tj = ParseJson(text, family);
  CHECK_OK(tj.status());
  TokenizerPair pair;
  absl::StatusOr<std::unique_ptr<Tokenizer>> hf = Tokenizer::FromJson(text, family);
  CHECK_OK(hf.status());
  pair.hf = std::move(*hf);
  // BOS / EOS as the families' configs name them.
  const std::map<std::string, std::pair<std::string, std::string>> specials = {
      {"llama3", {"<|begin_of_text|>", "<|end_of_text|>"}},
      {"o200k", {"<|begin_of_text|>", "<|end_of_text|>"}},
      {"gpt2", {"<|endoftext|>", "<|endoftext|>"}},
      {"qwen3", {"", "<|endoftext|>"}},
      {"llama2", {"<s>", "</s>"}}};
  const auto& [bos, eos] = specials.at(family);
  const int64_t bos_id = bos.empty() ? -1 : *pair.hf->TokenToId(bos);
  const int64_t eos_id = *pair.hf->TokenToId(eos);
  GgufWriter w;
  CHECK_OK(AddGgufTokenizer(*tj, bos_id, eos_id, &w));
  const std::string path = absl::StrCat(TmpDir(), "/", family, ".gguf");
  CHECK_OK(w.WriteFile(path));
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  CHECK_OK(file.status());
  absl::StatusOr<std::unique_ptr<Tokenizer>> g = LoadGgufTokenizer(**file);
  CHECK_OK(g.status());
  pair.gguf = std::move(*g);
  return pair;
}

class GgufTokenizerTest : public ::testing::TestWithParam<std::string> {};

TEST_P(GgufTokenizerTest, EncodesAndDecodesAsTokenizerJson) {
  const std::string family = GetParam();
  const TokenizerPair pair = MakePair(family);
  // llama.cpp does not NFC-normalize Qwen's text (Transformers does): texts that change under
  // NFC are left out for it.
  const bool nfc = family == "qwen3";
  std::vector<std::string> texts;
  std::ifstream in(
      absl::StrCat(kTokenizerTestdata, family == "o200k" ? "llama3" : family, "/vectors.jsonl"));
  std::string line;
  while (std::getline(in, line)) {
    absl::StatusOr<Json> v = ParseJson(line, "vectors.jsonl");
    ASSERT_TRUE(v.ok()) << v.status();
    if (v->contains("text")) texts.push_back((*v)["text"].get<std::string>());
  }
  ASSERT_GT(texts.size(), 50u);
  std::mt19937 rng(99);
  for (int i = 0; i < 2000; ++i) texts.push_back(RandomText(&rng));
  int compared = 0, failures = 0;
  for (const std::string& text : texts) {
    if (nfc && Nfc(text) != text) continue;
    ++compared;
    for (const bool special : {false, true}) {
      absl::StatusOr<std::vector<int32_t>> want = pair.hf->Encode(text, special);
      absl::StatusOr<std::vector<int32_t>> got = pair.gguf->Encode(text, special);
      ASSERT_TRUE(want.ok() && got.ok()) << want.status() << got.status();
      if (*got != *want && ++failures <= 10) {
        ADD_FAILURE() << family << ": encode(" << Json(text).dump() << ", " << special
                      << ") = " << Json(*got).dump() << ", tokenizer.json: " << Json(*want).dump();
      }
      for (const bool skip : {false, true}) {
        if (pair.gguf->Decode(*want, skip) != pair.hf->Decode(*want, skip) && ++failures <= 10) {
          ADD_FAILURE() << family << ": decode(" << Json(*want).dump() << ", " << skip
                        << ") = " << Json(pair.gguf->Decode(*want, skip)).dump()
                        << ", tokenizer.json: " << Json(pair.hf->Decode(*want, skip)).dump();
        }
      }
    }
  }
  EXPECT_GT(compared, 1000);
  EXPECT_EQ(failures, 0) << "of " << compared << " texts";
}

INSTANTIATE_TEST_SUITE_P(Families, GgufTokenizerTest,
                         ::testing::Values("llama3", "gpt2", "qwen3", "llama2", "o200k"));

// The o200k split is not Llama 3's: the GGUF file says "gpt-4o", and words split by case.
TEST(GgufSpecialTokensTest, O200kSplitsWordsByCase) {
  const TokenizerPair pair = MakePair("o200k");
  const TokenizerPair llama3 = MakePair("llama3");
  const std::string text = "iPhone JavaScript McDonald's";
  EXPECT_EQ(*pair.gguf->Encode(text, false), *pair.hf->Encode(text, false));
  EXPECT_NE(*pair.gguf->Encode(text, false), *llama3.gguf->Encode(text, false));
  GgufWriter w;
  ASSERT_TRUE(AddGgufTokenizer(*ParseJson(FamilyTokenizerJson("o200k"), "o200k"), -1, 0, &w).ok());
  const std::string path = TmpDir() + "/o200k-pre.gguf";
  ASSERT_TRUE(w.WriteFile(path).ok());
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ(*(*file)->GetString("tokenizer.ggml.pre"), "gpt-4o");
}

// o200k_harmony's ends (gpt-oss): with <|return|> and <|call|> among them, <|end|> (which closes
// every message, the analysis one too) ends nothing, as llama.cpp has it; without <|call|> (Phi-3,
// whose turns end at <|end|>) it stays an end.
TEST(GgufSpecialTokensTest, HarmonyMessagesDoNotEndAtEnd) {
  for (const bool call : {true, false}) {
    absl::StatusOr<Json> tj = ParseJson(TestdataTokenizerJson("llama3"), "llama3");
    ASSERT_TRUE(tj.ok());
    const int64_t base = (*tj)["added_tokens"].back()["id"].get<int64_t>() + 1;
    std::vector<std::string> added = {"<|start|>", "<|channel|>", "<|message|>", "<|end|>",
                                      "<|return|>"};
    if (call) added.push_back("<|call|>");
    for (size_t i = 0; i < added.size(); ++i) {
      (*tj)["added_tokens"].push_back({{"id", base + static_cast<int64_t>(i)},
                                       {"content", added[i]},
                                       {"special", true},
                                       {"single_word", false},
                                       {"lstrip", false},
                                       {"rstrip", false},
                                       {"normalized", false}});
    }
    const int64_t end = base + 3, ret = base + 4, call_id = base + 5;
    GgufWriter w;
    ASSERT_TRUE(AddGgufTokenizer(*tj, -1, ret, &w).ok());
    const std::string path = absl::StrCat(TmpDir(), "/harmony-", call, ".gguf");
    ASSERT_TRUE(w.WriteFile(path).ok());
    absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
    ASSERT_TRUE(file.ok());
    absl::StatusOr<GgufSpecialTokens> s = ReadGgufSpecialTokens(**file);
    ASSERT_TRUE(s.ok()) << s.status();
    const std::vector<int32_t>& ends = s->end_of_generation;
    EXPECT_EQ(s->eos, ret);
    EXPECT_NE(std::find(ends.begin(), ends.end(), ret), ends.end());
    EXPECT_EQ(std::find(ends.begin(), ends.end(), end) != ends.end(), !call) << call;
    if (call) {
      EXPECT_NE(std::find(ends.begin(), ends.end(), call_id), ends.end());
    }
  }
}

// llama.cpp's ends of generation: a Llama 3 file whose EOS is <|eot_id|> alone (as converted from
// an instruct model's tokenizer_config) also ends at <|end_of_text|>, as llama.cpp does.
TEST(GgufSpecialTokensTest, EndsOfGenerationAreLlamaCpps) {
  absl::StatusOr<Json> tj = ParseJson(TestdataTokenizerJson("llama3"), "llama3");
  ASSERT_TRUE(tj.ok());
  const TokenizerPair pair = MakePair("llama3");
  const int32_t eot = *pair.hf->TokenToId("<|eot_id|>");
  const int32_t end = *pair.hf->TokenToId("<|end_of_text|>");
  GgufWriter w;
  ASSERT_TRUE(AddGgufTokenizer(*tj, *pair.hf->TokenToId("<|begin_of_text|>"), eot, &w).ok());
  const std::string path = TmpDir() + "/llama3-eot.gguf";
  ASSERT_TRUE(w.WriteFile(path).ok());
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok());
  absl::StatusOr<GgufSpecialTokens> s = ReadGgufSpecialTokens(**file);
  ASSERT_TRUE(s.ok()) << s.status();
  EXPECT_EQ(s->eos, eot);
  EXPECT_THAT(s->end_of_generation, ::testing::ElementsAre(eot, end));
}

// A vocabulary shorter than the embedding (Qwen's 151,936 rows over ~151,665 tokens) is padded to
// the embedding's rows with unused "[PAD<id>]" tokens, as convert_hf_to_gguf pads it; the
// tokenizer read back encodes as before and never produces a pad.
TEST(GgufSpecialTokensTest, TokensArePaddedToTheEmbeddingsRows) {
  absl::StatusOr<Json> tj = ParseJson(TestdataTokenizerJson("qwen3"), "qwen3");
  ASSERT_TRUE(tj.ok());
  const TokenizerPair pair = MakePair("qwen3");
  const int64_t n = pair.hf->vocab_size(), rows = n + 7;
  GgufWriter w;
  ASSERT_TRUE(AddGgufTokenizer(*tj, -1, *pair.hf->TokenToId("<|endoftext|>"), &w, rows).ok());
  const std::string path = TmpDir() + "/qwen3-padded.gguf";
  ASSERT_TRUE(w.WriteFile(path).ok());
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok());
  absl::StatusOr<absl::Span<const absl::string_view>> tokens =
      (*file)->GetStringArray("tokenizer.ggml.tokens");
  ASSERT_TRUE(tokens.ok());
  ASSERT_EQ(static_cast<int64_t>(tokens->size()), rows);
  EXPECT_EQ((*tokens)[rows - 1], absl::StrCat("[PAD", rows - 1, "]"));
  absl::StatusOr<std::vector<double>> types = (*file)->GetNumberArray("tokenizer.ggml.token_type");
  ASSERT_TRUE(types.ok());
  EXPECT_EQ((*types)[rows - 1], 5);  // llama.cpp's UNUSED
  absl::StatusOr<std::unique_ptr<Tokenizer>> g = LoadGgufTokenizer(**file);
  ASSERT_TRUE(g.ok()) << g.status();
  for (const char* text : {"Hello, world!", "  indented\n\tcode();", "数字 123"}) {
    EXPECT_EQ(*(*g)->Encode(text, false), *pair.gguf->Encode(text, false)) << text;
  }
}

// A SentencePiece vocabulary with no id keys takes llama.cpp's defaults (BOS 1, EOS 2, BOS
// added); add_space_prefix false leaves the text's start alone.
TEST(GgufSpecialTokensTest, SentencePieceDefaultsAndSpacePrefix) {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<int32_t> types = {2, 3, 3};
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof(hex), "<0x%02X>", b);
    tokens.push_back(hex);
    types.push_back(6);
  }
  for (const char* piece : {"\xe2\x96\x81", "H", "i", "\xe2\x96\x81H", "Hi", "\xe2\x96\x81Hi"}) {
    tokens.push_back(piece);
    types.push_back(1);
  }
  std::vector<float> scores(tokens.size(), 0.0f);
  for (size_t i = 259; i < tokens.size(); ++i) scores[i] = -static_cast<float>(i);
  auto load = [&](std::optional<bool> space_prefix) {
    GgufWriter w;
    w.AddString("tokenizer.ggml.model", "llama");
    w.AddStringArray("tokenizer.ggml.tokens", tokens);
    w.AddFloat32Array("tokenizer.ggml.scores", scores);
    w.AddInt32Array("tokenizer.ggml.token_type", types);
    if (space_prefix) w.AddBool("tokenizer.ggml.add_space_prefix", *space_prefix);
    const std::string path = TmpDir() + "/spm.gguf";
    CHECK_OK(w.WriteFile(path));
    absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
    CHECK_OK(file.status());
    absl::StatusOr<GgufSpecialTokens> s = ReadGgufSpecialTokens(**file);
    CHECK_OK(s.status());
    EXPECT_EQ(s->bos, 1);
    EXPECT_THAT(s->end_of_generation, ::testing::ElementsAre(2));
    absl::StatusOr<std::unique_ptr<Tokenizer>> tok = LoadGgufTokenizer(**file);
    CHECK_OK(tok.status());
    return std::move(*tok);
  };
  const std::unique_ptr<Tokenizer> prefixed = load(std::nullopt);
  const int32_t space_hi = 258 + 6, hi = 258 + 5, bos = 1;
  EXPECT_THAT(*prefixed->Encode("Hi", true), ::testing::ElementsAre(bos, space_hi));
  EXPECT_EQ(prefixed->Decode({bos, space_hi}, true), "Hi");
  const std::unique_ptr<Tokenizer> plain = load(false);
  EXPECT_THAT(*plain->Encode("Hi", false), ::testing::ElementsAre(hi));
  EXPECT_EQ(plain->Decode({hi}, true), "Hi");
}

// ---- whole models -----------------------------------------------------------------------------

const std::string& TinyDir() {
  static const std::string* dir = [] {
    auto* d = new std::string(TmpDir() + "/tiny-f32");
    modelgen::MakeModelOptions o;
    o.size = "tiny";
    o.out_dir = *d;
    o.dtype = DType::kF32;
    CHECK_OK(modelgen::MakeModel(o).status());
    return d;
  }();
  return *dir;
}

std::unique_ptr<ModelBundle> Load(const std::string& path) {
  absl::StatusOr<std::unique_ptr<ModelBundle>> m = ModelBundle::Load(path);
  CHECK_OK(m.status());
  return std::move(*m);
}

std::string Convert(GgmlType type, const std::string& name) {
  const std::string path = TmpDir() + "/" + name;
  GgufConvertOptions options;
  options.type = type;
  CHECK_OK(ConvertToGguf(TinyDir(), path, options));
  return path;
}

std::vector<const WeightMatrix*> Matrices(const LlamaWeights& w) {
  std::vector<const WeightMatrix*> out = {&w.embed, &w.final_norm, &w.lm_head};
  for (const LayerWeights& l : w.layers) {
    for (const WeightMatrix* m :
         {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.mlp_norm, &l.w_gate, &l.w_up, &l.w_down}) {
      out.push_back(m);
    }
  }
  return out;
}

// Relative RMS difference of two matrices of the same shape.
double RmsShare(const WeightMatrix& a, const WeightMatrix& b) {
  EXPECT_EQ(a.rows, b.rows);
  EXPECT_EQ(a.cols, b.cols);
  std::vector<float> ra(a.cols), rb(b.cols);
  double err = 0, ref = 0;
  for (int64_t r = 0; r < a.rows; ++r) {
    WeightRowToFloat(a, r, ra.data());
    WeightRowToFloat(b, r, rb.data());
    for (int64_t c = 0; c < a.cols; ++c) {
      err += (double(ra[c]) - rb[c]) * (double(ra[c]) - rb[c]);
      ref += double(ra[c]) * ra[c];
    }
  }
  return std::sqrt(err / std::max(ref, 1e-300));
}

// The sizes, RoPE base, norm epsilon, tying, BOS and Granite's multipliers of a converted model
// equal its directory's.
void ExpectSameShape(const LlamaConfig& a, const LlamaConfig& b) {
  EXPECT_EQ(b.vocab_size, a.vocab_size);
  EXPECT_EQ(b.hidden_size, a.hidden_size);
  EXPECT_EQ(b.intermediate_size, a.intermediate_size);
  EXPECT_EQ(b.num_hidden_layers, a.num_hidden_layers);
  EXPECT_EQ(b.num_attention_heads, a.num_attention_heads);
  EXPECT_EQ(b.num_key_value_heads, a.num_key_value_heads);
  EXPECT_EQ(b.head_dim, a.head_dim);
  EXPECT_EQ(b.max_position_embeddings, a.max_position_embeddings);
  EXPECT_FLOAT_EQ(b.rms_norm_eps, a.rms_norm_eps);
  EXPECT_EQ(b.rope_theta, a.rope_theta);
  EXPECT_EQ(b.tie_word_embeddings, a.tie_word_embeddings);
  EXPECT_EQ(b.bos_token_id, a.bos_token_id);
  EXPECT_FLOAT_EQ(b.embedding_multiplier, a.embedding_multiplier);  // Granite's
  EXPECT_FLOAT_EQ(b.attention_scale, a.attention_scale);
  EXPECT_FLOAT_EQ(b.residual_multiplier, a.residual_multiplier);
  EXPECT_FLOAT_EQ(b.logits_scaling, a.logits_scaling);
}

TEST(GgufModelTest, AnF32FileIsTheSameModelAsItsDirectory) {
  const std::unique_ptr<ModelBundle> hf = Load(TinyDir());
  const std::unique_ptr<ModelBundle> gguf = Load(Convert(GgmlType::kF32, "tiny-f32.gguf"));
  ASSERT_NE(gguf->gguf, nullptr);
  EXPECT_EQ(gguf->name, "tiny-f32");
  const LlamaConfig &a = hf->config, &b = gguf->config;
  ExpectSameShape(a, b);
  // EOS is tokenizer_config's (as convert_hf_to_gguf takes it); the loader finds the other end of
  // generation by its text, as llama.cpp does.
  EXPECT_THAT(b.eos_token_ids, ::testing::UnorderedElementsAreArray(a.eos_token_ids));
  EXPECT_EQ(b.eos_token_ids[0], *hf->tokenizer->TokenToId(hf->chat.eos_token));
  // The tiny model's llama3 RoPE scaling arrives as rope_freqs (f32 divisors).
  ASSERT_EQ(a.rope_scaling.type, "llama3");
  EXPECT_EQ(b.rope_scaling.type, "freq_factors");
  const std::vector<double> fa = RopeInverseFrequencies(a), fb = RopeInverseFrequencies(b);
  ASSERT_EQ(fa.size(), fb.size());
  for (size_t i = 0; i < fa.size(); ++i) EXPECT_NEAR(fb[i], fa[i], 1e-7 * fa[i]) << i;

  // Every weight, exactly (attn_q and attn_k rows put back in HF's order).
  const auto ma = Matrices(hf->weights), mb = Matrices(gguf->weights);
  ASSERT_EQ(ma.size(), mb.size());
  for (size_t i = 0; i < ma.size(); ++i) EXPECT_EQ(RmsShare(*ma[i], *mb[i]), 0.0) << "matrix " << i;
  EXPECT_EQ(gguf->weights.num_parameters, hf->weights.num_parameters);

  // The tokenizer and the chat template.
  std::mt19937 rng(5);
  for (int i = 0; i < 500; ++i) {
    const std::string text = RandomText(&rng);
    for (const bool special : {false, true}) {
      EXPECT_EQ(*gguf->tokenizer->Encode(text, special), *hf->tokenizer->Encode(text, special))
          << Json(text).dump();
    }
  }
  EXPECT_EQ(gguf->chat.bos_token, hf->chat.bos_token);
  EXPECT_EQ(gguf->chat.eos_token, hf->chat.eos_token);
  ChatTemplateInputs inputs;
  inputs.messages.push_back(ChatMessage{"system", "Be brief."});
  inputs.messages.push_back(ChatMessage{"user", "Hello!"});
  inputs.add_generation_prompt = true;
  absl::StatusOr<std::string> ra = hf->chat.Render(inputs), rb = gguf->chat.Render(inputs);
  ASSERT_TRUE(ra.ok() && rb.ok()) << ra.status() << rb.status();
  EXPECT_EQ(*rb, *ra);
  EXPECT_EQ(gguf->chat.tool_call_format, hf->chat.tool_call_format);
}

// A quantized checkpoint converts from the values it stands for: an f32 file of an AWQ, an FP8
// (128x128 blocks), an int8 (W8A8) or a bitsandbytes NF4 checkpoint of tiny holds exactly its
// twin's weights (the float32 model of those values the writer makes beside it), FP8's and
// NF4's included though they load as requantized q8_0 blocks by default: the converter reads
// them in f32.
TEST(GgufConvertTest, QuantizedCheckpointsConvertExactlyTheirValues) {
  for (const auto& [name, method, format, group, block_rows] :
       {std::tuple{"awq", "awq", "pack-quantized", 32, 1},
        {"fp8", "fp8", "", 128, 128},
        {"int8", "compressed-tensors", "int-quantized", -1, 1},
        {"nf4", "bitsandbytes", "nf4", 64, 1}}) {
    SCOPED_TRACE(name);
    modelgen::QuantizeOptions q;
    q.method = method;
    q.format = format;
    q.bits = std::string(method) == "awq" ? 4 : 8;
    q.group_size = group;
    q.block_rows = block_rows;
    q.zero_point = std::string(method) == "awq";
    q.scale_dtype = std::string(method) == "compressed-tensors" ? DType::kBF16 : DType::kF32;
    if (std::string(method) == "awq") q.scale_dtype = DType::kF16;
    q.double_quant = std::string(method) == "bitsandbytes";
    const std::string dir = absl::StrCat(TmpDir(), "/tiny-", name), twin = dir + "-twin";
    ASSERT_TRUE(modelgen::QuantizeModelDir(TinyDir(), dir, twin, q).ok());
    const std::string path = absl::StrCat(dir, ".gguf");
    GgufConvertOptions options;
    options.type = GgmlType::kF32;
    ASSERT_TRUE(ConvertToGguf(dir, path, options).ok());
    const std::unique_ptr<ModelBundle> want = Load(twin), got = Load(path);
    const auto ma = Matrices(want->weights), mb = Matrices(got->weights);
    ASSERT_EQ(ma.size(), mb.size());
    for (size_t i = 0; i < ma.size(); ++i) {
      EXPECT_EQ(mb[i]->dtype, DType::kF32);
      EXPECT_EQ(RmsShare(*ma[i], *mb[i]), 0.0) << "matrix " << i;
    }
  }
}

// Quantized files: every matrix within its format's resolution of the original; norms exact
// (f32 in every file). The tiny model's 128- and 352-wide rows are no whole K-quant block, so q4_K
// falls back to q5_0 there, as llama-quantize does (K-quants through the loader: below).
TEST(GgufModelTest, QuantizedFilesHoldTheWeightsWithinTheirFormatsResolution) {
  const std::unique_ptr<ModelBundle> hf = Load(TinyDir());
  const auto original = Matrices(hf->weights);
  struct Case {
    GgmlType type;
    const char* name;
    double max_share;
  };
  for (const Case& c : {Case{GgmlType::kQ8_0, "q8_0", 0.01}, Case{GgmlType::kQ4_0, "q4_0", 0.15},
                        Case{GgmlType::kQ5_1, "q5_1", 0.06}, Case{GgmlType::kF16, "f16", 1e-3},
                        Case{GgmlType::kQ4_K, "q4_K", 0.075}}) {
    const std::string path = Convert(c.type, absl::StrCat("tiny-", c.name, ".gguf"));
    for (const DType dq : {DType::kBF16, DType::kF32}) {
      GgufLoadOptions options;
      options.dequantized = dq;
      absl::StatusOr<std::unique_ptr<GgufModel>> g = LoadGgufModel(path, options);
      ASSERT_TRUE(g.ok()) << g.status();
      const auto loaded = Matrices((*g)->weights);
      // Rows are shared among threads: one thread converts the same bits.
      options.threads = 1;
      absl::StatusOr<std::unique_ptr<GgufModel>> one = LoadGgufModel(path, options);
      ASSERT_TRUE(one.ok()) << one.status();
      const auto serial = Matrices((*one)->weights);
      for (size_t i = 0; i < loaded.size(); ++i) {
        ASSERT_EQ(std::memcmp(loaded[i]->data, serial[i]->data, loaded[i]->bytes()), 0)
            << c.name << " matrix " << i;
        const bool norm = loaded[i]->rows == 1;
        EXPECT_LT(RmsShare(*original[i], *loaded[i]), norm ? 1e-12 : c.max_share)
            << c.name << " matrix " << i;
        if (!norm && c.type != GgmlType::kF16) {
          EXPECT_EQ(loaded[i]->dtype, dq) << c.name;
        }
      }
    }
  }
}

TEST(GgufConvertTest, KQuantsFallBackAsLlamaQuantizeDoes) {
  EXPECT_EQ(FallbackType(GgmlType::kQ4_K, 4096), GgmlType::kQ4_K);
  EXPECT_EQ(FallbackType(GgmlType::kQ4_K, 352), GgmlType::kQ5_0);
  EXPECT_EQ(FallbackType(GgmlType::kQ5_K, 128), GgmlType::kQ5_1);
  EXPECT_EQ(FallbackType(GgmlType::kQ6_K, 128), GgmlType::kQ8_0);
  EXPECT_EQ(FallbackType(GgmlType::kQ8_0, 100), GgmlType::kF16);
  EXPECT_EQ(FallbackType(GgmlType::kF32, 7), GgmlType::kF32);
}

// The Q4_K_M mix: use_more_bits picks the first and last eighth of the layers and every third in
// between (16 of 32, as llama.cpp's Q4_K_M files of 32-layer models have); those layers' attn_v
// and ffn_down and the output (the tiny model ties it to the embedding) take q6_K, the rest
// q4_K, each falling back where rows are not whole 256-element blocks (the tiny model's 128 and
// 352: q6_K to q8_0, q4_K to q5_0).
TEST(GgufConvertTest, TheQ4_K_MMixGivesTheSensitiveMatricesMoreBits) {
  std::vector<int> picked;
  for (int i = 0; i < 32; ++i) {
    if (UseMoreBits(i, 32)) picked.push_back(i);
  }
  EXPECT_THAT(picked, ::testing::ElementsAre(0, 1, 2, 3, 6, 9, 12, 15, 18, 21, 24, 27, 28, 29, 30,
                                             31));
  const std::string path = TmpDir() + "/tiny-q4_K_M.gguf";
  GgufConvertOptions options;
  options.q4_k_m = true;
  ASSERT_TRUE(ConvertToGguf(TinyDir(), path, options).ok());
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  auto type_of = [&](const std::string& name) { return (*file)->FindTensor(name)->type; };
  EXPECT_EQ(type_of("token_embd.weight"), GgmlType::kQ8_0);  // the tied output: q6_K
  for (int i = 0; i < 4; ++i) {  // use_more_bits(i, 4): layers 2 and 3
    const GgmlType more = UseMoreBits(i, 4) ? GgmlType::kQ8_0 : GgmlType::kQ5_0;
    const std::string p = absl::StrCat("blk.", i, ".");
    EXPECT_EQ(type_of(p + "attn_v.weight"), more) << i;
    EXPECT_EQ(type_of(p + "ffn_down.weight"), more) << i;
    EXPECT_EQ(type_of(p + "attn_q.weight"), GgmlType::kQ5_0) << i;
    EXPECT_EQ(type_of(p + "ffn_up.weight"), GgmlType::kQ5_0) << i;
    EXPECT_EQ(type_of(p + "attn_norm.weight"), GgmlType::kF32) << i;
  }
  EXPECT_TRUE(UseMoreBits(2, 4) && UseMoreBits(3, 4) && !UseMoreBits(0, 4) && !UseMoreBits(1, 4));
  // It loads, and its matrices read back within their formats' resolution (q5_0, q8_0).
  const std::unique_ptr<ModelBundle> hf = Load(TinyDir()), mixed = Load(path);
  const auto original = Matrices(hf->weights), loaded = Matrices(mixed->weights);
  for (size_t i = 0; i < loaded.size(); ++i) {
    EXPECT_LT(RmsShare(*original[i], *loaded[i]), loaded[i]->rows == 1 ? 1e-12 : 0.08) << i;
  }
}

TEST(GgufModelTest, ADirectoryWithOneGgufFileLoadsIt) {
  const std::string dir = TmpDir() + "/one-gguf";
  fs::create_directories(dir);
  fs::copy_file(Convert(GgmlType::kF16, "tiny-f16.gguf"), dir + "/model.gguf",
                fs::copy_options::overwrite_existing);
  const std::unique_ptr<ModelBundle> m = Load(dir);
  EXPECT_NE(m->gguf, nullptr);
  EXPECT_EQ(m->name, "model");
  fs::copy_file(dir + "/model.gguf", dir + "/other.gguf", fs::copy_options::overwrite_existing);
  absl::StatusOr<std::unique_ptr<ModelBundle>> two = ModelBundle::Load(dir);
  EXPECT_EQ(two.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(two.status().message()), HasSubstr("2 GGUF files and no config.json"));
  EXPECT_EQ(ModelBundle::Load(dir + "/absent.gguf").status().code(), absl::StatusCode::kNotFound);
}

// What the loader refuses names the key or tensor: another architecture, a tokenizer model it
// does not implement, a pre-tokenizer llama.cpp would not know, a missing tensor.
TEST(GgufModelTest, UnsupportedFilesNameTheKey) {
  auto load = [](const GgufWriter& w, const std::string& name) {
    const std::string path = TmpDir() + "/" + name;
    CHECK_OK(w.WriteFile(path));
    return LoadGgufModel(path).status();
  };
  auto base = [](absl::string_view arch, absl::string_view tokenizer, absl::string_view pre) {
    GgufWriter w;
    w.AddString("general.architecture", arch);
    w.AddUint32("llama.context_length", 64);
    w.AddUint32("llama.embedding_length", 128);
    w.AddUint32("llama.block_count", 2);
    w.AddUint32("llama.feed_forward_length", 256);
    w.AddUint32("llama.attention.head_count", 4);
    w.AddFloat32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
    w.AddString("tokenizer.ggml.model", tokenizer);
    w.AddString("tokenizer.ggml.pre", pre);
    w.AddStringArray("tokenizer.ggml.tokens", {"a", "b", "ab"});
    w.AddStringArray("tokenizer.ggml.merges", {"a b"});
    return w;
  };
  absl::Status st = load(base("mamba", "gpt2", "qwen2"), "arch.gguf");
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(
      std::string(st.message()),
      HasSubstr("general.architecture: \"mamba\" is not supported (llama, qwen2, qwen3, "
                "qwen2moe, qwen3moe, phi3, granite, smollm3, olmo2, gemma2, gemma3, gpt-oss)"));
  // Experts: llama's (Mixtral) need their used count; other architectures' are not computed.
  GgufWriter experts = base("llama", "gpt2", "llama-bpe");
  experts.AddUint32("llama.expert_count", 8);
  st = load(experts, "experts.gguf");
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(st.message()), HasSubstr("llama.expert_used_count"));
  experts.AddUint32("llama.expert_used_count", 9);
  st = load(experts, "experts9.gguf");
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()),
              HasSubstr("num_experts_per_tok (9) must be at most num_local_experts (8)"));
  GgufWriter phi_experts = base("phi3", "gpt2", "llama-bpe");
  phi_experts.AddUint32("phi3.expert_count", 16);
  st = load(phi_experts, "phimoe.gguf");
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(st.message()),
              HasSubstr("phi3.expert_count: 16 experts: mixtures of experts are served for llama "
                        "(Mixtral), qwen2moe, qwen3moe and gpt-oss, not \"phi3\""));
  st = load(base("llama", "t5", "default"), "t5.gguf");
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(st.message()),
              HasSubstr("tokenizer.ggml.model: \"t5\" is not supported"));
  st = load(base("llama", "gpt2", "deepseek-coder"), "pre.gguf");
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(st.message()), HasSubstr("tokenizer.ggml.pre: \"deepseek-coder\""));
  st = load(base("llama", "gpt2", "llama-bpe"), "notensors.gguf");
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(st.message()), HasSubstr("tensor \"token_embd.weight\" is missing"));
  // A token text that is not UTF-8 (it used to throw out of the JSON writer: std::terminate).
  GgufWriter bytes;
  bytes.AddString("tokenizer.ggml.model", "gpt2");
  bytes.AddStringArray("tokenizer.ggml.tokens", {"a", "\xff"});
  bytes.AddStringArray("tokenizer.ggml.merges", {});
  const std::string path = TmpDir() + "/bytes.gguf";
  CHECK_OK(bytes.WriteFile(path));
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok());
  st = LoadGgufTokenizer(**file).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(st.message()), HasSubstr("tokenizer.ggml.tokens: token 1 is not UTF-8"));
  GgufWriter split = base("llama", "gpt2", "llama-bpe");
  split.AddUint32("split.count", 3);
  st = load(split, "split.gguf");
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(st.message()), HasSubstr("split.count: one part of 3"));
  GgufWriter partial = base("llama", "gpt2", "llama-bpe");
  partial.AddUint32("llama.rope.dimension_count", 16);
  st = load(partial, "partial.gguf");
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(st.message()), HasSubstr("llama.rope.dimension_count: RoPE over 16"));
}

// A file whose metadata claims two billion layers fails at the first layer tensor it lacks,
// without allocating for the claim (it used to size the layer table first: 864 GB).
TEST(GgufModelTest, ClaimedLayersAreBoundByTheTensorsPresent) {
  for (const uint32_t layers : {65536u, 2000000000u}) {
    SCOPED_TRACE(layers);
    GgufWriter w;
    w.AddString("general.architecture", "llama");
    w.AddUint32("llama.context_length", 64);
    w.AddUint32("llama.embedding_length", 128);
    w.AddUint32("llama.block_count", layers);
    w.AddUint32("llama.feed_forward_length", 256);
    w.AddUint32("llama.attention.head_count", 4);
    w.AddFloat32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
    w.AddString("tokenizer.ggml.model", "gpt2");
    w.AddString("tokenizer.ggml.pre", "gpt-2");
    w.AddStringArray("tokenizer.ggml.tokens", {"a", "b", "ab"});
    w.AddStringArray("tokenizer.ggml.merges", {"a b"});
    w.AddTensor("token_embd.weight", GgmlType::kF32, {128, 3}, std::vector<std::byte>(128 * 3 * 4));
    w.AddTensor("output_norm.weight", GgmlType::kF32, {128}, std::vector<std::byte>(128 * 4));
    const std::string path = TmpDir() + "/many-layers.gguf";
    ASSERT_TRUE(w.WriteFile(path).ok());
    const absl::Status st = LoadGgufModel(path).status();
    if (layers == 65536) {  // the most config.json allows: bound by the tensors present
      EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
      EXPECT_THAT(std::string(st.message()),
                  HasSubstr("tensor \"blk.0.attn_norm.weight\" is missing"));
    } else {  // more: refused before anything is kept per layer
      EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(std::string(st.message()),
                  HasSubstr("num_hidden_layers (2000000000) must be at most 65536"));
    }
  }
}

// K-quant matrices through the loader (the tiny model has no 256-wide rows): a one-layer model
// 256 wide in q4_K, q5_K and q6_K, loaded as f32, holds exactly the file's dequantized rows, with
// attn_q and attn_k rows back in Hugging Face's order.
// A one-layer model whose matrices have the given types (the embedding first, then Q, K, V, O,
// gate, up, down), written with random values and loaded with `options`: every matrix reads back
// (WeightRowToFloat) exactly as its blocks dequantize, attn_q / attn_k rows in HF order. Returns
// each matrix's format as loaded.
std::vector<WeightFormat> ExpectLoadedAsDequantizedRows(const std::vector<GgmlType>& types,
                                                        const std::string& file,
                                                        const GgufLoadOptions& options) {
  constexpr int64_t kD = 256, kHeads = 4, kKv = 2, kHd = 64, kFfn = 512, kVocab = 3;
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  w.AddUint32("llama.context_length", 64);
  w.AddUint32("llama.embedding_length", kD);
  w.AddUint32("llama.block_count", 1);
  w.AddUint32("llama.feed_forward_length", kFfn);
  w.AddUint32("llama.attention.head_count", kHeads);
  w.AddUint32("llama.attention.head_count_kv", kKv);
  w.AddFloat32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
  w.AddString("tokenizer.ggml.model", "gpt2");
  w.AddString("tokenizer.ggml.pre", "gpt-2");
  w.AddStringArray("tokenizer.ggml.tokens", {"a", "b", "ab"});
  w.AddStringArray("tokenizer.ggml.merges", {"a b"});
  std::mt19937 rng(3);
  std::normal_distribution<float> dist(0.0f, 0.05f);
  struct Matrix {
    const char* name;
    int64_t rows, cols;
  };
  const Matrix matrices[] = {{"token_embd.weight", kVocab, kD},
                             {"blk.0.attn_q.weight", kHeads * kHd, kD},
                             {"blk.0.attn_k.weight", kKv * kHd, kD},
                             {"blk.0.attn_v.weight", kKv * kHd, kD},
                             {"blk.0.attn_output.weight", kD, kHeads * kHd},
                             {"blk.0.ffn_gate.weight", kFfn, kD},
                             {"blk.0.ffn_up.weight", kFfn, kD},
                             {"blk.0.ffn_down.weight", kD, kFfn}};
  CHECK(types.size() == 8);
  std::map<std::string, std::vector<std::byte>> encoded;
  for (size_t i = 0; i < 8; ++i) {
    const Matrix& m = matrices[i];
    std::vector<float> x(m.rows * m.cols);
    for (float& v : x) v = dist(rng);
    const GgmlTypeTraits& t = GgmlTraits(types[i]);
    std::vector<std::byte> bytes(m.rows * m.cols / t.block_elems * t.block_bytes);
    QuantizeRow(types[i], x.data(), m.rows * m.cols, bytes.data());
    encoded[m.name] = bytes;
    w.AddTensor(m.name, types[i], {m.cols, m.rows}, std::move(bytes));
  }
  for (const char* norm :
       {"blk.0.attn_norm.weight", "blk.0.ffn_norm.weight", "output_norm.weight"}) {
    w.AddTensor(norm, GgmlType::kF32, {kD}, std::vector<std::byte>(kD * 4));
  }
  const std::string path = TmpDir() + "/" + file;
  CHECK_OK(w.WriteFile(path));
  absl::StatusOr<std::unique_ptr<GgufModel>> g = LoadGgufModel(path, options);
  CHECK_OK(g.status());
  const LlamaWeights& lw = (*g)->weights;
  const LayerWeights& l = lw.layers[0];
  const WeightMatrix* loaded[] = {&lw.embed, &l.wq,     &l.wk,   &l.wv,
                                  &l.wo,     &l.w_gate, &l.w_up, &l.w_down};
  EXPECT_EQ(lw.lm_head.data, lw.embed.data);  // no output.weight: tied
  std::vector<WeightFormat> formats;
  for (size_t i = 0; i < 8; ++i) {
    const Matrix& m = matrices[i];
    const WeightMatrix& got = *loaded[i];
    formats.push_back(got.format);
    EXPECT_EQ(got.dtype, options.dequantized) << m.name;
    const bool rope = std::string(m.name).find("attn_q") != std::string::npos ||
                      std::string(m.name).find("attn_k") != std::string::npos;
    // q8_0, q4_K and q6_K matrices whose rows keep their order are the file's own bytes.
    if ((types[i] == GgmlType::kQ8_0 || types[i] == GgmlType::kQ4_K ||
         types[i] == GgmlType::kQ6_K) &&
        got.format != WeightFormat::kDense && !rope) {
      EXPECT_EQ(got.data, (*g)->file->FindTensor(m.name)->data) << m.name;
    }
    const GgmlTypeTraits& t = GgmlTraits(types[i]);
    const size_t row_bytes = m.cols / t.block_elems * t.block_bytes;
    std::vector<float> want(m.cols), row(m.cols);
    for (int64_t r = 0; r < m.rows; ++r) {
      DequantizeRow(types[i], encoded[m.name].data() + r * row_bytes, m.cols, want.data());
      if (options.dequantized == DType::kBF16 && got.format == WeightFormat::kDense) {
        for (float& v : want) v = Bf16ToFloat(FloatToBf16(v));
      }
      WeightRowToFloat(got, rope ? GgufRopeRowToHf(r, kHd) : r, row.data());
      EXPECT_EQ(row, want) << m.name << " row " << r;
      if (row != want) break;
    }
  }
  return formats;
}

// Every quantized type loads as its exact block form with as_q8 (the default): q4_K and q6_K as
// they are, q4_0 as q4 groups (its rows here are whole 256-value super-blocks), q8_0 and q5_0 as
// q8_0 blocks, q4_1 and q5_K as q8 affine blocks,
// each matrix reading back as ggml's dequantization bit for bit (attn_q / attn_k reordered); with
// as_q8 off every matrix becomes `dequantized` (f32: exactly; bf16: rounded). Two files: the
// K-quants need 256-value rows, which the one-layer model has everywhere.
TEST(GgufModelTest, QuantizedMatricesLoadAsTheirExactBlockForms) {
  const std::vector<GgmlType> kquants = {GgmlType::kQ6_K, GgmlType::kQ4_K, GgmlType::kQ5_K,
                                         GgmlType::kQ6_K, GgmlType::kQ4_K, GgmlType::kQ5_K,
                                         GgmlType::kQ4_K, GgmlType::kQ6_K};
  const std::vector<GgmlType> blocks32 = {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ5_0,
                                          GgmlType::kQ8_0, GgmlType::kQ5_0, GgmlType::kQ4_0,
                                          GgmlType::kQ4_1, GgmlType::kQ8_0};
  auto form = [](GgmlType t) {
    switch (t) {
      case GgmlType::kQ6_K:
        return WeightFormat::kQ6K;
      case GgmlType::kQ4_K:
        return WeightFormat::kQ4K;
      case GgmlType::kQ4_1:
      case GgmlType::kQ5_K:
        return WeightFormat::kQ8Affine;
      case GgmlType::kQ4_0:
        return WeightFormat::kQ4G;
      default:
        return WeightFormat::kQ8_0;
    }
  };
  for (const auto& [types, name, dequantized] : {std::tuple{kquants, "kquants", DType::kF32},
                                                 std::tuple{blocks32, "q8q4q5", DType::kBF16}}) {
    for (bool as_q8 : {true, false}) {
      GgufLoadOptions options;
      options.dequantized = dequantized;
      options.as_q8 = as_q8;
      const std::vector<WeightFormat> formats = ExpectLoadedAsDequantizedRows(
          types, absl::StrCat(name, as_q8 ? "" : "-dense", ".gguf"), options);
      for (size_t i = 0; i < types.size(); ++i) {
        EXPECT_EQ(formats[i], as_q8 ? form(types[i]) : WeightFormat::kDense) << name << " " << i;
      }
    }
  }
}

// ---- qwen2, qwen3, and biased llama ----------------------------------------------------------

// The tiny model in another architecture (tools/modelgen: tiny-qwen2, tiny-qwen3, tiny-biased),
// f32, generated once per test binary.
const std::string& ArchitectureDir(const std::string& size) {
  static auto* dirs = new std::map<std::string, std::string>();
  auto it = dirs->find(size);
  if (it != dirs->end()) return it->second;
  modelgen::MakeModelOptions o;
  o.size = size;
  o.out_dir = TmpDir() + "/" + size + "-f32";
  o.dtype = DType::kF32;
  CHECK_OK(modelgen::MakeModel(o).status());
  return (*dirs)[size] = o.out_dir;
}

// A copy of the tiny model `size` (ArchitectureDir) in TmpDir()/`name` whose config.json has
// `edit`'s keys replaced; returns the directory.
std::string EditedArchitectureDir(const std::string& size, const std::string& name,
                                  const Json& edit) {
  const std::string dir = TmpDir() + "/" + name;
  std::filesystem::create_directories(dir);
  for (const auto& e : std::filesystem::directory_iterator(ArchitectureDir(size))) {
    std::filesystem::copy_file(e.path(), dir + "/" + e.path().filename().string(),
                               std::filesystem::copy_options::overwrite_existing);
  }
  absl::StatusOr<Json> config = ReadJsonFile(dir + "/config.json");
  CHECK_OK(config.status());
  for (const auto& [key, value] : edit.items()) (*config)[key] = value;
  std::ofstream(dir + "/config.json") << config->dump(2);
  return dir;
}

// What llama.cpp's gpt-oss graph fixes has no GGUF form otherwise: another GLU limit, other
// sliding layers. The file of tiny-gptoss itself holds gpt-oss's tensors under llama.cpp's names,
// the biases stacked in f32 ([experts][n]) and the experts in --type, or in --experts_type.
TEST(GgufConvertTest, GptOssFilesHoldLlamaCppsTensors) {
  const std::string src = ArchitectureDir("tiny-gptoss");
  GgufConvertOptions options;
  options.type = GgmlType::kQ8_0;
  for (const auto& [key, value, refusal] :
       {std::tuple{"swiglu_limit", Json(5.0), "swiglu_limit 5: llama.cpp's gpt-oss clamps at 7"},
        std::tuple{"layer_types",
                   Json::array(
                       {"full_attention", "full_attention", "sliding_attention", "full_attention"}),
                   "layer 0 attends to everything: llama.cpp's gpt-oss slides the even layers"}}) {
    const std::string dir =
        EditedArchitectureDir("tiny-gptoss", "tiny-gptoss-edited", {{key, value}});
    const absl::Status s = ConvertToGguf(dir, TmpDir() + "/refused.gguf", options);
    EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(refusal));
  }
  for (const std::optional<GgmlType> experts :
       {std::optional<GgmlType>(), std::optional<GgmlType>(GgmlType::kMxfp4)}) {
    options.experts_type = experts;
    const std::string path = TmpDir() + "/tiny-gptoss-q8_0.gguf";
    ASSERT_TRUE(ConvertToGguf(src, path, options).ok());
    absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
    ASSERT_TRUE(file.ok()) << file.status();
    const std::unique_ptr<ModelBundle> hf = Load(src);
    const LlamaConfig& c = hf->config;
    const int64_t e = c.num_experts, ffn = c.moe_intermediate_size, d = c.hidden_size;
    const std::map<std::string, std::pair<GgmlType, std::vector<int64_t>>> want = {
        {"blk.1.attn_sinks.weight", {GgmlType::kF32, {c.num_attention_heads}}},
        {"blk.1.post_attention_norm.weight", {GgmlType::kF32, {d}}},
        {"blk.1.ffn_gate_inp.weight", {GgmlType::kF32, {d, e}}},
        {"blk.1.ffn_gate_inp.bias", {GgmlType::kF32, {e}}},
        {"blk.1.ffn_gate_exps.bias", {GgmlType::kF32, {ffn, e}}},
        {"blk.1.ffn_up_exps.bias", {GgmlType::kF32, {ffn, e}}},
        {"blk.1.ffn_down_exps.bias", {GgmlType::kF32, {d, e}}},
        {"blk.1.ffn_gate_exps.weight", {experts.value_or(GgmlType::kQ8_0), {d, ffn, e}}},
        {"blk.1.ffn_down_exps.weight", {experts.value_or(GgmlType::kQ8_0), {ffn, d, e}}},
        {"blk.1.attn_q.weight", {GgmlType::kQ8_0, {d, c.num_attention_heads * c.head_dim}}},
        {"output.weight", {GgmlType::kQ8_0, {d, c.vocab_size}}}};
    for (const auto& [name, type_ne] : want) {
      const GgufTensor* t = (*file)->FindTensor(name);
      ASSERT_NE(t, nullptr) << name;
      EXPECT_EQ(t->type, type_ne.first) << name;
      EXPECT_EQ(t->ne, type_ne.second) << name;
    }
    EXPECT_EQ((*file)->FindTensor("blk.1.ffn_norm.weight"), nullptr);
    EXPECT_EQ(*(*file)->GetString("general.architecture"), "gpt-oss");
    EXPECT_EQ(*(*file)->GetUint("gpt-oss.attention.sliding_window"), c.sliding_window);
    EXPECT_EQ(*(*file)->GetUint("gpt-oss.expert_feed_forward_length"), ffn);
    // The biases and sinks read back exactly; the experts within their blocks' resolution.
    const std::unique_ptr<ModelBundle> g = Load(path);
    const LayerWeights &a = hf->weights.layers[1], &b = g->weights.layers[1];
    EXPECT_EQ(RmsShare(a.sinks, b.sinks), 0.0);
    EXPECT_EQ(RmsShare(a.router_bias, b.router_bias), 0.0);
    for (int64_t x = 0; x < e; ++x) {
      EXPECT_EQ(RmsShare(a.expert_gate_bias[x], b.expert_gate_bias[x]), 0.0) << x;
      EXPECT_EQ(RmsShare(a.expert_down_bias[x], b.expert_down_bias[x]), 0.0) << x;
      EXPECT_LT(RmsShare(a.expert_up[x], b.expert_up[x]), experts ? 0.15 : 0.01) << x;
      EXPECT_EQ(b.expert_up[x].format, experts ? WeightFormat::kMxfp4 : WeightFormat::kQ8_0);
    }
  }
}

// Every tensor a model binds, with its name: the matrices and norms, and the attention biases
// and Q/K norms it has.
std::vector<std::pair<std::string, const WeightMatrix*>> AllTensors(const LlamaWeights& w) {
  std::vector<std::pair<std::string, const WeightMatrix*>> out = {
      {"embed", &w.embed}, {"final_norm", &w.final_norm}, {"lm_head", &w.lm_head}};
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& l = w.layers[i];
    const WeightMatrix* all[] = {&l.attn_norm, &l.wq,     &l.wk,   &l.wv,     &l.wo,
                                 &l.mlp_norm,  &l.w_gate, &l.w_up, &l.w_down, &l.bq,
                                 &l.bk,        &l.bv,     &l.bo,   &l.q_norm, &l.k_norm};
    const char* names[] = {"attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_gate", "w_up",
                           "w_down",    "bq", "bk", "bv", "bo", "q_norm",   "k_norm"};
    for (size_t j = 0; j < std::size(all); ++j) {
      const WeightMatrix* m = all[j];
      const char* name = names[j];
      if (m->data != nullptr) out.push_back({absl::StrCat("layer ", i, " ", name), m});
    }
  }
  return out;
}

// The CPU backend's logits for `tokens`: prefilled in chunks of 16, the last chunk's last row
// kept for each chunk (one slot, f32 KV).
std::vector<float> CpuLogits(const LlamaConfig& config, const LlamaWeights& weights,
                             const std::vector<int32_t>& tokens) {
  CpuBackendOptions options;
  options.kv_blocks = 8;
  options.kv_block_tokens = 16;
  options.max_slots = 1;
  options.max_chunk_tokens = 16;
  options.max_context = std::min(128, config.max_position_embeddings);
  options.num_threads = 2;
  absl::StatusOr<std::unique_ptr<CpuBackend>> backend =
      CpuBackend::Create(config, &weights, options);
  CHECK_OK(backend.status());
  const KvRun runs[] = {{0, 8}};
  std::vector<float> all, logits(config.vocab_size);
  for (size_t start = 0; start < tokens.size(); start += 16) {
    const size_t n = std::min<size_t>(16, tokens.size() - start);
    PrefillChunk chunk{0, static_cast<int32_t>(start),
                       absl::MakeConstSpan(tokens).subspan(start, n), runs, 1};
    CHECK_OK((*backend)->Prefill(chunk, logits.data()));
    all.insert(all.end(), logits.begin(), logits.end());
  }
  return all;
}

// The largest difference of two sets of logits rows of `vocab`, each row's as a share of its
// scale: max |a - b| / max(1, max |b|) (as //tests:forward_test measures them).
double MaxRelativeDifference(const std::vector<float>& a, const std::vector<float>& b,
                             size_t vocab) {
  EXPECT_EQ(a.size(), b.size());
  double worst = 0;
  for (size_t row = 0; row + vocab <= std::min(a.size(), b.size()); row += vocab) {
    double diff = 0, scale = 1;
    for (size_t i = row; i < row + vocab; ++i) {
      diff = std::max(diff, std::abs(double(a[i]) - b[i]));
      scale = std::max(scale, std::abs(double(b[i])));
    }
    worst = std::max(worst, diff / scale);
  }
  return worst;
}

// SmolLM3 is llama.cpp's smollm3, whose layers without RoPE are every fourth, fixed: a model
// with others (tiny-smollm3's every second) is refused by name rather than converted wrong; with
// every fourth it converts, its Q/K rows reordered as llama's, and reads back as the same model
// (the same logits: //tests:llama_cpp_interop_test holds it to llama.cpp's).
TEST(GgufConvertTest, SmolLm3NopeLayersEveryFourth) {
  const absl::Status s = ConvertToGguf(ArchitectureDir("tiny-smollm3"),
                                       TmpDir() + "/tiny-smollm3.gguf", GgufConvertOptions());
  EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
  EXPECT_THAT(std::string(s.message()),
              ::testing::HasSubstr("no_rope_layers) are not every fourth (llama.cpp's smollm3)"));
  const std::string dir = EditedArchitectureDir("tiny-smollm3", "tiny-smollm3-every-fourth",
                                                {{"no_rope_layers", Json::array({1, 1, 1, 0})}});
  GgufConvertOptions options;
  options.type = GgmlType::kF32;
  const std::string path = TmpDir() + "/tiny-smollm3-every-fourth.gguf";
  ASSERT_TRUE(ConvertToGguf(dir, path, options).ok());
  const std::unique_ptr<ModelBundle> hf = Load(dir), gguf = Load(path);
  EXPECT_EQ(*gguf->gguf->file->GetString("general.architecture"), "smollm3");
  EXPECT_EQ(gguf->config.model_type, "smollm3");
  EXPECT_EQ(gguf->config.rope_layers, hf->config.rope_layers);
  EXPECT_EQ(gguf->config.rope_layers, std::vector<bool>({true, true, true, false}));
  EXPECT_TRUE(gguf->config.tie_word_embeddings);
  std::mt19937 rng(13);
  std::vector<int32_t> tokens(40);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % hf->config.vocab_size);
  EXPECT_EQ(CpuLogits(gguf->config, gguf->weights, tokens),
            CpuLogits(hf->config, hf->weights, tokens));
}

// OLMo 2 / 3 are llama.cpp's olmo2 (OLMo 3 where the file has a window): the block of output
// norms only (post_attention_norm, post_ffw_norm; no attn_norm or ffn_norm) and Q/K norms over
// the whole projections, Q/K rows in HF's order. Each directory's file reads back as the same
// model, the CPU backend's logits alike (//tests:llama_cpp_interop_test holds them to
// llama.cpp's); OLMo 3 with RoPE scaling (its full layers scaled, its sliding ones not) is
// refused.
TEST(GgufConvertTest, OlmoFilesAreTheSameModels) {
  GgufConvertOptions options;
  options.type = GgmlType::kF32;
  for (const std::string size : {"tiny-olmo2", "tiny-olmo3"}) {
    SCOPED_TRACE(size);
    std::string dir = ArchitectureDir(size);
    const std::string path = TmpDir() + "/" + size + ".gguf";
    if (size == "tiny-olmo3") {
      const absl::Status s = ConvertToGguf(dir, path, options);
      EXPECT_EQ(s.code(), absl::StatusCode::kUnimplemented) << s;
      EXPECT_THAT(std::string(s.message()), HasSubstr("RoPE scaling llama3 with OLMo 3's"));
      dir = EditedArchitectureDir(size, "tiny-olmo3-unscaled", {{"rope_scaling", nullptr}});
    }
    ASSERT_TRUE(ConvertToGguf(dir, path, options).ok());
    const std::unique_ptr<ModelBundle> hf = Load(dir), gguf = Load(path);
    const GgufFile& file = *gguf->gguf->file;
    EXPECT_EQ(*file.GetString("general.architecture"), "olmo2");
    EXPECT_EQ(gguf->config.model_type, hf->config.model_type);
    EXPECT_TRUE(gguf->config.qk_norm_whole);
    EXPECT_FALSE(gguf->config.pre_norms);
    EXPECT_EQ(gguf->config.sliding_window, hf->config.sliding_window);
    EXPECT_EQ(file.FindTensor("blk.0.attn_norm.weight"), nullptr);
    EXPECT_EQ(file.FindTensor("blk.0.ffn_norm.weight"), nullptr);
    ASSERT_NE(file.FindTensor("blk.0.post_ffw_norm.weight"), nullptr);
    EXPECT_EQ(file.FindTensor("blk.0.attn_q_norm.weight")->ne,
              std::vector<int64_t>{hf->config.num_attention_heads * hf->config.head_dim});
    std::mt19937 rng(14);
    std::vector<int32_t> tokens(64);  // (past tiny-olmo3's 48-position window)
    for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % hf->config.vocab_size);
    EXPECT_EQ(CpuLogits(gguf->config, gguf->weights, tokens),
              CpuLogits(hf->config, hf->weights, tokens));
  }
}

struct ArchitectureCase {
  const char* size;  // modelgen's
  const char* arch;  // the file's general.architecture
};

class GgufArchitectureTest : public ::testing::TestWithParam<ArchitectureCase> {};

// The directory as an f32 file is the same model: its architecture and config (biases and Q/K
// norms included), every tensor bit for bit, and the CPU backend's logits. The file holds what
// llama.cpp's converter writes: the architecture's tensor names, the 1-D tensors in f32, attn_q /
// attn_k rows (and their biases) reordered in llama only.
TEST_P(GgufArchitectureTest, AnF32FileIsTheSameModelAsItsDirectory) {
  const ArchitectureCase& c = GetParam();
  const std::string path = TmpDir() + "/" + c.size + "-f32.gguf";
  GgufConvertOptions options;
  options.type = GgmlType::kF32;
  ASSERT_TRUE(ConvertToGguf(ArchitectureDir(c.size), path, options).ok());
  const std::unique_ptr<ModelBundle> hf = Load(ArchitectureDir(c.size)), gguf = Load(path);
  ASSERT_NE(gguf->gguf, nullptr);
  const GgufFile& file = *gguf->gguf->file;
  EXPECT_EQ(*file.GetString("general.architecture"), c.arch);
  EXPECT_NE(file.Find(absl::StrCat(c.arch, ".block_count")), nullptr);
  const LlamaConfig &a = hf->config, &b = gguf->config;
  // Phi-3 is written as llama (its fused Q/K/V and gate/up split into llama's tensors).
  EXPECT_EQ(b.model_type, a.model_type == "phi3" ? "llama" : a.model_type);
  EXPECT_EQ(b.qkv_bias, a.qkv_bias);
  EXPECT_EQ(b.o_bias, a.o_bias);
  EXPECT_EQ(b.qk_norm, a.qk_norm);
  ExpectSameShape(a, b);
  EXPECT_EQ(b.rope_scaling.type, a.rope_scaling.type == "llama3" ? "freq_factors" : "");
  // Each architecture's own tensors are there (the tiny models differ in these only).
  const std::string arch = c.arch;
  EXPECT_EQ(a.qkv_bias, arch == "qwen2" || c.size == std::string("tiny-biased"));
  EXPECT_EQ(a.qk_norm, arch == "qwen3");

  const auto ta = AllTensors(hf->weights), tb = AllTensors(gguf->weights);
  ASSERT_EQ(ta.size(), tb.size());
  for (size_t i = 0; i < ta.size(); ++i) {
    ASSERT_EQ(tb[i].first, ta[i].first);
    EXPECT_EQ(RmsShare(*ta[i].second, *tb[i].second), 0.0) << ta[i].first;
  }
  EXPECT_EQ(gguf->weights.num_parameters, hf->weights.num_parameters);

  // The file itself, read directly: biases and Q/K norms 1-D f32; attn_q and its bias in HF's
  // order (qwen2, qwen3) or llama.cpp's RoPE order (llama).
  const bool permuted = GgufPermutesQk(arch);
  const LayerWeights& l = hf->weights.layers[1];
  auto expect_in_file = [&](const std::string& name, const WeightMatrix& m, bool rope) {
    SCOPED_TRACE(name);
    const GgufTensor* t = file.FindTensor(name);
    ASSERT_NE(t, nullptr);
    EXPECT_EQ(t->type, GgmlType::kF32);
    EXPECT_EQ(t->ne.size(), m.rows == 1 ? 1u : 2u);
    ASSERT_EQ(t->numel(), m.rows * m.cols);
    std::vector<float> stored(t->numel()), row(m.cols);
    std::memcpy(stored.data(), t->data, t->nbytes);
    for (int64_t r = 0; r < m.rows; ++r) {
      WeightRowToFloat(m, m.rows > 1 && rope ? GgufRopeRowToHf(r, a.head_dim) : r, row.data());
      for (int64_t i = 0; i < m.cols; ++i) {
        const int64_t hf_col = m.rows == 1 && rope ? GgufRopeRowToHf(i, a.head_dim) : i;
        ASSERT_EQ(stored[r * m.cols + i], row[hf_col]) << "row " << r << " element " << i;
      }
    }
  };
  expect_in_file("blk.1.attn_q.weight", l.wq, permuted);
  expect_in_file("blk.1.attn_k.weight", l.wk, permuted);
  if (a.qkv_bias) {
    expect_in_file("blk.1.attn_q.bias", l.bq, permuted);
    expect_in_file("blk.1.attn_k.bias", l.bk, permuted);
    expect_in_file("blk.1.attn_v.bias", l.bv, false);
  }
  if (a.o_bias) expect_in_file("blk.1.attn_output.bias", l.bo, false);
  if (a.qk_norm) {
    expect_in_file("blk.1.attn_q_norm.weight", l.q_norm, false);
    expect_in_file("blk.1.attn_k_norm.weight", l.k_norm, false);
  }

  // The CPU backend computes the same logits from either (tiny-biased's llama3 RoPE scaling
  // arrives as f32 rope_freqs divisors, ~1e-7 of each frequency).
  std::mt19937 rng(11);
  std::vector<int32_t> tokens(40);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % a.vocab_size);
  const std::vector<float> la = CpuLogits(a, hf->weights, tokens);
  const std::vector<float> lb = CpuLogits(b, gguf->weights, tokens);
  const double diff = MaxRelativeDifference(lb, la, a.vocab_size);
  if (a.rope_scaling.type.empty()) {
    EXPECT_EQ(lb, la);
  } else {
    EXPECT_LT(diff, 1e-6);
  }
  std::cout << c.size << " f32 GGUF logits: max relative difference " << diff << "\n";
}

// A Qwen directory with YaRN (Qwen2.5's long-context rope_scaling) converts to llama.cpp's YaRN
// keys and loads back as the same scaling: the same config, the same logits past the original
// context.
TEST(GgufYarnTest, YarnRoundTripsThroughItsKeys) {
  const std::string dir = TmpDir() + "/tiny-qwen2-yarn";
  std::filesystem::create_directories(dir);
  for (const auto& e : std::filesystem::directory_iterator(ArchitectureDir("tiny-qwen2"))) {
    std::filesystem::copy_file(e.path(), dir + "/" + e.path().filename().string(),
                               std::filesystem::copy_options::overwrite_existing);
  }
  absl::StatusOr<Json> config = ReadJsonFile(dir + "/config.json");
  ASSERT_TRUE(config.ok());
  (*config)["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0},
                               {"original_max_position_embeddings", 32}};
  std::ofstream(dir + "/config.json") << config->dump(2);
  const std::string path = TmpDir() + "/tiny-qwen2-yarn.gguf";
  GgufConvertOptions options;
  options.type = GgmlType::kF32;
  ASSERT_TRUE(ConvertToGguf(dir, path, options).ok());
  const std::unique_ptr<ModelBundle> hf = Load(dir), gguf = Load(path);
  const RopeScaling &a = hf->config.rope_scaling, &b = gguf->config.rope_scaling;
  EXPECT_EQ(b.type, "yarn");
  EXPECT_EQ(b.factor, a.factor);
  EXPECT_EQ(b.original_max_position_embeddings, 32);
  EXPECT_EQ(b.beta_fast, a.beta_fast);
  EXPECT_EQ(b.beta_slow, a.beta_slow);
  EXPECT_EQ(b.attention_factor, a.attention_factor);
  std::mt19937 rng(5);
  std::vector<int32_t> tokens(48);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % hf->config.vocab_size);
  EXPECT_EQ(CpuLogits(gguf->config, gguf->weights, tokens),
            CpuLogits(hf->config, hf->weights, tokens));
  // An attention factor of its own has no GGUF form (llama.cpp's is 0.1 ln(factor) + 1).
  (*config)["rope_scaling"] = {{"type", "yarn"}, {"factor", 4.0}, {"attention_factor", 1.5}};
  std::ofstream(dir + "/config.json") << config->dump(2);
  const absl::Status refused = ConvertToGguf(dir, path, options);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnimplemented) << refused;
}

// Every --type converts the architecture: the matrices in the type (or its fallback), the biases
// and Q/K norms f32 and exact; the file loads (as_q8, and dequantized to bf16) and its logits
// stay near the directory's (q8_0: the weights to 1/254 of each block's largest).
TEST_P(GgufArchitectureTest, EveryTypeConvertsAndLoads) {
  const ArchitectureCase& c = GetParam();
  const std::unique_ptr<ModelBundle> hf = Load(ArchitectureDir(c.size));
  const auto ta = AllTensors(hf->weights);
  std::mt19937 rng(12);
  std::vector<int32_t> tokens(24);
  for (int32_t& t : tokens) t = static_cast<int32_t>(rng() % hf->config.vocab_size);
  const std::vector<float> want = CpuLogits(hf->config, hf->weights, tokens);
  struct Type {
    GgmlType type;
    bool q4_k_m;
    const char* name;
  };
  for (const Type& t :
       {Type{GgmlType::kF16, false, "f16"}, Type{GgmlType::kBF16, false, "bf16"},
        Type{GgmlType::kQ8_0, false, "q8_0"}, Type{GgmlType::kQ4_0, false, "q4_0"},
        Type{GgmlType::kQ5_1, false, "q5_1"}, Type{GgmlType::kQ4_K, false, "q4_K"},
        Type{GgmlType::kQ6_K, false, "q6_K"}, Type{GgmlType::kQ4_K, true, "q4_K_M"}}) {
    SCOPED_TRACE(t.name);
    const std::string path = absl::StrCat(TmpDir(), "/", c.size, "-", t.name, ".gguf");
    GgufConvertOptions options;
    options.type = t.type;
    options.q4_k_m = t.q4_k_m;
    ASSERT_TRUE(ConvertToGguf(ArchitectureDir(c.size), path, options).ok());
    for (const bool as_q8 : {true, false}) {
      ModelBundle::LoadOptions load;
      load.as_q8 = as_q8;
      absl::StatusOr<std::unique_ptr<ModelBundle>> g = ModelBundle::Load(path, load);
      ASSERT_TRUE(g.ok()) << g.status();
      const auto tb = AllTensors((*g)->weights);
      ASSERT_EQ(tb.size(), ta.size());
      for (size_t i = 0; i < ta.size(); ++i) {
        if (ta[i].second->rows == 1) {
          EXPECT_EQ(RmsShare(*ta[i].second, *tb[i].second), 0.0) << ta[i].first;
        } else {
          EXPECT_LT(RmsShare(*ta[i].second, *tb[i].second), 0.15) << ta[i].first;
        }
      }
      const GgufFile& file = *(*g)->gguf->file;
      for (const GgufTensor& tensor : file.tensors()) {
        if (tensor.ne.size() == 1) {
          EXPECT_EQ(tensor.type, GgmlType::kF32) << tensor.name;
        }
      }
      const std::vector<float> got = CpuLogits((*g)->config, (*g)->weights, tokens);
      const double diff = MaxRelativeDifference(got, want, hf->config.vocab_size);
      if (t.type == GgmlType::kQ8_0 && as_q8) {
        EXPECT_EQ(file.FindTensor("blk.0.ffn_up.weight")->type, GgmlType::kQ8_0);
        EXPECT_EQ((*g)->weights.layers[0].w_up.format, WeightFormat::kQ8_0);
        EXPECT_LT(diff, 0.05);
        std::cout << c.size << " q8_0 GGUF logits: max relative difference " << diff << "\n";
      }
      for (float x : got) ASSERT_TRUE(std::isfinite(x));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, GgufArchitectureTest,
                         ::testing::Values(ArchitectureCase{"tiny-qwen2", "qwen2"},
                                           ArchitectureCase{"tiny-qwen3", "qwen3"},
                                           ArchitectureCase{"tiny-biased", "llama"},
                                           ArchitectureCase{"tiny-phi3", "llama"},
                                           ArchitectureCase{"tiny-granite", "granite"}),
                         [](const ::testing::TestParamInfo<ArchitectureCase>& info) {
                           std::string name = info.param.size;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// A one-layer model of `arch` written by hand (d 64, 2 heads and 1 KV head of 32, random f32
// values; vocabulary "a", "b", "ab", no BOS): every tensor the architecture has but those in
// `omit`, and the `extra` ones, of the shapes `shapes` gives. Returns the file's path.
std::string HandMadeFile(const std::string& arch, const std::string& file,
                         const std::vector<std::string>& omit = {},
                         const std::vector<std::string>& extra = {},
                         const std::map<std::string, std::vector<int64_t>>& shapes = {}) {
  constexpr int64_t kD = 64, kQ = 64, kKv = 32, kFfn = 128, kVocab = 3;
  std::map<std::string, std::vector<int64_t>> ne = {
      {"token_embd.weight", {kD, kVocab}},    {"output_norm.weight", {kD}},
      {"blk.0.attn_norm.weight", {kD}},       {"blk.0.attn_q.weight", {kD, kQ}},
      {"blk.0.attn_k.weight", {kD, kKv}},     {"blk.0.attn_v.weight", {kD, kKv}},
      {"blk.0.attn_output.weight", {kQ, kD}}, {"blk.0.ffn_norm.weight", {kD}},
      {"blk.0.ffn_gate.weight", {kD, kFfn}},  {"blk.0.ffn_up.weight", {kD, kFfn}},
      {"blk.0.ffn_down.weight", {kFfn, kD}},  {"blk.0.attn_q.bias", {kQ}},
      {"blk.0.attn_k.bias", {kKv}},           {"blk.0.attn_v.bias", {kKv}},
      {"blk.0.attn_output.bias", {kD}},       {"blk.0.attn_q_norm.weight", {32}},
      {"blk.0.attn_k_norm.weight", {32}}};
  for (const auto& [name, shape] : shapes) ne[name] = shape;
  std::vector<std::string> names = {
      "token_embd.weight",        "output_norm.weight",    "blk.0.attn_norm.weight",
      "blk.0.attn_q.weight",      "blk.0.attn_k.weight",   "blk.0.attn_v.weight",
      "blk.0.attn_output.weight", "blk.0.ffn_norm.weight", "blk.0.ffn_gate.weight",
      "blk.0.ffn_up.weight",      "blk.0.ffn_down.weight"};
  if (arch == "qwen2") {
    for (const char* b : {"blk.0.attn_q.bias", "blk.0.attn_k.bias", "blk.0.attn_v.bias"}) {
      names.push_back(b);
    }
  }
  if (arch == "qwen3") {
    names.push_back("blk.0.attn_q_norm.weight");
    names.push_back("blk.0.attn_k_norm.weight");
  }
  if (arch == "phi3") {
    // Fused: Q/K/V in attn_qkv, gate and up in one ffn_up of twice the rows.
    names.erase(std::remove_if(names.begin(), names.end(),
                               [](const std::string& n) {
                                 return n == "blk.0.attn_q.weight" || n == "blk.0.attn_k.weight" ||
                                        n == "blk.0.attn_v.weight" || n == "blk.0.ffn_gate.weight";
                               }),
                names.end());
    names.push_back("blk.0.attn_qkv.weight");
    ne["blk.0.attn_qkv.weight"] = {kD, kQ + 2 * kKv};
    ne["blk.0.ffn_up.weight"] = {kD, 2 * kFfn};
  }
  names.insert(names.end(), extra.begin(), extra.end());
  GgufWriter w;
  const std::string p = arch + ".";
  w.AddString("general.architecture", arch);
  w.AddUint32(p + "context_length", 64);
  w.AddUint32(p + "embedding_length", kD);
  w.AddUint32(p + "block_count", 1);
  w.AddUint32(p + "feed_forward_length", kFfn);
  w.AddUint32(p + "attention.head_count", 2);
  w.AddUint32(p + "attention.head_count_kv", 1);
  w.AddFloat32(p + "attention.layer_norm_rms_epsilon", 1e-6f);
  w.AddFloat32(p + "rope.freq_base", 1e6f);
  w.AddString("tokenizer.ggml.model", "gpt2");
  w.AddString("tokenizer.ggml.pre", "qwen2");
  w.AddStringArray("tokenizer.ggml.tokens", {"a", "b", "ab"});
  w.AddStringArray("tokenizer.ggml.merges", {"a b"});
  std::mt19937 rng(7);
  std::normal_distribution<float> dist(0.0f, 0.1f);
  for (const std::string& name : names) {
    if (std::find(omit.begin(), omit.end(), name) != omit.end()) continue;
    const std::vector<int64_t>& shape = ne.at(name);
    std::vector<float> x(shape.size() == 1 ? shape[0] : shape[0] * shape[1]);
    for (float& v : x) v = dist(rng);
    std::vector<std::byte> bytes(x.size() * 4);
    std::memcpy(bytes.data(), x.data(), bytes.size());
    w.AddTensor(name, GgmlType::kF32, shape, std::move(bytes));
  }
  const std::string path = TmpDir() + "/" + file;
  CHECK_OK(w.WriteFile(path));
  return path;
}

// A phi3 file as llama.cpp writes one: Q/K/V fused in attn_qkv, gate and up in one ffn_up (gate
// first, as llama.cpp's SwiGLU splits it). The matrices are views of the fused tensors' row
// ranges, in the file's order (no RoPE reordering: phi3 rotates halves).
TEST(GgufArchitectureFilesTest, APhi3FileBindsTheFusedTensorsRowRanges) {
  const std::string path = HandMadeFile("phi3", "phi3.gguf");
  absl::StatusOr<std::unique_ptr<ModelBundle>> m = ModelBundle::Load(path);
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ((*m)->config.model_type, "phi3");
  EXPECT_TRUE((*m)->config.fused_projections);
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  const LayerWeights& l = (*m)->weights.layers[0];
  auto expect_rows = [&](const char* tensor, int64_t first, const WeightMatrix& w) {
    SCOPED_TRACE(tensor);
    const GgufTensor* t = (*file)->FindTensor(tensor);
    ASSERT_NE(t, nullptr);
    std::vector<float> row(w.cols);
    for (int64_t r = 0; r < w.rows; ++r) {
      WeightRowToFloat(w, r, row.data());
      ASSERT_EQ(std::memcmp(row.data(), t->data + (first + r) * w.cols * 4, w.cols * 4), 0)
          << "row " << r;
    }
  };
  expect_rows("blk.0.attn_qkv.weight", 0, l.wq);
  expect_rows("blk.0.attn_qkv.weight", 64, l.wk);
  expect_rows("blk.0.attn_qkv.weight", 96, l.wv);
  expect_rows("blk.0.ffn_up.weight", 0, l.w_gate);
  expect_rows("blk.0.ffn_up.weight", 128, l.w_up);
  for (float x : CpuLogits((*m)->config, (*m)->weights, {0, 1, 2, 1})) {
    ASSERT_TRUE(std::isfinite(x));
  }
}

// A qwen2 file as llama.cpp's tools write one, with no BOS token (Qwen's tokenizers have none):
// it loads, its tokenizer adds nothing, and the CPU backend computes with it.
TEST(GgufArchitectureFilesTest, AQwen2FileWithoutBosServes) {
  absl::StatusOr<std::unique_ptr<ModelBundle>> m =
      ModelBundle::Load(HandMadeFile("qwen2", "qwen2-nobos.gguf"));
  ASSERT_TRUE(m.ok()) << m.status();
  const LlamaConfig& c = (*m)->config;
  EXPECT_EQ(c.model_type, "qwen2");
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_FALSE(c.o_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_FALSE(c.bos_token_id.has_value());
  EXPECT_EQ((*m)->chat.bos_token, "");
  EXPECT_THAT(*(*m)->tokenizer->Encode("ab", /*add_special_tokens=*/true),
              ::testing::ElementsAre(2));
  // The biases are the file's, in its order (qwen2 rotates halves, as HF: no reordering).
  const GgufTensor* bq = (*m)->gguf->file->FindTensor("blk.0.attn_q.bias");
  std::vector<float> stored(bq->numel()), loaded(bq->numel());
  std::memcpy(stored.data(), bq->data, bq->nbytes);
  WeightRowToFloat((*m)->weights.layers[0].bq, 0, loaded.data());
  EXPECT_EQ(loaded, stored);
  for (float x : CpuLogits(c, (*m)->weights, {0, 1, 2, 2, 0})) ASSERT_TRUE(std::isfinite(x));
}

// llama.cpp takes each of a llama model's attention biases as optional: Q/K/V biases without an
// O bias load as such, the Q/K biases' elements back in HF's order as their matrices' rows;
// Qwen3's attention_bias biases load too.
TEST(GgufArchitectureFilesTest, LlamaAndQwen3FilesWithBiasesLoadThem) {
  const std::string path =
      HandMadeFile("llama", "llama-qkv-bias.gguf", {},
                   {"blk.0.attn_q.bias", "blk.0.attn_k.bias", "blk.0.attn_v.bias"});
  absl::StatusOr<std::unique_ptr<GgufModel>> g = LoadGgufModel(path);
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_EQ((*g)->config.model_type, "llama");
  EXPECT_TRUE((*g)->config.qkv_bias);
  EXPECT_FALSE((*g)->config.o_bias);
  const LayerWeights& l = (*g)->weights.layers[0];
  for (const auto& [name, m, rope] :
       {std::tuple{"blk.0.attn_q.bias", &l.bq, true}, std::tuple{"blk.0.attn_k.bias", &l.bk, true},
        std::tuple{"blk.0.attn_v.bias", &l.bv, false}}) {
    const GgufTensor* t = (*g)->file->FindTensor(name);
    std::vector<float> stored(t->numel()), loaded(t->numel());
    std::memcpy(stored.data(), t->data, t->nbytes);
    WeightRowToFloat(*m, 0, loaded.data());
    for (int64_t i = 0; i < t->numel(); ++i) {
      ASSERT_EQ(loaded[rope ? GgufRopeRowToHf(i, 32) : i], stored[i]) << name << " " << i;
    }
  }
  EXPECT_EQ(l.bo.data, nullptr);
  // Qwen3 with attention_bias: all four, none reordered.
  g = LoadGgufModel(HandMadeFile(
      "qwen3", "qwen3-bias.gguf", {},
      {"blk.0.attn_q.bias", "blk.0.attn_k.bias", "blk.0.attn_v.bias", "blk.0.attn_output.bias"}));
  ASSERT_TRUE(g.ok()) << g.status();
  EXPECT_TRUE((*g)->config.qkv_bias && (*g)->config.o_bias && (*g)->config.qk_norm);
  const GgufTensor* bq = (*g)->file->FindTensor("blk.0.attn_q.bias");
  EXPECT_EQ((*g)->weights.layers[0].bq.data, bq->data);  // in place: the file's order
  EXPECT_EQ((*g)->weights.layers[0].bo.data,
            (*g)->file->FindTensor("blk.0.attn_output.bias")->data);
}

// What a file of these architectures lacks or has too many of is named: a missing bias or Q/K
// norm (NOT_FOUND), one of the wrong size (INVALID_ARGUMENT), a tensor the architecture does not
// have (UNIMPLEMENTED, as llama.cpp refuses it); an unknown architecture names the key.
TEST(GgufArchitectureFilesTest, MissingAndUnusedTensorsAreNamed) {
  struct Case {
    const char* arch;
    std::vector<std::string> omit, extra;
    absl::StatusCode code;
    const char* message;
  };
  const std::vector<Case> cases = {
      {"qwen2",
       {"blk.0.attn_k.bias"},
       {},
       absl::StatusCode::kNotFound,
       "tensor \"blk.0.attn_k.bias\" is missing"},
      {"qwen3",
       {"blk.0.attn_k_norm.weight"},
       {},
       absl::StatusCode::kNotFound,
       "tensor \"blk.0.attn_k_norm.weight\" is missing"},
      {"llama",
       {},
       {"blk.0.attn_q.bias", "blk.0.attn_k.bias"},
       absl::StatusCode::kNotFound,
       "tensor \"blk.0.attn_v.bias\" is missing"},
      {"qwen2",
       {},
       {"blk.0.attn_output.bias"},
       absl::StatusCode::kUnimplemented,
       "tensor \"blk.0.attn_output.bias\": is not used by a \"qwen2\" model"},
      {"llama",
       {},
       {"blk.0.attn_q_norm.weight"},
       absl::StatusCode::kUnimplemented,
       "tensor \"blk.0.attn_q_norm.weight\": is not used by a \"llama\" model"},
      {"llama",
       {},
       {"blk.0.attn_k.bias"},
       absl::StatusCode::kUnimplemented,
       "tensor \"blk.0.attn_k.bias\": is not used by a \"llama\" model"},
  };
  int i = 0;
  for (const Case& c : cases) {
    const absl::Status st =
        LoadGgufModel(HandMadeFile(c.arch, absl::StrCat("bad-", i++, ".gguf"), c.omit, c.extra))
            .status();
    EXPECT_EQ(st.code(), c.code) << st;
    EXPECT_THAT(std::string(st.message()), HasSubstr(c.message));
  }
  // A bias of another size than the config's: INVALID_ARGUMENT naming it and both shapes.
  const absl::Status st = LoadGgufModel(HandMadeFile("qwen2", "qwen2-short-bias.gguf", {}, {},
                                                     {{"blk.0.attn_q.bias", {32}}}))
                              .status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << st;
  EXPECT_THAT(std::string(st.message()),
              HasSubstr("tensor \"blk.0.attn_q.bias\": ne {32}, the config needs {64}"));
}
TEST(GgufModelTest, RopeRowsGoBackToTheirHuggingFaceOrder) {
  // head_dim 8: GGUF rows 0..7 hold HF rows 0,4,1,5,2,6,3,7 (pairs (j, j + 4) made adjacent).
  std::vector<int64_t> hf;
  for (int64_t r = 0; r < 16; ++r) hf.push_back(GgufRopeRowToHf(r, 8));
  EXPECT_THAT(hf, ::testing::ElementsAre(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15));
}

}  // namespace
}  // namespace kvrm
