#include "tools/modelgen/quantized_writer.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <numeric>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/json.h"
#include "common/status_macros.h"
#include "model/safetensors.h"
#include "model/safetensors_writer.h"
#include "tools/modelgen/prng.h"

namespace kvrm::modelgen {
namespace {

namespace fs = std::filesystem;

// AWQ's GEMM packing: nibble i of a word holds output feature 8 j + kAwqOrder[i].
constexpr int kAwqOrder[8] = {0, 2, 4, 6, 1, 3, 5, 7};

// A decoder layer's linear weight: what the methods quantize.
bool IsQuantizedLinear(const std::string& name, const TensorView& t) {
  if (t.shape.size() != 2 || !absl::EndsWith(name, ".weight") ||
      !absl::StrContains(name, "layers.") || absl::StrContains(name, "norm")) {
    return false;
  }
  // Routers ([experts][hidden]) and Qwen2-MoE's shared-expert gate ([1][hidden]) stay as they
  // are, as AutoAWQ, GPTQ and llm-compressor's recipes leave them.
  return !absl::EndsWith(name, ".gate.weight") &&
         !absl::EndsWith(name, "shared_expert_gate.weight");
}

float RoundTo(DType dtype, float x) {
  return dtype == DType::kF32    ? x
         : dtype == DType::kBF16 ? Bf16ToFloat(FloatToBf16(x))
                                 : F16ToFloat(FloatToF16(x));
}

void AppendScale(DType dtype, float x, std::vector<std::byte>* out) {
  const size_t at = out->size();
  out->resize(at + DTypeSize(dtype));
  if (dtype == DType::kF32) {
    std::memcpy(out->data() + at, &x, 4);
  } else {
    const uint16_t h = dtype == DType::kBF16 ? FloatToBf16(x) : FloatToF16(x);
    std::memcpy(out->data() + at, &h, 2);
  }
}

template <typename T>
std::vector<std::byte> Bytes(const std::vector<T>& v) {
  std::vector<std::byte> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// One quantized matrix: u [n][k], zu [n][groups], s [n][groups], g_idx [k].
struct Grid {
  int64_t n = 0, k = 0, groups = 0;
  std::vector<uint8_t> u, zu;
  std::vector<float> s;
  std::vector<int32_t> g_idx;
};

Grid Quantize(const TensorView& t, const std::string& name, const QuantizeOptions& o) {
  Grid g;
  g.n = t.shape[0];
  g.k = t.shape[1];
  const int64_t size = o.group_size > 0 ? o.group_size : g.k;
  g.groups = (g.k + size - 1) / size;
  const int maxq = (1 << o.bits) - 1, mid = 1 << (o.bits - 1);
  // The input features in group order: identity, or a permutation (desc_act).
  std::vector<int64_t> order(g.k);
  std::iota(order.begin(), order.end(), 0);
  if (o.act_order) {
    Rng rng(DeriveSeed(o.seed, name));
    for (int64_t i = g.k - 1; i > 0; --i) {
      std::swap(order[i], order[rng.Below(static_cast<uint32_t>(i + 1))]);
    }
  }
  g.g_idx.resize(g.k);
  for (int64_t i = 0; i < g.k; ++i) g.g_idx[order[i]] = static_cast<int32_t>(i / size);
  g.u.resize(g.n * g.k);
  g.zu.resize(g.n * g.groups);
  g.s.resize(g.n * g.groups);
  // GPTQ v1 stores zu - 1, so its asymmetric zeros start at 1 (a stored -1 would spill into the
  // next field of the word, as old AutoGPTQ files show).
  const int min_zero = o.method == "gptq" && !o.gptq_v2 ? 1 : 0;
  for (int64_t r = 0; r < g.n; ++r) {
    for (int64_t grp = 0; grp < g.groups; ++grp) {
      float lo = 0, hi = 0;
      for (int64_t i = grp * size; i < std::min(g.k, (grp + 1) * size); ++i) {
        const float w = FloatElement(t, r * g.k + order[i]);
        lo = std::min(lo, w);
        hi = std::max(hi, w);
      }
      float s;
      int zero;
      if (o.zero_point) {
        s = RoundTo(o.scale_dtype, std::max(hi - lo, 1e-5f) / static_cast<float>(maxq));
        zero = std::clamp(static_cast<int>(std::round(-lo / s)), min_zero, maxq);
      } else {
        const float amax = std::max(std::abs(lo), std::abs(hi));
        s = RoundTo(o.scale_dtype, std::max(2 * amax, 1e-5f) / static_cast<float>(maxq));
        zero = mid;
      }
      g.s[r * g.groups + grp] = s;
      g.zu[r * g.groups + grp] = static_cast<uint8_t>(zero);
      for (int64_t i = grp * size; i < std::min(g.k, (grp + 1) * size); ++i) {
        const int64_t c = order[i];
        const float w = FloatElement(t, r * g.k + c);
        g.u[r * g.k + c] =
            static_cast<uint8_t>(std::clamp(static_cast<int>(std::round(w / s)) + zero, 0, maxq));
      }
    }
  }
  return g;
}

// The tensors a method stores for one quantized matrix.
struct Owned {
  std::string name;
  std::optional<StorageType> type;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<std::byte> data;
};

void Pack(const Grid& g, const std::string& base, const QuantizeOptions& o,
          std::vector<Owned>* out) {
  const int bits = o.bits, pw = 32 / bits;
  const int64_t n = g.n, k = g.k, groups = g.groups;
  auto u = [&](int64_t r, int64_t c) { return static_cast<uint32_t>(g.u[r * k + c]); };
  auto zu = [&](int64_t r, int64_t grp) { return static_cast<uint32_t>(g.zu[r * groups + grp]); };
  std::vector<std::byte> scales;
  if (o.method == "awq") {
    std::vector<uint32_t> qweight(k * (n / 8)), qzeros(groups * (n / 8));
    for (int64_t c = 0; c < k; ++c) {
      for (int64_t j = 0; j < n / 8; ++j) {
        for (int i = 0; i < 8; ++i)
          qweight[c * (n / 8) + j] |= u(8 * j + kAwqOrder[i], c) << (4 * i);
      }
    }
    for (int64_t grp = 0; grp < groups; ++grp) {
      for (int64_t j = 0; j < n / 8; ++j) {
        for (int i = 0; i < 8; ++i) {
          qzeros[grp * (n / 8) + j] |= zu(8 * j + kAwqOrder[i], grp) << (4 * i);
        }
      }
      for (int64_t r = 0; r < n; ++r) AppendScale(o.scale_dtype, g.s[r * groups + grp], &scales);
    }
    out->push_back({base + ".qweight", StorageType::kI32, DType::kF32, {k, n / 8}, Bytes(qweight)});
    out->push_back(
        {base + ".qzeros", StorageType::kI32, DType::kF32, {groups, n / 8}, Bytes(qzeros)});
    out->push_back({base + ".scales", std::nullopt, o.scale_dtype, {groups, n}, scales});
    return;
  }
  if (o.method == "gptq") {
    std::vector<uint32_t> qweight((k / pw) * n), qzeros(groups * (n / pw));
    for (int64_t kw = 0; kw < k / pw; ++kw) {
      for (int64_t r = 0; r < n; ++r) {
        for (int i = 0; i < pw; ++i) qweight[kw * n + r] |= u(r, kw * pw + i) << (bits * i);
      }
    }
    const uint32_t bias = o.gptq_v2 ? 0 : 1;
    for (int64_t grp = 0; grp < groups; ++grp) {
      for (int64_t r = 0; r < n; ++r) {
        qzeros[grp * (n / pw) + r / pw] |= (zu(r, grp) - bias) << (bits * (r % pw));
        AppendScale(o.scale_dtype, g.s[r * groups + grp], &scales);
      }
    }
    out->push_back(
        {base + ".qweight", StorageType::kI32, DType::kF32, {k / pw, n}, Bytes(qweight)});
    out->push_back(
        {base + ".qzeros", StorageType::kI32, DType::kF32, {groups, n / pw}, Bytes(qzeros)});
    out->push_back({base + ".scales", std::nullopt, o.scale_dtype, {groups, n}, scales});
    out->push_back({base + ".g_idx", StorageType::kI32, DType::kF32, {k}, Bytes(g.g_idx)});
    return;
  }
  // compressed-tensors pack-quantized: u is q + 2^(bits-1) already (q signed), zu likewise.
  std::vector<uint32_t> packed(n * (k / pw));
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t kw = 0; kw < k / pw; ++kw) {
      for (int i = 0; i < pw; ++i) packed[r * (k / pw) + kw] |= u(r, kw * pw + i) << (bits * i);
    }
    for (int64_t grp = 0; grp < groups; ++grp) {
      AppendScale(o.scale_dtype, g.s[r * groups + grp], &scales);
    }
  }
  out->push_back(
      {base + ".weight_packed", StorageType::kI32, DType::kF32, {n, k / pw}, Bytes(packed)});
  out->push_back({base + ".weight_scale", std::nullopt, o.scale_dtype, {n, groups}, scales});
  if (o.zero_point) {
    std::vector<uint32_t> zeros((n / pw) * groups);
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t grp = 0; grp < groups; ++grp) {
        zeros[(r / pw) * groups + grp] |= zu(r, grp) << (bits * (r % pw));
      }
    }
    out->push_back({base + ".weight_zero_point",
                    StorageType::kI32,
                    DType::kF32,
                    {n / pw, groups},
                    Bytes(zeros)});
  }
  const std::vector<int64_t> shape = {n, k};
  out->push_back({base + ".weight_shape", StorageType::kI64, DType::kF32, {2}, Bytes(shape)});
  if (o.act_order) {
    out->push_back({base + ".weight_g_idx", StorageType::kI32, DType::kF32, {k}, Bytes(g.g_idx)});
  }
}

bool Unpacked(const QuantizeOptions& o) {
  return o.method == "fp8" || o.method == "fbgemm_fp8" || o.method == "bitsandbytes" ||
         (o.method == "compressed-tensors" && o.format != "pack-quantized");
}

bool Fp8(const QuantizeOptions& o) {
  return o.method == "fp8" || o.method == "fbgemm_fp8" || o.format == "float-quantized";
}

// The unpacked schemes: q [n][k] (I8 or F8_E4M3) and a scale per block_rows x group_size tile;
// `values` gets s * q, as the checkpoint defines them.
void QuantizeUnpacked(const TensorView& t, const std::string& base, const QuantizeOptions& o,
                      std::vector<Owned>* out, std::vector<float>* values) {
  const int64_t n = t.shape[0], k = t.shape[1];
  const bool fp8 = Fp8(o);
  const int64_t br = o.block_rows == 0 ? n : o.block_rows;
  const int64_t bc = o.block_rows == 0 || o.group_size <= 0 ? k : o.group_size;
  const int64_t rows = (n + br - 1) / br, cols = (k + bc - 1) / bc;
  std::vector<uint8_t> q(n * k);
  std::vector<std::byte> scales;
  values->resize(n * k);
  for (int64_t rb = 0; rb < rows; ++rb) {
    for (int64_t cb = 0; cb < cols; ++cb) {
      const int64_t r1 = std::min(n, (rb + 1) * br), c1 = std::min(k, (cb + 1) * bc);
      float amax = 0;
      for (int64_t r = rb * br; r < r1; ++r) {
        for (int64_t c = cb * bc; c < c1; ++c) {
          amax = std::max(amax, std::abs(FloatElement(t, r * k + c)));
        }
      }
      const float s = RoundTo(o.scale_dtype, std::max(amax, 1e-5f) / (fp8 ? 448.0f : 127.5f));
      AppendScale(o.scale_dtype, s, &scales);
      for (int64_t r = rb * br; r < r1; ++r) {
        for (int64_t c = cb * bc; c < c1; ++c) {
          const float x = FloatElement(t, r * k + c) / s;
          if (fp8) {
            q[r * k + c] = FloatToF8E4M3(x);
            (*values)[r * k + c] = s * F8E4M3ToFloat(q[r * k + c]);
          } else {
            const int v = std::clamp(static_cast<int>(std::round(x)), -128, 127);
            q[r * k + c] = static_cast<uint8_t>(static_cast<int8_t>(v));
            (*values)[r * k + c] = s * static_cast<float>(v);
          }
        }
      }
    }
  }
  out->push_back({base + ".weight",
                  fp8 ? StorageType::kF8E4M3 : StorageType::kI8,
                  DType::kF32,
                  {n, k},
                  Bytes(q)});
  // One scale a tensor: AutoFP8 saves a 0-d tensor, llm-compressor a [1].
  std::vector<int64_t> shape = {rows, cols};
  if (o.block_rows == 0)
    shape = o.method == "fp8" ? std::vector<int64_t>{} : std::vector<int64_t>{1};
  const bool inverse = o.method == "fp8" && o.block_rows > 1;
  out->push_back({base + (inverse ? ".weight_scale_inv" : ".weight_scale"), std::nullopt,
                  o.scale_dtype, shape, scales});
}

// bitsandbytes' code values (its get_4bit_type): NF4's normal quantiles, FP4's e2m1 over 12.
constexpr float kNf4[16] = {-1.0f,
                            -0.6961928009986877f,
                            -0.5250730514526367f,
                            -0.39491748809814453f,
                            -0.28444138169288635f,
                            -0.18477343022823334f,
                            -0.09105003625154495f,
                            0.0f,
                            0.07958029955625534f,
                            0.16093020141124725f,
                            0.24611230194568634f,
                            0.33791524171829224f,
                            0.44070982933044434f,
                            0.5626170039176941f,
                            0.7229568362236023f,
                            1.0f};
constexpr float kFp4[16] = {
    0.0f,  0.0625f / 12,  8.0f / 12,  1.0f,  4.0f / 12,  6.0f / 12,  2.0f / 12,  3.0f / 12,
    -0.0f, -0.0625f / 12, -8.0f / 12, -1.0f, -4.0f / 12, -6.0f / 12, -2.0f / 12, -3.0f / 12};

// bitsandbytes: the tensors of one weight as Params4bit / Int8Params serialize them; `values`
// gets what they stand for, computed as the loader computes it.
void QuantizeBnb(const TensorView& t, const std::string& name, const QuantizeOptions& o,
                 std::vector<Owned>* out, std::vector<float>* values) {
  const int64_t n = t.shape[0], k = t.shape[1];
  values->resize(n * k);
  if (o.format == "int8") {  // LLM.int8(): int8 rows, SCB their largest magnitudes
    std::vector<int8_t> q(n * k);
    std::vector<float> scb(n);
    for (int64_t r = 0; r < n; ++r) {
      float amax = 1e-5f;
      for (int64_t c = 0; c < k; ++c) amax = std::max(amax, std::abs(FloatElement(t, r * k + c)));
      scb[r] = amax;
      const float s = amax * (1.0f / 127);
      for (int64_t c = 0; c < k; ++c) {
        const int v = std::clamp(
            static_cast<int>(std::round(127.0f * FloatElement(t, r * k + c) / amax)), -127, 127);
        q[r * k + c] = static_cast<int8_t>(v);
        (*values)[r * k + c] = s * static_cast<float>(v);
      }
    }
    out->push_back({name, StorageType::kI8, DType::kF32, {n, k}, Bytes(q)});
    // Linear8bitLt saves SCB beside the weight ("<module>.SCB"), with its weight_format.
    const std::string module = name.substr(0, name.size() - std::string_view(".weight").size());
    out->push_back({module + ".SCB", std::nullopt, DType::kF32, {n}, Bytes(scb)});
    out->push_back({module + ".weight_format",
                    StorageType::kU8,
                    DType::kF32,
                    {},
                    Bytes(std::vector<uint8_t>{0})});
    return;
  }
  const float* map = o.format == "nf4" ? kNf4 : kFp4;
  const int64_t size = o.group_size, total = n * k, blocks = (total + size - 1) / size;
  std::vector<float> absmax(blocks);
  for (int64_t b = 0; b < blocks; ++b) {
    float amax = 1e-5f;
    for (int64_t j = b * size; j < std::min(total, (b + 1) * size); ++j) {
      amax = std::max(amax, std::abs(FloatElement(t, j)));
    }
    absmax[b] = amax;
  }
  // The codes, against the true absmax (as bitsandbytes quantizes before it double-quantizes).
  std::vector<uint8_t> packed((total + 1) / 2);
  for (int64_t j = 0; j < total; ++j) {
    const float x = FloatElement(t, j) / absmax[j / size];
    int best = 0;
    for (int c = 1; c < 16; ++c) {
      if (std::abs(map[c] - x) < std::abs(map[best] - x)) best = c;
    }
    packed[j / 2] |= static_cast<uint8_t>(j % 2 == 0 ? best << 4 : best);
  }
  // The absmax the loader will read back.
  std::vector<float> scales = absmax;
  Json state = {
      {"quant_type", o.format}, {"blocksize", size}, {"dtype", "float32"}, {"shape", {n, k}}};
  if (o.double_quant) {
    constexpr int64_t kNested = 256;
    double sum = 0;
    for (float a : absmax) sum += a;
    const float offset = static_cast<float>(sum / blocks);
    std::vector<float> nested_map(256), nested_absmax((blocks + kNested - 1) / kNested);
    for (int i = 0; i < 256; ++i) nested_map[i] = (static_cast<float>(i) - 127.5f) / 127.5f;
    std::vector<uint8_t> index(blocks);
    for (int64_t nb = 0; nb < static_cast<int64_t>(nested_absmax.size()); ++nb) {
      float amax = 1e-8f;
      for (int64_t b = nb * kNested; b < std::min(blocks, (nb + 1) * kNested); ++b) {
        amax = std::max(amax, std::abs(absmax[b] - offset));
      }
      nested_absmax[nb] = amax;
      for (int64_t b = nb * kNested; b < std::min(blocks, (nb + 1) * kNested); ++b) {
        const float x = (absmax[b] - offset) / amax;
        const int i = std::clamp(static_cast<int>(std::round(x * 127.5f + 127.5f)), 0, 255);
        index[b] = static_cast<uint8_t>(i);
        scales[b] = nested_map[i] * nested_absmax[nb] + offset;
      }
    }
    state["nested_blocksize"] = kNested;
    state["nested_offset"] = offset;
    state["nested_dtype"] = "float32";
    out->push_back({name + ".absmax", StorageType::kU8, DType::kF32, {blocks}, Bytes(index)});
    out->push_back({name + ".nested_absmax",
                    std::nullopt,
                    DType::kF32,
                    {static_cast<int64_t>(nested_absmax.size())},
                    Bytes(nested_absmax)});
    out->push_back(
        {name + ".nested_quant_map", std::nullopt, DType::kF32, {256}, Bytes(nested_map)});
  } else {
    out->push_back({name + ".absmax", std::nullopt, DType::kF32, {blocks}, Bytes(absmax)});
  }
  for (int64_t j = 0; j < total; ++j) {
    const uint8_t byte = packed[j / 2];
    (*values)[j] = map[j % 2 == 0 ? byte >> 4 : byte & 15] * scales[j / size];
  }
  const std::string state_text = state.dump();
  out->push_back({name, StorageType::kU8, DType::kF32, {(total + 1) / 2, 1}, Bytes(packed)});
  out->push_back({name + ".quant_map",
                  std::nullopt,
                  DType::kF32,
                  {16},
                  Bytes(std::vector<float>(map, map + 16))});
  out->push_back({name + ".quant_state.bitsandbytes__" + o.format,
                  StorageType::kU8,
                  DType::kF32,
                  {static_cast<int64_t>(state_text.size())},
                  Bytes(std::vector<char>(state_text.begin(), state_text.end()))});
}

// gpt-oss's experts (mlp.experts.gate_up_proj, mlp.experts.down_proj): what mxfp4 quantizes.
bool IsMxfp4Expert(const std::string& name, const TensorView& t) {
  return t.shape.size() == 3 && (absl::EndsWith(name, ".mlp.experts.gate_up_proj") ||
                                 absl::EndsWith(name, ".mlp.experts.down_proj"));
}

// One fused expert tensor `t` ([experts][in][out], input x output as GptOssExperts holds it) as
// MXFP4: <name>_blocks [experts][out][in / 32][16] and <name>_scales [experts][out][in / 32],
// each output feature's inputs in blocks of 32 (the layout of openai's checkpoints, which
// Transformers' convert_moe_packed_tensors transposes back). `values` gets the dequantized
// tensor, in t's layout.
absl::Status QuantizeMxfp4(const TensorView& t, const std::string& name, std::vector<Owned>* out,
                           std::vector<float>* values) {
  constexpr int64_t kBlock = 32;
  const int64_t experts = t.shape[0], in = t.shape[1], cols = t.shape[2];
  if (in % kBlock != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("quantize: mxfp4: ", name, " has ", in, " inputs, not whole blocks of 32"));
  }
  const int64_t blocks = in / kBlock;
  std::vector<uint8_t> packed(experts * cols * blocks * kBlock / 2),
      scales(experts * cols * blocks);
  values->resize(experts * in * cols);
  float x[kBlock];
  for (int64_t e = 0; e < experts; ++e) {
    for (int64_t r = 0; r < cols; ++r) {
      for (int64_t b = 0; b < blocks; ++b) {
        auto at = [&](int64_t i) { return (e * in + b * kBlock + i) * cols + r; };
        for (int64_t i = 0; i < kBlock; ++i) {
          x[i] = FloatElement(t, at(i));
          if (!std::isfinite(x[i])) {
            return absl::InvalidArgumentError(
                absl::StrCat("quantize: mxfp4: ", name, " holds ", x[i]));
          }
        }
        const int64_t block = (e * cols + r) * blocks + b;
        uint8_t* bytes = packed.data() + block * kBlock / 2;
        QuantizeMxfp4Block(x, bytes, &scales[block]);
        for (int64_t i = 0; i < kBlock; ++i) {
          const uint8_t code = i % 2 == 0 ? bytes[i / 2] & 15 : bytes[i / 2] >> 4;
          (*values)[at(i)] = std::ldexp(kE2M1Values[code], scales[block] - 127);
        }
      }
    }
  }
  out->push_back({name + "_blocks",
                  StorageType::kU8,
                  DType::kF32,
                  {experts, cols, blocks, 16},
                  Bytes(packed)});
  out->push_back(
      {name + "_scales", StorageType::kU8, DType::kF32, {experts, cols, blocks}, Bytes(scales)});
  return absl::OkStatus();
}

// `values` as a float tensor of `dtype` (bf16 or f32), which must hold each exactly.
absl::StatusOr<std::vector<std::byte>> ExactBytes(const std::vector<float>& values, DType dtype,
                                                  const std::string& name) {
  if (dtype == DType::kF32) return Bytes(values);
  std::vector<uint16_t> h(values.size());
  for (size_t i = 0; i < values.size(); ++i) {
    h[i] = FloatToBf16(values[i]);
    if (Bf16ToFloat(h[i]) != values[i]) {
      return absl::InternalError(
          absl::StrCat("quantize: ", name, "'s value ", values[i], " is not a bf16 number"));
    }
  }
  return Bytes(h);
}

Json QuantizationConfig(const QuantizeOptions& o) {
  if (o.method == "mxfp4") {  // openai/gpt-oss-20b's
    return Json{{"modules_to_not_convert",
                 {"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
                  "lm_head"}},
                {"quant_method", "mxfp4"}};
  }
  if (o.method == "awq") {
    return Json{{"quant_method", "awq"}, {"bits", o.bits},    {"group_size", o.group_size},
                {"zero_point", true},    {"version", "gemm"}, {"modules_to_not_convert", nullptr}};
  }
  if (o.method == "gptq") {
    return Json{{"quant_method", "gptq"},
                {"bits", o.bits},
                {"group_size", o.group_size},
                {"desc_act", o.act_order},
                {"sym", !o.zero_point},
                {"damp_percent", 0.01},
                {"true_sequential", true},
                {"static_groups", false},
                {"checkpoint_format", o.gptq_v2 ? "gptq_v2" : "gptq"}};
  }
  if (o.method == "fp8") {
    Json q = {{"quant_method", "fp8"}, {"fmt", "e4m3"}, {"activation_scheme", "dynamic"}};
    if (o.block_rows > 1) q["weight_block_size"] = {o.block_rows, o.group_size};
    return q;
  }
  if (o.method == "bitsandbytes") {
    const bool in4 = o.format != "int8";
    Json q = {{"quant_method", "bitsandbytes"},
              {"load_in_4bit", in4},
              {"load_in_8bit", !in4},
              {"llm_int8_threshold", 6.0},
              {"llm_int8_skip_modules", nullptr},
              {"llm_int8_has_fp16_weight", false}};
    if (in4) {
      q["bnb_4bit_quant_type"] = o.format;
      q["bnb_4bit_use_double_quant"] = o.double_quant;
      q["bnb_4bit_compute_dtype"] = "bfloat16";
      q["bnb_4bit_quant_storage"] = "uint8";
    }
    return q;
  }
  if (o.method == "fbgemm_fp8") {
    return Json{{"quant_method", "fbgemm_fp8"},
                {"activation_scale_ub", 1200.0},
                {"modules_to_not_convert", {"lm_head"}}};
  }
  const bool fp8 = Fp8(o);
  const char* strategy = o.block_rows == 0  ? "tensor"
                         : o.block_rows > 1 ? "block"
                         : o.group_size > 0 ? "group"
                                            : "channel";
  Json weights = {
      {"num_bits", o.bits},
      {"type", fp8 ? "float" : "int"},
      {"symmetric", !o.zero_point},
      {"strategy", strategy},
      {"group_size", std::string_view(strategy) == "group" ? Json(o.group_size) : Json(nullptr)},
      {"dynamic", false},
      {"actorder", o.act_order ? Json("group") : Json(nullptr)},
      {"observer", "minmax"},
      {"block_structure", o.block_rows > 1 ? Json({o.block_rows, o.group_size}) : Json(nullptr)}};
  // W8A8 and FP8: the activations too, by token at run time (what kvrm does not reproduce).
  Json activations = nullptr;
  if (Unpacked(o)) {
    activations = {{"num_bits", 8},     {"type", fp8 ? "float" : "int"},
                   {"symmetric", true}, {"strategy", "token"},
                   {"dynamic", true},   {"observer", nullptr}};
  }
  return Json{{"quant_method", "compressed-tensors"},
              {"format", o.format},
              {"quantization_status", "compressed"},
              {"ignore", {"lm_head"}},
              {"kv_cache_scheme", nullptr},
              {"config_groups",
               {{"group_0",
                 {{"targets", {"Linear"}},
                  {"weights", weights},
                  {"input_activations", activations},
                  {"output_activations", nullptr},
                  {"format", o.format}}}}}};
}

absl::Status CheckOptions(const QuantizeOptions& o) {
  if (o.method != "awq" && o.method != "gptq" && o.method != "compressed-tensors" &&
      o.method != "fp8" && o.method != "fbgemm_fp8" && o.method != "bitsandbytes" &&
      o.method != "mxfp4") {
    return absl::InvalidArgumentError(
        absl::StrCat("quantize: method \"", o.method,
                     "\" (awq, gptq, compressed-tensors, fp8, fbgemm_fp8, bitsandbytes or mxfp4)"));
  }
  // E2M1 values in blocks of 32 with E8M0 scales: the format leaves nothing to choose.
  if (o.method == "mxfp4") return absl::OkStatus();
  if (o.method == "bitsandbytes") {
    if (o.format != "nf4" && o.format != "fp4" && o.format != "int8") {
      return absl::InvalidArgumentError(
          absl::StrCat("quantize: bitsandbytes format \"", o.format, "\" (nf4, fp4 or int8)"));
    }
    if (o.format != "int8" && o.group_size <= 0) {
      return absl::InvalidArgumentError("quantize: bitsandbytes 4-bit needs a group_size (64)");
    }
    return absl::OkStatus();
  }
  if (o.method == "compressed-tensors" && o.format != "pack-quantized" &&
      o.format != "int-quantized" && o.format != "float-quantized") {
    return absl::InvalidArgumentError(absl::StrCat(
        "quantize: format \"", o.format, "\" (pack-quantized, int-quantized or float-quantized)"));
  }
  if (Unpacked(o)) {
    if (o.bits != 8 || o.zero_point || o.act_order || o.block_rows < 0 ||
        (o.block_rows > 1 && o.group_size <= 0)) {
      return absl::InvalidArgumentError(
          "quantize: int-quantized, float-quantized, fp8 and fbgemm_fp8 are 8-bit, symmetric, "
          "without act_order; blocks need a group_size");
    }
    if ((o.method == "fp8" && o.block_rows == 1) ||
        (o.method == "fbgemm_fp8" && (o.block_rows != 1 || o.group_size > 0))) {
      return absl::InvalidArgumentError(
          "quantize: fp8 has blocks (block_rows > 1) or one scale a tensor (block_rows 0); "
          "fbgemm_fp8 one scale a row (block_rows 1, group_size -1)");
    }
    return absl::OkStatus();
  }
  if (o.block_rows != 1) {
    return absl::InvalidArgumentError("quantize: block_rows is for the unpacked schemes");
  }
  if (o.bits != 4 && (o.bits != 8 || o.method == "awq")) {
    return absl::InvalidArgumentError(absl::StrCat("quantize: ", o.bits, " bits for ", o.method));
  }
  if (o.method == "awq" && (!o.zero_point || o.act_order)) {
    return absl::InvalidArgumentError("quantize: awq is asymmetric and has no act_order");
  }
  if (o.group_size == 0 || o.group_size < -1) {
    return absl::InvalidArgumentError("quantize: group_size must be positive or -1");
  }
  return absl::OkStatus();
}

// Copies `src`'s files but the weights and config.json into `dir`, and writes config.json with
// `quantization` (null: none) and the tensors.
absl::Status WriteDir(const std::string& src, const std::string& dir, const Json& config,
                      const std::vector<Owned>& tensors) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return absl::InternalError(absl::StrCat(dir, ": ", ec.message()));
  for (const fs::directory_entry& e : fs::directory_iterator(src)) {
    const std::string file = e.path().filename().string();
    if (!e.is_regular_file() || file == "config.json" || absl::StrContains(file, ".safetensors")) {
      continue;
    }
    fs::copy_file(e.path(), fs::path(dir) / file, fs::copy_options::overwrite_existing, ec);
    if (ec) return absl::InternalError(absl::StrCat(e.path().string(), ": ", ec.message()));
  }
  std::vector<TensorToWrite> write;
  for (const Owned& t : tensors) {
    write.push_back(TensorToWrite{t.name, t.dtype, t.shape, t.data, t.type});
  }
  // Wider element types first keep every tensor aligned to its size (safetensors_writer.h).
  std::stable_sort(write.begin(), write.end(), [](const TensorToWrite& a, const TensorToWrite& b) {
    auto size = [](const TensorToWrite& t) {
      return t.type ? StorageTypeSize(*t.type) : DTypeSize(t.dtype);
    };
    return size(a) > size(b);
  });
  for (const fs::directory_entry& e : fs::directory_iterator(dir)) {
    if (absl::StrContains(e.path().filename().string(), ".safetensors")) fs::remove(e.path(), ec);
  }
  RETURN_IF_ERROR(
      WriteSafetensors((fs::path(dir) / "model.safetensors").string(), write, {{"format", "pt"}}));
  return WriteFileAtomically((fs::path(dir) / "config.json").string(), config.dump(2) + "\n");
}

}  // namespace

uint8_t NearestE2M1(double x) {
  // Magnitudes 0..6 by code 0..7; only neighbours can tie, and then the even code wins.
  const double a = std::abs(x);
  uint8_t best = 0;
  for (uint8_t c = 1; c < 8; ++c) {
    const double d = std::abs(kE2M1Values[c] - a), d_best = std::abs(kE2M1Values[best] - a);
    if (d < d_best || (d == d_best && c % 2 == 0)) best = c;
  }
  return static_cast<uint8_t>(best != 0 && x < 0 ? best | 8 : best);
}

void QuantizeMxfp4Block(const float* x, uint8_t* packed, uint8_t* scale) {
  float amax = 0;
  for (int i = 0; i < 32; ++i) amax = std::max(amax, std::abs(x[i]));
  // floor(log2(amax)) - 2, exactly (ilogb of the value widened to double, subnormals included):
  // amax / 2^e lies in [4, 8), whose top (over 6) saturates.
  const int e = amax > 0 ? std::clamp(std::ilogb(static_cast<double>(amax)) - 2, -127, 127) : 0;
  *scale = static_cast<uint8_t>(e + 127);
  for (int j = 0; j < 16; ++j) {
    const uint8_t lo = NearestE2M1(std::ldexp(static_cast<double>(x[2 * j]), -e));
    const uint8_t hi = NearestE2M1(std::ldexp(static_cast<double>(x[2 * j + 1]), -e));
    packed[j] = static_cast<uint8_t>(lo | hi << 4);
  }
}

absl::Status QuantizeModelDir(const std::string& src, const std::string& out,
                              const std::string& dequantized, const QuantizeOptions& options) {
  RETURN_IF_ERROR(CheckOptions(options));
  ASSIGN_OR_RETURN(const std::unique_ptr<SafetensorsSet> files, SafetensorsSet::OpenDirectory(src));
  ASSIGN_OR_RETURN(Json config, ReadJsonFile(src + "/config.json"));
  // gpt-oss's experts are fused 3-D tensors that only its own MXFP4 layout covers (the other
  // methods would quantize the router and leave the experts); MXFP4 is defined for them only.
  const bool mxfp4 = options.method == "mxfp4";
  const bool gpt_oss = config.is_object() && config.value("model_type", "") == "gpt_oss";
  if (mxfp4 != gpt_oss) {
    return absl::InvalidArgumentError(
        mxfp4 ? absl::StrCat("quantize: mxfp4 is gpt-oss's format, for gpt_oss models only (", src,
                             " is \"", config.value("model_type", ""), "\")")
              : absl::StrCat("quantize: a gpt_oss model is quantized as mxfp4 only, not ",
                             options.method));
  }
  std::vector<Owned> packed, plain;
  for (const std::string& name : files->TensorNames()) {
    ASSIGN_OR_RETURN(const TensorView t, files->Get(name));
    if (mxfp4 && IsMxfp4Expert(name, t)) {
      std::vector<float> w;
      RETURN_IF_ERROR(QuantizeMxfp4(t, name, &packed, &w));
      if (dequantized.empty()) continue;
      // bf16 and f32 hold every MXFP4 value (one mantissa bit, the exponent within f32's range
      // for any scale a finite input gives); f16 would not.
      const DType dtype = t.dtype == DType::kBF16 ? DType::kBF16 : DType::kF32;
      ASSIGN_OR_RETURN(std::vector<std::byte> bytes, ExactBytes(w, dtype, name));
      plain.push_back({name, std::nullopt, dtype, t.shape, std::move(bytes)});
      continue;
    }
    if (mxfp4 || !IsQuantizedLinear(name, t)) {
      Owned copy{name, std::nullopt, t.dtype, t.shape,
                 std::vector<std::byte>(t.data, t.data + t.nbytes)};
      packed.push_back(copy);
      if (!dequantized.empty()) plain.push_back(std::move(copy));
      continue;
    }
    const int64_t n = t.shape[0], k = t.shape[1];
    const std::string base = name.substr(0, name.size() - std::string_view(".weight").size());
    if (Unpacked(options)) {
      std::vector<float> w;
      if (options.method == "bitsandbytes") {
        QuantizeBnb(t, name, options, &packed, &w);
      } else {
        QuantizeUnpacked(t, base, options, &packed, &w);
      }
      if (!dequantized.empty())
        plain.push_back({name, std::nullopt, DType::kF32, {n, k}, Bytes(w)});
      continue;
    }
    const int pw = 32 / options.bits;
    if ((options.method != "compressed-tensors" && n % pw != 0) ||
        (options.method != "awq" && k % pw != 0)) {
      return absl::InvalidArgumentError(absl::StrCat("quantize: ", name, " [", n, ", ", k,
                                                     "] does not pack ", pw, " values a word"));
    }
    const Grid g = Quantize(t, name, options);
    Pack(g, base, options, &packed);
    if (dequantized.empty()) continue;
    std::vector<float> w(n * k);
    for (int64_t r = 0; r < n; ++r) {
      for (int64_t c = 0; c < k; ++c) {
        const int64_t grp = r * g.groups + g.g_idx[c];
        w[r * k + c] = g.s[grp] * static_cast<float>(static_cast<int>(g.u[r * k + c]) -
                                                     static_cast<int>(g.zu[grp]));
      }
    }
    plain.push_back({name, std::nullopt, DType::kF32, {n, k}, Bytes(w)});
  }
  Json quantized_config = config;
  quantized_config["quantization_config"] = QuantizationConfig(options);
  RETURN_IF_ERROR(WriteDir(src, out, quantized_config, packed));
  if (!dequantized.empty()) RETURN_IF_ERROR(WriteDir(src, dequantized, config, plain));
  return absl::OkStatus();
}

}  // namespace kvrm::modelgen
