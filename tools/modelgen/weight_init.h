// The tensors of a generated Llama model (HF names and shapes) and their deterministic values.
//
// Standard deviations are chosen so the random model is a useful test subject rather than
// matching training-time init (config.json's initializer_range 0.02 is metadata only):
//   - every projection has std gain/sqrt(fan_in), so its output has ~unit RMS on a normed input
//     and every layer moves the residual stream: a wrong attention or MLP in an engine changes
//     the greedy output instead of being drowned by the embedding;
//   - q/k gain 1 gives attention scores of std ~1 (peaked but not one-hot);
//   - embed_tokens and lm_head have std 2/sqrt(hidden), so logits have std ~2: a varied,
//     non-degenerate next-token distribution (with tied embeddings the residual added by the
//     layers keeps the last input token from dominating its own logit);
//   - RMSNorm weights are 1 + N(0, 0.1), not all ones, so a missing norm weight is visible;
//     Gemma stores them as w - 1 (its RMSNorm multiplies by 1 + w), so N(0, 0.1) there, but
//     its post-attention and post-feedforward norms 3 + N(0, 0.1) (a gain of 4, so the layers
//     outweigh Gemma's sqrt(hidden)-scaled input embedding: weight_init.cc);
//   - a mixture of experts' router has std 0.25, larger than the projections' 1/sqrt(hidden), so
//     its logits (std ~2.8 at hidden 128) separate the experts clearly (weight_init.cc); the
//     experts' matrices are drawn as the dense MLP's (Qwen2-MoE's shared expert too), and
//     Qwen2-MoE's shared_expert_gate has std 0.1, so sigmoid of its logits (std ~1.1 at hidden
//     128) spreads over (0, 1) rather than saturating;
//   - gpt-oss: attention sinks N(0, 1), as large as the scores they compete with; the router's
//     bias N(0, 0.5); the experts' biases N(0, 0.1); gate_up_proj std 3/sqrt(hidden), so that a
//     few percent of gate and up values pass swiglu_limit 7 and the clamp matters, and down_proj
//     std (1/6.5)/sqrt(ffn), which brings the clamped GLU's larger outputs back to unit RMS
//     (weight_init.cc). Tensors may be 3-D ([experts][in][out]): numel() covers every dimension.
#ifndef KVRM_TOOLS_MODELGEN_WEIGHT_INIT_H_
#define KVRM_TOOLS_MODELGEN_WEIGHT_INIT_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "tools/modelgen/model_spec.h"

namespace kvrm::modelgen {

struct TensorPlan {
  std::string name;
  std::vector<int64_t> shape;
  double mean = 0.0;
  double stddev = 0.0;
  int64_t numel() const;
};

// In the order the checkpoint stores them: embed, layers 0..n-1, norm, lm_head (unless tied).
std::vector<TensorPlan> PlanTensors(const ModelSpec& spec);

// Writes numel() values mean + stddev * N(0, 1), drawn from a stream seeded by (seed, name),
// converted to `dtype` with round-to-nearest-even, little-endian, into `out`
// (numel() * DTypeSize(dtype) bytes).
void FillTensor(const TensorPlan& plan, uint64_t seed, DType dtype, std::byte* out);

}  // namespace kvrm::modelgen

#endif  // KVRM_TOOLS_MODELGEN_WEIGHT_INIT_H_
