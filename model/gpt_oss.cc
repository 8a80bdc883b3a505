#include "model/gpt_oss.h"

#include <cstring>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kvrm {
namespace {

// "model.layers.N.mlp.experts.E.<gate|up|down>_proj.<weight|bias>", split.
struct ExpertName {
  std::string experts;  // "model.layers.N.mlp.experts."
  int64_t expert = 0;
  std::string product;  // "gate", "up" or "down"
  bool bias = false;
};

std::optional<ExpertName> ParseExpertName(const std::string& name) {
  constexpr std::string_view kExperts = ".mlp.experts.";
  const size_t at = name.find(kExperts);
  if (at == std::string::npos) return std::nullopt;
  ExpertName n;
  n.experts = name.substr(0, at + kExperts.size());
  const std::string rest = name.substr(n.experts.size());  // "E.gate_proj.weight"
  const size_t dot = rest.find('.');
  if (dot == std::string::npos || !absl::SimpleAtoi(rest.substr(0, dot), &n.expert)) {
    return std::nullopt;
  }
  const std::string tail = rest.substr(dot + 1);
  for (const char* product : {"gate", "up", "down"}) {
    for (const bool bias : {false, true}) {
      if (tail == absl::StrCat(product, "_proj.", bias ? "bias" : "weight")) {
        n.product = product;
        n.bias = bias;
        return n;
      }
    }
  }
  return std::nullopt;
}

absl::Status ShapeError(const SafetensorsSet& files, const std::string& name, const TensorView& t,
                        const std::string& expected) {
  return absl::InvalidArgumentError(absl::StrCat(files.dir(), ": ", name, " in ", t.file, " is ",
                                                 ShapeToString(t.shape), "; ", expected,
                                                 " expected"));
}

absl::StatusOr<WeightMatrix> Bias(const SafetensorsSet& files, const LlamaConfig& c,
                                  const ExpertName& n, int64_t len,
                                  std::vector<std::vector<std::byte>>* converted) {
  const int64_t experts = c.num_experts, ffn = c.moe_intermediate_size;
  if (n.product == "down") {  // a row of [E][hidden]: a view
    const std::string name = n.experts + "down_proj_bias";
    ASSIGN_OR_RETURN(const TensorView t, files.Get(name, {experts, c.hidden_size}));
    if (len != c.hidden_size) return absl::InternalError(absl::StrCat(name, ": asked for ", len));
    const int64_t size = static_cast<int64_t>(DTypeSize(t.dtype));
    return WeightMatrix{t.dtype, t.data + n.expert * len * size, 1, len, len};
  }
  // Every other element of a row of [E][2 I]: gathered in f32.
  const std::string name = n.experts + "gate_up_proj_bias";
  ASSIGN_OR_RETURN(const TensorView t, files.Get(name, {experts, 2 * ffn}));
  if (len != ffn) return absl::InternalError(absl::StrCat(name, ": asked for ", len));
  std::vector<std::byte>& buffer = converted->emplace_back(len * sizeof(float));
  auto* out = reinterpret_cast<float*>(buffer.data());
  const int64_t first = n.expert * 2 * ffn + (n.product == "up" ? 1 : 0);
  for (int64_t f = 0; f < len; ++f) out[f] = FloatElement(t, first + 2 * f);
  return WeightMatrix{DType::kF32, buffer.data(), 1, len, len};
}

// A fused float tensor's expert, transposed (and for gate / up, every other column).
absl::StatusOr<WeightMatrix> DenseProduct(const SafetensorsSet& files, const LlamaConfig& c,
                                          const ExpertName& n, int64_t rows, int64_t cols,
                                          std::vector<std::vector<std::byte>>* converted) {
  const int64_t experts = c.num_experts, d = c.hidden_size, ffn = c.moe_intermediate_size;
  const bool down = n.product == "down";
  const std::string name = n.experts + (down ? "down_proj" : "gate_up_proj");
  // Stored [E][in][out]: gate_up [E][hidden][2 I], down [E][I][hidden].
  const int64_t in = down ? ffn : d, out = down ? d : 2 * ffn;
  ASSIGN_OR_RETURN(const TensorView t, files.Get(name, {experts, in, out}));
  const int64_t step = down ? 1 : 2, first = n.product == "up" ? 1 : 0;
  if (rows * step != out || cols != in) {
    return absl::InternalError(absl::StrCat(name, ": asked for [", rows, "][", cols, "]"));
  }
  const size_t size = DTypeSize(t.dtype);
  std::vector<std::byte>& buffer = converted->emplace_back(rows * cols * size);
  const std::byte* src = t.data + n.expert * in * out * size;
  // out row r, column k = stored [k][first + r * step]; a tile of 64 columns at a time, so the
  // stored rows are read in order.
  auto transpose = [&](auto element) {
    using T = decltype(element);
    T* to = reinterpret_cast<T*>(buffer.data());
    constexpr int64_t kTile = 64;
    for (int64_t k0 = 0; k0 < cols; k0 += kTile) {
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t k = k0; k < std::min(cols, k0 + kTile); ++k) {
          std::memcpy(&to[r * cols + k], src + (k * out + first + r * step) * size, sizeof(T));
        }
      }
    }
  };
  if (size == 2) {
    transpose(uint16_t{});
  } else {
    transpose(float{});
  }
  return WeightMatrix{t.dtype, buffer.data(), rows, cols, cols};
}

}  // namespace

std::optional<absl::StatusOr<WeightMatrix>> GptOssExpertTensor(
    const SafetensorsSet& files, const LlamaConfig& config, const std::string& name,
    const std::vector<int64_t>& shape, const QuantizedLoadOptions* options,
    std::vector<std::vector<std::byte>>* converted, QuantizedLoadStats* stats) {
  if (config.model_type != "gpt_oss") return std::nullopt;
  const std::optional<ExpertName> n = ParseExpertName(name);
  if (!n.has_value()) return std::nullopt;
  if (files.Contains(name)) return std::nullopt;  // stored per expert after all: read as it is
  if (converted == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(files.dir(), ": ", name,
                     " is part of gpt-oss's fused expert tensors, and this loader "
                     "does not convert them"));
  }
  if (n->expert < 0 || n->expert >= config.num_experts) {
    return absl::InvalidArgumentError(absl::StrCat(name, ": no such expert"));
  }
  if (n->bias) return Bias(files, config, *n, shape.back(), converted);
  if (shape.size() != 2) return absl::InternalError("an expert product is a matrix");
  const int64_t rows = shape[0], cols = shape[1];
  const bool down = n->product == "down";
  const std::string fused = n->experts + (down ? "down_proj" : "gate_up_proj");
  if (files.Contains(fused)) return DenseProduct(files, config, *n, rows, cols, converted);
  if (!files.Contains(fused + "_blocks")) {
    return absl::NotFoundError(absl::StrCat(files.dir(), ": neither ", fused, " nor ", fused,
                                            "_blocks (MXFP4) is in the checkpoint"));
  }
  if (config.quantization.method != "mxfp4") {
    return absl::InvalidArgumentError(
        absl::StrCat(files.dir(), ": ", fused,
                     "_blocks is MXFP4, but config.json's quantization_config does "
                     "not say quant_method \"mxfp4\""));
  }
  absl::StatusOr<TensorView> blocks = files.GetAny(fused + "_blocks");
  if (!blocks.ok()) return blocks.status();
  const int64_t out_rows_all = down ? rows : 2 * rows;
  absl::StatusOr<TensorView> scales =
      files.GetAny(fused + "_scales", {config.num_experts, out_rows_all, cols / 32});
  if (!scales.ok()) return scales.status();
  // [E][out rows][cols / 32][16]: gate_up's rows interleave gate and up.
  const int64_t out_rows = down ? rows : 2 * rows;
  if (blocks->shape.size() != 4 || blocks->shape[0] != config.num_experts ||
      blocks->shape[1] != out_rows) {
    return ShapeError(
        files, fused + "_blocks", *blocks,
        absl::StrCat("[", config.num_experts, "][", out_rows, "][", cols / 32, "][16]"));
  }
  const int64_t first = n->expert * out_rows + (n->product == "up" ? 1 : 0);
  const QuantizedLoadOptions fallback;
  return LoadMxfp4Rows(*blocks, *scales, first, down ? 1 : 2, rows, cols,
                       options != nullptr ? *options : fallback, converted, stats);
}

}  // namespace kvrm
