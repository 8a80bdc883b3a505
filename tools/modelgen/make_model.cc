// make_model: writes a deterministic random-weight Llama model in Hugging Face layout.
//
//   make_model --size=tiny|small --out=DIR [--dtype=f32|bf16|f16] [--shards=N] [--seed=S]
//
// With --lora_out=DIR it (also) writes a random LoRA adapter in PEFT's layout for --size's model
// (tools/modelgen/lora_writer.h); without --out, only the adapter:
//
//   make_model --size=tiny --lora_out=DIR [--lora_rank=8] [--lora_alpha=16] [--lora_rslora]
//       [--lora_targets=q_proj,v_proj] [--lora_layers=0,2] [--lora_dtype=f32] [--lora_seed=S]
//
// With --quantize=awq|gptq|compressed-tensors|fp8|fbgemm_fp8|bitsandbytes it also writes a
// quantized checkpoint of the model to --quantize_out, laid out as AutoAWQ, AutoGPTQ,
// llm-compressor, Transformers' FP8 or fbgemm save theirs (round to nearest;
// tools/modelgen/quantized_writer.h):
//
//   make_model --size=tiny --out=DIR --quantize=gptq --quantize_out=QDIR [--quantize_bits=4]
//       [--quantize_group_size=128] [--quantize_sym] [--quantize_act_order]
//   make_model --size=tiny --out=DIR --quantize=fp8 --quantize_out=QDIR    (blocks 128x128)
//   make_model --size=tiny --out=DIR --quantize=compressed-tensors
//       --quantize_format=float-quantized --quantize_group_size=-1 --quantize_out=QDIR  (FP8)
//
// gpt-oss models (--size=tiny-gptoss) take --quantize=mxfp4 only, the layout of openai's own
// checkpoints (the experts' fused tensors as *_blocks / *_scales, the rest as it is), and other
// models do not take it:
//
//   make_model --size=tiny-gptoss --out=DIR --quantize=mxfp4 --quantize_out=QDIR
//       [--quantize_twin_out=TWIN]    (TWIN: the experts holding the MXFP4 values, bf16 or f32)
//
// The same flags give byte-identical files on any machine. See tools/modelgen/README.md.
#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "common/dtype.h"
#include "tools/modelgen/lora_writer.h"
#include "tools/modelgen/model_writer.h"
#include "tools/modelgen/quantized_writer.h"

ABSL_FLAG(std::string, size, "tiny", "model shape: tiny (~1M params) or small (~125M)");
ABSL_FLAG(std::string, out, "", "output directory (created if missing)");
ABSL_FLAG(std::string, dtype, "bf16", "weight dtype: f32, bf16 or f16");
ABSL_FLAG(int, shards, 1, "number of safetensors shards (1 writes model.safetensors)");
ABSL_FLAG(uint64_t, seed, 0, "random seed for weights and the tokenizer corpus");
ABSL_FLAG(std::string, lora_out, "",
          "also write a random LoRA adapter (PEFT layout) for --size's model into this directory; "
          "without --out, only the adapter");
ABSL_FLAG(int32_t, lora_rank, 8, "the adapter's rank r");
ABSL_FLAG(double, lora_alpha, 16, "the adapter's lora_alpha");
ABSL_FLAG(bool, lora_rslora, false, "use_rslora: scale alpha / sqrt(r) instead of alpha / r");
ABSL_FLAG(std::string, lora_targets, "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj",
          "comma-separated modules the adapter adapts");
ABSL_FLAG(std::string, lora_layers, "", "comma-separated layers the adapter adapts (empty: all)");
ABSL_FLAG(std::string, lora_dtype, "f32", "the adapter's tensor dtype: f32, bf16 or f16");
ABSL_FLAG(uint64_t, lora_seed, 0, "random seed for the adapter's values");
ABSL_FLAG(std::string, lora_base_model, "",
          "the adapter's base_model_name_or_path (default: --out, else --size)");
ABSL_FLAG(std::string, quantize, "",
          "also write a quantized checkpoint of the model: awq, gptq, compressed-tensors, fp8, "
          "fbgemm_fp8, bitsandbytes, or mxfp4 (gpt_oss models only, which take no other)");
ABSL_FLAG(std::string, quantize_out, "", "where --quantize writes it");
ABSL_FLAG(std::string, quantize_twin_out, "",
          "with --quantize, also write the model with float32 weights holding exactly the "
          "checkpoint's values (s * (q - z)) here: a reference for other tools' dequantization "
          "(mxfp4: the experts' decoded values, in bf16 for a bf16 model)");
ABSL_FLAG(int, quantize_bits, 4,
          "bits a weight: 4 (awq), 4 or 8 (gptq, compressed-tensors); 8 for FP8 and int8");
ABSL_FLAG(std::string, quantize_format, "pack-quantized",
          "compressed-tensors: pack-quantized, int-quantized (int8, W8A8) or float-quantized "
          "(FP8); bitsandbytes: nf4 (the default), fp4 or int8 (LLM.int8())");
ABSL_FLAG(bool, quantize_double_quant, false,
          "bitsandbytes 4-bit: double-quantize the absmax (bnb_4bit_use_double_quant)");
ABSL_FLAG(int, quantize_block_rows, -1,
          "int-quantized, float-quantized and fp8: output features a scale (blocks of "
          "block_rows x group_size), 1 by row, 0 one scale a tensor; -1: fp8's 128, else 1");
ABSL_FLAG(int, quantize_group_size, 128, "input features a scale (-1: one per output row)");
ABSL_FLAG(bool, quantize_sym, false,
          "symmetric (gptq sym, compressed-tensors symmetric): no stored zeros");
ABSL_FLAG(bool, quantize_act_order, false,
          "gptq desc_act / compressed-tensors actorder group: groups of a permutation (g_idx)");

namespace {

std::optional<kvrm::DType> ParseDType(const std::string& name) {
  if (name == "f32") return kvrm::DType::kF32;
  if (name == "bf16") return kvrm::DType::kBF16;
  if (name == "f16") return kvrm::DType::kF16;
  return std::nullopt;
}

// --lora_* into an adapter of --size's model.
int WriteLora() {
  kvrm::modelgen::MakeLoraOptions lora;
  lora.out_dir = absl::GetFlag(FLAGS_lora_out);
  lora.rank = absl::GetFlag(FLAGS_lora_rank);
  lora.alpha = absl::GetFlag(FLAGS_lora_alpha);
  lora.use_rslora = absl::GetFlag(FLAGS_lora_rslora);
  lora.seed = absl::GetFlag(FLAGS_lora_seed);
  lora.target_modules = absl::StrSplit(absl::GetFlag(FLAGS_lora_targets), ',', absl::SkipEmpty());
  for (absl::string_view l :
       absl::StrSplit(absl::GetFlag(FLAGS_lora_layers), ',', absl::SkipEmpty())) {
    int32_t layer = 0;
    if (!absl::SimpleAtoi(l, &layer)) {
      std::fprintf(stderr, "make_model: --lora_layers: \"%s\" is not a layer number\n",
                   std::string(l).c_str());
      return 2;
    }
    lora.layers.push_back(layer);
  }
  const std::string dtype = absl::GetFlag(FLAGS_lora_dtype);
  const std::optional<kvrm::DType> parsed = ParseDType(dtype);
  if (!parsed.has_value()) {
    std::fprintf(stderr, "make_model: --lora_dtype must be f32, bf16 or f16, got \"%s\"\n",
                 dtype.c_str());
    return 2;
  }
  lora.dtype = *parsed;
  lora.base_model = absl::GetFlag(FLAGS_lora_base_model);
  if (lora.base_model.empty()) {
    lora.base_model =
        absl::GetFlag(FLAGS_out).empty() ? absl::GetFlag(FLAGS_size) : absl::GetFlag(FLAGS_out);
  }
  const auto config = kvrm::modelgen::LlamaConfigForSize(absl::GetFlag(FLAGS_size));
  absl::Status status = config.status();
  if (status.ok()) status = kvrm::modelgen::MakeLoraAdapter(*config, lora);
  if (!status.ok()) {
    std::fprintf(stderr, "make_model: %s\n", status.ToString().c_str());
    return 1;
  }
  std::printf("make_model: LoRA adapter for %s (r %d, alpha %g) -> %s\n",
              absl::GetFlag(FLAGS_size).c_str(), lora.rank, lora.alpha, lora.out_dir.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "make_model --size=tiny|small --out=DIR [--dtype=f32|bf16|f16] [--shards=N] [--seed=S]\n"
      "make_model --size=tiny|small --lora_out=DIR [--lora_rank=R] [--lora_alpha=A] "
      "[--lora_targets=q_proj,...] [--lora_layers=L,...] [--lora_seed=S]");
  absl::ParseCommandLine(argc, argv);
  const bool lora = !absl::GetFlag(FLAGS_lora_out).empty();
  if (lora && absl::GetFlag(FLAGS_out).empty()) return WriteLora();
  kvrm::modelgen::MakeModelOptions options;
  options.size = absl::GetFlag(FLAGS_size);
  options.out_dir = absl::GetFlag(FLAGS_out);
  options.shards = absl::GetFlag(FLAGS_shards);
  options.seed = absl::GetFlag(FLAGS_seed);
  const std::string dtype = absl::GetFlag(FLAGS_dtype);
  const std::optional<kvrm::DType> parsed = ParseDType(dtype);
  if (!parsed.has_value()) {
    std::fprintf(stderr, "make_model: --dtype must be f32, bf16 or f16, got \"%s\"\n",
                 dtype.c_str());
    return 2;
  }
  options.dtype = *parsed;
  const auto summary = kvrm::modelgen::MakeModel(options);
  if (!summary.ok()) {
    std::fprintf(stderr, "make_model: %s\n", summary.status().ToString().c_str());
    return 1;
  }
  std::printf(
      "make_model: %s %s -> %s: %lld parameters, %lld weight bytes, %d merges, %.2f s "
      "(tokenizer %.2f s, weights %.2f s)\n",
      std::string(summary->spec.name).c_str(), dtype.c_str(), options.out_dir.c_str(),
      static_cast<long long>(summary->parameters), static_cast<long long>(summary->weight_bytes),
      summary->num_merges, summary->total_seconds, summary->tokenizer_seconds,
      summary->weights_seconds);
  if (const std::string method = absl::GetFlag(FLAGS_quantize); !method.empty()) {
    kvrm::modelgen::QuantizeOptions q;
    q.method = method;
    q.bits = absl::GetFlag(FLAGS_quantize_bits);
    q.group_size = absl::GetFlag(FLAGS_quantize_group_size);
    q.zero_point = !absl::GetFlag(FLAGS_quantize_sym);
    q.act_order = absl::GetFlag(FLAGS_quantize_act_order);
    q.seed = options.seed;
    q.format = absl::GetFlag(FLAGS_quantize_format);
    q.block_rows = absl::GetFlag(FLAGS_quantize_block_rows);
    if (q.block_rows < 0) q.block_rows = method == "fp8" ? 128 : 1;
    const bool unpacked = method == "fp8" || method == "fbgemm_fp8" ||
                          (method == "compressed-tensors" && q.format != "pack-quantized");
    if (unpacked) {  // 8-bit and symmetric
      q.bits = 8;
      q.zero_point = false;
    }
    if (method == "fbgemm_fp8") q.group_size = -1;
    if (method == "mxfp4") {  // FP4 E2M1 in blocks of 32: what the format fixes
      q.bits = 4;
      q.group_size = 32;
    }
    if (method == "bitsandbytes") {  // bitsandbytes' blocks of 64; nf4 unless told
      if (q.format == "pack-quantized") q.format = "nf4";
      q.group_size = 64;
      q.double_quant = absl::GetFlag(FLAGS_quantize_double_quant);
    }
    // compressed-tensors keeps its scales in the model's dtype; AWQ and GPTQ in f16; FP8's
    // (DeepSeek-V3's weight_scale_inv, fbgemm's) are f32.
    if (method == "compressed-tensors") q.scale_dtype = options.dtype;
    if (method == "fp8" || method == "fbgemm_fp8") q.scale_dtype = kvrm::DType::kF32;
    const std::string out = absl::GetFlag(FLAGS_quantize_out);
    absl::Status st = out.empty()
                          ? absl::InvalidArgumentError("--quantize needs --quantize_out")
                          : kvrm::modelgen::QuantizeModelDir(
                                options.out_dir, out, absl::GetFlag(FLAGS_quantize_twin_out), q);
    if (!st.ok()) {
      std::fprintf(stderr, "make_model: %s\n", st.ToString().c_str());
      return 1;
    }
    std::printf("make_model: %s %d-bit checkpoint -> %s\n", method.c_str(), q.bits, out.c_str());
  }
  return lora ? WriteLora() : 0;
}
