#include "model/quantized_checkpoint.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/json.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "kernels/cpu/q4_k.h"
#include "kernels/cpu/q8_0.h"

namespace kvrm {
namespace {

enum class Layout { kAwq, kGptq, kPacked };

Layout LayoutOf(const CheckpointQuantization& q) {
  return q.method == "awq" ? Layout::kAwq : q.method == "gptq" ? Layout::kGptq : Layout::kPacked;
}

// The tensor that holds the packed integers.
std::string PackedName(const CheckpointQuantization& q, const std::string& base) {
  return base + (LayoutOf(q) == Layout::kPacked ? ".weight_packed" : ".qweight");
}

// AWQ's nibble order: nibble i of a word holds output feature 8 j + {0, 2, 4, 6, 1, 3, 5, 7}[i],
// so feature 8 j + m sits in nibble kAwqNibble[m].
constexpr int kAwqNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};

int32_t LoadI32(const std::byte* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// The tensors of one packed linear weight, checked, and how to read q, z, s and g_idx from them.
struct Packed {
  Layout layout;
  int bits = 4;
  int per_word = 8;  // values a 32-bit word
  uint32_t mask = 15;
  int64_t n = 0, k = 0, groups = 1, group_size = 0;
  int32_t zero_bias = 0;  // added to a stored zero (GPTQ v1: 1)
  TensorView qweight, scales, zeros, g_idx;
  bool has_zeros = false, has_g_idx = false;
  std::vector<int32_t> group_of;  // [k]: each input feature's group

  float Scale(int64_t nn, int64_t g) const {
    return FloatElement(scales, layout == Layout::kPacked ? nn * groups + g : g * n + nn);
  }
  // The zero of (n, g), as Signed(q) - z subtracts it: the stored one (plus GPTQ v1's 1, less
  // compressed-tensors' offset); without stored zeros, 0 for compressed-tensors (whose q is
  // signed) and the grid's middle for the others.
  int32_t Zero(int64_t nn, int64_t g) const {
    if (!has_zeros) return layout == Layout::kPacked ? 0 : 1 << (bits - 1);
    int64_t word, shift;
    switch (layout) {
      case Layout::kAwq:  // [groups][n / 8], AWQ's nibble order
        word = g * (n / 8) + nn / 8;
        shift = 4 * kAwqNibble[nn % 8];
        break;
      case Layout::kGptq:  // [groups][n / per_word]
        word = g * (n / per_word) + nn / per_word;
        shift = bits * (nn % per_word);
        break;
      default:  // [n / per_word][groups], stored as z + 2^(bits-1)
        word = (nn / per_word) * groups + g;
        shift = bits * (nn % per_word);
        break;
    }
    const uint32_t stored = (static_cast<uint32_t>(LoadI32(zeros.data + word * 4)) >> shift) & mask;
    return static_cast<int32_t>(stored) + zero_bias;
  }
};

absl::Status TensorProblem(const TensorView& t, std::string_view problem) {
  return absl::InvalidArgumentError(
      absl::StrCat(t.file, ": tensor \"", t.name, "\" ", std::string(problem)));
}

absl::StatusOr<TensorView> Need(const SafetensorsSet& files, const std::string& name,
                                std::vector<int64_t> shape, bool integer) {
  ASSIGN_OR_RETURN(TensorView t, files.GetAny(name, shape));
  if (integer ? t.type != StorageType::kI32 : !t.is_float()) {
    return TensorProblem(
        t, absl::StrCat("has dtype ", std::string(StorageTypeName(t.type)),
                        integer ? " (I32 expected)" : " (F16, BF16 or F32 expected)"));
  }
  return t;
}

absl::StatusOr<Packed> OpenPacked(const SafetensorsSet& files, const CheckpointQuantization& q,
                                  const std::string& base, int64_t n, int64_t k) {
  Packed p;
  p.layout = LayoutOf(q);
  p.bits = q.bits;
  p.per_word = 32 / q.bits;
  p.mask = (1u << q.bits) - 1;
  p.n = n;
  p.k = k;
  p.group_size = q.group_size > 0 ? q.group_size : k;
  p.groups = (k + p.group_size - 1) / p.group_size;
  const int pw = p.per_word;
  auto divisible = [&](int64_t features, const char* what) -> absl::Status {
    if (features % pw == 0) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(base, ": ", what, " (", features,
                                                   ") is not a multiple of the ", pw,
                                                   " values a packed word holds"));
  };
  switch (p.layout) {
    case Layout::kAwq: {
      RETURN_IF_ERROR(divisible(n, "out_features"));
      ASSIGN_OR_RETURN(p.qweight, Need(files, base + ".qweight", {k, n / pw}, true));
      ASSIGN_OR_RETURN(p.zeros, Need(files, base + ".qzeros", {p.groups, n / pw}, true));
      ASSIGN_OR_RETURN(p.scales, Need(files, base + ".scales", {p.groups, n}, false));
      p.has_zeros = true;
      break;
    }
    case Layout::kGptq: {
      RETURN_IF_ERROR(divisible(n, "out_features"));
      RETURN_IF_ERROR(divisible(k, "in_features"));
      ASSIGN_OR_RETURN(p.qweight, Need(files, base + ".qweight", {k / pw, n}, true));
      // Symmetric checkpoints store their zeros too (all the grid's middle, less one in v1):
      // read as stored, as AutoGPTQ's kernels do.
      ASSIGN_OR_RETURN(p.zeros, Need(files, base + ".qzeros", {p.groups, n / pw}, true));
      ASSIGN_OR_RETURN(p.scales, Need(files, base + ".scales", {p.groups, n}, false));
      p.has_zeros = true;
      p.zero_bias = q.gptq_v1_zeros ? 1 : 0;
      if (files.Contains(base + ".g_idx")) {
        ASSIGN_OR_RETURN(p.g_idx, Need(files, base + ".g_idx", {k}, true));
        p.has_g_idx = true;
      }
      break;
    }
    case Layout::kPacked: {
      RETURN_IF_ERROR(divisible(k, "in_features"));
      ASSIGN_OR_RETURN(p.qweight, Need(files, base + ".weight_packed", {n, k / pw}, true));
      ASSIGN_OR_RETURN(p.scales, Need(files, base + ".weight_scale", {n, p.groups}, false));
      if (files.Contains(base + ".weight_shape")) {
        ASSIGN_OR_RETURN(const TensorView shape, files.GetAny(base + ".weight_shape", {2}));
        if (shape.type != StorageType::kI64 && shape.type != StorageType::kI32) {
          return TensorProblem(shape, "must be I64 or I32");
        }
        int64_t dims[2];
        for (int i = 0; i < 2; ++i) {
          if (shape.type == StorageType::kI64) {
            std::memcpy(&dims[i], shape.data + 8 * i, 8);
          } else {
            dims[i] = LoadI32(shape.data + 4 * i);
          }
        }
        if (dims[0] != n || dims[1] != k) {
          return TensorProblem(shape, absl::StrCat("is [", dims[0], ", ", dims[1],
                                                   "], the config needs [", n, ", ", k, "]"));
        }
      }
      if (q.zero_point) {
        RETURN_IF_ERROR(divisible(n, "out_features"));
        ASSIGN_OR_RETURN(p.zeros,
                         Need(files, base + ".weight_zero_point", {n / pw, p.groups}, true));
        p.has_zeros = true;
        p.zero_bias = -(1 << (q.bits - 1));
      }
      if (files.Contains(base + ".weight_g_idx")) {
        ASSIGN_OR_RETURN(p.g_idx, Need(files, base + ".weight_g_idx", {k}, true));
        p.has_g_idx = true;
      }
      break;
    }
  }
  p.group_of.resize(k);
  for (int64_t i = 0; i < k; ++i) {
    p.group_of[i] = static_cast<int32_t>(i / p.group_size);
    if (!p.has_g_idx) continue;
    const int32_t g = LoadI32(p.g_idx.data + i * 4);
    if (g < 0 || g >= p.groups) {
      return TensorProblem(
          p.g_idx, absl::StrCat("[", i, "] = ", g, " is not a group (0 to ", p.groups - 1, ")"));
    }
    p.group_of[i] = g;
  }
  return p;
}

// Rows [n0, n1) of the packed integers, unpacked to q (unsigned, as stored: compressed-tensors'
// carry their 2^(bits-1) offset, taken out by Packed::Zero) in tile[(n - n0) * k + kk], each
// layout read in its own memory order.
void UnpackRows(const Packed& p, int64_t n0, int64_t n1, uint8_t* tile) {
  const int64_t k = p.k;
  const int pw = p.per_word, bits = p.bits;
  const uint32_t mask = p.mask;
  switch (p.layout) {
    case Layout::kAwq:  // [k][n / 8]: a word is 8 output features of one input feature
      for (int64_t kk = 0; kk < k; ++kk) {
        const std::byte* row = p.qweight.data + kk * (p.n / 8) * 4;
        for (int64_t j = n0 / 8; j < n1 / 8; ++j) {
          const uint32_t w = static_cast<uint32_t>(LoadI32(row + j * 4));
          for (int m = 0; m < 8; ++m) {
            tile[(8 * j + m - n0) * k + kk] = (w >> (4 * kAwqNibble[m])) & 15;
          }
        }
      }
      break;
    case Layout::kGptq:  // [k / pw][n]: a word is pw input features of one output feature
      for (int64_t kw = 0; kw < k / pw; ++kw) {
        const std::byte* row = p.qweight.data + kw * p.n * 4;
        for (int64_t nn = n0; nn < n1; ++nn) {
          const uint32_t w = static_cast<uint32_t>(LoadI32(row + nn * 4));
          uint8_t* out = tile + (nn - n0) * k + kw * pw;
          for (int i = 0; i < pw; ++i) out[i] = (w >> (bits * i)) & mask;
        }
      }
      break;
    case Layout::kPacked:  // [n][k / pw]
      for (int64_t nn = n0; nn < n1; ++nn) {
        const std::byte* row = p.qweight.data + nn * (k / pw) * 4;
        uint8_t* out = tile + (nn - n0) * k;
        for (int64_t kw = 0; kw < k / pw; ++kw) {
          const uint32_t w = static_cast<uint32_t>(LoadI32(row + kw * 4));
          for (int i = 0; i < pw; ++i) out[kw * pw + i] = (w >> (bits * i)) & mask;
        }
      }
      break;
  }
}

// The value a stored q stands for before its zero: compressed-tensors stores q + 2^(bits-1).
int32_t Signed(const Packed& p, uint8_t stored) {
  return p.layout == Layout::kPacked ? static_cast<int32_t>(stored) - (1 << (p.bits - 1))
                                     : static_cast<int32_t>(stored);
}

bool IsF16(float s) { return F16ToFloat(FloatToF16(s)) == s; }

// The format of a matrix whose values are quantized again: q4_K where asked (requantize_as) and
// its rows are whole 256-value super-blocks, else q8_0 where they are whole blocks of 32.
WeightFormat RequantizedFormat(const QuantizedLoadOptions& options, int64_t k) {
  if (options.requantize_as == WeightFormat::kQ4K && k % WeightMatrix::kQ4KBlock == 0) {
    return WeightFormat::kQ4K;
  }
  return WeightFormat::kQ8_0;
}

// A row of values that are not blocks of one scale as the matrix holds them: q8_0 or q4_K blocks
// (ggml's reference quantizers) by `format`, else (kDense) `dense` elements (f32 exactly; bf16 /
// f16 rounded).
void StoreRow(const float* values, int64_t k, WeightFormat format, DType dense, std::byte* out) {
  if (format == WeightFormat::kQ8_0) {
    QuantizeRowQ8_0(values, k, reinterpret_cast<uint8_t*>(out));
  } else if (format == WeightFormat::kQ4K) {
    QuantizeRowQ4K(values, k, reinterpret_cast<uint8_t*>(out));
  } else if (dense == DType::kF32) {
    std::memcpy(out, values, k * 4);
  } else {
    for (int64_t kk = 0; kk < k; ++kk) {
      const uint16_t h = dense == DType::kBF16 ? FloatToBf16(values[kk]) : FloatToF16(values[kk]);
      std::memcpy(out + kk * 2, &h, 2);
    }
  }
}

// Block `b` of a row of q8_0 blocks (d = s as an f16) or q8 affine ones (s and o as f32): writes
// its scales and returns where its 32 int8 go.
std::byte* Q8BlockScales(WeightFormat format, std::byte* row, int64_t b, float s, float o) {
  if (format == WeightFormat::kQ8_0) {
    std::byte* block = row + b * WeightMatrix::kQ8BlockBytes;
    const uint16_t d = FloatToF16(s);
    std::memcpy(block, &d, 2);
    return block + 2;
  }
  std::byte* block = row + b * WeightMatrix::kQ8AffineBlockBytes;
  std::memcpy(block, &s, 4);
  std::memcpy(block + 4, &o, 4);
  return block + 8;
}

// The first element (row * cols + col) that is NaN or infinite among the rows the threads
// converted: a thread notes the first of a row and stops.
class NonFinite {
 public:
  // Whether values[0, k) of row `row` are all finite; notes the first that is not.
  bool Check(const float* values, int64_t k, int64_t row) {
    for (int64_t c = 0; c < k; ++c) {
      if (std::isfinite(values[c])) continue;
      const std::lock_guard<std::mutex> lock(mu_);
      at_ = at_ < 0 ? row * k + c : std::min(at_, row * k + c);
      return false;
    }
    return true;
  }
  int64_t first() const { return at_; }  // -1: none

 private:
  std::mutex mu_;
  int64_t at_ = -1;
};

// Runs convert(r0, r1) over the rows [0, n), split among up to `threads` threads at multiples
// of 128 rows (whole words of every packed layout).
void ForRowTiles(int64_t n, int threads, const std::function<void(int64_t, int64_t)>& convert) {
  constexpr int64_t kTile = 128;
  const int64_t tiles = (n + kTile - 1) / kTile;
  const int64_t count = std::clamp<int64_t>(tiles, 1, std::max(threads, 1));
  auto rows = [&](int64_t i) { return std::min(n, tiles * i / count * kTile); };
  std::vector<std::thread> pool;
  for (int64_t i = 1; i < count; ++i) pool.emplace_back(convert, rows(i), rows(i + 1));
  convert(0, rows(1));
  for (std::thread& th : pool) th.join();
}

// The unpacked schemes (CheckpointQuantization::unpacked): the .weight tensor holds q, one I8
// or FP8 element each, and `scale_suffix` one scale per block_rows x group_size tile (one for
// the whole matrix when block_rows is 0): the weight is s * q. As 8-bit blocks: I8 ones exactly
// (q8_0 with d = s when every scale is an f16, else q8 affine with offset 0) where every block of
// 32 input features has one scale; FP8 ones (3 mantissa bits over 16 binades: not 8-bit
// integers of one scale) quantized again (RequantizedFormat).
absl::StatusOr<WeightMatrix> LoadUnpackedLinear(const SafetensorsSet& files,
                                                const CheckpointQuantization& q,
                                                const std::string& base, int64_t n, int64_t k,
                                                const QuantizedLoadOptions& options,
                                                std::vector<std::vector<std::byte>>* converted,
                                                QuantizedLoadStats* stats) {
  ASSIGN_OR_RETURN(const TensorView w, files.GetAny(base + ".weight", {n, k}));
  // LLM.int8(): bitsandbytes saves a weight that ran on a GPU in a tiled layout (col_turing,
  // col_ampere) and says so in weight_format; only row-major (0) is read.
  if (const std::string format_name = base + ".weight_format"; files.Contains(format_name)) {
    ASSIGN_OR_RETURN(const TensorView format, files.GetAny(format_name));
    if (format.type != StorageType::kU8 || format.numel() != 1 ||
        static_cast<uint8_t>(format.data[0]) != 0) {
      return TensorProblem(format,
                           "is not 0 (row-major): bitsandbytes' tiled layouts are not "
                           "read");
    }
  }
  const bool f8 = w.type == StorageType::kF8E4M3 || w.type == StorageType::kF8E5M2;
  if (q.fp8 ? !f8 : w.type != StorageType::kI8) {
    return TensorProblem(w,
                         absl::StrCat("has dtype ", std::string(StorageTypeName(w.type)),
                                      q.fp8 ? " (F8_E4M3 or F8_E5M2 expected)" : " (I8 expected)"));
  }
  const bool per_tensor = q.block_rows == 0;
  const int64_t br = per_tensor ? n : q.block_rows;
  const int64_t bc = per_tensor || q.group_size == 0 ? k : q.group_size;
  const int64_t scale_rows = (n + br - 1) / br, scale_cols = (k + bc - 1) / bc;
  ASSIGN_OR_RETURN(const TensorView scale, files.GetAny(base + q.scale_suffix));
  if (per_tensor ? scale.numel() != 1
                 : scale.shape != std::vector<int64_t>{scale_rows, scale_cols} &&
                       // one a row may be [rows] (LLM.int8's SCB)
                       !(scale_cols == 1 && scale.shape == std::vector<int64_t>{scale_rows})) {
    return TensorProblem(scale, absl::StrCat("has shape ", ShapeToString(scale.shape), ", ",
                                             per_tensor ? std::string("one scale a tensor")
                                                        : ShapeToString({scale_rows, scale_cols}),
                                             " expected"));
  }
  if (!scale.is_float()) {
    return TensorProblem(scale, absl::StrCat("has dtype ", std::string(StorageTypeName(scale.type)),
                                             " (F16, BF16 or F32 expected)"));
  }
  bool f16_scales = true;
  for (int64_t i = 0; i < scale.numel(); ++i) {
    const float s = FloatElement(scale, i) * q.scale_multiplier;
    if (!std::isfinite(s)) {
      return TensorProblem(scale, absl::StrCat("[", i, "] is ", s, ", not a finite scale"));
    }
    f16_scales = f16_scales && IsF16(s);
  }
  auto scale_of = [&](int64_t nn, int64_t kk) {
    return FloatElement(scale, per_tensor ? 0 : (nn / br) * scale_cols + kk / bc) *
           q.scale_multiplier;
  };
  constexpr int64_t kBlock = WeightMatrix::kQ8Block;
  const bool blocks = options.as_q8 && k % kBlock == 0;
  // Exactly as 8-bit blocks: integers whose every block of 32 has one scale.
  const bool exact_blocks = blocks && !q.fp8 && (bc % kBlock == 0 || bc >= k);
  WeightMatrix m{options.dense, nullptr, n, k, k};
  if (blocks) {
    m.format = !exact_blocks ? RequantizedFormat(options, k)
               : f16_scales  ? WeightFormat::kQ8_0
                             : WeightFormat::kQ8Affine;
  }
  const int64_t row_bytes = m.DataBytes(k);
  std::vector<std::byte>& buffer = converted->emplace_back(row_bytes * n);
  m.data = buffer.data();
  const auto* qs = reinterpret_cast<const uint8_t*>(w.data);
  // Every element's value before its scale, by its byte: FP8 numbers, or int8 integers.
  float value_of[256];
  for (int b = 0; b < 256; ++b) {
    const auto u = static_cast<uint8_t>(b);
    value_of[b] = !q.fp8                           ? static_cast<float>(static_cast<int8_t>(u))
                  : w.type == StorageType::kF8E5M2 ? F8E5M2ToFloat(u)
                                                   : F8E4M3ToFloat(u);
  }
  NonFinite bad;
  ForRowTiles(n, options.threads, [&](int64_t r0, int64_t r1) {
    std::vector<float> values(k), row_scales(scale_cols);
    for (int64_t nn = r0; nn < r1; ++nn) {
      const uint8_t* row = qs + nn * k;
      std::byte* out = buffer.data() + nn * row_bytes;
      for (int64_t cb = 0; cb < scale_cols; ++cb) row_scales[cb] = scale_of(nn, cb * bc);
      if (exact_blocks) {
        for (int64_t b = 0; b < k / kBlock; ++b) {
          std::memcpy(Q8BlockScales(m.format, out, b, row_scales[b * kBlock / bc], 0),
                      row + b * kBlock, kBlock);
        }
        continue;
      }
      for (int64_t cb = 0; cb < scale_cols; ++cb) {
        const float sc = row_scales[cb];
        for (int64_t kk = cb * bc; kk < std::min(k, (cb + 1) * bc); ++kk) {
          values[kk] = sc * value_of[row[kk]];
        }
      }
      if (!bad.Check(values.data(), k, nn)) return;
      StoreRow(values.data(), k, m.format, options.dense, out);
    }
  });
  if (const int64_t i = bad.first(); i >= 0) {
    return TensorProblem(w, absl::StrCat("[", i / k, "][", i % k, "] is ", value_of[qs[i]],
                                         ", not a finite weight"));
  }
  if (stats != nullptr) {
    const bool exact = exact_blocks || (!blocks && options.dense == DType::kF32);
    ++(exact ? stats->exact : stats->requantized);
  }
  return m;
}

// bitsandbytes' 4-bit weights (Transformers' load_in_4bit), as bitsandbytes serializes a
// Params4bit: ".weight" U8, the codes of the [rows][cols] matrix flattened row-major two a byte,
// the first in the high nibble; ".weight.quant_map" F32 [16], each code's value; one absmax per
// `blocksize` consecutive codes, ".weight.absmax" F32, or with double quantization U8 indices
// into ".weight.nested_quant_map" F32 [256] times ".weight.nested_absmax" F32 (one per
// nested_blocksize absmax) plus nested_offset; and ".weight.quant_state.bitsandbytes__<type>"
// U8, the JSON of quant_type, blocksize, shape, dtype and the nested ones. The weight is
// quant_map[code] * absmax. NF4 and FP4 values are not integers of one scale: as blocks they
// are quantized again (RequantizedFormat).
absl::StatusOr<WeightMatrix> LoadBnb4Linear(const SafetensorsSet& files,
                                            const CheckpointQuantization& q,
                                            const std::string& base, int64_t n, int64_t k,
                                            const QuantizedLoadOptions& options,
                                            std::vector<std::vector<std::byte>>* converted,
                                            QuantizedLoadStats* stats) {
  const std::string w_name = base + ".weight";
  ASSIGN_OR_RETURN(const TensorView w, files.GetAny(w_name));
  if (w.type != StorageType::kU8 || w.numel() != (n * k + 1) / 2) {
    return TensorProblem(
        w, absl::StrCat("is ", std::string(StorageTypeName(w.type)), " ", ShapeToString(w.shape),
                        ", the U8 codes of [", n, ", ", k, "] two a byte expected"));
  }
  ASSIGN_OR_RETURN(const TensorView state_tensor,
                   files.GetAny(w_name + ".quant_state.bitsandbytes__" + q.bnb_4bit_type));
  if (state_tensor.type != StorageType::kU8) return TensorProblem(state_tensor, "must be U8");
  const std::string_view state_text(reinterpret_cast<const char*>(state_tensor.data),
                                    state_tensor.nbytes);
  absl::StatusOr<Json> parsed = ParseJson(state_text, state_tensor.name);
  if (!parsed.ok() || !parsed->is_object()) {
    return TensorProblem(state_tensor, "is not a JSON object (bitsandbytes' quant_state)");
  }
  const Json& state = *parsed;
  auto positive = [&](const char* key, int64_t* out) -> absl::Status {
    const auto it = state.find(key);
    if (it == state.end() || !it->is_number_integer() || it->get<int64_t>() <= 0 ||
        it->get<int64_t>() > (int64_t{1} << 30)) {
      return TensorProblem(state_tensor, absl::StrCat("has no positive integer \"", key, "\""));
    }
    *out = it->get<int64_t>();
    return absl::OkStatus();
  };
  int64_t blocksize = 0;
  RETURN_IF_ERROR(positive("blocksize", &blocksize));
  if (const auto it = state.find("shape"); it == state.end() || *it != Json::array({n, k})) {
    return TensorProblem(state_tensor,
                         absl::StrCat("says shape ", it == state.end() ? "none" : it->dump(),
                                      ", the config needs [", n, ", ", k, "]"));
  }
  if (const auto it = state.find("quant_type"); it != state.end() && *it != q.bnb_4bit_type) {
    return TensorProblem(state_tensor, absl::StrCat("says quant_type ", it->dump(), ", the config ",
                                                    q.bnb_4bit_type));
  }
  ASSIGN_OR_RETURN(const TensorView quant_map, files.GetAny(w_name + ".quant_map", {16}));
  if (!quant_map.is_float()) return TensorProblem(quant_map, "must be F32, F16 or BF16");
  float code_value[16];
  for (int i = 0; i < 16; ++i) {
    code_value[i] = FloatElement(quant_map, i);
    if (!std::isfinite(code_value[i])) {
      return TensorProblem(quant_map, absl::StrCat("[", i, "] is ", code_value[i]));
    }
  }
  const int64_t blocks = (n * k + blocksize - 1) / blocksize;
  ASSIGN_OR_RETURN(const TensorView absmax, files.GetAny(w_name + ".absmax", {blocks}));
  std::vector<float> scales(blocks);
  if (files.Contains(w_name + ".nested_absmax")) {  // double quantization
    int64_t nested_blocksize = 0;
    RETURN_IF_ERROR(positive("nested_blocksize", &nested_blocksize));
    const auto offset_it = state.find("nested_offset");
    if (offset_it == state.end() || !offset_it->is_number()) {
      return TensorProblem(state_tensor, "has no \"nested_offset\"");
    }
    const float offset = offset_it->get<float>();
    ASSIGN_OR_RETURN(const TensorView nested_map,
                     files.GetAny(w_name + ".nested_quant_map", {256}));
    ASSIGN_OR_RETURN(const TensorView nested_absmax,
                     files.GetAny(w_name + ".nested_absmax",
                                  {(blocks + nested_blocksize - 1) / nested_blocksize}));
    if (absmax.type != StorageType::kU8 || !nested_map.is_float() || !nested_absmax.is_float()) {
      return TensorProblem(absmax, "with nested_absmax must be U8 (and the nested tensors float)");
    }
    const auto* index = reinterpret_cast<const uint8_t*>(absmax.data);
    for (int64_t b = 0; b < blocks; ++b) {
      scales[b] =
          FloatElement(nested_map, index[b]) * FloatElement(nested_absmax, b / nested_blocksize) +
          offset;
    }
  } else {
    if (!absmax.is_float()) return TensorProblem(absmax, "must be F32 (or U8 with nested_absmax)");
    for (int64_t b = 0; b < blocks; ++b) scales[b] = FloatElement(absmax, b);
  }
  for (int64_t b = 0; b < blocks; ++b) {
    if (!std::isfinite(scales[b])) {
      return TensorProblem(absmax, absl::StrCat("block ", b, "'s absmax is ", scales[b]));
    }
  }
  const bool as_blocks = options.as_q8 && k % WeightMatrix::kQ8Block == 0;
  WeightMatrix m{options.dense, nullptr, n, k, k};
  if (as_blocks) m.format = RequantizedFormat(options, k);
  const int64_t row_bytes = m.DataBytes(k);
  std::vector<std::byte>& buffer = converted->emplace_back(row_bytes * n);
  m.data = buffer.data();
  const auto* codes = reinterpret_cast<const uint8_t*>(w.data);
  NonFinite bad;  // (a finite code value times a finite absmax may still overflow)
  ForRowTiles(n, options.threads, [&](int64_t r0, int64_t r1) {
    std::vector<float> values(k);
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = 0; c < k; ++c) {
        const int64_t j = r * k + c;
        const uint8_t byte = codes[j / 2];
        values[c] = code_value[j % 2 == 0 ? byte >> 4 : byte & 15] * scales[j / blocksize];
      }
      if (!bad.Check(values.data(), k, r)) return;
      StoreRow(values.data(), k, m.format, options.dense, buffer.data() + r * row_bytes);
    }
  });
  if (const int64_t i = bad.first(); i >= 0) {
    return TensorProblem(w, absl::StrCat("[", i / k, "][", i % k,
                                         "] overflows: its code's value "
                                         "times its block's absmax is not finite"));
  }
  if (stats != nullptr) {
    ++(as_blocks || options.dense != DType::kF32 ? stats->requantized : stats->exact);
  }
  return m;
}

}  // namespace

bool HasQuantizedLinear(const SafetensorsSet& files, const CheckpointQuantization& q,
                        const std::string& base) {
  // (mxfp4: only gpt-oss's fused expert tensors, which model/gpt_oss.h reads.)
  if (!q.enabled() || q.method == "mxfp4") return false;
  if (q.unpacked) {
    // The weight itself, of a quantized element type; modules the recipe left alone (ignore,
    // modules_to_not_convert) keep a float one.
    const absl::StatusOr<TensorView> t = files.GetAny(base + ".weight");
    return t.ok() && !t->is_float();
  }
  return files.Contains(PackedName(q, base));
}

absl::StatusOr<WeightMatrix> LoadQuantizedLinear(const SafetensorsSet& files,
                                                 const CheckpointQuantization& q,
                                                 const std::string& base, int64_t rows,
                                                 int64_t cols, const QuantizedLoadOptions& options,
                                                 std::vector<std::vector<std::byte>>* converted,
                                                 QuantizedLoadStats* stats) {
  if (!q.bnb_4bit_type.empty()) {
    return LoadBnb4Linear(files, q, base, rows, cols, options, converted, stats);
  }
  if (q.unpacked) {
    return LoadUnpackedLinear(files, q, base, rows, cols, options, converted, stats);
  }
  ASSIGN_OR_RETURN(const Packed p, OpenPacked(files, q, base, rows, cols));
  const int64_t n = rows, k = cols;
  // Whether every block of 32 columns has one group, column c being input feature feature(c).
  auto blocks_of_one_group = [&](const auto& feature) {
    if (k % WeightMatrix::kQ8Block != 0) return false;
    for (int64_t c = 0; c < k; ++c) {
      if (p.group_of[feature(c)] != p.group_of[feature(c - c % WeightMatrix::kQ8Block)]) {
        return false;
      }
    }
    return true;
  };
  // Exactly as 8-bit blocks when every block of 32 input features has one group.
  const bool aligned = blocks_of_one_group([](int64_t c) { return c; });
  // Act-order groups (g_idx) that are not blocks of 32 in input order may be in another order:
  // the input features sorted by group (stably), where every group fills whole blocks of 32,
  // hold the groups as blocks, and the kernels gather their activations in that order
  // (WeightMatrix::input_order).
  std::vector<int32_t> order;
  if (!aligned && p.has_g_idx && k % WeightMatrix::kQ8Block == 0) {
    order.resize(k);
    for (int64_t kk = 0; kk < k; ++kk) order[kk] = static_cast<int32_t>(kk);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return p.group_of[a] < p.group_of[b]; });
    if (!blocks_of_one_group([&](int64_t c) { return order[c]; })) order.clear();
  }
  // q8_0 when every scale is an f16 and every q - z an int8; else q8 affine.
  const int32_t mid = 1 << (p.bits - 1);
  bool q8_0 = true;
  const bool ordered_aligned = aligned || !order.empty();
  for (int64_t nn = 0; ordered_aligned && q8_0 && nn < n; ++nn) {
    for (int64_t g = 0; q8_0 && g < p.groups; ++g) {
      const int32_t z = p.Zero(nn, g);
      const int32_t lo = Signed(p, 0) - z, hi = Signed(p, static_cast<uint8_t>(p.mask)) - z;
      q8_0 = IsF16(p.Scale(nn, g)) && lo >= -128 && hi <= 127 && z - Signed(p, 0) >= 0 &&
             z - Signed(p, 0) <= 255;
    }
  }
  // 4-bit groups as they are (q4 groups: f16 s, u8 z and the nibbles per 32 values) where they
  // fill whole 256-value super-blocks.
  constexpr int64_t kSuper = WeightMatrix::kQ4KBlock;
  const bool q4g = options.as_q8 && options.q4_groups && p.bits == 4 && ordered_aligned && q8_0 &&
                   k % kSuper == 0;
  if (!q4g) order.clear();  // (8-bit blocks are in input order)
  WeightMatrix m{options.dense, nullptr, n, k, k};
  const bool blocks = options.as_q8 && k % WeightMatrix::kQ8Block == 0;
  if (q4g) {
    m.format = WeightFormat::kQ4G;
  } else if (blocks) {
    m.format = !aligned ? RequantizedFormat(options, k)
               : q8_0   ? WeightFormat::kQ8_0
                        : WeightFormat::kQ8Affine;
  } else {
    m.dtype = options.dense;
  }
  if (!order.empty()) {
    std::vector<std::byte>& kept = converted->emplace_back(k * sizeof(int32_t));
    std::memcpy(kept.data(), order.data(), kept.size());
    m.input_order = reinterpret_cast<const int32_t*>(kept.data());
  }
  // (Last: `buffer` must stay a reference to the element, which a later emplace_back would move.)
  const int64_t row_bytes = m.DataBytes(k);
  std::vector<std::byte>& buffer = converted->emplace_back(row_bytes * n);
  m.data = buffer.data();
  if (stats != nullptr) {
    const bool exact = q4g || (blocks ? aligned : options.dense == DType::kF32);
    ++(exact ? stats->exact : stats->requantized);
    if (q4g) ++stats->q4_groups;
  }
  // Tiles of 128 output rows (whole words of every layout), shared among the threads.
  constexpr int64_t kTile = 128;
  ForRowTiles(n, options.threads, [&](int64_t r0, int64_t r1) {
    std::vector<uint8_t> tile(kTile * k);
    std::vector<uint8_t> reordered(order.empty() ? 0 : k);
    std::vector<float> values(k);
    for (int64_t n0 = r0; n0 < r1; n0 += kTile) {
      const int64_t n1 = std::min(r1, n0 + kTile);
      UnpackRows(p, n0, n1, tile.data());
      for (int64_t nn = n0; nn < n1; ++nn) {
        const uint8_t* qrow = tile.data() + (nn - n0) * k;  // input order
        std::byte* out = buffer.data() + nn * row_bytes;
        if (q4g) {
          uint16_t scales[8];
          uint8_t zeros[8];
          if (!order.empty()) {  // the row's q in the groups' order
            for (int64_t c = 0; c < k; ++c) reordered[c] = qrow[order[c]];
            qrow = reordered.data();
          }
          for (int64_t sb = 0; sb < k / kSuper; ++sb) {
            for (int j = 0; j < 8; ++j) {
              const int64_t c = sb * kSuper + 32 * j;
              const int64_t g = p.group_of[order.empty() ? c : order[c]];
              scales[j] = FloatToF16(p.Scale(nn, g));
              // The zero in the stored integers' own terms (compressed-tensors': z + 2^(bits-1)),
              // at most 16 for these formats.
              zeros[j] = static_cast<uint8_t>(p.Zero(nn, g) - Signed(p, 0));
            }
            EncodeBlockQ4G(scales, zeros, qrow + sb * kSuper,
                           reinterpret_cast<uint8_t*>(out) + sb * WeightMatrix::kQ4GBlockBytes);
          }
          continue;
        }
        if (blocks && aligned) {
          for (int64_t b = 0; b < k / WeightMatrix::kQ8Block; ++b) {
            const int64_t k0 = b * WeightMatrix::kQ8Block;
            const int64_t g = p.group_of[k0];
            const float s = p.Scale(nn, g);
            const int32_t z = p.Zero(nn, g);
            // q8_0: d = s and the int8 Signed(stored) - z. q8 affine: s * (stored - mid) +
            // s * (mid + Signed(0) - z), the int8 the stored value less the grid's middle and
            // the offset the rest of Signed(stored) - z.
            const bool affine = m.format == WeightFormat::kQ8Affine;
            std::byte* q = Q8BlockScales(
                m.format, out, b, s, affine ? s * static_cast<float>(mid + Signed(p, 0) - z) : 0);
            for (int i = 0; i < WeightMatrix::kQ8Block; ++i) {
              const int32_t v = affine ? qrow[k0 + i] - mid : Signed(p, qrow[k0 + i]) - z;
              q[i] = static_cast<std::byte>(static_cast<int8_t>(v));
            }
          }
          continue;
        }
        for (int64_t kk = 0; kk < k; ++kk) {
          const int64_t g = p.group_of[kk];
          values[kk] = p.Scale(nn, g) * static_cast<float>(Signed(p, qrow[kk]) - p.Zero(nn, g));
        }
        StoreRow(values.data(), k, m.format, options.dense, out);
      }
    }
  });
  return m;
}

absl::StatusOr<WeightMatrix> LoadMxfp4Rows(const TensorView& blocks, const TensorView& scales,
                                           int64_t first_row, int64_t row_step, int64_t rows,
                                           int64_t cols, const QuantizedLoadOptions& options,
                                           std::vector<std::vector<std::byte>>* converted,
                                           QuantizedLoadStats* stats) {
  constexpr int64_t kBlock = WeightMatrix::kQ8Block;  // MXFP4's 32 values a scale too
  if (cols % kBlock != 0) {
    return TensorProblem(
        blocks, absl::StrCat("holds rows of ", cols, " values: MXFP4 needs whole blocks of 32"));
  }
  const int64_t nb = cols / kBlock;
  if (blocks.type != StorageType::kU8 || blocks.shape.size() < 2 || blocks.shape.back() != 16 ||
      blocks.shape[blocks.shape.size() - 2] != nb) {
    return TensorProblem(
        blocks, absl::StrCat("is ", std::string(StorageTypeName(blocks.type)), " ",
                             ShapeToString(blocks.shape), "; U8 [..][", nb, "][16] expected"));
  }
  const std::vector<int64_t> per_block(blocks.shape.begin(), blocks.shape.end() - 1);
  if (scales.type != StorageType::kU8 || scales.shape != per_block) {
    return TensorProblem(
        scales, absl::StrCat("is ", std::string(StorageTypeName(scales.type)), " ",
                             ShapeToString(scales.shape), "; U8 [..][", nb, "] (one a block of ",
                             ShapeToString(blocks.shape), ") expected"));
  }
  const int64_t stored_rows = scales.numel() / nb;
  if (first_row < 0 || row_step < 1 || rows < 1 ||
      first_row + (rows - 1) * row_step >= stored_rows) {
    return TensorProblem(
        blocks, absl::StrCat("has ", stored_rows, " rows; rows ", first_row, " + k * ", row_step,
                             " for k < ", rows, " were asked for"));
  }
  const auto* q = reinterpret_cast<const uint8_t*>(blocks.data);
  const auto* e = reinterpret_cast<const uint8_t*>(scales.data);
  // Every scale of the rows read: finite (E8M0's 255 is NaN), and whether all are f16 as
  // q8_0's d = 2^(e - 128) (the int8 q being twice the FP4 value).
  bool f16_scales = true, kernel_scales = true;
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* row = e + (first_row + r * row_step) * nb;
    for (int64_t b = 0; b < nb; ++b) {
      if (!Mxfp4FiniteScale(row[b])) {
        return TensorProblem(
            scales, absl::StrCat("[", (first_row + r * row_step) * nb + b, "] is ", row[b],
                                 row[b] == 255 ? ", E8M0's NaN" : ": 6 x 2^(e - 127) overflows"));
      }
      f16_scales = f16_scales && IsF16(std::ldexp(1.0f, static_cast<int>(row[b]) - 128));
      kernel_scales = kernel_scales && Mxfp4KernelScale(row[b]);
    }
  }
  WeightMatrix m{options.dense, nullptr, rows, cols, cols};
  if (options.as_q8) {
    m.format = options.mxfp4 && kernel_scales ? WeightFormat::kMxfp4
               : f16_scales                   ? WeightFormat::kQ8_0
                                              : WeightFormat::kQ8Affine;
  }
  const int64_t row_bytes = m.DataBytes(cols);
  std::vector<std::byte>& buffer = converted->emplace_back(row_bytes * rows);
  m.data = buffer.data();
  const int8_t* twice = kMxfp4Twice;  // each code's value times 2: a q8 block's int8 q
  ForRowTiles(rows, options.threads, [&](int64_t r0, int64_t r1) {
    std::vector<float> values(cols);
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t stored = first_row + r * row_step;
      const uint8_t* codes = q + stored * nb * 16;
      const uint8_t* exps = e + stored * nb;
      std::byte* out = buffer.data() + r * row_bytes;
      if (m.format == WeightFormat::kMxfp4) {  // the codes re-ordered: ggml's block_mxfp4
        auto* to = reinterpret_cast<uint8_t*>(out);
        for (int64_t b = 0; b < nb; ++b) {
          const uint8_t* from = codes + b * 16;  // value 2i: byte i's low nibble, 2i + 1: high
          auto code = [&](int j) { return j % 2 == 0 ? from[j / 2] & 15 : from[j / 2] >> 4; };
          uint8_t* block = to + b * WeightMatrix::kMxfp4BlockBytes;
          block[0] = exps[b];
          for (int j = 0; j < 16; ++j) {
            block[1 + j] = static_cast<uint8_t>(code(j) | code(j + 16) << 4);
          }
        }
        continue;
      }
      for (int64_t b = 0; b < nb; ++b) {
        const float half_scale = std::ldexp(1.0f, static_cast<int>(exps[b]) - 128);
        if (options.as_q8) {
          auto* qs = reinterpret_cast<int8_t*>(Q8BlockScales(m.format, out, b, half_scale, 0));
          for (int i = 0; i < 16; ++i) {
            qs[2 * i] = twice[codes[b * 16 + i] & 15];
            qs[2 * i + 1] = twice[codes[b * 16 + i] >> 4];
          }
          continue;
        }
        for (int i = 0; i < 16; ++i) {
          values[b * kBlock + 2 * i] = twice[codes[b * 16 + i] & 15] * half_scale;
          values[b * kBlock + 2 * i + 1] = twice[codes[b * 16 + i] >> 4] * half_scale;
        }
      }
      if (!options.as_q8) StoreRow(values.data(), cols, WeightFormat::kDense, options.dense, out);
    }
  });
  if (stats != nullptr) {
    ++stats->exact;
    stats->mxfp4 += m.format == WeightFormat::kMxfp4;
  }
  return m;
}

}  // namespace kvrm
