// Serving a GGUF file end to end: the engine, over gRPC, on the tiny model converted to GGUF
// (tools/gguf) generates what it generates on the model directory the file came from.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/json.h"
#include "common/logging.h"
#include "common/subprocess.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/weight_matrix.h"
#include "model/gguf.h"
#include "model/gguf_quants.h"
#include "runtime/model_bundle.h"
#include "tests/test_server.h"
#include "tools/gguf/gguf_convert.h"
#include "tools/modelgen/model_writer.h"
#include "tools/modelgen/quantized_writer.h"

namespace kvrm {
namespace {

std::string ConvertTiny(GgmlType type, const std::string& name) {
  const std::string path = TestTmpDir() + "/" + name;
  GgufConvertOptions options;
  options.type = type;
  CHECK_OK(ConvertToGguf(TinyModelDir(), path, options));
  return path;
}

std::unique_ptr<ModelBundle> Load(const std::string& path,
                                  const ModelBundle::LoadOptions& options = {}) {
  absl::StatusOr<std::unique_ptr<ModelBundle>> m = ModelBundle::Load(path, options);
  CHECK_OK(m.status());
  return std::move(*m);
}

// Generates the f32 model `size` into TestTmpDir()/size and returns the directory.
std::string MakeF32Model(const std::string& size) {
  const std::string dir = TestTmpDir() + "/" + size;
  modelgen::MakeModelOptions mo;
  mo.size = size;
  mo.out_dir = dir;
  mo.dtype = DType::kF32;
  CHECK_OK(modelgen::MakeModel(mo).status());
  return dir;
}

EngineOptions Options() {
  EngineOptions o;
  o.slots = 4;
  o.max_context = 256;
  o.threads = 2;
  return o;
}

// Greedy tokens of a few prompts, served one at a time and then all at once.
std::vector<std::vector<int32_t>> Generate(TestServer& server) {
  const std::vector<std::string> prompts = {"Hello there", "The quick brown fox jumps", "1, 2, 3,",
                                            "A much longer prompt that spans "
                                            "more than one block of sixteen tokens, twice over."};
  std::vector<std::vector<int32_t>> out;
  for (const std::string& p : prompts) {
    v1::GenerateRequest r = TextRequest(p, 24);
    r.mutable_stopping()->set_ignore_eos(true);
    const StreamResult res = RunGenerate(server.stub(), r);
    EXPECT_TRUE(res.status.ok()) << res.status.error_message();
    EXPECT_EQ(res.tokens.size(), 24u);
    out.push_back(res.tokens);
  }
  return out;
}

TEST(GgufE2eTest, AnF32FileGeneratesWhatItsDirectoryGenerates) {
  TestServer hf(Load(TinyModelDir()), Options());
  TestServer gguf(Load(ConvertTiny(GgmlType::kF32, "tiny-f32.gguf")), Options());
  // The only difference: Llama 3.1's RoPE factors as f32 (rope_freqs), ~1e-7 of each frequency.
  EXPECT_EQ(Generate(gguf), Generate(hf));
}

// A qwen3 file (per-head Q/K norms, heads of 64 over a hidden size of 128) served over gRPC
// generates what its directory generates: f32, so the same weights bit for bit; q8_0 serves too.
TEST(GgufE2eTest, AQwen3FileGeneratesWhatItsDirectoryGenerates) {
  const std::string dir = MakeF32Model("tiny-qwen3");
  GgufConvertOptions co;
  co.type = GgmlType::kF32;
  const std::string path = TestTmpDir() + "/tiny-qwen3-f32.gguf";
  CHECK_OK(ConvertToGguf(dir, path, co));
  TestServer hf(Load(dir), Options());
  TestServer gguf(Load(path), Options());
  EXPECT_EQ(gguf.model().config.model_type, "qwen3");
  EXPECT_TRUE(gguf.model().config.qk_norm);
  EXPECT_EQ(Generate(gguf), Generate(hf));
  co.type = GgmlType::kQ8_0;
  const std::string q8 = TestTmpDir() + "/tiny-qwen3-q8_0.gguf";
  CHECK_OK(ConvertToGguf(dir, q8, co));
  TestServer quantized(Load(q8), Options());
  const std::vector<std::vector<int32_t>> tokens = Generate(quantized);
  ASSERT_EQ(tokens.size(), 4u);
  grpc::ClientContext ctx;
  v1::ModelInfo info;
  ASSERT_TRUE(quantized.stub().GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.weights_format(), "gguf q8_0");
  EXPECT_EQ(info.architecture(), "Qwen3ForCausalLM");
}

// A gemma3 file (llama.cpp's names and keys: the norms written as 1 + w, post_attention_norm and
// post_ffw_norm, the window and its period, the sliding layers' RoPE base, linear scaling on the
// full layers) generates what its directory generates over prompts past the 48-position window:
// f32 and torch_dtype float32, so the embedding scale sqrtf(128) is what both sides use, and the
// norms' 1 + w is exact in f32 either way. A gemma2 file likewise, from tiny-gemma2 with the
// attention scale llama.cpp derives (query_pre_attn_scalar = head_dim); tiny-gemma2's own 96 has
// no GGUF form and is refused by name.
TEST(GgufE2eTest, GemmaFilesGenerateWhatTheirDirectoriesGenerate) {
  for (const std::string size : {"tiny-gemma3", "tiny-gemma2"}) {
    const std::string dir = MakeF32Model(size);
    GgufConvertOptions co;
    co.type = GgmlType::kF32;
    const std::string path = TestTmpDir() + "/" + size + "-f32.gguf";
    if (size == "tiny-gemma2") {
      const absl::Status refused = ConvertToGguf(dir, path, co);
      EXPECT_EQ(refused.code(), absl::StatusCode::kUnimplemented) << refused;
      EXPECT_THAT(std::string(refused.message()),
                  ::testing::HasSubstr("query_pre_attn_scalar 96: llama.cpp's gemma2 takes the "
                                       "attention scale from the head size"));
      // The same model with the scale llama.cpp derives.
      const std::string config_path = dir + "/config.json";
      absl::StatusOr<std::string> text = ReadFileToString(config_path);
      CHECK_OK(text.status());
      Json config = Json::parse(*text);
      config["query_pre_attn_scalar"] = 64;
      std::ofstream(config_path) << config.dump(2);
    }
    CHECK_OK(ConvertToGguf(dir, path, co));
    TestServer hf(Load(dir), Options());
    TestServer gguf(Load(path), Options());
    const LlamaConfig& g = gguf.model().config;
    const LlamaConfig& h = hf.model().config;
    EXPECT_EQ(g.model_type, h.model_type) << size;
    EXPECT_EQ(g.norm_weight_offset, 0) << size;  // the file's norms are 1 + w
    EXPECT_EQ(g.sliding_window, 48) << size;
    EXPECT_EQ(g.sliding_layers, h.sliding_layers) << size;
    EXPECT_EQ(g.rope_local_theta, h.rope_local_theta) << size;
    EXPECT_EQ(g.rope_scaling.type, h.rope_scaling.type) << size;
    EXPECT_EQ(g.attention_scale, static_cast<float>(h.attention_scale)) << size;
    EXPECT_EQ(g.attn_logit_softcapping, static_cast<float>(h.attn_logit_softcapping)) << size;
    EXPECT_EQ(g.final_logit_softcapping, static_cast<float>(h.final_logit_softcapping)) << size;
    EXPECT_EQ(g.embedding_multiplier, h.embedding_multiplier) << size;
    EXPECT_EQ(Generate(gguf), Generate(hf)) << size;
    // Well past the window: a prompt of over 100 tokens.
    std::string text;
    for (int i = 0; i < 8; ++i) text += "The quick brown fox jumps over the lazy dog. ";
    v1::GenerateRequest r = TextRequest(text, 32);
    r.mutable_stopping()->set_ignore_eos(true);
    const StreamResult a = RunGenerate(gguf.stub(), r), b = RunGenerate(hf.stub(), r);
    ASSERT_TRUE(a.status.ok() && b.status.ok()) << a.status.error_message();
    EXPECT_GT(a.finished.usage().prompt_tokens(), 100) << size;
    EXPECT_EQ(a.tokens, b.tokens) << size;
  }
  // A window as long as the context masks nothing, but Gemma 3's sliding layers still rotate with
  // the local base: the file marks them (window = the context), and the round trip keeps them.
  const std::string dir = TestTmpDir() + "/tiny-gemma3";
  absl::StatusOr<std::string> text = ReadFileToString(dir + "/config.json");
  CHECK_OK(text.status());
  Json config = Json::parse(*text);
  config["sliding_window"] = config["max_position_embeddings"];
  std::ofstream(dir + "/config.json") << config.dump(2);
  const std::string path = TestTmpDir() + "/tiny-gemma3-nowindow.gguf";
  GgufConvertOptions co;
  co.type = GgmlType::kF32;
  CHECK_OK(ConvertToGguf(dir, path, co));
  TestServer hf(Load(dir), Options());
  TestServer gguf(Load(path), Options());
  EXPECT_EQ(hf.model().config.sliding_window, 0);
  EXPECT_EQ(gguf.model().config.sliding_window, 0);
  EXPECT_EQ(gguf.model().config.sliding_layers, hf.model().config.sliding_layers);
  EXPECT_TRUE(gguf.model().config.IsSlidingLayer(0));
  EXPECT_EQ(Generate(gguf), Generate(hf));
}

// Mixtures of experts as llama.cpp's files hold them: a llama file with experts (Mixtral), a
// qwen2moe one (a shared expert, ffn_*_shexp, gated by ffn_gate_inp_shexp) and a qwen3moe one, each
// expert a slab of ffn_gate_exps / ffn_up_exps / ffn_down_exps, the router (ffn_gate_inp) in f32.
// f32 files generate what their directories generate; a q8_0 one and a Q4_K_M one serve, their
// experts' slabs multiplied in place as the file's blocks. tiny-qwen3-moe itself has no GGUF form
// (weights not renormalized, a dense layer: llama.cpp's qwen3moe has neither) and is refused by
// name; its first three layers, renormalized, are a qwen3moe model.
TEST(GgufE2eTest, MixtureOfExpertsFilesGenerateWhatTheirDirectoriesGenerate) {
  for (const std::string size : {"tiny-mixtral", "tiny-qwen3-moe", "tiny-qwen2-moe"}) {
    const std::string dir = MakeF32Model(size);
    GgufConvertOptions co;
    co.type = GgmlType::kF32;
    const std::string path = TestTmpDir() + "/" + size + "-f32.gguf";
    if (size == "tiny-qwen3-moe") {
      absl::Status refused = ConvertToGguf(dir, path, co);
      EXPECT_EQ(refused.code(), absl::StatusCode::kUnimplemented) << refused;
      EXPECT_THAT(std::string(refused.message()),
                  ::testing::HasSubstr("norm_topk_prob false: llama.cpp's qwen3_moe renormalizes"));
      const std::string config_path = dir + "/config.json";
      absl::StatusOr<std::string> text = ReadFileToString(config_path);
      CHECK_OK(text.status());
      Json config = Json::parse(*text);
      config["norm_topk_prob"] = true;
      std::ofstream(config_path) << config.dump(2);
      refused = ConvertToGguf(dir, path, co);
      EXPECT_EQ(refused.code(), absl::StatusCode::kUnimplemented) << refused;
      EXPECT_THAT(std::string(refused.message()), ::testing::HasSubstr("layer 3 is dense"));
      config["num_hidden_layers"] = 3;  // layer 3's tensors stay in the file, unread
      config["mlp_only_layers"] = Json::array();
      std::ofstream(config_path) << config.dump(2);
    }
    CHECK_OK(ConvertToGguf(dir, path, co));
    TestServer hf(Load(dir), Options());
    TestServer gguf(Load(path), Options());
    const LlamaConfig& g = gguf.model().config;
    const LlamaConfig& h = hf.model().config;
    EXPECT_EQ(g.model_type, h.model_type) << size;
    EXPECT_EQ(g.num_experts, h.num_experts) << size;
    EXPECT_EQ(g.num_experts_per_tok, h.num_experts_per_tok) << size;
    EXPECT_EQ(g.moe_intermediate_size, h.moe_intermediate_size) << size;
    EXPECT_EQ(g.norm_topk_prob, size != "tiny-qwen2-moe") << size;  // qwen2moe's are not
    EXPECT_EQ(g.shared_expert_intermediate_size, h.shared_expert_intermediate_size) << size;
    EXPECT_EQ(g.moe_layers, h.moe_layers) << size;
    EXPECT_EQ(Generate(gguf), Generate(hf)) << size;
    for (const auto& [type, q4_k_m, format] :
         {std::tuple{GgmlType::kQ8_0, false, "gguf q8_0"},
          // (Q4_K_M's q4_K falls back to q5_0 for rows of 128, as llama-quantize's does.)
          std::tuple{GgmlType::kQ4_K, true, "gguf q5_0"}}) {
      co.type = type;
      co.q4_k_m = q4_k_m;
      const std::string quantized_path = TestTmpDir() + "/" + size + "-" + format + ".gguf";
      CHECK_OK(ConvertToGguf(dir, quantized_path, co));
      TestServer quantized(Load(quantized_path), Options());
      EXPECT_EQ(Generate(quantized).size(), 4u) << size << " " << format;
      // Each expert is its own slab of the file's blocks: its values are the directory's to the
      // format's resolution (a step of a block's largest magnitude / 127 for q8_0, / 15 for
      // q5_0), nowhere near another expert's; the router is f32, exact.
      const double steps = type == GgmlType::kQ8_0 ? 127 : 15;
      for (int32_t layer = 0; layer < g.num_hidden_layers; ++layer) {
        const LayerWeights& q = quantized.model().weights.layers[layer];
        const LayerWeights& d = hf.model().weights.layers[layer];
        std::vector<float> a(d.router.cols), b(a.size());
        for (int64_t r = 0; r < d.router.rows; ++r) {
          WeightRowToFloat(q.router, r, a.data());
          WeightRowToFloat(d.router, r, b.data());
          ASSERT_EQ(a, b) << size << " layer " << layer << " router row " << r;
        }
        for (int32_t e = 0; e < h.num_experts; ++e) {
          for (const auto& [qm, dm] : {std::pair{&q.expert_gate[e], &d.expert_gate[e]},
                                       std::pair{&q.expert_down[e], &d.expert_down[e]}}) {
            std::vector<float> x(dm->cols), y(dm->cols);
            for (int64_t r = 0; r < dm->rows; r += 5) {
              WeightRowToFloat(*qm, r, x.data());
              WeightRowToFloat(*dm, r, y.data());
              float amax = 0, worst = 0;
              for (int64_t c = 0; c < dm->cols; ++c) {
                amax = std::max(amax, std::abs(y[c]));
                worst = std::max(worst, std::abs(x[c] - y[c]));
              }
              ASSERT_LE(worst, amax / steps)
                  << size << " " << format << " layer " << layer << " expert " << e << " row " << r;
            }
          }
        }
      }
      grpc::ClientContext ctx;
      v1::ModelInfo info;
      ASSERT_TRUE(quantized.stub().GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
      EXPECT_EQ(info.weights_format(), format) << size;
      EXPECT_EQ(info.architecture(), size == "tiny-mixtral"     ? "MixtralForCausalLM"
                                     : size == "tiny-qwen2-moe" ? "Qwen2MoeForCausalLM"
                                                                : "Qwen3MoeForCausalLM");
      EXPECT_EQ(info.num_experts(), h.num_experts);
      EXPECT_EQ(info.num_experts_per_tok(), h.num_experts_per_tok);
      EXPECT_EQ(info.moe_intermediate_size(), h.moe_intermediate_size);
      // Each layer's experts a token does not run: gate, up and down of each.
      EXPECT_EQ(info.num_parameters() - info.num_active_parameters(),
                int64_t{h.num_hidden_layers} * (h.num_experts - h.num_experts_per_tok) * 3 *
                    h.moe_intermediate_size * h.hidden_size);
    }
  }
}

// gpt-oss as llama.cpp's files hold it (architecture gpt-oss: attn_sinks, the FFN pre-norm as
// post_attention_norm, ffn_gate_inp.bias and the experts' biases stacked in f32, the experts in
// MXFP4 where the checkpoint's are). llama.cpp's YaRN ramp runs between whole dimensions, so a
// gpt-oss file reads as truncate true whatever the directory said (modelgen's, as gpt-oss's own,
// says false); with the directory saying true as well, the f32 file generates what the directory
// generates, and the file of an MXFP4 checkpoint holds its experts as MXFP4 blocks in place (the
// file's bytes) of exactly the checkpoint's values and generates what the checkpoint generates.
// An expert with an E8M0 scale the kernels do not take is held as exact q8 affine blocks; one
// past float's range, or NaN, is refused naming the tensor.
TEST(GgufE2eTest, GptOssFilesGenerateWhatTheirDirectoriesGenerate) {
  const std::string dir = MakeF32Model("tiny-gptoss");
  GgufConvertOptions co;
  co.type = GgmlType::kF32;
  const std::string untruncated = TestTmpDir() + "/tiny-gptoss-untruncated.gguf";
  CHECK_OK(ConvertToGguf(dir, untruncated, co));
  EXPECT_FALSE(Load(dir)->config.rope_scaling.truncate);
  EXPECT_TRUE(Load(untruncated)->config.rope_scaling.truncate);
  {
    const std::string config_path = dir + "/config.json";
    absl::StatusOr<std::string> text = ReadFileToString(config_path);
    CHECK_OK(text.status());
    Json config = Json::parse(*text);
    config["rope_scaling"]["truncate"] = true;
    std::ofstream(config_path) << config.dump(2);
  }
  const std::string path = TestTmpDir() + "/tiny-gptoss-f32.gguf";
  CHECK_OK(ConvertToGguf(dir, path, co));
  {
    TestServer hf(Load(dir), Options());
    TestServer gguf(Load(path), Options());
    const LlamaConfig& g = gguf.model().config;
    const LlamaConfig& h = hf.model().config;
    EXPECT_EQ(g.model_type, "gpt_oss");
    EXPECT_TRUE(g.attention_sinks && g.moe_biases && g.qkv_bias && g.o_bias);
    EXPECT_EQ(g.swiglu_limit, h.swiglu_limit);
    EXPECT_EQ(g.sliding_layers, h.sliding_layers);
    EXPECT_EQ(g.sliding_window, h.sliding_window);
    EXPECT_EQ(g.head_dim, h.head_dim);
    EXPECT_EQ(g.num_experts, h.num_experts);
    EXPECT_EQ(g.num_experts_per_tok, h.num_experts_per_tok);
    EXPECT_EQ(g.moe_intermediate_size, h.moe_intermediate_size);
    EXPECT_EQ(g.rope_scaling.type, "yarn");
    EXPECT_EQ(g.rope_scaling.factor, h.rope_scaling.factor);
    EXPECT_EQ(g.rope_scaling.original_max_position_embeddings,
              h.rope_scaling.original_max_position_embeddings);
    EXPECT_EQ(g.rope_scaling.beta_fast, h.rope_scaling.beta_fast);
    EXPECT_EQ(g.rope_scaling.beta_slow, h.rope_scaling.beta_slow);
    EXPECT_EQ(g.rope_scaling.attention_factor, h.rope_scaling.attention_factor);
    EXPECT_TRUE(g.rope_scaling.truncate && h.rope_scaling.truncate);
    EXPECT_EQ(Generate(gguf), Generate(hf));
  }

  // openai's MXFP4 layout of the same model, and its file.
  const std::string mx = TestTmpDir() + "/tiny-gptoss-mxfp4";
  modelgen::QuantizeOptions qo;
  qo.method = "mxfp4";
  CHECK_OK(modelgen::QuantizeModelDir(dir, mx, TestTmpDir() + "/tiny-gptoss-mxfp4-twin", qo));
  const std::string mx_path = mx + ".gguf";
  CHECK_OK(ConvertToGguf(mx, mx_path, co));
  {
    TestServer hf(Load(mx), Options());
    TestServer gguf(Load(mx_path), Options());
    const GgufFile& file = *gguf.model().gguf->file;
    EXPECT_EQ(gguf.model().weights_format, "gguf mxfp4");
    const LlamaConfig& c = hf.model().config;
    for (int32_t layer = 0; layer < c.num_hidden_layers; ++layer) {
      const LayerWeights& g = gguf.model().weights.layers[layer];
      const LayerWeights& h = hf.model().weights.layers[layer];
      for (const auto& [name, gm, hm] :
           {std::tuple{"ffn_gate_exps", &g.expert_gate, &h.expert_gate},
            std::tuple{"ffn_up_exps", &g.expert_up, &h.expert_up},
            std::tuple{"ffn_down_exps", &g.expert_down, &h.expert_down}}) {
        const GgufTensor* t = file.FindTensor(absl::StrCat("blk.", layer, ".", name, ".weight"));
        ASSERT_NE(t, nullptr);
        ASSERT_EQ(t->type, GgmlType::kMxfp4);
        for (int32_t e = 0; e < c.num_experts; ++e) {
          const WeightMatrix& x = (*gm)[e];
          ASSERT_EQ(x.format, WeightFormat::kMxfp4);
          EXPECT_EQ(x.data, t->data + e * t->nbytes / c.num_experts) << "in place";
          std::vector<float> a(x.cols), b(x.cols);
          for (int64_t r = 0; r < x.rows; ++r) {
            WeightRowToFloat(x, r, a.data());
            WeightRowToFloat((*hm)[e], r, b.data());
            ASSERT_EQ(a, b) << name << " layer " << layer << " expert " << e << " row " << r;
          }
        }
      }
    }
    EXPECT_EQ(Generate(gguf), Generate(hf));
  }

  // Expert 0's first block of layer 0's down matrix, its scale byte rewritten.
  absl::StatusOr<std::string> bytes = ReadFileToString(mx_path);
  CHECK_OK(bytes.status());
  size_t at = std::string::npos;
  {
    absl::StatusOr<std::unique_ptr<GgufFile>> f = GgufFile::Open(mx_path);
    CHECK_OK(f.status());
    const GgufTensor* t = (*f)->FindTensor("blk.0.ffn_down_exps.weight");
    ASSERT_NE(t, nullptr);
    at = bytes->find(std::string(reinterpret_cast<const char*>(t->data), 4 * 17));
    ASSERT_NE(at, std::string::npos);
  }
  auto with_scale = [&](uint8_t e) {
    std::string edited = *bytes;
    edited[at] = static_cast<char>(e);
    const std::string edited_path = absl::StrCat(TestTmpDir(), "/scale-", int{e}, ".gguf");
    std::ofstream(edited_path, std::ios::binary) << edited;
    return edited_path;
  };
  const std::unique_ptr<ModelBundle> small = Load(with_scale(1));  // 2^-127: below the kernels'
  const WeightMatrix& down = small->weights.layers[0].expert_down[0];
  EXPECT_EQ(down.format, WeightFormat::kQ8Affine);
  EXPECT_EQ(small->weights.layers[0].expert_down[1].format, WeightFormat::kMxfp4);
  {
    std::vector<float> got(down.cols), want(down.cols);
    WeightRowToFloat(down, 0, got.data());
    const auto* file = reinterpret_cast<const std::byte*>(
        small->gguf->file->FindTensor("blk.0.ffn_down_exps.weight")->data);
    DequantizeRow(GgmlType::kMxfp4, file, down.cols, want.data());
    EXPECT_EQ(got, want);
    EXPECT_LT(std::abs(got[0]), 1e-36f);
  }
  for (const uint8_t e : {253, 255}) {
    absl::StatusOr<std::unique_ptr<ModelBundle>> refused = ModelBundle::Load(with_scale(e), {});
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << int{e};
    EXPECT_THAT(std::string(refused.status().message()),
                ::testing::HasSubstr(absl::StrCat("tensor \"blk.0.ffn_down_exps.weight\": block 0 "
                                                  "of expert 0: E8M0 scale ",
                                                  int{e})));
  }
}

// A smoke test of the quantized paths end to end (their numerics: //tools/gguf:gguf_convert_test,
// the weights against the originals and the block formats against their layouts): q4_0 held as
// exact q8_0 blocks, q4_1 (d * q + m) as exact q8 affine blocks, and both dequantized to bf16 with
// as_q8 off (kvrmd --quantization=none).
TEST(GgufE2eTest, QuantizedFilesServe) {
  for (const auto& [type, name, as_q8, quantization] :
       {std::tuple{GgmlType::kQ4_0, "q4_0", true, "q8_0"},
        std::tuple{GgmlType::kQ4_1, "q4_1", true, "q8_affine"},
        std::tuple{GgmlType::kQ4_1, "q4_1", false, ""}}) {
    ModelBundle::LoadOptions load;
    load.as_q8 = as_q8;
    TestServer gguf(Load(ConvertTiny(type, absl::StrCat("tiny-", name, ".gguf")), load), Options());
    const std::vector<std::vector<int32_t>> tokens = Generate(gguf);
    ASSERT_EQ(tokens.size(), 4u);
    for (const std::vector<int32_t>& t : tokens) {
      for (int32_t id : t) EXPECT_LT(id, gguf.model().config.vocab_size);
    }
    // The model info names the file's type, the type its quantized matrices would become, and
    // whether they are multiplied as q8_0.
    EXPECT_EQ(gguf.model().weights.layers[0].wq.dtype, DType::kBF16);
    grpc::ClientContext ctx;
    v1::ModelInfo info;
    ASSERT_TRUE(gguf.stub().GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
    EXPECT_EQ(info.weights_format(), absl::StrCat("gguf ", name));
    EXPECT_EQ(info.dtype(), "bf16");
    EXPECT_EQ(info.weight_quantization(), quantization) << name;
  }
}

// A q8_0 file's matrices stay q8_0: views of the file's own blocks (those whose rows llama.cpp
// permutes put back in order in memory), multiplied as they are (kernels/cpu/q8_0.h; numerics:
// //tests:forward_test's Q8ForwardTest), and the model info says so. With as_q8 off
// (kvrmd --quantization=none) they become bf16 as the types without an exact q8_0 form do.
TEST(GgufE2eTest, AQ8_0FileIsMultipliedAsQ8_0) {
  const std::string path = ConvertTiny(GgmlType::kQ8_0, "tiny-q8_0.gguf");
  TestServer gguf(Load(path), Options());
  const LlamaWeights& w = gguf.model().weights;
  const GgufFile& file = *gguf.model().gguf->file;
  for (const WeightMatrix* m : {&w.layers[0].wv, &w.layers[1].w_up, &w.layers[3].w_down}) {
    EXPECT_EQ(m->format, WeightFormat::kQ8_0);
    const GgufTensor* t = nullptr;
    for (const GgufTensor& candidate : file.tensors()) {
      if (candidate.data == m->data) t = &candidate;
    }
    ASSERT_NE(t, nullptr) << "not a view of one of the file's tensors";
    EXPECT_EQ(t->type, GgmlType::kQ8_0);
  }
  EXPECT_EQ(w.layers[0].wq.format, WeightFormat::kQ8_0);  // rows put back in HF order
  EXPECT_EQ(w.layers[0].attn_norm.format, WeightFormat::kDense);
  const std::vector<std::vector<int32_t>> tokens = Generate(gguf);
  ASSERT_EQ(tokens.size(), 4u);
  grpc::ClientContext ctx;
  v1::ModelInfo info;
  ASSERT_TRUE(gguf.stub().GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.weights_format(), "gguf q8_0");
  EXPECT_EQ(info.weight_quantization(), "q8_0");

  ModelBundle::LoadOptions none;
  none.as_q8 = false;
  TestServer dense(Load(path, none), Options());
  EXPECT_EQ(dense.model().weights.layers[0].wv.format, WeightFormat::kDense);
  EXPECT_EQ(dense.model().weights.layers[0].wv.dtype, DType::kBF16);
  grpc::ClientContext ctx2;
  v1::ModelInfo dense_info;
  ASSERT_TRUE(dense.stub().GetModelInfo(&ctx2, v1::GetModelInfoRequest(), &dense_info).ok());
  EXPECT_EQ(dense_info.weight_quantization(), "");
  // The same values either way, to bf16's rounding of d * q.
  std::vector<float> a(w.layers[2].w_gate.cols), b(a.size());
  for (int64_t r = 0; r < w.layers[2].w_gate.rows; r += 7) {
    WeightRowToFloat(w.layers[2].w_gate, r, a.data());
    WeightRowToFloat(dense.model().weights.layers[2].w_gate, r, b.data());
    for (size_t c = 0; c < a.size(); ++c) ASSERT_EQ(Bf16ToFloat(FloatToBf16(a[c])), b[c]);
  }
}

// A q4_K file (the small model: every linear weight's rows are whole 256-value super-blocks,
// which the tiny model's are not) is served with its q4_K matrices multiplied as they are: views
// of the file's tensors (attn_q / attn_k put back in HF order), the model info says q4_K, and the
// engine generates with them (numerics: //tests:forward_test's Q4KForwardTest).
TEST(GgufE2eTest, AQ4_KFileIsMultipliedAsQ4_K) {
  const std::string dir = TestTmpDir() + "/kvrm-small";
  modelgen::MakeModelOptions mo;
  mo.size = "small";
  mo.out_dir = dir;
  CHECK_OK(modelgen::MakeModel(mo).status());
  const std::string path = TestTmpDir() + "/small-q4_K.gguf";
  GgufConvertOptions co;
  co.type = GgmlType::kQ4_K;
  CHECK_OK(ConvertToGguf(dir, path, co));
  TestServer gguf(Load(path), Options());
  const LlamaWeights& w = gguf.model().weights;
  const GgufFile& file = *gguf.model().gguf->file;
  for (const WeightMatrix* m : {&w.layers[0].wv, &w.layers[5].w_up, &w.layers[11].w_down}) {
    EXPECT_EQ(m->format, WeightFormat::kQ4K);
    bool view = false;
    for (const GgufTensor& t : file.tensors()) view = view || t.data == m->data;
    EXPECT_TRUE(view) << "not a view of one of the file's tensors";
  }
  EXPECT_EQ(w.layers[0].wq.format, WeightFormat::kQ4K);  // rows put back in HF order
  const std::vector<std::vector<int32_t>> tokens = Generate(gguf);
  ASSERT_EQ(tokens.size(), 4u);
  grpc::ClientContext ctx;
  v1::ModelInfo info;
  ASSERT_TRUE(gguf.stub().GetModelInfo(&ctx, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.weights_format(), "gguf q4_K");
  EXPECT_EQ(info.weight_quantization(), "q4_K");
}

}  // namespace
}  // namespace kvrm
