#include "runtime/cuda/attention_vectors.h"

#include "absl/strings/str_cat.h"
#include "kernels/cpu/weight_matrix.h"

namespace kvrm::cuda {
namespace {

constexpr int64_t kAlignFloats = 64;  // 256 bytes

int64_t RoundUp(int64_t n, int64_t to) { return (n + to - 1) / to * to; }

}  // namespace

absl::StatusOr<AttentionVectors> PackAttentionVectors(const LlamaConfig& config,
                                                      const RankWeights& w) {
  const int64_t hd = config.head_dim;
  const int64_t qw = int64_t{w.heads} * hd, kvw = int64_t{w.kv_heads} * hd;
  AttentionVectors out;
  // Where each vector goes: offsets first, then one buffer filled in place.
  struct Part {
    const WeightMatrix* v;
    int64_t length;
    size_t layer;
    const char* name;
    int64_t at;
  };
  std::vector<Part> parts;
  int64_t at = 0;
  // `aligned`: the start of a vector the kernels read; else it continues the one before.
  auto place = [&](const WeightMatrix& v, int64_t length, const char* name, bool aligned) {
    if (aligned) at = RoundUp(at, kAlignFloats);
    parts.push_back(Part{&v, length, out.layers.size(), name, at});
    at += length;
    return at - length;
  };
  for (const LayerWeights& l : w.layers) {
    AttentionVectors::Layer la;
    if (config.qkv_bias) {
      la.qkv_bias = place(l.bq, qw, "q_proj.bias", true);  // one [q + k + v] vector
      place(l.bk, kvw, "k_proj.bias", false);
      place(l.bv, kvw, "v_proj.bias", false);
    }
    if (config.o_bias) la.o_bias = place(l.bo, config.hidden_size, "o_proj.bias", true);
    if (config.qk_norm) {
      la.q_norm = place(l.q_norm, hd, "q_norm", true);
      la.k_norm = place(l.k_norm, hd, "k_norm", true);
    }
    out.layers.push_back(la);
  }
  out.data.assign(at, 0.0f);
  for (const Part& p : parts) {
    if (p.v->data == nullptr || p.v->rows != 1 || p.v->cols != p.length) {
      return absl::InvalidArgumentError(
          absl::StrCat("layer ", p.layer, " ", p.name, ": ",
                       p.v->data == nullptr ? "missing" : "a vector of another length",
                       " (the config asks for ", p.length, " values)"));
    }
    WeightRowToFloat(*p.v, 0, out.data.data() + p.at);
  }
  return out;
}

}  // namespace kvrm::cuda
