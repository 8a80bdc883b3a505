// GGUF files made by the converter and read by kvrm's loader: the same model as the safetensors
// directory it came from (config, every weight, tokenizer, chat template), quantized weights
// within their formats' resolution, and the tokenizer.ggml.* translation of real vocabularies
// (Llama 3, GPT-2, Qwen3, Llama 2) encoding and decoding as their tokenizer.json does.
#include "tools/gguf/gguf_convert.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/json.h"
#include "common/logging.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/weight_matrix.h"
#include "model/gguf.h"
#include "model/gguf_model.h"
#include "model/gguf_quants.h"
#include "model/gguf_tokenizer.h"
#include "model/gguf_writer.h"
#include "model/tokenizer.h"
#include "model/tokenizer_testdata.h"
#include "runtime/model_bundle.h"
#include "tools/modelgen/model_writer.h"

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

TokenizerPair MakePair(const std::string& family) {
  const std::string text = TestdataTokenizerJson(family);
  absl::StatusOr<Json> tj = ParseJson(text, family);
  CHECK_OK(tj.status());
  TokenizerPair pair;
  absl::StatusOr<std::unique_ptr<Tokenizer>> hf = Tokenizer::FromJson(text, family);
  CHECK_OK(hf.status());
  pair.hf = std::move(*hf);
  // BOS / EOS as the families' configs name them.
  const std::map<std::string, std::pair<std::string, std::string>> specials = {
      {"llama3", {"<|begin_of_text|>", "<|end_of_text|>"}},
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
  std::ifstream in(absl::StrCat(kTokenizerTestdata, family, "/vectors.jsonl"));
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
                         ::testing::Values("llama3", "gpt2", "qwen3", "llama2"));

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

TEST(GgufModelTest, AnF32FileIsTheSameModelAsItsDirectory) {
  const std::unique_ptr<ModelBundle> hf = Load(TinyDir());
  const std::unique_ptr<ModelBundle> gguf = Load(Convert(GgmlType::kF32, "tiny-f32.gguf"));
  ASSERT_NE(gguf->gguf, nullptr);
  EXPECT_EQ(gguf->name, "tiny-f32");
  const LlamaConfig &a = hf->config, &b = gguf->config;
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
        if (!norm && c.type != GgmlType::kF16) EXPECT_EQ(loaded[i]->dtype, dq) << c.name;
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
  absl::Status st = load(base("qwen2", "gpt2", "qwen2"), "arch.gguf");
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(st.message()),
              HasSubstr("general.architecture: \"qwen2\" is not supported"));
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
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  w.AddUint32("llama.context_length", 64);
  w.AddUint32("llama.embedding_length", 128);
  w.AddUint32("llama.block_count", 2000000000);
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
  EXPECT_EQ(st.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(st.message()), HasSubstr("tensor \"blk.0.attn_norm.weight\" is missing"));
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
// they are, q8_0, q4_0 and q5_0 as q8_0 blocks, q4_1 and q5_K as q8 affine blocks,
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

TEST(GgufModelTest, RopeRowsGoBackToTheirHuggingFaceOrder) {
  // head_dim 8: GGUF rows 0..7 hold HF rows 0,4,1,5,2,6,3,7 (pairs (j, j + 4) made adjacent).
  std::vector<int64_t> hf;
  for (int64_t r = 0; r < 16; ++r) hf.push_back(GgufRopeRowToHf(r, 8));
  EXPECT_THAT(hf, ::testing::ElementsAre(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15));
}

}  // namespace
}  // namespace kvrm
