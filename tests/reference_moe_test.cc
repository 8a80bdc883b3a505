// The float64 reference's mixtures of experts (Mixtral, Qwen3-MoE, Qwen2-MoE), on tiny models
// written here from hand-built configs: every expert the dense MLP gives the dense model's logits
// exactly (whatever the router picks); all experts kept unrenormalized, the top-k picks of a
// router whose choices differ by token, and Qwen2-MoE's gated shared expert agree with a second
// computation of the first position written here; a shared expert whose gate is zero adds half
// its output (sigmoid(0) = 1/2), as a dense model with that expert's features appended shows; the
// routing margin; and which tensors the weight replacement visits. gpt-oss (gpt_oss) against a
// second computation written here from Transformers' modeling_gpt_oss: the attention sinks' share
// of each softmax, the router's bias and the softmax of the kept logits, the experts' fused
// tensors (gate and up interleaved), the clamped GLU with up + 1, and MXFP4 blocks decoded to the
// float tensors they stand for; and modelgen's tiny-gptoss, whose sinks and clamp move its logits
// and whose MXFP4 checkpoint gives exactly its twin's.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "gtest/gtest.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/safetensors_writer.h"
#include "tests/reference_llama.h"
#include "tools/modelgen/model_writer.h"
#include "tools/modelgen/quantized_writer.h"

namespace kvrm {
namespace {

constexpr int32_t kVocab = 20;
constexpr int32_t kHidden = 16;
constexpr int32_t kHeads = 2;
constexpr int32_t kKvHeads = 1;
constexpr int32_t kHeadDim = 8;
constexpr int32_t kFfn = 12;
constexpr int32_t kExperts = 4;
constexpr int32_t kSharedFfn = 8;  // Qwen2-MoE's shared expert's features

// A model's tensors by HF name: shape and f32 values (which widen to double exactly).
struct Tensor {
  std::vector<int64_t> shape;
  std::vector<float> values;
};
using Weights = std::map<std::string, Tensor>;

class Random {
 public:
  explicit Random(uint32_t seed) : rng_(seed) {}
  Tensor Make(std::vector<int64_t> shape, float center, float spread) {
    Tensor t{std::move(shape), {}};
    const int64_t n = std::accumulate(t.shape.begin(), t.shape.end(), int64_t{1},
                                      [](int64_t a, int64_t b) { return a * b; });
    std::uniform_real_distribution<float> u(-spread, spread);
    for (int64_t i = 0; i < n; ++i) t.values.push_back(center + u(rng_));
    return t;
  }

 private:
  std::mt19937 rng_;
};

// `layers` layers of `model_type` ("mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe" or
// "qwen3_moe") with the sizes above; a mixture in the layers `moe` marks (empty: dense), without
// a shared expert.
LlamaConfig MakeConfig(const std::string& model_type, int32_t layers, std::vector<bool> moe,
                       int32_t top_k, bool norm_topk_prob) {
  LlamaConfig c;
  c.model_type = model_type;
  c.vocab_size = kVocab;
  c.hidden_size = kHidden;
  c.intermediate_size = kFfn;
  c.num_hidden_layers = layers;
  c.num_attention_heads = kHeads;
  c.num_key_value_heads = kKvHeads;
  c.head_dim = kHeadDim;
  c.max_position_embeddings = 64;
  c.qk_norm = model_type == "qwen3" || model_type == "qwen3_moe";
  c.qkv_bias = model_type == "qwen2" || model_type == "qwen2_moe";  // as the parser sets it
  if (std::find(moe.begin(), moe.end(), true) != moe.end()) {
    c.num_experts = kExperts;
    c.num_experts_per_tok = top_k;
    c.moe_intermediate_size = kFfn;
    c.norm_topk_prob = norm_topk_prob;
    c.moe_layers = std::move(moe);
  }
  return c;
}

// The dense model's tensors (random; norms near 1), the MLP of c.intermediate_size.
Weights DenseWeights(const LlamaConfig& c, Random& random) {
  Weights w;
  w["model.embed_tokens.weight"] = random.Make({kVocab, kHidden}, 0, 1);
  w["lm_head.weight"] = random.Make({kVocab, kHidden}, 0, 0.3f);
  w["model.norm.weight"] = random.Make({kHidden}, 1, 0.2f);
  for (int32_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    w[p + "input_layernorm.weight"] = random.Make({kHidden}, 1, 0.2f);
    w[p + "post_attention_layernorm.weight"] = random.Make({kHidden}, 1, 0.2f);
    w[p + "self_attn.q_proj.weight"] = random.Make({kHeads * kHeadDim, kHidden}, 0, 0.4f);
    w[p + "self_attn.k_proj.weight"] = random.Make({kKvHeads * kHeadDim, kHidden}, 0, 0.4f);
    w[p + "self_attn.v_proj.weight"] = random.Make({kKvHeads * kHeadDim, kHidden}, 0, 0.4f);
    w[p + "self_attn.o_proj.weight"] = random.Make({kHidden, kHeads * kHeadDim}, 0, 0.3f);
    if (c.qkv_bias) {
      w[p + "self_attn.q_proj.bias"] = random.Make({kHeads * kHeadDim}, 0, 0.3f);
      w[p + "self_attn.k_proj.bias"] = random.Make({kKvHeads * kHeadDim}, 0, 0.3f);
      w[p + "self_attn.v_proj.bias"] = random.Make({kKvHeads * kHeadDim}, 0, 0.3f);
    }
    if (c.qk_norm) {
      w[p + "self_attn.q_norm.weight"] = random.Make({kHeadDim}, 1, 0.2f);
      w[p + "self_attn.k_norm.weight"] = random.Make({kHeadDim}, 1, 0.2f);
    }
    const int64_t ffn = c.intermediate_size;
    w[p + "mlp.gate_proj.weight"] = random.Make({ffn, kHidden}, 0, 0.4f);
    w[p + "mlp.up_proj.weight"] = random.Make({ffn, kHidden}, 0, 0.4f);
    w[p + "mlp.down_proj.weight"] = random.Make({kHidden, ffn}, 0, 0.3f);
  }
  return w;
}

// HF names of layer `layer`'s router and expert `e`'s gate, up and down, as the two
// architectures' modeling code names them.
std::string RouterName(const LlamaConfig& c, int32_t layer) {
  return absl::StrCat(
      "model.layers.", layer,
      c.model_type == "mixtral" ? ".block_sparse_moe.gate.weight" : ".mlp.gate.weight");
}
std::vector<std::string> ExpertNames(const LlamaConfig& c, int32_t layer, int32_t e) {
  if (c.model_type == "mixtral") {
    const std::string p = absl::StrCat("model.layers.", layer, ".block_sparse_moe.experts.", e);
    return {p + ".w1.weight", p + ".w3.weight", p + ".w2.weight"};
  }
  const std::string p = absl::StrCat("model.layers.", layer, ".mlp.experts.", e);
  return {p + ".gate_proj.weight", p + ".up_proj.weight", p + ".down_proj.weight"};
}
// Qwen2-MoE's shared expert's gate, up and down, and its gate's [1][hidden] vector.
std::vector<std::string> SharedExpertNames(int32_t layer) {
  const std::string p = absl::StrCat("model.layers.", layer, ".mlp.shared_expert.");
  return {p + "gate_proj.weight", p + "up_proj.weight", p + "down_proj.weight"};
}
std::string SharedExpertGateName(int32_t layer) {
  return absl::StrCat("model.layers.", layer, ".mlp.shared_expert_gate.weight");
}

// `dense`'s tensors as MoE model `c`: in each MoE layer a random router (spread `router_spread`)
// and experts that are the dense MLP (`same_experts`) or random; and when
// c.shared_expert_intermediate_size > 0 a random shared expert and gate.
Weights MoeWeights(const LlamaConfig& c, const Weights& dense, Random& random, bool same_experts,
                   float router_spread = 1.0f) {
  Weights w = dense;
  for (int32_t i = 0; i < c.num_hidden_layers; ++i) {
    if (!c.IsMoeLayer(i)) continue;
    const std::string p = absl::StrCat("model.layers.", i, ".mlp.");
    const std::string dense_names[] = {p + "gate_proj.weight", p + "up_proj.weight",
                                       p + "down_proj.weight"};
    w[RouterName(c, i)] = random.Make({kExperts, kHidden}, 0, router_spread);
    for (int32_t e = 0; e < kExperts; ++e) {
      const std::vector<std::string> names = ExpertNames(c, i, e);
      for (int j = 0; j < 3; ++j) {
        const Tensor& d = dense.at(dense_names[j]);
        w[names[j]] = same_experts ? d : random.Make(d.shape, 0, 0.4f);
      }
    }
    for (const std::string& name : dense_names) w.erase(name);
    if (c.shared_expert_intermediate_size > 0) {
      const int64_t shared = c.shared_expert_intermediate_size;
      const std::vector<std::string> names = SharedExpertNames(i);
      w[names[0]] = random.Make({shared, kHidden}, 0, 0.4f);
      w[names[1]] = random.Make({shared, kHidden}, 0, 0.4f);
      w[names[2]] = random.Make({kHidden, shared}, 0, 0.4f);
      w[SharedExpertGateName(i)] = random.Make({1, kHidden}, 0, 0.5f);
    }
  }
  return w;
}

// U8 tensors by name (MXFP4 blocks and scales): shape and bytes.
struct Bytes {
  std::vector<int64_t> shape;
  std::vector<uint8_t> values;
};
using ByteTensors = std::map<std::string, Bytes>;

std::string TestDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/reference_moe_", name);
}

// The reference on a model directory holding `w` (f32) and `u8`.
absl::StatusOr<std::unique_ptr<ReferenceLlama>> TryMakeReference(const LlamaConfig& c,
                                                                 const Weights& w,
                                                                 const std::string& name,
                                                                 const ByteTensors& u8 = {}) {
  const std::string dir = TestDir(name);
  std::filesystem::create_directories(dir);
  std::vector<TensorToWrite> tensors;
  for (const auto& [n, t] : w) {
    tensors.push_back({n, DType::kF32, t.shape,
                       absl::MakeConstSpan(reinterpret_cast<const std::byte*>(t.values.data()),
                                           t.values.size() * sizeof(float))});
  }
  for (const auto& [n, t] : u8) {  // after the f32 ones: every tensor stays aligned
    tensors.push_back(
        {n, DType::kF32, t.shape,
         absl::MakeConstSpan(reinterpret_cast<const std::byte*>(t.values.data()), t.values.size()),
         StorageType::kU8});
  }
  EXPECT_TRUE(WriteSafetensors(dir + "/model.safetensors", tensors).ok());
  auto files = SafetensorsSet::OpenDirectory(dir);
  EXPECT_TRUE(files.ok()) << files.status();
  return ReferenceLlama::Create(c, **files);
}

std::unique_ptr<ReferenceLlama> MakeReference(const LlamaConfig& c, const Weights& w,
                                              const std::string& name, const ByteTensors& u8 = {}) {
  auto ref = TryMakeReference(c, w, name, u8);
  EXPECT_TRUE(ref.ok()) << ref.status();
  return std::move(*ref);
}

double MaxAbsDiff(const std::vector<std::vector<double>>& a,
                  const std::vector<std::vector<double>>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t t = 0; t < a.size(); ++t) {
    EXPECT_EQ(a[t].size(), b[t].size());
    for (size_t i = 0; i < a[t].size(); ++i) m = std::max(m, std::fabs(a[t][i] - b[t][i]));
  }
  return m;
}

// ---- a second computation of the first position, for one-layer models ----------------------

std::vector<double> MatVec(const Tensor& w, const std::vector<double>& x) {
  const int64_t rows = w.shape[0], cols = w.shape[1];
  std::vector<double> y(rows, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < cols; ++i) y[r] += static_cast<double>(w.values[r * cols + i]) * x[i];
  }
  return y;
}

std::vector<double> Norm(const std::vector<double>& x, const Tensor& w, double eps) {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = w.values[i] * x[i] * inv;
  return y;
}

struct FirstPosition {
  std::vector<double> logits;                               // [vocab]
  std::vector<int32_t> experts;                             // the kept ones, best first
  double margin = std::numeric_limits<double>::infinity();  // k-th minus (k+1)-th router logit
};

// Logits of a one-layer MoE model after `token` at position 0, where attention has one key:
// each query head's output is its KV head's value (with v_proj's bias, if any), whatever Q, K,
// their biases, norms and RoPE are. Qwen2-MoE's shared expert, when c has one, is added as
// Qwen2MoeSparseMoeBlock adds it: sigmoid(shared_expert_gate . m) * shared_expert(m).
FirstPosition FirstPositionOf(const LlamaConfig& c, const Weights& w, int32_t token) {
  const std::string p = "model.layers.0.";
  const Tensor& embed = w.at("model.embed_tokens.weight");
  std::vector<double> x(embed.values.begin() + token * kHidden,
                        embed.values.begin() + (token + 1) * kHidden);
  std::vector<double> v = MatVec(w.at(p + "self_attn.v_proj.weight"),
                                 Norm(x, w.at(p + "input_layernorm.weight"), c.rms_norm_eps));
  if (c.qkv_bias) {
    const Tensor& bias = w.at(p + "self_attn.v_proj.bias");
    for (size_t i = 0; i < v.size(); ++i) v[i] += bias.values[i];
  }
  std::vector<double> attn(kHeads * kHeadDim);
  for (int32_t h = 0; h < kHeads; ++h) {
    for (int32_t i = 0; i < kHeadDim; ++i) {
      attn[h * kHeadDim + i] = v[(h / (kHeads / kKvHeads)) * kHeadDim + i];
    }
  }
  const std::vector<double> o = MatVec(w.at(p + "self_attn.o_proj.weight"), attn);
  for (int32_t i = 0; i < kHidden; ++i) x[i] += o[i];
  const std::vector<double> m =
      Norm(x, w.at(p + "post_attention_layernorm.weight"), c.rms_norm_eps);
  const std::vector<double> scores = MatVec(w.at(RouterName(c, 0)), m);
  // Softmax, then the top num_experts_per_tok by probability.
  std::vector<double> prob(kExperts);
  double sum = 0;
  for (int32_t e = 0; e < kExperts; ++e) sum += prob[e] = std::exp(scores[e]);
  for (double& q : prob) q /= sum;
  FirstPosition out;
  std::vector<int32_t> order(kExperts);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return prob[a] > prob[b]; });
  const int32_t k = c.num_experts_per_tok;
  out.experts.assign(order.begin(), order.begin() + k);
  if (k < kExperts) out.margin = scores[order[k - 1]] - scores[order[k]];
  double kept = 0;
  for (int32_t e : out.experts) kept += prob[e];
  for (int32_t e : out.experts) {
    const std::vector<std::string> names = ExpertNames(c, 0, e);
    std::vector<double> g = MatVec(w.at(names[0]), m);
    const std::vector<double> u = MatVec(w.at(names[1]), m);
    for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
    const std::vector<double> y = MatVec(w.at(names[2]), g);
    const double weight = c.norm_topk_prob ? prob[e] / kept : prob[e];
    for (int32_t i = 0; i < kHidden; ++i) x[i] += weight * y[i];
  }
  if (c.shared_expert_intermediate_size > 0) {
    const std::vector<std::string> names = SharedExpertNames(0);
    std::vector<double> g = MatVec(w.at(names[0]), m);
    const std::vector<double> u = MatVec(w.at(names[1]), m);
    for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1 + std::exp(-g[i])) * u[i];
    const std::vector<double> y = MatVec(w.at(names[2]), g);
    const double gate = 1 / (1 + std::exp(-MatVec(w.at(SharedExpertGateName(0)), m)[0]));
    for (int32_t i = 0; i < kHidden; ++i) x[i] += gate * y[i];
  }
  out.logits = MatVec(w.at("lm_head.weight"), Norm(x, w.at("model.norm.weight"), c.rms_norm_eps));
  return out;
}

// ---- tests -----------------------------------------------------------------------------------

const std::vector<int32_t> kTokens = {3, 17, 0, 9, 9, 12, 5, 1, 19, 4, 8, 2};

// With every expert equal to the dense MLP and the kept probabilities renormalized, the mixture
// is that MLP whatever the router picks: the logits are the dense model's (full attention and
// far history alike). Mixtral against Mistral in every layer; Qwen3-MoE against Qwen3 and
// Qwen2-MoE without a shared expert against Qwen2, with a dense first layer (mlp_only_layers).
TEST(ReferenceMoeTest, EveryExpertTheDenseMlpGivesTheDenseModel) {
  for (const auto& [dense_type, moe_type, moe] :
       {std::tuple<std::string, std::string, std::vector<bool>>{"mistral", "mixtral", {true, true}},
        {"qwen3", "qwen3_moe", {false, true}},
        {"qwen2", "qwen2_moe", {false, true}}}) {
    SCOPED_TRACE(moe_type);
    Random random(7);
    const LlamaConfig dense_config = MakeConfig(dense_type, 2, {}, 0, false);
    const LlamaConfig moe_config = MakeConfig(moe_type, 2, moe, 2, true);
    const Weights dense = DenseWeights(dense_config, random);
    const Weights mixture = MoeWeights(moe_config, dense, random, /*same_experts=*/true);
    auto dense_ref = MakeReference(dense_config, dense, dense_type);
    auto moe_ref = MakeReference(moe_config, mixture, moe_type);
    EXPECT_EQ(moe_ref->min_routing_margin(), std::numeric_limits<double>::infinity());

    const auto want = dense_ref->Forward(kTokens);
    EXPECT_LE(MaxAbsDiff(moe_ref->Forward(kTokens), want), 1e-12);
    const double margin = moe_ref->min_routing_margin();
    EXPECT_GT(margin, 0);
    EXPECT_LT(margin, std::numeric_limits<double>::infinity());
    EXPECT_EQ(dense_ref->min_routing_margin(), std::numeric_limits<double>::infinity());

    const ReferenceLlama::FarHistory far{/*block_tokens=*/2, /*sink_blocks=*/1,
                                         /*window_blocks=*/2};
    const auto far_want = dense_ref->Forward(kTokens, far);
    EXPECT_GT(MaxAbsDiff(far_want, want), 1e-6);  // the summaries change something
    EXPECT_LE(MaxAbsDiff(moe_ref->Forward(kTokens, far), far_want), 1e-12);
    EXPECT_LE(moe_ref->min_routing_margin(), margin);  // only ever lowered

    // The experts' matrices are replaced as the dense MLP's are (here: down halved), the router
    // not at all.
    std::vector<std::string> names;
    auto halve_down = [&](const std::string& name, int64_t rows, int64_t cols, double* data) {
      names.push_back(name);
      if (name.find("down_proj") != std::string::npos || name.find(".w2.") != std::string::npos) {
        for (int64_t i = 0; i < rows * cols; ++i) data[i] *= 0.5;
      }
    };
    dense_ref->ReplaceLinearWeights(halve_down);
    names.clear();
    moe_ref->ReplaceLinearWeights(halve_down);
    const auto halved = dense_ref->Forward(kTokens);
    EXPECT_GT(MaxAbsDiff(halved, want), 1e-6);
    EXPECT_LE(MaxAbsDiff(moe_ref->Forward(kTokens), halved), 1e-12);
    for (int32_t layer = 0; layer < 2; ++layer) {
      EXPECT_EQ(std::count(names.begin(), names.end(), RouterName(moe_config, layer)), 0);
      if (!moe_config.IsMoeLayer(layer)) continue;
      for (int32_t e = 0; e < kExperts; ++e) {
        for (const std::string& name : ExpertNames(moe_config, layer, e)) {
          EXPECT_EQ(std::count(names.begin(), names.end(), name), 1) << name;
        }
      }
    }
    std::set<std::string> want_names;
    for (const auto& [name, t] : mixture) {
      if (t.shape.size() == 2 && name != "model.embed_tokens.weight" &&
          name.find(".gate.weight") == std::string::npos) {
        want_names.insert(name);
      }
    }
    EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), want_names);
    EXPECT_EQ(names.size(), want_names.size());
  }
}

// Every token at position 0 through `ref` against the second computation (to 1e-12): the
// distinct sets of experts kept, and the smallest margin.
struct EveryToken {
  std::set<std::vector<int32_t>> picks;
  double margin = std::numeric_limits<double>::infinity();
};
EveryToken CheckEveryToken(const LlamaConfig& config, const Weights& w, const ReferenceLlama& ref) {
  EveryToken out;
  for (int32_t token = 0; token < kVocab; ++token) {
    const std::vector<int32_t> one = {token};
    const FirstPosition want = FirstPositionOf(config, w, token);
    EXPECT_LE(MaxAbsDiff(ref.Forward(one), {want.logits}), 1e-12) << token;
    std::vector<int32_t> set = want.experts;
    std::sort(set.begin(), set.end());
    out.picks.insert(set);
    out.margin = std::min(out.margin, want.margin);
  }
  return out;
}

// Every expert kept, not renormalized: the output is the softmax-weighted sum of all of them.
TEST(ReferenceMoeTest, AllExpertsUnnormalizedAreTheSoftmaxWeightedSum) {
  Random random(11);
  const LlamaConfig config = MakeConfig("qwen3_moe", 1, {true}, kExperts, false);
  const Weights w =
      MoeWeights(config, DenseWeights(config, random), random, /*same_experts=*/false);
  auto ref = MakeReference(config, w, "all_experts");
  CheckEveryToken(config, w, *ref);
  // And as the first position of a longer sequence.
  EXPECT_LE(MaxAbsDiff({ref->Forward(kTokens)[0]}, {FirstPositionOf(config, w, kTokens[0]).logits}),
            1e-12);
  EXPECT_EQ(ref->min_routing_margin(), std::numeric_limits<double>::infinity());
}

// Top 2 of 4, renormalized, with distinct experts and a router whose picks differ by token: the
// logits, the picks and the smallest margin agree with the second computation, both namings.
TEST(ReferenceMoeTest, TopKPicksDependOnTheToken) {
  for (const std::string type : {"mixtral", "qwen3_moe"}) {
    SCOPED_TRACE(type);
    Random random(23);
    const LlamaConfig config = MakeConfig(type, 1, {true}, 2, true);
    const Weights w = MoeWeights(config, DenseWeights(config, random), random,
                                 /*same_experts=*/false, /*router_spread=*/2.0f);
    auto ref = MakeReference(config, w, type + "_top2");
    const EveryToken every = CheckEveryToken(config, w, *ref);
    EXPECT_GE(every.picks.size(), 3u);  // the choice varies with the token
    EXPECT_NEAR(ref->min_routing_margin(), every.margin, 1e-12);
    EXPECT_GT(every.margin, 0);

    // Renormalizing matters: without it the same picks give other logits.
    LlamaConfig unnormalized = config;
    unnormalized.norm_topk_prob = false;
    auto ref_unnormalized = MakeReference(unnormalized, w, type + "_top2_unnormalized");
    const FirstPosition want = FirstPositionOf(unnormalized, w, kTokens[0]);
    const auto got = ref_unnormalized->Forward(kTokens);
    EXPECT_LE(MaxAbsDiff({got[0]}, {want.logits}), 1e-12);
    EXPECT_GT(MaxAbsDiff({got[0]}, {FirstPositionOf(config, w, kTokens[0]).logits}), 1e-6);
  }
}

// Qwen2-MoE, top 2 of 4 unrenormalized (Qwen2MoeConfig's default) with a gated shared expert of
// its own size: the logits and the smallest margin agree with the second computation, and the
// shared expert matters.
TEST(ReferenceMoeTest, Qwen2MoeSharedExpertAgreesWithTheSecondComputation) {
  Random random(31);
  LlamaConfig config = MakeConfig("qwen2_moe", 1, {true}, 2, false);
  config.shared_expert_intermediate_size = kSharedFfn;
  const Weights w = MoeWeights(config, DenseWeights(config, random), random,
                               /*same_experts=*/false, /*router_spread=*/2.0f);
  auto ref = MakeReference(config, w, "qwen2_moe_shared");
  const EveryToken every = CheckEveryToken(config, w, *ref);
  EXPECT_GE(every.picks.size(), 3u);
  EXPECT_NEAR(ref->min_routing_margin(), every.margin, 1e-12);
  EXPECT_GT(every.margin, 0);
  // The first position of a longer sequence too.
  const auto got = ref->Forward(kTokens);
  EXPECT_LE(MaxAbsDiff({got[0]}, {FirstPositionOf(config, w, kTokens[0]).logits}), 1e-12);

  // Without the shared expert (same tensors, the shared ones unread) the logits are the second
  // computation's without it, and differ.
  LlamaConfig unshared = config;
  unshared.shared_expert_intermediate_size = 0;
  auto ref_unshared = MakeReference(unshared, w, "qwen2_moe_unshared");
  const auto got_unshared = ref_unshared->Forward(kTokens);
  EXPECT_LE(MaxAbsDiff({got_unshared[0]}, {FirstPositionOf(unshared, w, kTokens[0]).logits}),
            1e-12);
  EXPECT_GT(MaxAbsDiff(got_unshared, got), 1e-6);
}

// A shared expert whose gate is all zeros is added at half weight (sigmoid(0) = 1/2): Qwen2-MoE
// whose experts are all one MLP D (renormalized top 2, so the routed sum is D whatever the
// router picks) plus a shared expert S gated by zeros is the dense Qwen2 model whose MLP is D's
// and S's features side by side, S's down_proj columns halved: down([gD; gS] x ...) =
// D(x) + S(x) / 2. Over a whole sequence, with a dense first layer (mlp_only_layers) of the same
// width. Also: the weight replacement visits the shared expert's matrices under their names (and
// not its gate nor the router).
TEST(ReferenceMoeTest, ZeroSharedExpertGateAddsHalfTheSharedExpert) {
  Random random(41);
  constexpr int32_t kWide = kFfn + kSharedFfn;
  LlamaConfig dense_config = MakeConfig("qwen2", 2, {}, 0, false);
  dense_config.intermediate_size = kWide;
  LlamaConfig moe_config = MakeConfig("qwen2_moe", 2, {false, true}, 2, true);
  moe_config.intermediate_size = kWide;  // layer 0's dense MLP
  moe_config.shared_expert_intermediate_size = kSharedFfn;
  Weights dense = DenseWeights(dense_config, random);
  Weights full = dense;  // as `dense`, S's down not halved

  // Layer 1: D (the experts) and S (the shared expert), and the wide MLP [D; S].
  const Tensor d_gate = random.Make({kFfn, kHidden}, 0, 0.4f);
  const Tensor d_up = random.Make({kFfn, kHidden}, 0, 0.4f);
  const Tensor d_down = random.Make({kHidden, kFfn}, 0, 0.4f);
  const Tensor s_gate = random.Make({kSharedFfn, kHidden}, 0, 0.4f);
  const Tensor s_up = random.Make({kSharedFfn, kHidden}, 0, 0.4f);
  const Tensor s_down = random.Make({kHidden, kSharedFfn}, 0, 0.4f);
  auto stacked = [](const Tensor& a, const Tensor& b) {  // rows of a, then rows of b
    Tensor t{{a.shape[0] + b.shape[0], a.shape[1]}, a.values};
    t.values.insert(t.values.end(), b.values.begin(), b.values.end());
    return t;
  };
  auto side_by_side = [](const Tensor& a, const Tensor& b, float b_scale) {
    Tensor t{{a.shape[0], a.shape[1] + b.shape[1]}, {}};
    for (int64_t r = 0; r < a.shape[0]; ++r) {
      for (int64_t i = 0; i < a.shape[1]; ++i) t.values.push_back(a.values[r * a.shape[1] + i]);
      for (int64_t i = 0; i < b.shape[1]; ++i) {
        t.values.push_back(b_scale * b.values[r * b.shape[1] + i]);
      }
    }
    return t;
  };
  const std::string p = "model.layers.1.mlp.";
  for (Weights* wide : {&dense, &full}) {
    (*wide)[p + "gate_proj.weight"] = stacked(d_gate, s_gate);
    (*wide)[p + "up_proj.weight"] = stacked(d_up, s_up);
  }
  dense[p + "down_proj.weight"] = side_by_side(d_down, s_down, 0.5f);  // exact in f32
  full[p + "down_proj.weight"] = side_by_side(d_down, s_down, 1.0f);

  Weights mixture = dense;
  for (const char* name : {"gate_proj.weight", "up_proj.weight", "down_proj.weight"}) {
    mixture.erase(p + name);
  }
  mixture[RouterName(moe_config, 1)] = random.Make({kExperts, kHidden}, 0, 2.0f);
  for (int32_t e = 0; e < kExperts; ++e) {
    const std::vector<std::string> names = ExpertNames(moe_config, 1, e);
    mixture[names[0]] = d_gate;
    mixture[names[1]] = d_up;
    mixture[names[2]] = d_down;
  }
  const std::vector<std::string> shared_names = SharedExpertNames(1);
  mixture[shared_names[0]] = s_gate;
  mixture[shared_names[1]] = s_up;
  mixture[shared_names[2]] = s_down;
  mixture[SharedExpertGateName(1)] = Tensor{{1, kHidden}, std::vector<float>(kHidden, 0.0f)};

  auto dense_ref = MakeReference(dense_config, dense, "qwen2_wide_half");
  auto full_ref = MakeReference(dense_config, full, "qwen2_wide_full");
  auto moe_ref = MakeReference(moe_config, mixture, "qwen2_moe_zero_gate");
  const auto want = dense_ref->Forward(kTokens);
  EXPECT_LE(MaxAbsDiff(moe_ref->Forward(kTokens), want), 1e-12);
  EXPECT_GT(MaxAbsDiff(full_ref->Forward(kTokens), want), 1e-6);  // the half matters
  EXPECT_GT(moe_ref->min_routing_margin(), 0);

  // Halving S's down_proj in both (the wide down's last kSharedFfn columns): still equal, and the
  // replacement visits exactly the linear weights, S's under their names, not the router nor
  // the shared expert's gate.
  std::vector<std::string> names;
  moe_ref->ReplaceLinearWeights(
      [&](const std::string& name, int64_t rows, int64_t cols, double* data) {
        names.push_back(name);
        if (name != shared_names[2]) return;
        EXPECT_EQ(rows, kHidden);
        EXPECT_EQ(cols, kSharedFfn);
        for (int64_t i = 0; i < rows * cols; ++i) data[i] *= 0.5;
      });
  dense_ref->ReplaceLinearWeights(
      [&](const std::string& name, int64_t rows, int64_t cols, double* data) {
        if (name != p + "down_proj.weight") return;
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t i = kFfn; i < cols; ++i) data[r * cols + i] *= 0.5;
        }
      });
  const auto quartered = dense_ref->Forward(kTokens);
  EXPECT_GT(MaxAbsDiff(quartered, want), 1e-6);
  EXPECT_LE(MaxAbsDiff(moe_ref->Forward(kTokens), quartered), 1e-12);
  std::set<std::string> want_names;
  for (const auto& [name, t] : mixture) {
    if (t.shape.size() == 2 && name != "model.embed_tokens.weight" &&
        name != RouterName(moe_config, 1) && name != SharedExpertGateName(1)) {
      want_names.insert(name);
    }
  }
  for (const std::string& name : shared_names) EXPECT_EQ(want_names.count(name), 1u) << name;
  EXPECT_EQ(std::set<std::string>(names.begin(), names.end()), want_names);
  EXPECT_EQ(names.size(), want_names.size());
}

// ---- gpt-oss ----------------------------------------------------------------------------------

// gpt-oss's shapes here: hidden 32 and ffn 32 (whole MXFP4 blocks of 32), 4 heads of 8 (a Q width
// of 16 != hidden) over 2 KV heads, 4 experts, the even layers sliding within 4 positions.
constexpr int32_t kOssHidden = 32;
constexpr int32_t kOssFfn = 32;
constexpr int32_t kOssHeads = 4;
constexpr int32_t kOssKvHeads = 2;
constexpr int32_t kOssHeadDim = 8;
constexpr int32_t kOssExperts = 4;
constexpr int32_t kOssWindow = 4;

// A `layers`-layer gpt_oss config as model/config.cc reads GptOssConfig: every attention
// projection biased, sinks, the biased router (top `top_k`, their logits' softmax) and experts,
// the clamped GLU at `limit`, YaRN (factor 4 over 16 positions, truncate false) on every layer,
// the even layers sliding.
LlamaConfig MakeGptOssConfig(int32_t layers, int32_t top_k, double limit) {
  LlamaConfig c;
  c.model_type = "gpt_oss";
  c.vocab_size = kVocab;
  c.hidden_size = kOssHidden;
  c.intermediate_size = kOssFfn;
  c.num_hidden_layers = layers;
  c.num_attention_heads = kOssHeads;
  c.num_key_value_heads = kOssKvHeads;
  c.head_dim = kOssHeadDim;
  c.max_position_embeddings = 64;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 150000;
  c.rope_scaling.type = "yarn";
  c.rope_scaling.factor = 4;
  c.rope_scaling.original_max_position_embeddings = 16;
  c.rope_scaling.truncate = false;
  c.rope_scaling.attention_factor = 0.1 * std::log(4.0) + 1;
  c.qkv_bias = c.o_bias = true;
  c.attention_sinks = true;
  c.moe_biases = true;
  c.swiglu_limit = limit;
  c.num_experts = kOssExperts;
  c.num_experts_per_tok = top_k;
  c.moe_intermediate_size = kOssFfn;
  c.norm_topk_prob = true;
  c.moe_layers.assign(layers, true);
  c.sliding_layers.resize(layers);
  for (int32_t i = 0; i < layers; ++i) c.sliding_layers[i] = i % 2 == 0;
  c.sliding_window = kOssWindow;
  return c;
}

std::string OssLayer(int32_t layer) { return absl::StrCat("model.layers.", layer, "."); }

// Random gpt-oss tensors under their HF names, the experts fused as GptOssExperts holds them
// (gate_up_proj [E][hidden][2 ffn], gate and up in alternate columns; down_proj [E][ffn][hidden]):
// gate_up_proj of spread 0.5 gives gate and up values of std ~1.6 on a normed input, so a limit
// of 2 clamps many; the router's spread 1 and bias spread `router_bias` (logits of std ~3 and
// ~`router_bias` / sqrt(3)).
Weights GptOssWeights(const LlamaConfig& c, Random& random, float router_bias = 2.0f) {
  const int64_t d = kOssHidden, q = kOssHeads * kOssHeadDim, kv = kOssKvHeads * kOssHeadDim;
  const int64_t ffn = kOssFfn, experts = kOssExperts;
  Weights w;
  w["model.embed_tokens.weight"] = random.Make({kVocab, d}, 0, 1);
  w["lm_head.weight"] = random.Make({kVocab, d}, 0, 0.3f);
  w["model.norm.weight"] = random.Make({d}, 1, 0.2f);
  for (int32_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string p = OssLayer(i);
    w[p + "input_layernorm.weight"] = random.Make({d}, 1, 0.2f);
    w[p + "post_attention_layernorm.weight"] = random.Make({d}, 1, 0.2f);
    w[p + "self_attn.q_proj.weight"] = random.Make({q, d}, 0, 0.4f);
    w[p + "self_attn.k_proj.weight"] = random.Make({kv, d}, 0, 0.4f);
    w[p + "self_attn.v_proj.weight"] = random.Make({kv, d}, 0, 0.4f);
    w[p + "self_attn.o_proj.weight"] = random.Make({d, q}, 0, 0.3f);
    w[p + "self_attn.q_proj.bias"] = random.Make({q}, 0, 0.3f);
    w[p + "self_attn.k_proj.bias"] = random.Make({kv}, 0, 0.3f);
    w[p + "self_attn.v_proj.bias"] = random.Make({kv}, 0, 0.3f);
    w[p + "self_attn.o_proj.bias"] = random.Make({d}, 0, 0.3f);
    w[p + "self_attn.sinks"] = random.Make({kOssHeads}, 0, 1.5f);
    w[p + "mlp.router.weight"] = random.Make({experts, d}, 0, 1.0f);
    w[p + "mlp.router.bias"] = random.Make({experts}, 0, router_bias);
    w[p + "mlp.experts.gate_up_proj"] = random.Make({experts, d, 2 * ffn}, 0, 0.5f);
    w[p + "mlp.experts.gate_up_proj_bias"] = random.Make({experts, 2 * ffn}, 0, 0.3f);
    w[p + "mlp.experts.down_proj"] = random.Make({experts, ffn, d}, 0, 0.3f);
    w[p + "mlp.experts.down_proj_bias"] = random.Make({experts, d}, 0, 0.3f);
  }
  return w;
}

std::vector<double> Plus(std::vector<double> a, const Tensor& b) {
  for (size_t i = 0; i < a.size(); ++i) a[i] += b.values[i];
  return a;
}

// What a second computation of a one-layer gpt-oss model saw at one position.
struct OssRoute {
  std::vector<int32_t> experts;  // the kept ones, best first
  double margin = std::numeric_limits<double>::infinity();
  int64_t clamped = 0;  // gate values above the limit and up values outside it
};

// The MLP half and the head of one-layer gpt-oss model `c`, for a position whose residual
// stream after attention is `x`, written from GptOssMLP: router logits W m + b, the top k by
// logit (ties to the lower expert), weighted by the softmax of those k logits; each expert's
// gate_up = m @ gate_up_proj[e] + gate_up_proj_bias[e], gate its even columns and up its odd,
// gate = min(gate, L), up = clamp(up, -L, L), ((up + 1) * gate * sigmoid(1.702 gate)) @
// down_proj[e] + down_proj_bias[e].
std::vector<double> OssMlpAndHead(const LlamaConfig& c, const Weights& w, std::vector<double> x,
                                  OssRoute* route) {
  const std::string p = OssLayer(0);
  const int64_t d = kOssHidden, ffn = kOssFfn;
  const std::vector<double> m =
      Norm(x, w.at(p + "post_attention_layernorm.weight"), c.rms_norm_eps);
  const std::vector<double> logits =
      Plus(MatVec(w.at(p + "mlp.router.weight"), m), w.at(p + "mlp.router.bias"));
  std::vector<int32_t> order(kOssExperts);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  const int32_t k = c.num_experts_per_tok;
  route->experts.assign(order.begin(), order.begin() + k);
  if (k < kOssExperts) route->margin = logits[order[k - 1]] - logits[order[k]];
  double z = 0;
  for (int32_t j = 0; j < k; ++j) z += std::exp(logits[order[j]] - logits[order[0]]);
  const Tensor& gate_up = w.at(p + "mlp.experts.gate_up_proj");
  const Tensor& gate_up_bias = w.at(p + "mlp.experts.gate_up_proj_bias");
  const Tensor& down = w.at(p + "mlp.experts.down_proj");
  const Tensor& down_bias = w.at(p + "mlp.experts.down_proj_bias");
  const double limit = c.swiglu_limit;
  std::vector<double> out(d, 0.0);
  for (int32_t j = 0; j < k; ++j) {
    const int32_t e = order[j];
    const double weight = std::exp(logits[e] - logits[order[0]]) / z;
    std::vector<double> h(ffn);
    for (int64_t f = 0; f < ffn; ++f) {
      double g = gate_up_bias.values[e * 2 * ffn + 2 * f];
      double u = gate_up_bias.values[e * 2 * ffn + 2 * f + 1];
      for (int64_t i = 0; i < d; ++i) {
        g += m[i] * gate_up.values[(e * d + i) * 2 * ffn + 2 * f];
        u += m[i] * gate_up.values[(e * d + i) * 2 * ffn + 2 * f + 1];
      }
      route->clamped += (g > limit) + (std::abs(u) > limit);
      g = std::min(g, limit);
      u = std::max(-limit, std::min(u, limit));
      h[f] = (u + 1) * g / (1 + std::exp(-1.702 * g));
    }
    for (int64_t r = 0; r < d; ++r) {
      double y = down_bias.values[e * d + r];
      for (int64_t f = 0; f < ffn; ++f) y += h[f] * down.values[(e * ffn + f) * d + r];
      x[r] += weight * y;
    }
  }
  return MatVec(w.at("lm_head.weight"), Norm(x, w.at("model.norm.weight"), c.rms_norm_eps));
}

// The residual stream of one-layer gpt-oss model `c` after attention at position 0, where head h
// has one key: with its sink (when `sinks`) the softmax over [s, sink_h] gives that key the
// weight 1 / (1 + exp(sink_h - s)), s the head's score; RoPE at position 0 rotates by nothing but
// multiplies q and k by YaRN's attention factor.
std::vector<double> OssAttentionAtZero(const LlamaConfig& c, const Weights& w, int32_t token,
                                       bool sinks) {
  const std::string p = OssLayer(0);
  const Tensor& embed = w.at("model.embed_tokens.weight");
  std::vector<double> x(embed.values.begin() + token * kOssHidden,
                        embed.values.begin() + (token + 1) * kOssHidden);
  const std::vector<double> h = Norm(x, w.at(p + "input_layernorm.weight"), c.rms_norm_eps);
  const std::vector<double> q =
      Plus(MatVec(w.at(p + "self_attn.q_proj.weight"), h), w.at(p + "self_attn.q_proj.bias"));
  const std::vector<double> k =
      Plus(MatVec(w.at(p + "self_attn.k_proj.weight"), h), w.at(p + "self_attn.k_proj.bias"));
  const std::vector<double> v =
      Plus(MatVec(w.at(p + "self_attn.v_proj.weight"), h), w.at(p + "self_attn.v_proj.bias"));
  const double af = c.rope_scaling.attention_factor;
  std::vector<double> attn(kOssHeads * kOssHeadDim);
  for (int32_t head = 0; head < kOssHeads; ++head) {
    const int32_t g = head / (kOssHeads / kOssKvHeads);
    double s = 0;
    for (int32_t i = 0; i < kOssHeadDim; ++i)
      s += q[head * kOssHeadDim + i] * k[g * kOssHeadDim + i];
    s *= af * af / std::sqrt(double{kOssHeadDim});
    const double sink = w.at(p + "self_attn.sinks").values[head];
    const double weight = sinks ? 1 / (1 + std::exp(sink - s)) : 1.0;
    for (int32_t i = 0; i < kOssHeadDim; ++i) {
      attn[head * kOssHeadDim + i] = weight * v[g * kOssHeadDim + i];
    }
  }
  return Plus(
      Plus(MatVec(w.at(p + "self_attn.o_proj.weight"), attn), w.at(p + "self_attn.o_proj.bias")),
      Tensor{{kOssHidden}, std::vector<float>(x.begin(), x.end())});
}

// The residual streams of one-layer gpt-oss model `c` after attention at every position of
// `tokens`, when every key is zero (k_proj and its bias zero, so every score is 0): each of the
// n keys head h sees (the last `window` positions in a sliding layer, else all so far) has the
// weight 1 / (n + exp(sink_h)), and the sink takes the rest, exp(sink_h) / (n + exp(sink_h)).
std::vector<std::vector<double>> OssUniformAttention(const LlamaConfig& c, const Weights& w,
                                                     const std::vector<int32_t>& tokens) {
  const std::string p = OssLayer(0);
  const Tensor& embed = w.at("model.embed_tokens.weight");
  const int64_t n = static_cast<int64_t>(tokens.size()), window = c.SlidingWindowOf(0);
  std::vector<std::vector<double>> x(n), v(n);
  for (int64_t t = 0; t < n; ++t) {
    x[t].assign(embed.values.begin() + tokens[t] * kOssHidden,
                embed.values.begin() + (tokens[t] + 1) * kOssHidden);
    v[t] = Plus(MatVec(w.at(p + "self_attn.v_proj.weight"),
                       Norm(x[t], w.at(p + "input_layernorm.weight"), c.rms_norm_eps)),
                w.at(p + "self_attn.v_proj.bias"));
  }
  std::vector<std::vector<double>> out(n);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t first = window > 0 ? std::max<int64_t>(0, t - window + 1) : 0;
    std::vector<double> attn(kOssHeads * kOssHeadDim, 0.0);
    for (int32_t head = 0; head < kOssHeads; ++head) {
      const int32_t g = head / (kOssHeads / kOssKvHeads);
      const double sink = std::exp(double{w.at(p + "self_attn.sinks").values[head]});
      const double weight = 1 / (static_cast<double>(t - first + 1) + sink);
      for (int64_t s = first; s <= t; ++s) {
        for (int32_t i = 0; i < kOssHeadDim; ++i) {
          attn[head * kOssHeadDim + i] += weight * v[s][g * kOssHeadDim + i];
        }
      }
    }
    out[t] =
        Plus(MatVec(w.at(p + "self_attn.o_proj.weight"), attn), w.at(p + "self_attn.o_proj.bias"));
    for (int32_t i = 0; i < kOssHidden; ++i) out[t][i] += x[t][i];
  }
  return out;
}

// One-layer gpt-oss, top 2 of 4, limit 2, every token at position 0 against the second
// computation (to 1e-12): the sinks' share of each head, the router's bias in the choice and the
// softmax of the kept logits, the interleaved gate / up columns, the clamp and up + 1. Each piece
// is shown to matter: the bias changes some token's experts, the clamp changes values, and
// without the sinks (or with a limit too high to clamp) the logits are the second computation's
// without them, and differ.
TEST(ReferenceMoeTest, GptOssAgreesWithTheSecondComputation) {
  Random random(53);
  const LlamaConfig config = MakeGptOssConfig(1, 2, /*limit=*/2.0);
  const Weights w = GptOssWeights(config, random);
  auto ref = MakeReference(config, w, "gpt_oss");
  Weights unbiased = w;  // the same router without its bias
  for (float& b : unbiased.at(OssLayer(0) + "mlp.router.bias").values) b = 0;
  std::set<std::vector<int32_t>> picks;
  double margin = std::numeric_limits<double>::infinity();
  int64_t clamped = 0, bias_changed = 0;
  for (int32_t token = 0; token < kVocab; ++token) {
    OssRoute route, unbiased_route;
    const std::vector<double> want =
        OssMlpAndHead(config, w, OssAttentionAtZero(config, w, token, true), &route);
    OssMlpAndHead(config, unbiased, OssAttentionAtZero(config, w, token, true), &unbiased_route);
    EXPECT_LE(MaxAbsDiff(ref->Forward(std::vector<int32_t>{token}), {want}), 1e-12) << token;
    std::vector<int32_t> set = route.experts, unbiased_set = unbiased_route.experts;
    std::sort(set.begin(), set.end());
    std::sort(unbiased_set.begin(), unbiased_set.end());
    picks.insert(set);
    bias_changed += set != unbiased_set;
    margin = std::min(margin, route.margin);
    clamped += route.clamped;
  }
  EXPECT_GE(picks.size(), 3u);
  EXPECT_GE(bias_changed, 3) << "the router's bias changes no choice";
  EXPECT_GT(clamped, 20) << "the limit clamps nothing";
  EXPECT_GT(margin, 0);
  EXPECT_NEAR(ref->min_routing_margin(), margin, 1e-12);

  // Without the sinks (the same tensors, sinks unread): every head's one key takes weight 1.
  LlamaConfig no_sinks = config;
  no_sinks.attention_sinks = false;
  auto ref_no_sinks = MakeReference(no_sinks, w, "gpt_oss_no_sinks");
  OssRoute route;
  const auto got = ref_no_sinks->Forward(std::vector<int32_t>{kTokens[0]});
  EXPECT_LE(
      MaxAbsDiff(got, {OssMlpAndHead(config, w, OssAttentionAtZero(config, w, kTokens[0], false),
                                     &route)}),
      1e-12);
  EXPECT_GT(MaxAbsDiff(got, ref->Forward(std::vector<int32_t>{kTokens[0]})), 1e-3);

  // A limit no value reaches: the plain (up + 1) * glu, and other logits.
  LlamaConfig unclamped = config;
  unclamped.swiglu_limit = 1e6;
  auto ref_unclamped = MakeReference(unclamped, w, "gpt_oss_unclamped");
  double clamp_effect = 0;
  for (int32_t token = 0; token < kVocab; ++token) {
    const std::vector<int32_t> one = {token};
    OssRoute r;
    const auto u = ref_unclamped->Forward(one);
    EXPECT_LE(MaxAbsDiff(
                  u, {OssMlpAndHead(unclamped, w, OssAttentionAtZero(config, w, token, true), &r)}),
              1e-12);
    clamp_effect = std::max(clamp_effect, MaxAbsDiff(u, ref->Forward(one)));
  }
  EXPECT_GT(clamp_effect, 1e-2);
}

// With every key zero, every score is 0 and head h gives each of its n visible keys the weight
// 1 / (n + exp(sink_h)), the sink the rest: over a whole sequence, in a sliding layer (n at most
// the window of 4) and a full one, the reference's logits are the second computation's.
TEST(ReferenceMoeTest, GptOssSinksTakeTheirShareOfEveryWindow) {
  Random random(59);
  for (const bool sliding : {true, false}) {
    SCOPED_TRACE(sliding ? "sliding" : "full");
    LlamaConfig config = MakeGptOssConfig(1, 2, /*limit=*/2.0);
    config.sliding_layers = {sliding};
    Weights w = GptOssWeights(config, random);
    for (const char* name : {"self_attn.k_proj.weight", "self_attn.k_proj.bias"}) {
      for (float& v : w.at(OssLayer(0) + name).values) v = 0;
    }
    auto ref = MakeReference(config, w, absl::StrCat("gpt_oss_zero_keys_", sliding));
    const std::vector<std::vector<double>> x = OssUniformAttention(config, w, kTokens);
    const auto got = ref->Forward(kTokens);
    ASSERT_EQ(got.size(), kTokens.size());
    for (size_t t = 0; t < kTokens.size(); ++t) {
      OssRoute route;
      EXPECT_LE(MaxAbsDiff({got[t]}, {OssMlpAndHead(config, w, x[t], &route)}), 1e-12) << t;
    }
  }
}

// MXFP4 packing, written here from the OCP MX layout (the writer's //tools/modelgen is not
// used): `values` [experts][in][out] become blocks [experts][out][in / 32][16] (two codes a byte,
// the earlier in the low nibble) and scales [experts][out][in / 32]; each value is replaced by
// the one its random code and scale (2^-7 .. 2^0) stand for.
void RandomMxfp4(Tensor& values, std::mt19937& rng, Bytes* blocks, Bytes* scales) {
  static constexpr float kE2M1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                      -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
  const int64_t experts = values.shape[0], in = values.shape[1], out = values.shape[2];
  const int64_t nb = in / 32;
  blocks->shape = {experts, out, nb, 16};
  scales->shape = {experts, out, nb};
  blocks->values.assign(experts * out * nb * 16, 0);
  scales->values.assign(experts * out * nb, 0);
  std::uniform_int_distribution<int> code(0, 15), scale(120, 127);
  for (int64_t e = 0; e < experts; ++e) {
    for (int64_t r = 0; r < out; ++r) {
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t block = (e * out + r) * nb + b;
        scales->values[block] = static_cast<uint8_t>(scale(rng));
        for (int64_t i = 0; i < 32; ++i) {
          const int c = code(rng);
          blocks->values[block * 16 + i / 2] |= static_cast<uint8_t>(i % 2 == 0 ? c : c << 4);
          values.values[(e * in + b * 32 + i) * out + r] =
              std::ldexp(kE2M1[c], scales->values[block] - 127);
        }
      }
    }
  }
}

// A gpt-oss model whose experts are MXFP4 numbers, once as float tensors and once as blocks and
// scales (config.quantization.method "mxfp4"): the same logits exactly. A hand-made block reads
// back as its codes say (through ReplaceLinearWeights, which shows the decoded values), and a NaN
// scale (255) is refused.
TEST(ReferenceMoeTest, GptOssMxfp4DecodesToTheFloatTensors) {
  Random random(61);
  std::mt19937 rng(67);
  const LlamaConfig config = MakeGptOssConfig(2, 2, /*limit=*/2.0);
  Weights w = GptOssWeights(config, random);
  Weights packed = w;
  ByteTensors bytes;
  for (int32_t layer = 0; layer < config.num_hidden_layers; ++layer) {
    for (const char* part : {"gate_up_proj", "down_proj"}) {
      const std::string name = OssLayer(layer) + "mlp.experts." + part;
      RandomMxfp4(w.at(name), rng, &bytes[name + "_blocks"], &bytes[name + "_scales"]);
      packed.erase(name);
    }
  }
  // Expert 1's output column 3 of layer 0's gate_up_proj (up feature 1), its first block of
  // inputs: scale 2^-2, codes 2 (1), 9 (-0.5), 15 (-6), 7 (6), then zeros.
  const std::string gate_up = OssLayer(0) + "mlp.experts.gate_up_proj";
  const int64_t row = 1 * 2 * kOssFfn + 3, nb = kOssHidden / 32;
  bytes.at(gate_up + "_scales").values[row * nb] = 125;
  uint8_t* block = bytes.at(gate_up + "_blocks").values.data() + row * nb * 16;
  std::fill(block, block + 16, 0);
  block[0] = 0x92;
  block[1] = 0x7F;
  const float hand[4] = {0.25f, -0.125f, -1.5f, 1.5f};
  for (int i = 0; i < 32; ++i) {
    w.at(gate_up).values[(1 * kOssHidden + i) * 2 * kOssFfn + 3] = i < 4 ? hand[i] : 0.0f;
  }

  LlamaConfig mxfp4 = config;
  mxfp4.quantization.method = "mxfp4";
  auto ref = MakeReference(config, w, "gpt_oss_mxfp4_floats");
  auto ref_mxfp4 = MakeReference(mxfp4, packed, "gpt_oss_mxfp4", bytes);
  const auto want = ref->Forward(kTokens);
  EXPECT_EQ(MaxAbsDiff(ref_mxfp4->Forward(kTokens), want), 0.0);

  int visited = 0;
  ref_mxfp4->ReplaceLinearWeights(
      [&](const std::string& name, int64_t rows, int64_t cols, double* data) {
        if (name != gate_up) return;
        ++visited;
        ASSERT_EQ(rows, kOssExperts * 2 * kOssFfn);
        ASSERT_EQ(cols, kOssHidden);
        for (int i = 0; i < 32; ++i) EXPECT_EQ(data[row * cols + i], i < 4 ? hand[i] : 0) << i;
      });
  EXPECT_EQ(visited, 1);

  bytes.at(gate_up + "_scales").values[5] = 255;
  const auto nan = TryMakeReference(mxfp4, packed, "gpt_oss_mxfp4_nan", bytes);
  EXPECT_TRUE(absl::IsInvalidArgument(nan.status())) << nan.status();
}

// ReplaceLinearWeights on gpt-oss: the attention's projections and the LM head as any model's,
// and each layer's two fused expert tensors once, as [E * out][in] (the transposed HF tensor,
// gate_up_proj's rows in its interleaved column order); what it writes is what the forward pass
// multiplies by (halving down_proj there is halving it in the files), and neither the router nor
// any bias nor the sinks are visited. q8_0 quantizes the experts as other MLPs (a small change).
TEST(ReferenceMoeTest, GptOssReplacementVisitsTheTransposedFusedTensors) {
  Random random(71);
  const LlamaConfig config = MakeGptOssConfig(2, 2, /*limit=*/2.0);
  const Weights w = GptOssWeights(config, random);
  Weights halved = w;
  for (int32_t layer = 0; layer < 2; ++layer) {
    for (float& v : halved.at(OssLayer(layer) + "mlp.experts.down_proj").values) v *= 0.5f;
  }
  auto ref = MakeReference(config, w, "gpt_oss_replace");
  auto ref_halved = MakeReference(config, halved, "gpt_oss_replace_halved");
  const auto original = ref->Forward(kTokens);
  std::vector<std::string> names;
  ref->ReplaceLinearWeights([&](const std::string& name, int64_t rows, int64_t cols, double* data) {
    names.push_back(name);
    const bool gate_up = absl::EndsWith(name, "mlp.experts.gate_up_proj");
    if (!gate_up && !absl::EndsWith(name, "mlp.experts.down_proj")) return;
    const Tensor& t = w.at(name);  // [E][in][out]
    const int64_t in = t.shape[1], out = t.shape[2];
    ASSERT_EQ(rows, kOssExperts * out) << name;
    ASSERT_EQ(cols, in) << name;
    for (int64_t e = 0; e < kOssExperts; ++e) {
      for (int64_t r = 0; r < out; ++r) {
        for (int64_t c = 0; c < in; ++c) {
          ASSERT_EQ(data[(e * out + r) * in + c], t.values[(e * in + c) * out + r]) << name;
        }
      }
    }
    if (!gate_up) {
      for (int64_t i = 0; i < rows * cols; ++i) data[i] *= 0.5;
    }
  });
  std::vector<std::string> want = {"lm_head.weight"};
  for (int32_t layer = 0; layer < 2; ++layer) {
    for (const char* part :
         {"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
          "self_attn.o_proj.weight", "mlp.experts.gate_up_proj", "mlp.experts.down_proj"}) {
      want.push_back(OssLayer(layer) + part);
    }
  }
  EXPECT_EQ(names, want);
  const auto want_halved = ref_halved->Forward(kTokens);
  EXPECT_GT(MaxAbsDiff(want_halved, original), 1e-3);
  EXPECT_LE(MaxAbsDiff(ref->Forward(kTokens), want_halved), 1e-12);

  auto quantized = MakeReference(config, w, "gpt_oss_q8_0");
  quantized->QuantizeLinearQ8_0();
  const double q8_0 = MaxAbsDiff(quantized->Forward(kTokens), original);
  EXPECT_GT(q8_0, 0);
  EXPECT_LT(q8_0, 0.5);
}

// The generated tiny-gptoss (//tools/modelgen) through the reference: finite, varied logits, a
// router never near a tie on these tokens, and the features that an engine must compute moving
// the logits: the sinks (left out), the clamp (a limit nothing reaches). Its MXFP4 checkpoint,
// decoded here, gives exactly the logits of the writer's twin, and other ones than the bf16
// model's.
TEST(ReferenceMoeTest, TinyGptOssRunsAndItsSinksMatter) {
  modelgen::MakeModelOptions options;
  options.size = "tiny-gptoss";
  options.out_dir = TestDir("tiny_gptoss");
  options.dtype = DType::kBF16;
  ASSERT_TRUE(modelgen::MakeModel(options).ok());
  auto config = LoadLlamaConfig(options.out_dir);
  ASSERT_TRUE(config.ok()) << config.status();
  auto files = SafetensorsSet::OpenDirectory(options.out_dir);
  ASSERT_TRUE(files.ok()) << files.status();
  auto ref = ReferenceLlama::Create(*config, **files);
  ASSERT_TRUE(ref.ok()) << ref.status();
  std::mt19937 rng(73);
  std::uniform_int_distribution<int32_t> token(0, config->vocab_size - 5);
  std::vector<int32_t> tokens(40);  // past the 16-position window
  for (int32_t& t : tokens) t = token(rng);
  const auto logits = (*ref)->Forward(tokens);
  double sq = 0;
  int64_t n = 0;
  for (const auto& row : logits) {
    for (double v : row) {
      ASSERT_TRUE(std::isfinite(v));
      sq += v * v, ++n;
    }
  }
  const double rms = std::sqrt(sq / n), margin = (*ref)->min_routing_margin();
  EXPECT_GT(rms, 0.5);
  EXPECT_LT(rms, 8);
  EXPECT_GT(margin, 1e-4) << "a top-k choice is nearly tied";

  LlamaConfig no_sinks = *config;
  no_sinks.attention_sinks = false;
  const double sink_effect =
      MaxAbsDiff((*ReferenceLlama::Create(no_sinks, **files))->Forward(tokens), logits);
  EXPECT_GT(sink_effect, 0.5) << "the sinks hardly matter";
  LlamaConfig unclamped = *config;
  unclamped.swiglu_limit = 1e6;
  const double clamp_effect =
      MaxAbsDiff((*ReferenceLlama::Create(unclamped, **files))->Forward(tokens), logits);
  EXPECT_GT(clamp_effect, 0.05) << "the clamp hardly matters";

  const std::string mx = TestDir("tiny_gptoss_mxfp4"), twin = TestDir("tiny_gptoss_mxfp4_twin");
  modelgen::QuantizeOptions q;
  q.method = "mxfp4";
  ASSERT_TRUE(modelgen::QuantizeModelDir(options.out_dir, mx, twin, q).ok());
  auto mx_config = LoadLlamaConfig(mx), twin_config = LoadLlamaConfig(twin);
  ASSERT_TRUE(mx_config.ok() && twin_config.ok());
  ASSERT_EQ(mx_config->quantization.method, "mxfp4");
  auto mx_files = SafetensorsSet::OpenDirectory(mx),
       twin_files = SafetensorsSet::OpenDirectory(twin);
  ASSERT_TRUE(mx_files.ok() && twin_files.ok());
  auto mx_ref = ReferenceLlama::Create(*mx_config, **mx_files);
  auto twin_ref = ReferenceLlama::Create(*twin_config, **twin_files);
  ASSERT_TRUE(mx_ref.ok() && twin_ref.ok()) << mx_ref.status() << twin_ref.status();
  const auto mx_logits = (*mx_ref)->Forward(tokens);
  EXPECT_EQ(MaxAbsDiff(mx_logits, (*twin_ref)->Forward(tokens)), 0.0);
  const double mxfp4_effect = MaxAbsDiff(mx_logits, logits);
  EXPECT_GT(mxfp4_effect, 1e-3);
  std::printf(
      "tiny-gptoss, 40 tokens: logit rms %.2f, smallest routing margin %.4f (MXFP4: %.4f); max "
      "logit change without the sinks %.2f, without the clamp %.2f, MXFP4 against bf16 %.2f\n",
      rms, margin, (*mx_ref)->min_routing_margin(), sink_effect, clamp_effect, mxfp4_effect);
}

}  // namespace
}  // namespace kvrm
