#include "tools/kv_scales/kv_scales.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/json.h"
#include "common/status_macros.h"
#include "model/safetensors_writer.h"
#include "model/weights.h"
#include "runtime/backend.h"
#include "runtime/cpu_backend.h"

namespace kvrm {
namespace {

constexpr int32_t kBlockTokens = 16;
constexpr char kScalesShard[] = "kv_cache_scales.safetensors";

}  // namespace

absl::StatusOr<KvScaleCalibration> CalibrateKvScales(
    const ModelBundle& model, const std::vector<std::vector<int32_t>>& sequences,
    const KvScaleOptions& options) {
  if (model.files == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(model.dir, ": a GGUF model has no place for KV cache scales"));
  }
  if (!IsFp8(options.format)) {
    return absl::InvalidArgumentError(
        absl::StrCat("format ", std::string(DTypeName(options.format)), ": fp8_e4m3 or fp8_e5m2"));
  }
  if (sequences.empty()) return absl::InvalidArgumentError("no calibration sequences");
  const LlamaConfig& c = model.config;
  size_t longest = 0;
  for (size_t i = 0; i < sequences.size(); ++i) {
    if (sequences[i].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("calibration sequence ", i, " is empty"));
    }
    longest = std::max(longest, sequences[i].size());
  }
  if (longest > static_cast<size_t>(c.max_position_embeddings)) {
    return absl::InvalidArgumentError(absl::StrCat("a calibration sequence of ", longest,
                                                   " tokens is longer than the model's ",
                                                   c.max_position_embeddings, " positions"));
  }
  const int32_t blocks = static_cast<int32_t>((longest + kBlockTokens - 1) / kBlockTokens);
  CpuBackendOptions o;
  o.kv_blocks = blocks;
  o.kv_block_tokens = kBlockTokens;
  o.kv_dtype = DType::kF32;  // the values before any cache rounds them
  o.max_slots = 1;
  o.max_chunk_tokens = options.chunk_tokens;
  o.max_context = static_cast<int32_t>(longest);
  o.num_threads = options.threads;
  ASSIGN_OR_RETURN(std::unique_ptr<CpuBackend> backend, CpuBackend::Create(c, &model.weights, o));
  backend->RecordKvAmax(true);
  const KvRun run{0, blocks};
  KvScaleCalibration out;
  for (const std::vector<int32_t>& seq : sequences) {
    for (size_t start = 0; start < seq.size(); start += options.chunk_tokens) {
      const size_t n = std::min<size_t>(options.chunk_tokens, seq.size() - start);
      PrefillChunk chunk{0, static_cast<int32_t>(start), absl::MakeConstSpan(seq).subspan(start, n),
                         &run, 1};
      RETURN_IF_ERROR(backend->Prefill(chunk, nullptr));
    }
    ++out.sequences;
    out.tokens += static_cast<int64_t>(seq.size());
  }
  out.amax = backend->KvAmax();
  const float largest = Fp8MaxFinite(options.format);
  for (size_t l = 0; l < out.amax.size(); ++l) {
    const auto [k, v] = out.amax[l];
    if (!(k > 0) || !(v > 0) || !std::isfinite(k) || !std::isfinite(v)) {
      return absl::FailedPreconditionError(absl::StrCat("layer ", l, ": largest |key| ", k,
                                                        ", |value| ", v,
                                                        " over the calibration text; a "
                                                        "scale needs a positive finite one"));
    }
    out.scales.emplace_back(k / largest, v / largest);
  }
  return out;
}

absl::Status WriteKvScales(const ModelBundle& model, const KvScaleCalibration& calibration) {
  if (model.files == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat(model.dir, ": a GGUF model has no place for KV cache scales"));
  }
  if (!model.weights.kv_cache_scales.empty() || !model.weights.kv_cache_scales_error.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat(model.dir, ": the checkpoint already has KV cache scales (",
                     model.weights.kv_cache_scales.empty()
                         ? std::string(model.weights.kv_cache_scales_error.message())
                         : model.weights.kv_cache_scales,
                     "); remove them first"));
  }
  const int32_t layers = model.config.num_hidden_layers;
  if (static_cast<int32_t>(calibration.scales.size()) != layers) {
    return absl::InvalidArgumentError(
        absl::StrCat(calibration.scales.size(), " layers of scales for a model of ", layers));
  }
  const std::string prefix = LanguageModelPrefix(model.config, *model.files);
  std::vector<float> values;
  values.reserve(2 * layers);
  std::vector<TensorToWrite> scales;
  for (int32_t i = 0; i < layers; ++i) {
    const std::string p = absl::StrCat(prefix, "layers.", i, ".self_attn.");
    for (const auto& [what, v] : {std::pair{"k_scale", calibration.scales[i].first},
                                  std::pair{"v_scale", calibration.scales[i].second}}) {
      values.push_back(v);
      scales.push_back(
          {p + what,
           DType::kF32,
           {},
           absl::MakeConstSpan(reinterpret_cast<const std::byte*>(&values.back()), sizeof(float))});
    }
  }
  const std::string single = model.dir + "/model.safetensors";
  if (std::filesystem::exists(single)) {
    // One file: rewritten whole, atomically, with the scales after its tensors.
    return AppendToSafetensors(single, scales);
  }
  // Shards: a new one, listed in the index.
  const std::string index_path = model.dir + "/model.safetensors.index.json";
  ASSIGN_OR_RETURN(Json index, ReadJsonFile(index_path));
  if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
    return absl::InvalidArgumentError(index_path + ": no weight_map object");
  }
  RETURN_IF_ERROR(WriteSafetensors(model.dir + "/" + kScalesShard, scales, {{"format", "pt"}}));
  for (const TensorToWrite& t : scales) index["weight_map"][t.name] = kScalesShard;
  return WriteFileAtomically(index_path, index.dump(2) + "\n");
}

const std::vector<std::string>& DefaultCalibrationTexts() {
  static const std::vector<std::string>* texts = new std::vector<std::string>{
      "The history of the printing press begins in the workshops of fifteenth-century Mainz, "
      "where Johannes Gutenberg combined movable metal type, oil-based ink and a screw press "
      "adapted from wine making. Within fifty years presses were running in more than two "
      "hundred European cities, and the price of a book fell to a fraction of a manuscript's.",
      "User: Can you explain why the sky is blue?\nAssistant: Sunlight is scattered by the "
      "molecules of the air, and shorter wavelengths scatter far more strongly than longer ones "
      "(Rayleigh scattering goes as the inverse fourth power of the wavelength), so blue light "
      "reaches your eye from every direction of the sky.\nUser: Then why are sunsets red?",
      "def merge_sorted(a, b):\n    out, i, j = [], 0, 0\n    while i < len(a) and j < len(b):\n"
      "        if a[i] <= b[j]:\n            out.append(a[i]); i += 1\n        else:\n"
      "            out.append(b[j]); j += 1\n    return out + a[i:] + b[j:]\n\n"
      "print(merge_sorted([1, 4, 9], [2, 3, 10, 11]))",
      "Quarterly results, in millions: revenue 1,284.6 (up 12.4%), gross margin 61.2%, "
      "operating expenses 512.9, net income 201.3; cash at 30 September 3,940.0. Guidance for "
      "the fourth quarter: revenue between 1,310 and 1,350, a margin of 60 to 62 percent.",
      "Ingredients: 2 cups flour, 1 tsp baking soda, 1/2 tsp salt, 1 cup butter, 3/4 cup sugar, "
      "2 eggs, 2 cups chocolate chips.\n1. Preheat the oven to 190 C.\n2. Whisk the dry "
      "ingredients.\n3. Cream the butter and sugar, beat in the eggs, then fold everything "
      "together.\n4. Bake spoonfuls for 9 to 11 minutes.",
      "Les modèles de langue prédisent le mot suivant; 言語モデルは次の単語を予測します; "
      "языковые модели предсказывают следующее слово. {\"id\": 42, \"tags\": [\"a\", \"b\"], "
      "\"ok\": true}",
  };
  return *texts;
}

}  // namespace kvrm
