// Static FP8 KV cache scales for a checkpoint that has none: each layer's largest |key| and
// |value| over calibration text, run through the CPU engine, divided by the FP8 format's largest
// finite value (llm-compressor's static per-tensor scheme for the KV cache), written where
// kvrmd --kv_dtype=fp8 (and vLLM) read them: model.layers.N.self_attn.k_scale / v_scale.
#ifndef KVRM_TOOLS_KV_SCALES_KV_SCALES_H_
#define KVRM_TOOLS_KV_SCALES_KV_SCALES_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "runtime/model_bundle.h"

namespace kvrm {

struct KvScaleOptions {
  DType format = DType::kF8E4M3;  // whose largest finite value the amax maps to (448; 57344)
  int32_t threads = 2;
  int32_t chunk_tokens = 256;  // prefill chunk
};

struct KvScaleCalibration {
  std::vector<std::pair<float, float>> amax;    // per layer: largest |key|, |value|
  std::vector<std::pair<float, float>> scales;  // per layer: amax / the format's largest value
  int64_t sequences = 0;
  int64_t tokens = 0;
};

// Prefills each of `sequences` (token ids, at most the model's context each) through a CPU
// backend with an f32 cache and records the amax. INVALID_ARGUMENT for an empty set or a
// sequence too long; FAILED_PRECONDITION for a GGUF model (its scales have no place to go) or
// a layer whose keys or values were all zero.
absl::StatusOr<KvScaleCalibration> CalibrateKvScales(
    const ModelBundle& model, const std::vector<std::vector<int32_t>>& sequences,
    const KvScaleOptions& options);

// Writes the scales into the model directory `model` was loaded from, as one-element f32
// tensors <prefix>layers.N.self_attn.k_scale / v_scale: into model.safetensors (rewritten whole,
// atomically, its metadata kept) or, for a sharded checkpoint, a new shard
// kv_cache_scales.safetensors listed in model.safetensors.index.json. FAILED_PRECONDITION when
// the checkpoint already has KV cache scales of any convention.
absl::Status WriteKvScales(const ModelBundle& model, const KvScaleCalibration& calibration);

// Text the tool calibrates on when given none: prose, dialogue, code, numbers and lists, so that
// keys see more than one kind of token stream.
const std::vector<std::string>& DefaultCalibrationTexts();

}  // namespace kvrm

#endif  // KVRM_TOOLS_KV_SCALES_KV_SCALES_H_
