// The device sampling procedure (DeviceSampling, runtime/backend.h) on the host, in double: the
// reference the CUDA kernel (kernels/cuda/sampling.cu) is checked against by the device check,
// and what a backend without a GPU uses to sample rows inside its step.
//
// Order: NaN counts as -inf; temperature 0 (or no finite logit): argmax, lowest id on ties.
// Otherwise p_v = exp((x_v - max) / T) (if any logit is +inf: 1 for those, 0 elsewhere); the
// kept support is {v : p_v >= threshold, p_v > 0}, threshold the largest of: the k-th largest p
// (top-k), the smallest p whose cumulative mass from the top reaches top_p of what top-k kept
// (top-p), and min_p (relative to the max entry, which is 1); ties at a threshold are all kept.
// The token is the first kept id, in id order, at which the cumulative kept mass exceeds
// uniform * total.
#ifndef KVRM_RUNTIME_DEVICE_SAMPLING_H_
#define KVRM_RUNTIME_DEVICE_SAMPLING_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "runtime/backend.h"

namespace kvrm {

struct DeviceSampleResult {
  int32_t token = 0;
  // How far the draw is from a decision boundary, as a fraction of the kept mass (sampling) or
  // of the largest logit's magnitude (greedy: the gap to the runner-up): a float implementation
  // may fairly pick a neighbour when this is below its rounding.
  double margin = 0;
};

// The ranges every backend may assume of a marked row's parameters (the engine's to keep): OK, or
// INVALID_ARGUMENT "sampling.FIELD = value outside range". temperature in [0, inf), top_k in
// [0, vocab_size] (0: off), top_p in (0, 1], min_p in [0, 1], uniform in [0, 1). Allocates
// nothing when the row is good.
absl::Status CheckDeviceSampling(const DeviceSampling& params, int32_t vocab_size);

// `scratch` is resized to the vocabulary on first use (reuse it: then nothing allocates).
DeviceSampleResult SampleLikeDevice(absl::Span<const float> logits, const DeviceSampling& params,
                                    std::vector<double>& scratch);

}  // namespace kvrm

#endif  // KVRM_RUNTIME_DEVICE_SAMPLING_H_
