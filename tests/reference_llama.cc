#include "tests/reference_llama.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/dtype.h"
#include "common/status_macros.h"

namespace kvrm {
namespace {

// Element i of a stored tensor, widened exactly (every f16/bf16/f32 value is a double).
double ElementAt(const TensorView& t, int64_t i) {
  const std::byte* p = t.data + i * static_cast<int64_t>(DTypeSize(t.dtype));
  switch (t.dtype) {
    case DType::kF32: {
      float f;
      std::memcpy(&f, p, sizeof(f));
      return f;
    }
    case DType::kF16:
    case DType::kBF16: {
      uint16_t h;
      std::memcpy(&h, p, sizeof(h));
      return t.dtype == DType::kF16 ? F16ToFloat(h) : Bf16ToFloat(h);
    }
    case DType::kF8E4M3:
      return F8E4M3ToFloat(static_cast<uint8_t>(*p));
    case DType::kF8E5M2:
      return F8E5M2ToFloat(static_cast<uint8_t>(*p));
  }
  return NAN;
}

// Each value rounded to bf16 (through float, to nearest even).
std::vector<double> RoundedToBf16(const std::vector<double>& x) {
  std::vector<double> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = Bf16ToFloat(FloatToBf16(static_cast<float>(x[i])));
  return y;
}

double Silu(double x) { return x / (1.0 + std::exp(-x)); }

// PyTorch's gelu(approximate="tanh") (Transformers' gelu_pytorch_tanh, Gemma's hidden_activation).
double GeluTanh(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

// Gemma 2's soft-capping (attention scores, final logits): c * tanh(x / c); none when c is 0.
double SoftCap(double x, double c) { return c > 0 ? c * std::tanh(x / c) : x; }

// A float tensor of exactly `shape` (any rank), widened to double.
absl::StatusOr<std::vector<double>> LoadValues(const SafetensorsSet& files, const std::string& name,
                                               const std::vector<int64_t>& shape) {
  ASSIGN_OR_RETURN(TensorView t, files.Get(name, shape));
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) v[i] = ElementAt(t, i);
  return v;
}

// OCP MX's FP4 E2M1 by its 4-bit code, bit 3 the sign (Transformers' FP4_VALUES).
constexpr double kE2M1[16] = {+0.0, +0.5, +1.0, +1.5, +2.0, +3.0, +4.0, +6.0,
                              -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0};

// gpt-oss's MXFP4 form of the fused expert tensor `base` ([experts][in][out], input x output):
// `base`_blocks U8 [experts][out][in / 32][16] and `base`_scales U8 [experts][out][in / 32].
// Input i of output feature r is code (i % 32) of block i / 32 of row r, the even codes in the
// low nibbles (convert_moe_packed_tensors: lut[blk & 0x0F] to the even places, lut[blk >> 4] to
// the odd), times 2^(scale - 127) (E8M0; 255, NaN, refused). Returns the decoded tensor in
// `base`'s own layout, [experts][in][out].
absl::StatusOr<std::vector<double>> DecodeMxfp4(const SafetensorsSet& files,
                                                const std::string& base, int64_t experts,
                                                int64_t in, int64_t out) {
  if (in % 32 != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(base, ": ", in, " inputs are not whole MXFP4 blocks of 32"));
  }
  const int64_t nb = in / 32;
  ASSIGN_OR_RETURN(TensorView blocks, files.GetAny(base + "_blocks", {experts, out, nb, 16}));
  ASSIGN_OR_RETURN(TensorView scales, files.GetAny(base + "_scales", {experts, out, nb}));
  if (blocks.type != StorageType::kU8 || scales.type != StorageType::kU8) {
    return absl::InvalidArgumentError(absl::StrCat(base, "_blocks / _scales: expected U8"));
  }
  const auto* b = reinterpret_cast<const uint8_t*>(blocks.data);
  const auto* sc = reinterpret_cast<const uint8_t*>(scales.data);
  std::vector<double> w(static_cast<size_t>(experts * in * out));
  for (int64_t e = 0; e < experts; ++e) {
    for (int64_t r = 0; r < out; ++r) {
      for (int64_t k = 0; k < nb; ++k) {
        const int64_t block = (e * out + r) * nb + k;
        if (sc[block] == 255) {
          return absl::InvalidArgumentError(absl::StrCat(base, "_scales: NaN scale (255)"));
        }
        const double scale = std::ldexp(1.0, static_cast<int>(sc[block]) - 127);
        for (int64_t i = 0; i < 32; ++i) {
          const uint8_t byte = b[block * 16 + i / 2];
          const int code = i % 2 == 0 ? byte & 0x0F : byte >> 4;
          w[(e * in + k * 32 + i) * out + r] = kE2M1[code] * scale;
        }
      }
    }
  }
  return w;
}

}  // namespace

// The router of MoE layer `layer`: block_sparse_moe.gate (Mixtral), mlp.router (gpt-oss) or
// mlp.gate (Qwen3-MoE, Qwen2-MoE).
std::string ReferenceLlama::RouterName(const LlamaConfig& config, int32_t layer) {
  if (config.model_type == "gpt_oss")
    return absl::StrCat("model.layers.", layer, ".mlp.router.weight");
  return absl::StrCat("model.layers.", layer, ".",
                      config.model_type == "mixtral" ? "block_sparse_moe" : "mlp", ".gate.weight");
}

absl::Status ReferenceLlama::LoadGptOssMoe(const LlamaConfig& config, const SafetensorsSet& files,
                                           int32_t layer, Layer& l) {
  // GptOssMLP: router (GptOssTopKRouter: weight [E][hidden], bias [E]) and experts
  // (GptOssExperts: gate_up_proj [E][hidden][2 ffn], down_proj [E][ffn][hidden], applied as
  // x @ W + b, and their biases).
  const int64_t experts = config.num_experts, d = config.hidden_size;
  const int64_t ffn = config.moe_intermediate_size;
  const std::string p = absl::StrCat("model.layers.", layer, ".mlp.");
  ASSIGN_OR_RETURN(l.router, Load(files, RouterName(config, layer), experts, d, /*two_d=*/true));
  ASSIGN_OR_RETURN(l.router_bias, LoadValues(files, p + "router.bias", {experts}));
  std::vector<double> gate_up, down;
  if (config.quantization.method == "mxfp4") {
    ASSIGN_OR_RETURN(gate_up, DecodeMxfp4(files, p + "experts.gate_up_proj", experts, d, 2 * ffn));
    ASSIGN_OR_RETURN(down, DecodeMxfp4(files, p + "experts.down_proj", experts, ffn, d));
  } else {
    ASSIGN_OR_RETURN(gate_up, LoadValues(files, p + "experts.gate_up_proj", {experts, d, 2 * ffn}));
    ASSIGN_OR_RETURN(down, LoadValues(files, p + "experts.down_proj", {experts, ffn, d}));
  }
  ASSIGN_OR_RETURN(const std::vector<double> gate_up_bias,
                   LoadValues(files, p + "experts.gate_up_proj_bias", {experts, 2 * ffn}));
  ASSIGN_OR_RETURN(const std::vector<double> down_bias,
                   LoadValues(files, p + "experts.down_proj_bias", {experts, d}));
  for (int64_t e = 0; e < experts; ++e) {
    // gate = gate_up[..., ::2], up = gate_up[..., 1::2]: feature f is column 2 f, resp. 2 f + 1.
    Mlp m;
    m.gate.rows = m.up.rows = ffn;
    m.gate.cols = m.up.cols = d;
    m.down.rows = d;
    m.down.cols = ffn;
    m.gate.data.resize(ffn * d);
    m.up.data.resize(ffn * d);
    m.down.data.resize(d * ffn);
    for (int64_t f = 0; f < ffn; ++f) {
      for (int64_t k = 0; k < d; ++k) {
        m.gate.data[f * d + k] = gate_up[(e * d + k) * 2 * ffn + 2 * f];
        m.up.data[f * d + k] = gate_up[(e * d + k) * 2 * ffn + 2 * f + 1];
      }
      m.gate_bias.push_back(gate_up_bias[e * 2 * ffn + 2 * f]);
      m.up_bias.push_back(gate_up_bias[e * 2 * ffn + 2 * f + 1]);
    }
    for (int64_t r = 0; r < d; ++r) {
      for (int64_t f = 0; f < ffn; ++f) m.down.data[r * ffn + f] = down[(e * ffn + f) * d + r];
    }
    m.down_bias.assign(down_bias.begin() + e * d, down_bias.begin() + (e + 1) * d);
    l.experts.push_back(std::move(m));
  }
  return absl::OkStatus();
}

void ReferenceLlama::ForEachGptOssExpertTensor(
    Layer& l, const std::string& prefix,
    const std::function<void(const std::string&, Matrix&)>& f) {
  const int64_t experts = static_cast<int64_t>(l.experts.size());
  // gate_up_proj: row e * 2 ffn + c is expert e's output column c (gate feature c / 2 when c is
  // even, up feature c / 2 when odd); down_proj: row e * hidden + r its output r.
  auto source = [&](int64_t e, int64_t row, bool gate_up) -> Matrix& {
    Mlp& m = l.experts[e];
    return !gate_up ? m.down : row % 2 == 0 ? m.gate : m.up;
  };
  for (const bool gate_up : {true, false}) {
    const Matrix& first = gate_up ? l.experts[0].gate : l.experts[0].down;
    const int64_t out = gate_up ? 2 * first.rows : first.rows, cols = first.cols;
    Matrix fused;
    fused.rows = experts * out;
    fused.cols = cols;
    fused.int8_block_inputs = first.int8_block_inputs;
    fused.input_order = first.input_order;
    fused.data.resize(fused.rows * cols);
    for (int64_t e = 0; e < experts; ++e) {
      for (int64_t c = 0; c < out; ++c) {
        const double* row = source(e, c, gate_up).Row(gate_up ? c / 2 : c);
        std::copy(row, row + cols, fused.data.begin() + (e * out + c) * cols);
      }
    }
    f(prefix + (gate_up ? "gate_up_proj" : "down_proj"), fused);
    for (int64_t e = 0; e < experts; ++e) {
      for (int64_t c = 0; c < out; ++c) {
        Matrix& m = source(e, c, gate_up);
        m.int8_block_inputs = fused.int8_block_inputs;
        m.input_order = fused.input_order;
        const double* row = fused.Row(e * out + c);
        std::copy(row, row + cols, m.data.begin() + (gate_up ? c / 2 : c) * cols);
      }
    }
  }
}

// Expert `e` of MoE layer `layer`'s three tensors: (HF name, matrix of `expert`, rows, cols).
std::vector<std::tuple<std::string, ReferenceLlama::Matrix*, int64_t, int64_t>>
ReferenceLlama::ExpertTensors(const LlamaConfig& config, int32_t layer, int64_t e, Mlp& expert,
                              int64_t hidden, int64_t ffn) {
  const bool mixtral = config.model_type == "mixtral";
  const std::string p = absl::StrCat("model.layers.", layer, ".",
                                     mixtral ? "block_sparse_moe" : "mlp", ".experts.", e, ".");
  // MixtralBlockSparseTop2MLP: w2(act(w1(x)) * w3(x)).
  return {{p + (mixtral ? "w1" : "gate_proj") + ".weight", &expert.gate, ffn, hidden},
          {p + (mixtral ? "w3" : "up_proj") + ".weight", &expert.up, ffn, hidden},
          {p + (mixtral ? "w2" : "down_proj") + ".weight", &expert.down, hidden, ffn}};
}

// Qwen2MoeSparseMoeBlock.shared_expert, a Qwen2MoeMLP of shared_expert_intermediate_size:
// down_proj(act(gate_proj(x)) * up_proj(x)).
std::vector<std::tuple<std::string, ReferenceLlama::Matrix*, int64_t, int64_t>>
ReferenceLlama::SharedExpertTensors(int32_t layer, Mlp& expert, int64_t hidden, int64_t ffn) {
  const std::string p = absl::StrCat("model.layers.", layer, ".mlp.shared_expert.");
  return {{p + "gate_proj.weight", &expert.gate, ffn, hidden},
          {p + "up_proj.weight", &expert.up, ffn, hidden},
          {p + "down_proj.weight", &expert.down, hidden, ffn}};
}

// Rows [begin, begin + count) of `m`, copied.
ReferenceLlama::Matrix ReferenceLlama::Rows(const Matrix& m, int64_t begin, int64_t count) {
  Matrix out;
  out.rows = count;
  out.cols = m.cols;
  out.data.assign(m.data.begin() + begin * m.cols, m.data.begin() + (begin + count) * m.cols);
  return out;
}

absl::StatusOr<ReferenceLlama::Matrix> ReferenceLlama::Load(const SafetensorsSet& files,
                                                            const std::string& name, int64_t rows,
                                                            int64_t cols, bool two_d) {
  // 1-D tensors (norm weights) are loaded as one row.
  std::vector<int64_t> shape =
      rows == 1 && !two_d ? std::vector<int64_t>{cols} : std::vector<int64_t>{rows, cols};
  ASSIGN_OR_RETURN(TensorView t, files.Get(name, shape));
  Matrix m;
  m.rows = rows;
  m.cols = cols;
  m.data.resize(static_cast<size_t>(rows * cols));
  for (int64_t i = 0; i < rows * cols; ++i) m.data[i] = ElementAt(t, i);
  return m;
}

absl::StatusOr<std::unique_ptr<ReferenceLlama>> ReferenceLlama::Create(
    const LlamaConfig& config, const SafetensorsSet& files) {
  std::unique_ptr<ReferenceLlama> ref(new ReferenceLlama(config));
  const int64_t d = config.hidden_size, hd = config.head_dim;
  const int64_t qw = config.num_attention_heads * hd, kvw = config.num_key_value_heads * hd;
  const int64_t ffn = config.intermediate_size, vocab = config.vocab_size;
  ref->inv_freq_ = RopeInverseFrequencies(config);
  const LlamaConfig local = LocalRopeConfig(config);
  ref->local_inv_freq_ = RopeInverseFrequencies(local);
  ref->local_attention_factor_ = local.rope_scaling.attention_factor;
  ASSIGN_OR_RETURN(ref->embed_, Load(files, "model.embed_tokens.weight", vocab, d));
  if (config.tie_word_embeddings) {
    ref->lm_head_ = ref->embed_;  // HF ties lm_head to the embedding, ignoring lm_head.weight
  } else {
    ASSIGN_OR_RETURN(ref->lm_head_, Load(files, "lm_head.weight", vocab, d));
  }
  ASSIGN_OR_RETURN(Matrix final_norm, Load(files, "model.norm.weight", 1, d));
  ref->final_norm_ = std::move(final_norm.data);
  for (int32_t i = 0; i < config.num_hidden_layers; ++i) {
    const std::string p = absl::StrCat("model.layers.", i, ".");
    Layer l;
    // OLMo 2 (Olmo2DecoderLayer) has no input norms: no input_layernorm, no
    // pre_feedforward_layernorm.
    if (config.pre_norms) {
      ASSIGN_OR_RETURN(Matrix in_norm, Load(files, p + "input_layernorm.weight", 1, d));
      l.input_norm = std::move(in_norm.data);
    }
    ASSIGN_OR_RETURN(Matrix post_norm, Load(files, p + "post_attention_layernorm.weight", 1, d));
    l.post_attention_norm = std::move(post_norm.data);
    if (config.sandwich_norms) {
      if (config.pre_norms) {
        ASSIGN_OR_RETURN(Matrix pre_ff, Load(files, p + "pre_feedforward_layernorm.weight", 1, d));
        l.pre_feedforward_norm = std::move(pre_ff.data);
      }
      ASSIGN_OR_RETURN(Matrix post_ff, Load(files, p + "post_feedforward_layernorm.weight", 1, d));
      l.post_feedforward_norm = std::move(post_ff.data);
    }
    if (config.fused_projections) {
      // Phi-3 (modeling_phi3): qkv_proj's rows are [q; k; v].
      ASSIGN_OR_RETURN(Matrix qkv, Load(files, p + "self_attn.qkv_proj.weight", qw + 2 * kvw, d));
      l.q = Rows(qkv, 0, qw);
      l.k = Rows(qkv, qw, kvw);
      l.v = Rows(qkv, qw + kvw, kvw);
    } else {
      ASSIGN_OR_RETURN(l.q, Load(files, p + "self_attn.q_proj.weight", qw, d));
      ASSIGN_OR_RETURN(l.k, Load(files, p + "self_attn.k_proj.weight", kvw, d));
      ASSIGN_OR_RETURN(l.v, Load(files, p + "self_attn.v_proj.weight", kvw, d));
    }
    ASSIGN_OR_RETURN(l.o, Load(files, p + "self_attn.o_proj.weight", d, qw));
    if (config.IsMoeLayer(i) && config.model_type == "gpt_oss") {
      RETURN_IF_ERROR(LoadGptOssMoe(config, files, i, l));
    } else if (config.IsMoeLayer(i)) {
      // MixtralSparseMoeBlock (block_sparse_moe: gate; experts.E.w1 / w3 / w2 as gate / up /
      // down) or Qwen3MoeSparseMoeBlock / Qwen2MoeSparseMoeBlock (mlp: gate; experts.E.gate_proj
      // / up_proj / down_proj).
      const int64_t experts = config.num_experts, moe_ffn = config.moe_intermediate_size;
      for (int64_t e = 0; e < experts; ++e) {
        Mlp expert;
        for (const auto& [name, m, rows, cols] : ExpertTensors(config, i, e, expert, d, moe_ffn)) {
          ASSIGN_OR_RETURN(*m, Load(files, name, rows, cols));
        }
        l.experts.push_back(std::move(expert));
      }
      ASSIGN_OR_RETURN(l.router, Load(files, RouterName(config, i), experts, d));
      if (config.shared_expert_intermediate_size > 0) {
        // Qwen2MoeSparseMoeBlock: shared_expert (a Qwen2MoeMLP) and shared_expert_gate, an
        // nn.Linear(hidden_size, 1, bias=False): weight [1][hidden].
        for (const auto& [name, m, rows, cols] :
             SharedExpertTensors(i, l.shared_expert, d, config.shared_expert_intermediate_size)) {
          ASSIGN_OR_RETURN(*m, Load(files, name, rows, cols));
        }
        ASSIGN_OR_RETURN(l.shared_expert_gate,
                         Load(files, p + "mlp.shared_expert_gate.weight", 1, d, /*two_d=*/true));
      }
    } else if (config.fused_projections) {
      // Phi-3: gate_up_proj's rows are [gate; up].
      ASSIGN_OR_RETURN(Matrix gate_up, Load(files, p + "mlp.gate_up_proj.weight", 2 * ffn, d));
      l.mlp.gate = Rows(gate_up, 0, ffn);
      l.mlp.up = Rows(gate_up, ffn, ffn);
      ASSIGN_OR_RETURN(l.mlp.down, Load(files, p + "mlp.down_proj.weight", d, ffn));
    } else {
      ASSIGN_OR_RETURN(l.mlp.gate, Load(files, p + "mlp.gate_proj.weight", ffn, d));
      ASSIGN_OR_RETURN(l.mlp.up, Load(files, p + "mlp.up_proj.weight", ffn, d));
      ASSIGN_OR_RETURN(l.mlp.down, Load(files, p + "mlp.down_proj.weight", d, ffn));
    }
    auto vector = [&](const std::string& name, int64_t n,
                      std::vector<double>* out) -> absl::Status {
      ASSIGN_OR_RETURN(Matrix m, Load(files, p + name, 1, n));
      *out = std::move(m.data);
      return absl::OkStatus();
    };
    if (config.qkv_bias) {
      RETURN_IF_ERROR(vector("self_attn.q_proj.bias", qw, &l.bq));
      RETURN_IF_ERROR(vector("self_attn.k_proj.bias", kvw, &l.bk));
      RETURN_IF_ERROR(vector("self_attn.v_proj.bias", kvw, &l.bv));
    }
    if (config.o_bias) RETURN_IF_ERROR(vector("self_attn.o_proj.bias", d, &l.bo));
    if (config.attention_sinks) {
      // GptOssAttention.sinks: one logit per query head.
      ASSIGN_OR_RETURN(l.sinks,
                       LoadValues(files, p + "self_attn.sinks", {config.num_attention_heads}));
    }
    if (config.qk_norm) {
      // Qwen3Attention: over each head; Olmo2Attention: over the whole projection (HeadNorm
      // normalizes spans of the weight's length).
      RETURN_IF_ERROR(vector("self_attn.q_norm.weight", config.qk_norm_whole ? qw : hd, &l.q_norm));
      RETURN_IF_ERROR(
          vector("self_attn.k_norm.weight", config.qk_norm_whole ? kvw : hd, &l.k_norm));
    }
    ref->layers_.push_back(std::move(l));
  }
  return ref;
}

void ReferenceLlama::QuantizeLinearQ8_0() {
  auto quantize = [](Matrix& m) {
    for (int64_t r = 0; r < m.rows; ++r) {
      double* row = m.data.data() + r * m.cols;
      for (int64_t b = 0; b < m.cols; b += 32) {
        const int64_t end = std::min(m.cols, b + 32);
        float amax = 0;
        for (int64_t c = b; c < end; ++c) {
          amax = std::max(amax, std::fabs(static_cast<float>(row[c])));
        }
        const float d = amax / 127;
        const float id = d != 0 ? 1 / d : 0;
        const double stored = static_cast<double>(static_cast<_Float16>(d));
        for (int64_t c = b; c < end; ++c) {
          row[c] = stored * std::roundf(static_cast<float>(row[c]) * id);
        }
      }
    }
  };
  quantize(lm_head_);  // a copy of the embedding when tied: the lookup keeps the stored values
  for (Layer& l : layers_) {
    for (Matrix* m : {&l.q, &l.k, &l.v, &l.o, &l.mlp.gate, &l.mlp.up, &l.mlp.down}) quantize(*m);
    // The experts and the shared expert are quantized like the dense MLP; the router and the
    // shared expert's gate are not.
    for (Mlp& e : l.experts) {
      for (Matrix* m : {&e.gate, &e.up, &e.down}) quantize(*m);
    }
    for (Matrix* m : {&l.shared_expert.gate, &l.shared_expert.up, &l.shared_expert.down}) {
      quantize(*m);  // empty (nothing to do) without a shared expert
    }
  }
  q8_0_linear_ = true;
}

void ReferenceLlama::ForEachLinear(const std::function<void(const std::string&, Matrix&)>& f) {
  f("lm_head.weight", lm_head_);
  for (size_t i = 0; i < layers_.size(); ++i) {
    Layer& l = layers_[i];
    const std::string p = absl::StrCat("model.layers.", i, ".");
    for (const auto& [name, m] : {std::pair{"self_attn.q_proj", &l.q},
                                  {"self_attn.k_proj", &l.k},
                                  {"self_attn.v_proj", &l.v},
                                  {"self_attn.o_proj", &l.o}}) {
      f(absl::StrCat(p, name, ".weight"), *m);
    }
    if (config_.IsMoeLayer(static_cast<int32_t>(i)) && config_.model_type == "gpt_oss") {
      // The fused tensors, as [E * out][in] (the header comment); router and biases kept.
      ForEachGptOssExpertTensor(l, p + "mlp.experts.", f);
      continue;
    }
    if (config_.IsMoeLayer(static_cast<int32_t>(i))) {
      // Each expert's matrices and the shared expert's by their HF names; the router and the
      // shared expert's gate are kept.
      for (size_t e = 0; e < l.experts.size(); ++e) {
        for (const auto& [name, m, rows, cols] :
             ExpertTensors(config_, static_cast<int32_t>(i), static_cast<int64_t>(e), l.experts[e],
                           config_.hidden_size, config_.moe_intermediate_size)) {
          f(name, *m);
        }
      }
      if (config_.shared_expert_intermediate_size > 0) {
        for (const auto& [name, m, rows, cols] :
             SharedExpertTensors(static_cast<int32_t>(i), l.shared_expert, config_.hidden_size,
                                 config_.shared_expert_intermediate_size)) {
          f(name, *m);
        }
      }
      continue;
    }
    for (const auto& [name, m] : {std::pair{"mlp.gate_proj", &l.mlp.gate},
                                  {"mlp.up_proj", &l.mlp.up},
                                  {"mlp.down_proj", &l.mlp.down}}) {
      f(absl::StrCat(p, name, ".weight"), *m);
    }
  }
}

void ReferenceLlama::ReplaceLinearWeights(
    const std::function<void(const std::string&, int64_t, int64_t, double*)>& fill) {
  ForEachLinear(
      [&](const std::string& name, Matrix& m) { fill(name, m.rows, m.cols, m.data.data()); });
}

void ReferenceLlama::set_int8_block_input_order_of(
    const std::function<std::vector<int32_t>(const std::string&)>& order) {
  ForEachLinear([&](const std::string& name, Matrix& m) { m.input_order = order(name); });
}

void ReferenceLlama::set_int8_block_inputs_of(
    const std::function<bool(const std::string&, int64_t, int64_t)>& which) {
  ForEachLinear([&](const std::string& name, Matrix& m) {
    m.int8_block_inputs = which(name, m.rows, m.cols);
  });
}

std::vector<double> ReferenceLlama::Linear(const Matrix& w, const std::vector<double>& x_in) const {
  std::vector<double> rounded;
  if (bf16_linear_inputs_) {
    rounded = RoundedToBf16(x_in);
  } else if (q8_0_linear_) {
    float amax = 0;
    for (double v : x_in) amax = std::max(amax, std::fabs(static_cast<float>(v)));
    rounded.assign(x_in.size(), 0.0);
    if (amax > 0) {
      const float inv = 32767.0f / amax;
      const double step = amax / 32767.0f;
      for (size_t i = 0; i < x_in.size(); ++i) {
        rounded[i] = std::nearbyint(static_cast<float>(x_in[i]) * inv) * step;
      }
    }
  }
  const bool int8_blocks = int8_block_linear_inputs_ || w.int8_block_inputs;
  if (int8_blocks) {
    rounded.assign(x_in.size(), 0.0);
    // Input at position i of the blocks' order.
    auto at = [&](size_t i) {
      return w.input_order.empty() ? i : static_cast<size_t>(w.input_order[i]);
    };
    for (size_t b = 0; b < x_in.size(); b += 32) {
      const size_t end = std::min(x_in.size(), b + 32);
      float amax = 0;
      for (size_t i = b; i < end; ++i) {
        amax = std::max(amax, std::fabs(static_cast<float>(x_in[at(i)])));
      }
      if (amax == 0) continue;
      const float inv = 127.0f / amax;
      const double step = amax / 127.0f;
      for (size_t i = b; i < end; ++i) {
        rounded[at(i)] = std::nearbyint(static_cast<float>(x_in[at(i)]) * inv) * step;
      }
    }
  }
  return Product(w, bf16_linear_inputs_ || q8_0_linear_ || int8_blocks ? rounded : x_in);
}

std::vector<double> ReferenceLlama::Product(const Matrix& w, const std::vector<double>& x) {
  std::vector<double> y(w.rows);
  for (int64_t r = 0; r < w.rows; ++r) {
    const double* row = w.Row(r);
    double s = 0;
    for (int64_t c = 0; c < w.cols; ++c) s += row[c] * x[c];
    y[r] = s;
  }
  return y;
}

std::vector<double> ReferenceLlama::RmsNorm(const std::vector<double>& x,
                                            const std::vector<double>& w) const {
  double ss = 0;
  for (double v : x) ss += v * v;
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + config_.rms_norm_eps);
  std::vector<double> y(x.size());
  // Gemma stores w - 1 (Gemma2RMSNorm: output * (1.0 + weight)); offset 0 elsewhere.
  const double offset = config_.norm_weight_offset;
  for (size_t i = 0; i < x.size(); ++i) y[i] = (offset + w[i]) * (x[i] * inv);
  return y;
}

std::vector<double> ReferenceLlama::GatedMlp(const Mlp& mlp, const std::vector<double>& x) const {
  // The biases are empty (none) but in gpt-oss's experts.
  std::vector<double> gate = Affine(mlp.gate, mlp.gate_bias, x);
  const std::vector<double> up = Affine(mlp.up, mlp.up_bias, x);
  const double limit = config_.swiglu_limit;
  for (size_t i = 0; i < gate.size(); ++i) {
    if (config_.clamped_swiglu()) {
      // GptOssExperts: gate.clamp(max=limit), up.clamp(-limit, limit),
      // glu = gate * sigmoid(gate * alpha), (up + 1) * glu.
      const double g = std::min(gate[i], limit), u = std::clamp(up[i], -limit, limit);
      gate[i] = (u + 1) * (g / (1.0 + std::exp(-kGptOssSwigluAlpha * g)));
    } else {
      gate[i] = (config_.gelu_tanh() ? GeluTanh(gate[i]) : Silu(gate[i])) * up[i];
    }
  }
  return Affine(mlp.down, mlp.down_bias, gate);
}

std::vector<double> ReferenceLlama::MixtureOfExperts(const Layer& l, const std::vector<double>& x,
                                                     double* min_margin) const {
  // router_logits = self.gate(hidden_states): a linear layer whose input only the bf16 option
  // rounds (the engine keeps the router in the model's dtype, unquantized, and takes its input
  // as such a product would; q8_0's and q4_K's input rounding belong to quantized weights).
  std::vector<double> logits = Product(l.router, bf16_linear_inputs_ ? RoundedToBf16(x) : x);
  // gpt-oss: F.linear(hidden_states, self.weight, self.bias), the bias in every comparison below.
  for (size_t e = 0; e < l.router_bias.size(); ++e) logits[e] += l.router_bias[e];
  const int64_t experts = static_cast<int64_t>(logits.size());
  const int64_t top_k = config_.num_experts_per_tok;
  // routing_weights = softmax(router_logits) over every expert.
  const double mx = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(experts);
  double sum = 0;
  for (int64_t e = 0; e < experts; ++e) sum += (p[e] = std::exp(logits[e] - mx));
  for (double& v : p) v /= sum;
  // torch.topk(routing_weights, top_k): the softmax keeps the logits' order, so rank the logits
  // (exact, where the probabilities may round two close ones together); a tie goes to the lower
  // expert number.
  std::vector<int64_t> order(experts);
  for (int64_t e = 0; e < experts; ++e) order[e] = e;
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return logits[a] > logits[b]; });
  if (top_k < experts) {
    *min_margin = std::min(*min_margin, logits[order[top_k - 1]] - logits[order[top_k]]);
  }
  // norm_topk_prob: routing_weights /= routing_weights.sum(dim=-1, keepdim=True).
  double kept = 0;
  for (int64_t j = 0; j < top_k; ++j) kept += p[order[j]];
  const double norm = config_.norm_topk_prob ? kept : 1.0;
  if (config_.model_type == "gpt_oss") {
    // GptOssTopKRouter: router_scores = softmax(top_value) over the kept logits alone (the same
    // weights as the renormalized ones, computed as Transformers does).
    const double top = logits[order[0]];
    double z = 0;
    for (int64_t j = 0; j < top_k; ++j) z += std::exp(logits[order[j]] - top);
    for (int64_t j = 0; j < top_k; ++j) p[order[j]] = std::exp(logits[order[j]] - top) / z;
  }
  std::vector<double> out(x.size(), 0.0);
  for (int64_t j = 0; j < top_k; ++j) {
    const int64_t e = order[j];
    const std::vector<double> y = GatedMlp(l.experts[e], x);
    const double w = config_.model_type == "gpt_oss" ? p[e] : p[e] / norm;
    for (size_t i = 0; i < out.size(); ++i) out[i] += w * y[i];
  }
  if (!l.shared_expert_gate.data.empty()) {
    // Qwen2-MoE: shared_expert_output = sigmoid(shared_expert_gate(x)) * shared_expert(x), added
    // to the routed experts' sum. The gate is taken as the router is (unquantized; its input
    // rounded by the bf16 option only), the shared expert as any MLP.
    const double g = Product(l.shared_expert_gate, bf16_linear_inputs_ ? RoundedToBf16(x) : x)[0];
    const double s = 1.0 / (1.0 + std::exp(-g));
    const std::vector<double> y = GatedMlp(l.shared_expert, x);
    for (size_t i = 0; i < out.size(); ++i) out[i] += s * y[i];
  }
  return out;
}

void ReferenceLlama::Rope(std::vector<double>& x, int64_t heads, int64_t position,
                          bool local) const {
  // HF: emb = cat(freqs, freqs); x * cos(emb) + rotate_half(x) * sin(emb), with
  // rotate_half(x) = cat(-x[half:], x[:half]).
  // YaRN scales cos and sin by its attention factor (HF: cos = emb.cos() * attention_scaling).
  // Gemma 3's sliding layers take cos and sin from rotary_emb_local (rope_local_base_freq, the
  // default rope type: no scaling, attention factor 1).
  const int64_t hd = config_.head_dim, half = hd / 2;
  const std::vector<double>& inv_freq = local ? local_inv_freq_ : inv_freq_;
  const double scale = local ? local_attention_factor_ : config_.rope_scaling.attention_factor;
  for (int64_t h = 0; h < heads; ++h) {
    double* v = x.data() + h * hd;
    for (int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(position) * inv_freq[i];
      const double c = std::cos(angle) * scale, s = std::sin(angle) * scale;
      const double a = v[i], b = v[i + half];
      v[i] = a * c - b * s;
      v[i + half] = b * c + a * s;
    }
  }
}

std::vector<double> ReferenceLlama::Affine(const Matrix& w, const std::vector<double>& bias,
                                           const std::vector<double>& x) const {
  std::vector<double> y = Linear(w, x);
  for (size_t i = 0; i < bias.size(); ++i) y[i] += bias[i];
  return y;
}

void ReferenceLlama::HeadNorm(std::vector<double>& x, const std::vector<double>& w) const {
  if (w.empty()) return;
  const size_t hd = w.size();
  for (size_t h = 0; h * hd < x.size(); ++h) {
    const std::vector<double> head(x.begin() + h * hd, x.begin() + (h + 1) * hd);
    const std::vector<double> normed = RmsNorm(head, w);
    std::copy(normed.begin(), normed.end(), x.begin() + h * hd);
  }
}

std::vector<std::pair<double, double>> ReferenceLlama::kv_amax() const {
  std::lock_guard<std::mutex> lock(kv_amax_mu_);
  return kv_amax_;
}

void ReferenceLlama::reset_kv_amax() {
  std::lock_guard<std::mutex> lock(kv_amax_mu_);
  kv_amax_.clear();
}

std::vector<std::vector<double>> ReferenceLlama::Forward(absl::Span<const int32_t> tokens) const {
  return Forward(tokens, FarHistory{});
}

std::vector<std::vector<double>> ReferenceLlama::Forward(absl::Span<const int32_t> tokens,
                                                         const FarHistory& far) const {
  std::vector<std::vector<double>> logits = FinalHidden(tokens, far);
  for (std::vector<double>& row : logits) {
    row = Linear(lm_head_, row);
    // Granite divides by logits_scaling; Gemma 2 soft-caps (no model does both).
    for (double& v : row) v = SoftCap(v / config_.logits_scaling, config_.final_logit_softcapping);
  }
  return logits;
}

std::vector<std::vector<double>> ReferenceLlama::FinalHidden(
    absl::Span<const int32_t> tokens) const {
  return FinalHidden(tokens, FarHistory{});
}

std::vector<std::vector<double>> ReferenceLlama::FinalHidden(absl::Span<const int32_t> tokens,
                                                             const FarHistory& far) const {
  const int64_t n = static_cast<int64_t>(tokens.size());
  const int64_t d = config_.hidden_size, hd = config_.head_dim;
  const int64_t heads = config_.num_attention_heads, kv_heads = config_.num_key_value_heads;
  const int64_t n_rep = heads / kv_heads;  // HF repeat_kv: query head h reads KV head h / n_rep
  // Granite (modeling_granite): the attention scale is attention_multiplier, the embedding is
  // multiplied by embedding_multiplier, each residual branch by residual_multiplier, and the
  // logits divided by logits_scaling; 1 / sqrt(head_dim) and ones for every other model.
  const double scale = config_.attention_scale > 0 ? config_.attention_scale
                                                   : 1.0 / std::sqrt(static_cast<double>(hd));
  const double residual = config_.residual_multiplier;
  if (far.window_blocks > 0 && config_.sliding_window > 0) {
    // Far history is defined over a layer's whole history; a sliding layer has none beyond its
    // window, and no definition of the two together exists to write this from.
    std::fprintf(stderr, "ReferenceLlama: far history with a sliding-window model\n");
    std::abort();
  }

  // This pass's routing margin (see min_routing_margin).
  double min_margin = std::numeric_limits<double>::infinity();
  std::vector<std::vector<double>> x(n);  // residual stream, [T][hidden]
  for (int64_t t = 0; t < n; ++t) {
    const double* e = embed_.Row(tokens[t]);
    x[t].assign(e, e + d);
    for (double& v : x[t]) v *= config_.embedding_multiplier;
  }
  for (int32_t layer = 0; layer < config_.num_hidden_layers; ++layer) {
    const Layer& l = layers_[layer];
    // HF sliding_window_causal: key k is visible to query q when q - window < k <= q.
    const int64_t window = config_.SlidingWindowOf(layer);
    // Gemma 3: the sliding layers rotate with the local base (LocalRopeConfig; when
    // rope_local_theta is 0 that is the global rotation anyway).
    const bool local_rope = config_.IsSlidingLayer(layer) && config_.rope_local_theta > 0;
    std::vector<std::vector<double>> q(n), k(n), v(n);
    std::pair<double, double> amax{0, 0};
    for (int64_t t = 0; t < n; ++t) {
      const std::vector<double> h = config_.pre_norms ? RmsNorm(x[t], l.input_norm) : x[t];
      q[t] = Affine(l.q, l.bq, h);
      k[t] = Affine(l.k, l.bk, h);
      v[t] = Affine(l.v, l.bv, h);
      HeadNorm(q[t], l.q_norm);
      HeadNorm(k[t], l.k_norm);
      // SmolLM3Attention: `if self.use_rope:` (its config's no_rope_layers[layer] is 1).
      if (config_.UsesRope(layer)) {
        Rope(q[t], heads, t, local_rope);
        Rope(k[t], kv_heads, t, local_rope);
      }
      for (double e : k[t]) amax.first = std::max(amax.first, std::abs(e));
      for (double e : v[t]) amax.second = std::max(amax.second, std::abs(e));
      if (kv_dtype_ == DType::kBF16) {
        for (std::vector<double>* kv : {&k[t], &v[t]}) {
          for (double& e : *kv) e = Bf16ToFloat(FloatToBf16(static_cast<float>(e)));
        }
      } else if (IsFp8(kv_dtype_)) {
        const bool e4m3 = kv_dtype_ == DType::kF8E4M3;
        auto round = [&](double x, double scale) {
          const float s = static_cast<float>(x / scale);
          return (e4m3 ? F8E4M3ToFloat(FloatToF8E4M3(s)) : F8E5M2ToFloat(FloatToF8E5M2(s))) * scale;
        };
        const std::pair<double, double> sc =
            kv_scales_.empty() ? std::pair<double, double>{1, 1} : kv_scales_.at(layer);
        for (double& e : k[t]) e = round(e, sc.first);
        for (double& e : v[t]) e = round(e, sc.second);
      }
    }
    {
      std::lock_guard<std::mutex> lock(kv_amax_mu_);
      if (kv_amax_.size() <= static_cast<size_t>(layer)) kv_amax_.resize(layer + 1);
      kv_amax_[layer].first = std::max(kv_amax_[layer].first, amax.first);
      kv_amax_[layer].second = std::max(kv_amax_[layer].second, amax.second);
    }
    for (int64_t t = 0; t < n; ++t) {
      std::vector<double> attn(heads * hd, 0.0);
      std::vector<double> p(t + 1);
      const int64_t bt = far.block_tokens;
      const int64_t summaries =
          far.window_blocks == 0
              ? 0
              : std::max<int64_t>(0, t / bt - far.window_blocks + 1 - far.sink_blocks);
      for (int64_t h = 0; h < heads; ++h) {
        const int64_t g = h / n_rep;
        const double* qh = q[t].data() + h * hd;
        if (summaries > 0) {
          // Columns: (key, value, bias) for the sinks, the block means, the window.
          std::vector<std::vector<double>> ck, cv;
          std::vector<double> bias;
          auto token = [&](int64_t s) {
            ck.emplace_back(k[s].begin() + g * hd, k[s].begin() + (g + 1) * hd);
            cv.emplace_back(v[s].begin() + g * hd, v[s].begin() + (g + 1) * hd);
            bias.push_back(0);
          };
          for (int64_t s = 0; s < far.sink_blocks * bt; ++s) token(s);
          for (int64_t b = far.sink_blocks; b < far.sink_blocks + summaries; ++b) {
            std::vector<double> mk(hd, 0), mv(hd, 0);
            for (int64_t s = b * bt; s < (b + 1) * bt; ++s) {
              for (int64_t i = 0; i < hd; ++i) {
                mk[i] += k[s][g * hd + i] / bt;
                mv[i] += v[s][g * hd + i] / bt;
              }
            }
            ck.push_back(mk);
            cv.push_back(mv);
            bias.push_back(std::log(static_cast<double>(bt)));
          }
          for (int64_t s = (far.sink_blocks + summaries) * bt; s <= t; ++s) token(s);
          std::vector<double> w(ck.size());
          double mx = l.sinks.empty() ? -INFINITY : l.sinks[h], sum = 0;
          for (size_t c = 0; c < ck.size(); ++c) {
            double dot = 0;
            for (int64_t i = 0; i < hd; ++i) dot += qh[i] * ck[c][i];
            w[c] = SoftCap(dot * scale, config_.attn_logit_softcapping) + bias[c];
            mx = std::max(mx, w[c]);
          }
          for (double& x : w) sum += (x = std::exp(x - mx));
          if (!l.sinks.empty()) sum += std::exp(l.sinks[h] - mx);  // a column without a value
          for (size_t c = 0; c < ck.size(); ++c) {
            for (int64_t i = 0; i < hd; ++i) attn[h * hd + i] += w[c] / sum * cv[c][i];
          }
          continue;
        }
        // Causal: keys at positions <= t; in a sliding layer only the last `window` of them.
        const int64_t first = window > 0 ? std::max<int64_t>(0, t - window + 1) : 0;
        // gpt-oss: the head's sink logit joins the max and the denominator, and carries no value
        // (the softmax over [scores, sink] with the sink's column dropped after it).
        double mx = l.sinks.empty() ? -INFINITY : l.sinks[h];
        for (int64_t s = first; s <= t; ++s) {
          double dot = 0;
          for (int64_t i = 0; i < hd; ++i) dot += qh[i] * k[s][g * hd + i];
          // Gemma 2: soft-capped after scaling, before the mask and softmax.
          p[s] = SoftCap(dot * scale, config_.attn_logit_softcapping);
          mx = std::max(mx, p[s]);
        }
        double sum = l.sinks.empty() ? 0 : std::exp(l.sinks[h] - mx);
        for (int64_t s = first; s <= t; ++s) sum += (p[s] = std::exp(p[s] - mx));
        for (int64_t s = first; s <= t; ++s) {
          for (int64_t i = 0; i < hd; ++i) attn[h * hd + i] += p[s] / sum * v[s][g * hd + i];
        }
      }
      std::vector<double> o = Affine(l.o, l.bo, attn);
      // Gemma 2 / 3: h = x + post_attention_layernorm(attn(input_layernorm(x))).
      if (config_.sandwich_norms) o = RmsNorm(o, l.post_attention_norm);
      for (int64_t i = 0; i < d; ++i) x[t][i] += o[i] * residual;
    }
    for (int64_t t = 0; t < n; ++t) {
      // Llama: post_attention_layernorm normalizes the MLP's input; Gemma 2 / 3:
      // out = h + post_feedforward_layernorm(mlp(pre_feedforward_layernorm(h))); OLMo 2:
      // out = h + post_feedforward_layernorm(mlp(h)).
      const std::vector<double> h =
          !config_.pre_norms ? x[t]
                             : RmsNorm(x[t], config_.sandwich_norms ? l.pre_feedforward_norm
                                                                    : l.post_attention_norm);
      std::vector<double> down =
          config_.IsMoeLayer(layer) ? MixtureOfExperts(l, h, &min_margin) : GatedMlp(l.mlp, h);
      if (config_.sandwich_norms) down = RmsNorm(down, l.post_feedforward_norm);
      for (int64_t i = 0; i < d; ++i) x[t][i] += down[i] * residual;
    }
  }
  // Lowers the recorded margin to this pass's (a compare-and-swap minimum).
  double recorded = min_routing_margin_.load();
  while (min_margin < recorded &&
         !min_routing_margin_.compare_exchange_weak(recorded, min_margin)) {
  }
  std::vector<std::vector<double>> hidden(n);
  for (int64_t t = 0; t < n; ++t) hidden[t] = RmsNorm(x[t], final_norm_);
  return hidden;
}

}  // namespace kvrm
