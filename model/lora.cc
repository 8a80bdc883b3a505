#include "model/lora.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/dtype.h"
#include "common/json.h"
#include "common/status_macros.h"
#include "model/safetensors.h"

namespace kvrm {
namespace {

// Bounds what one file may make us allocate per projection, with the model's own sizes.
constexpr int64_t kMaxRank = kMaxLoraRank;

// Abseil 20220623 keeps its own string_view: StrCat takes std::string_view through this.
absl::string_view A(std::string_view s) { return absl::string_view(s.data(), s.size()); }

constexpr std::string_view kTargetNames[kNumLoraTargets] = {
    "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"};

// ---- adapter_config.json ----------------------------------------------------------------------

// Typed access to adapter_config.json's fields; errors read "<path>: <key> <problem>".
class Fields {
 public:
  Fields(const Json& obj, std::string_view what) : obj_(obj), what_(what) {}

  // nullptr when the key is absent or JSON null (PEFT's "use the default").
  const Json* Get(const char* key) const {
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }

  absl::Status Invalid(const char* key, std::string_view problem) const {
    return absl::InvalidArgumentError(absl::StrCat(A(what_), ": ", key, " ", A(problem)));
  }
  absl::Status Unimplemented(const char* key, std::string_view problem) const {
    return absl::UnimplementedError(absl::StrCat(A(what_), ": ", key, " ", A(problem)));
  }

  absl::Status Bool(const char* key, bool* out) const {
    const Json* v = Get(key);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_boolean()) return Invalid(key, "must be true or false");
    *out = v->get<bool>();
    return absl::OkStatus();
  }

  absl::Status String(const char* key, std::string* out) const {
    const Json* v = Get(key);
    if (v == nullptr) return absl::OkStatus();
    if (!v->is_string()) return Invalid(key, "must be a string");
    *out = v->get_ref<const std::string&>();
    return absl::OkStatus();
  }

  // A flag whose true value PEFT computes with and this engine does not.
  absl::Status RefuseTrue(const char* key, std::string_view feature) const {
    bool value = false;
    RETURN_IF_ERROR(Bool(key, &value));
    if (value)
      return Unimplemented(key, absl::StrCat("is true: ", A(feature), " is not supported"));
    return absl::OkStatus();
  }

  // A list or object that must be absent, null or empty (`object` says which kind it is).
  absl::Status RefuseNonEmpty(const char* key, bool object, std::string_view feature) const {
    const Json* v = Get(key);
    if (v == nullptr) return absl::OkStatus();
    if (object ? !v->is_object() : !v->is_array()) {
      return Invalid(key, object ? "must be an object or null" : "must be a list or null");
    }
    if (v->empty()) return absl::OkStatus();
    std::string shown = v->dump();
    if (shown.size() > 80) shown = shown.substr(0, 77) + "...";
    return Unimplemented(key, absl::StrCat("(", shown, "): ", A(feature), " is not supported"));
  }

 private:
  const Json& obj_;
  std::string_view what_;
};

struct AdapterConfig {
  int32_t rank = 0;
  double alpha = 8;  // PEFT's LoraConfig default
  bool use_rslora = false;
  std::string base_model;
};

absl::StatusOr<AdapterConfig> ParseAdapterConfig(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string text, ReadFileToString(path));
  ASSIGN_OR_RETURN(const Json root, ParseJson(text, path));
  if (!root.is_object())
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  const Fields f(root, path);
  AdapterConfig c;

  if (const Json* type = f.Get("peft_type")) {
    if (!type->is_string()) return f.Invalid("peft_type", "must be a string");
    if (type->get_ref<const std::string&>() != "LORA") {
      return f.Unimplemented("peft_type",
                             absl::StrCat(type->dump(), " is not supported (only \"LORA\")"));
    }
  }

  const Json* r = f.Get("r");
  if (r == nullptr) return f.Invalid("r", "is missing");
  if (!r->is_number_integer()) return f.Invalid("r", "must be an integer");
  if ((r->is_number_unsigned() && r->get<uint64_t>() > static_cast<uint64_t>(kMaxRank)) ||
      r->get<int64_t>() < 1 || r->get<int64_t>() > kMaxRank) {
    return f.Invalid("r", absl::StrCat("(", r->dump(), ") must be in [1, ", kMaxRank, "]"));
  }
  c.rank = static_cast<int32_t>(r->get<int64_t>());

  if (const Json* alpha = f.Get("lora_alpha")) {
    if (!alpha->is_number()) return f.Invalid("lora_alpha", "must be a number");
    c.alpha = alpha->get<double>();
    if (!std::isfinite(c.alpha) || c.alpha <= 0) {
      return f.Invalid("lora_alpha", absl::StrCat("(", alpha->dump(), ") must be > 0"));
    }
  }
  RETURN_IF_ERROR(f.Bool("use_rslora", &c.use_rslora));
  RETURN_IF_ERROR(f.String("base_model_name_or_path", &c.base_model));

  // What PEFT would compute differently from W x + scale * B A x.
  RETURN_IF_ERROR(f.RefuseTrue("fan_in_fan_out", "a transposed (Conv1D-style) layout"));
  RETURN_IF_ERROR(f.RefuseTrue("use_dora", "DoRA"));
  RETURN_IF_ERROR(f.RefuseTrue("lora_bias", "a trained lora_B bias"));
  std::string bias = "none";
  RETURN_IF_ERROR(f.String("bias", &bias));
  if (bias != "none") {
    return f.Unimplemented(
        "bias", absl::StrCat("\"", bias, "\": trained biases are not supported (only \"none\")"));
  }
  RETURN_IF_ERROR(
      f.RefuseNonEmpty("modules_to_save", false, "replacing whole modules (modules_to_save)"));
  RETURN_IF_ERROR(f.RefuseNonEmpty("rank_pattern", true, "a per-module rank"));
  RETURN_IF_ERROR(f.RefuseNonEmpty("alpha_pattern", true, "a per-module alpha"));
  RETURN_IF_ERROR(f.RefuseNonEmpty("layer_replication", false, "layer replication"));
  RETURN_IF_ERROR(f.RefuseNonEmpty("alora_invocation_tokens", false, "activated LoRA"));
  if (const Json* tokens = f.Get("trainable_token_indices")) {
    if (!tokens->empty()) {
      return f.Unimplemented("trainable_token_indices",
                             "is set: trainable tokens are not supported");
    }
  }
  return c;
}

// ---- adapter_model.safetensors ----------------------------------------------------------------

struct ParsedName {
  int32_t layer = 0;
  size_t module = 0;  // into LoraModulesOf
  bool is_b = false;
  std::string adapter;  // the ".default" segment's name, "" without one
  // Gemma 3's multimodal models: a tensor of the vision tower or its projector, which text-only
  // serving never runs (skipped, not refused).
  bool vision = false;
};

std::vector<std::string_view> SplitDots(std::string_view s) {
  std::vector<std::string_view> parts;
  for (size_t start = 0;;) {
    const size_t dot = s.find('.', start);
    parts.push_back(s.substr(start, dot == std::string_view::npos ? dot : dot - start));
    if (dot == std::string_view::npos) return parts;
    start = dot + 1;
  }
}

constexpr std::string_view kExpectedName =
    "(expected [base_model.model.]model.layers.{L}.{self_attn|mlp}.{module}.lora_{A|B}"
    "[.{adapter}].weight)";

// Maps a PEFT tensor name to (layer, module, A or B). `error(code, problem)` builds a status
// naming the tensor.
template <typename Error>
absl::StatusOr<ParsedName> ParseTensorName(std::string_view name, const LlamaConfig& config,
                                           const std::vector<LoraModule>& modules,
                                           const Error& error) {
  std::string_view s = name;
  if (s.starts_with("base_model.model."))
    s.remove_prefix(std::string_view("base_model.model.").size());
  std::string text_model;  // a multimodal model's language-model name, as a text model's
  if (config.multimodal_wrapper) {
    for (std::string_view vision : {"vision_tower.", "multi_modal_projector.",
                                    "model.vision_tower.", "model.multi_modal_projector."}) {
      if (s.starts_with(vision)) {
        ParsedName skipped;
        skipped.vision = true;
        return skipped;
      }
    }
    for (std::string_view prefix : {"language_model.model.", "model.language_model."}) {
      if (s.starts_with(prefix)) {
        text_model = absl::StrCat("model.", A(s.substr(prefix.size())));
        s = text_model;
        break;
      }
    }
  }
  const std::vector<std::string_view> parts = SplitDots(s);
  const auto has_part = [&](std::string_view p) {
    for (std::string_view x : parts) {
      if (x == p) return true;
    }
    return false;
  };
  if (has_part("lora_embedding_A") || has_part("lora_embedding_B") || has_part("embed_tokens") ||
      has_part("lm_head")) {
    return error(absl::StatusCode::kUnimplemented,
                 "adapts the embedding or lm_head, which is not supported (only the attention "
                 "and MLP projections)");
  }
  if (has_part("lora_magnitude_vector")) {
    return error(absl::StatusCode::kUnimplemented, "is a DoRA magnitude: DoRA is not supported");
  }
  if ((has_part("lora_A") || has_part("lora_B")) && parts.back() == "bias") {
    return error(absl::StatusCode::kUnimplemented, "is a LoRA bias, which is not supported");
  }
  if (has_part("experts") || has_part("block_sparse_moe")) {
    return error(absl::StatusCode::kUnimplemented,
                 "adapts a mixture of experts' expert or router, which is not supported (only the "
                 "attention projections, and the MLPs of dense layers)");
  }
  // model . layers . L . parent . module . lora_X [. adapter] . weight
  if ((parts.size() != 7 && parts.size() != 8) || parts[0] != "model" || parts[1] != "layers" ||
      parts.back() != "weight" || (parts[5] != "lora_A" && parts[5] != "lora_B")) {
    return error(absl::StatusCode::kInvalidArgument,
                 absl::StrCat("is not a LoRA weight of a projection ", A(kExpectedName)));
  }
  const std::string_view layer = parts[2];
  if (layer.empty() || layer.size() > 9 || layer.find_first_not_of("0123456789") != layer.npos) {
    return error(
        absl::StatusCode::kInvalidArgument,
        absl::StrCat("has layer index \"", A(layer), "\", not a number ", A(kExpectedName)));
  }
  ParsedName out;
  int64_t index = 0;
  for (char ch : layer) index = index * 10 + (ch - '0');
  if (index >= config.num_hidden_layers) {
    return error(absl::StatusCode::kInvalidArgument,
                 absl::StrCat("names layer ", index, " but the model has ",
                              config.num_hidden_layers, " layers (num_hidden_layers)"));
  }
  out.layer = static_cast<int32_t>(index);
  const std::string module = absl::StrCat(A(parts[3]), ".", A(parts[4]));
  out.module = modules.size();
  for (size_t i = 0; i < modules.size(); ++i) {
    if (modules[i].path == module) out.module = i;
  }
  if (out.module == modules.size()) {
    std::vector<absl::string_view> known;
    for (const LoraModule& m : modules) known.push_back(A(m.path));
    return error(
        absl::StatusCode::kInvalidArgument,
        absl::StrCat("adapts ", module, ", which this model (", config.model_type,
                     ") does not have (its projections: ", absl::StrJoin(known, ", "), ")"));
  }
  out.is_b = parts[5] == "lora_B";
  if (parts.size() == 8) {
    if (parts[6].empty()) {
      return error(absl::StatusCode::kInvalidArgument,
                   absl::StrCat("has an empty adapter name ", A(kExpectedName)));
    }
    out.adapter = std::string(parts[6]);
  }
  return out;
}

// The tensor's values as floats, each times `scale` (in double, rounded once); INVALID_ARGUMENT
// naming the tensor for a NaN or infinity in the file or after scaling.
template <typename Error>
absl::StatusOr<std::vector<float>> ReadFloats(const TensorView& t, double scale,
                                              const Error& error) {
  const int64_t n = t.numel();
  std::vector<float> out(static_cast<size_t>(n));
  const size_t width = DTypeSize(t.dtype);
  for (int64_t i = 0; i < n; ++i) {
    const std::byte* p = t.data + i * width;
    float v = 0;
    if (t.dtype == DType::kF32) {
      std::memcpy(&v, p, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, p, 2);
      v = t.dtype == DType::kBF16 ? Bf16ToFloat(h) : F16ToFloat(h);
    }
    if (!std::isfinite(v)) {
      return error(absl::StatusCode::kInvalidArgument,
                   absl::StrCat("has a value that is not finite (", v, " at index ", i, ")"));
    }
    if (scale != 1) {
      v = static_cast<float>(static_cast<double>(v) * scale);
      if (!std::isfinite(v)) {
        return error(
            absl::StatusCode::kInvalidArgument,
            absl::StrCat("overflows float at index ", i, " when multiplied by the scale ", scale));
      }
    }
    out[i] = v;
  }
  return out;
}

}  // namespace

std::vector<LoraModule> LoraModulesOf(const LlamaConfig& config) {
  using T = LoraTarget;
  if (config.fused_projections) {
    return {{"self_attn.qkv_proj", {T::kQ, T::kK, T::kV}},
            {"self_attn.o_proj", {T::kO}},
            {"mlp.gate_up_proj", {T::kGate, T::kUp}},
            {"mlp.down_proj", {T::kDown}}};
  }
  return {{"self_attn.q_proj", {T::kQ}}, {"self_attn.k_proj", {T::kK}},
          {"self_attn.v_proj", {T::kV}}, {"self_attn.o_proj", {T::kO}},
          {"mlp.gate_proj", {T::kGate}}, {"mlp.up_proj", {T::kUp}},
          {"mlp.down_proj", {T::kDown}}};
}

std::pair<int64_t, int64_t> LoraTargetShape(const LlamaConfig& c, LoraTarget t) {
  const int64_t d = c.hidden_size, ffn = c.intermediate_size;
  const int64_t q = static_cast<int64_t>(c.num_attention_heads) * c.head_dim;
  const int64_t kv = static_cast<int64_t>(c.num_key_value_heads) * c.head_dim;
  switch (t) {
    case LoraTarget::kQ:
      return {q, d};
    case LoraTarget::kK:
    case LoraTarget::kV:
      return {kv, d};
    case LoraTarget::kO:
      return {d, q};
    case LoraTarget::kGate:
    case LoraTarget::kUp:
      return {ffn, d};
    case LoraTarget::kDown:
      return {d, ffn};
  }
  return {0, 0};
}

std::string_view LoraTargetName(LoraTarget target) {
  const int32_t i = static_cast<int32_t>(target);
  return i >= 0 && i < kNumLoraTargets ? kTargetNames[i] : "unknown";
}

absl::StatusOr<LoraAdapter> LoadLoraAdapter(const LlamaConfig& config, std::string_view name,
                                            const std::string& dir) {
  const std::filesystem::path root(dir);
  ASSIGN_OR_RETURN(const AdapterConfig ac,
                   ParseAdapterConfig((root / "adapter_config.json").string()));
  const std::string weights_path = (root / "adapter_model.safetensors").string();
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> opened = SafetensorsFile::Open(weights_path);
  if (absl::IsNotFound(opened.status()) && std::filesystem::exists(root / "adapter_model.bin")) {
    return absl::NotFoundError(absl::StrCat(weights_path,
                                            " not found; adapter_model.bin (a pickle) is not read: "
                                            "convert it to safetensors"));
  }
  if (!opened.ok()) return opened.status();
  const SafetensorsFile& file = **opened;

  LoraAdapter adapter;
  adapter.name = std::string(name);
  adapter.path = dir;
  adapter.rank = ac.rank;
  adapter.alpha = ac.alpha;
  adapter.scale = ac.use_rslora ? ac.alpha / std::sqrt(static_cast<double>(ac.rank))
                                : ac.alpha / static_cast<double>(ac.rank);
  adapter.base_model = ac.base_model;

  const std::vector<LoraModule> modules = LoraModulesOf(config);
  struct Pair {
    const TensorView* a = nullptr;
    const TensorView* b = nullptr;
  };
  std::map<std::pair<int32_t, size_t>, Pair> pairs;  // by (layer, module): forward order
  std::optional<std::string> adapter_segment;        // every tensor must agree
  const std::vector<std::string> names = file.TensorNames();
  if (names.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(weights_path, ": holds no tensors"));
  }
  for (const std::string& tensor : names) {
    const auto error = [&](absl::StatusCode code, std::string_view problem) {
      return absl::Status(code, absl::StrCat(weights_path, ": tensor ", tensor, " ", A(problem)));
    };
    ASSIGN_OR_RETURN(const ParsedName p, ParseTensorName(tensor, config, modules, error));
    if (p.vision) continue;
    if (!adapter_segment.has_value()) adapter_segment = p.adapter;
    if (p.adapter != *adapter_segment) {
      return error(absl::StatusCode::kInvalidArgument,
                   absl::StrCat("has adapter name \"", p.adapter, "\" where other tensors have \"",
                                *adapter_segment, "\" (one adapter per file)"));
    }
    const TensorView*& slot = p.is_b ? pairs[{p.layer, p.module}].b : pairs[{p.layer, p.module}].a;
    if (slot != nullptr) {
      return error(absl::StatusCode::kInvalidArgument,
                   absl::StrCat("is the same weight as ", slot->name));
    }
    slot = file.Find(tensor);
  }

  if (pairs.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        weights_path, ": adapts only the vision tower, which text-only serving does not run"));
  }
  adapter.layers.resize(config.num_hidden_layers);
  std::array<bool, kNumLoraTargets> adapted{};
  for (const auto& entry : pairs) {
    // (Not a structured binding: the lambdas below capture `pair`, which clang 14 refuses.)
    const auto& key = entry.first;
    const auto& pair = entry.second;
    const LoraModule& module = modules[key.second];
    const TensorView& present = pair.a != nullptr ? *pair.a : *pair.b;
    const auto error = [&](absl::StatusCode code, std::string_view problem) {
      return absl::Status(code,
                          absl::StrCat(weights_path, ": tensor ", present.name, " ", A(problem)));
    };
    if (config.IsMoeLayer(key.first) &&
        (module.targets[0] == LoraTarget::kGate || module.targets[0] == LoraTarget::kDown ||
         module.targets[0] == LoraTarget::kUp)) {
      return error(absl::StatusCode::kUnimplemented,
                   absl::StrCat("adapts the MLP of layer ", key.first,
                                ", a mixture of experts: only attention projections are adapted "
                                "in such layers"));
    }
    if (pair.a == nullptr || pair.b == nullptr) {
      return error(absl::StatusCode::kInvalidArgument,
                   absl::StrCat("has no matching ", pair.a == nullptr ? "lora_A" : "lora_B",
                                " (each adapted projection needs both)"));
    }
    const int64_t in = LoraTargetShape(config, module.targets[0]).second;
    int64_t out = 0;
    for (LoraTarget t : module.targets) out += LoraTargetShape(config, t).first;
    const std::vector<int64_t> a_shape = {ac.rank, in}, b_shape = {out, ac.rank};
    for (const auto& [t, expected] : {std::pair{pair.a, &a_shape}, std::pair{pair.b, &b_shape}}) {
      if (t->shape != *expected) {
        return absl::InvalidArgumentError(
            absl::StrCat(weights_path, ": tensor ", t->name, " has shape ", ShapeToString(t->shape),
                         ", expected ", ShapeToString(*expected), " (",
                         t == pair.a ? "lora_A [r][in]" : "lora_B [out][r]", " of ", A(module.path),
                         " with r = ", ac.rank, " from adapter_config.json)"));
      }
    }
    const auto error_a = [&](absl::StatusCode code, std::string_view problem) {
      return absl::Status(code,
                          absl::StrCat(weights_path, ": tensor ", pair.a->name, " ", A(problem)));
    };
    const auto error_b = [&](absl::StatusCode code, std::string_view problem) {
      return absl::Status(code,
                          absl::StrCat(weights_path, ": tensor ", pair.b->name, " ", A(problem)));
    };
    for (const TensorView* t : {pair.a, pair.b}) {
      if (!t->is_float()) {
        return absl::InvalidArgumentError(absl::StrCat(
            weights_path, ": tensor ", t->name, " has dtype ",
            std::string(StorageTypeName(t->type)), " (LoRA factors are F32, F16 or BF16)"));
      }
    }
    ASSIGN_OR_RETURN(std::vector<float> a, ReadFloats(*pair.a, 1.0, error_a));
    ASSIGN_OR_RETURN(const std::vector<float> b, ReadFloats(*pair.b, adapter.scale, error_b));
    adapter.num_parameters += pair.a->numel() + pair.b->numel();
    // B's rows split as the fused base matrix's do ([q; k; v], [gate; up]); A is shared.
    int64_t row = 0;
    for (size_t i = 0; i < module.targets.size(); ++i) {
      const LoraTarget t = module.targets[i];
      LoraMatrix& m = adapter.layers[key.first].m[static_cast<int32_t>(t)];
      m.rank = ac.rank;
      m.in = in;
      m.out = LoraTargetShape(config, t).first;
      m.a = i + 1 == module.targets.size() ? std::move(a) : a;
      m.b.assign(b.begin() + row * ac.rank, b.begin() + (row + m.out) * ac.rank);
      row += m.out;
      adapted[static_cast<int32_t>(t)] = true;
    }
  }
  for (int32_t t = 0; t < kNumLoraTargets; ++t) {
    if (adapted[t]) adapter.target_modules.emplace_back(kTargetNames[t]);
  }
  return adapter;
}

}  // namespace kvrm
