// The float64 reference's mixtures of experts (Mixtral, Qwen3-MoE, Qwen2-MoE), on tiny models
// written here from hand-built configs: every expert the dense MLP gives the dense model's logits
// exactly (whatever the router picks); all experts kept unrenormalized, the top-k picks of a
// router whose choices differ by token, and Qwen2-MoE's gated shared expert agree with a second
// computation of the first position written here; a shared expert whose gate is zero adds half
// its output (sigmoid(0) = 1/2), as a dense model with that expert's features appended shows; the
// routing margin; and which tensors the weight replacement visits.
#include <algorithm>
#include <cmath>
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

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "gtest/gtest.h"
#include "model/config.h"
#include "model/safetensors.h"
#include "model/safetensors_writer.h"
#include "tests/reference_llama.h"

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

std::unique_ptr<ReferenceLlama> MakeReference(const LlamaConfig& c, const Weights& w,
                                              const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/reference_moe_", name);
  std::filesystem::create_directories(dir);
  std::vector<TensorToWrite> tensors;
  for (const auto& [n, t] : w) {
    tensors.push_back({n, DType::kF32, t.shape,
                       absl::MakeConstSpan(reinterpret_cast<const std::byte*>(t.values.data()),
                                           t.values.size() * sizeof(float))});
  }
  EXPECT_TRUE(WriteSafetensors(dir + "/model.safetensors", tensors).ok());
  auto files = SafetensorsSet::OpenDirectory(dir);
  EXPECT_TRUE(files.ok()) << files.status();
  auto ref = ReferenceLlama::Create(c, **files);
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

}  // namespace
}  // namespace kvrm
