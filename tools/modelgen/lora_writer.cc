#include "tools/modelgen/lora_writer.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/json.h"
#include "common/status_macros.h"
#include "model/lora.h"
#include "model/safetensors_writer.h"
#include "tools/modelgen/hf_config.h"
#include "tools/modelgen/model_spec.h"
#include "tools/modelgen/weight_init.h"

namespace kvrm::modelgen {
namespace {

constexpr int32_t kMaxRank = kMaxLoraRank;  // as model/lora.cc accepts

// One module the adapter may target: its PEFT name, parent, and the base matrix's [out][in]
// (a fused module's rows are its targets' rows stacked), from the loader's LoraModulesOf.
struct Module {
  std::string name;    // "q_proj"
  std::string parent;  // "self_attn" or "mlp"
  int64_t out = 0;
  int64_t in = 0;
};

std::vector<Module> ModulesOf(const LlamaConfig& c) {
  std::vector<Module> out;
  for (const LoraModule& m : LoraModulesOf(c)) {
    const size_t dot = m.path.find('.');
    Module& module = out.emplace_back();
    module.parent = std::string(m.path.substr(0, dot));
    module.name = std::string(m.path.substr(dot + 1));
    module.in = LoraTargetShape(c, m.targets[0]).second;
    for (LoraTarget t : m.targets) module.out += LoraTargetShape(c, t).first;
  }
  return out;
}

// The module a requested name means in this model (see MakeLoraOptions::target_modules).
std::string ResolveModule(const LlamaConfig& c, const std::string& name) {
  if (!c.fused_projections) return name;
  if (name == "q_proj" || name == "k_proj" || name == "v_proj") return "qkv_proj";
  if (name == "gate_proj" || name == "up_proj") return "gate_up_proj";
  return name;
}

// PEFT's LoraConfig as save_pretrained writes it (json.dumps(sort_keys=True, indent=2); Json's
// std::map keeps the keys sorted). lora_alpha is an integer when it is one, as PEFT's usually is.
std::string BuildAdapterConfigJson(const MakeLoraOptions& o,
                                   const std::vector<std::string>& modules,
                                   const std::vector<int32_t>& layers) {
  Json c;
  c["alpha_pattern"] = Json::object();
  c["auto_mapping"] = nullptr;
  c["base_model_name_or_path"] = o.base_model;
  c["bias"] = "none";
  c["fan_in_fan_out"] = false;
  c["inference_mode"] = true;
  c["init_lora_weights"] = true;
  c["layers_pattern"] = nullptr;
  c["layers_to_transform"] = layers.empty() ? Json(nullptr) : Json(layers);
  if (o.alpha == std::floor(o.alpha) && o.alpha < 1e15) {
    c["lora_alpha"] = static_cast<int64_t>(o.alpha);
  } else {
    c["lora_alpha"] = o.alpha;
  }
  c["lora_dropout"] = 0.0;
  c["modules_to_save"] = nullptr;
  c["peft_type"] = "LORA";
  c["r"] = o.rank;
  c["rank_pattern"] = Json::object();
  c["revision"] = nullptr;
  c["target_modules"] = modules;
  c["task_type"] = "CAUSAL_LM";
  c["use_dora"] = false;
  c["use_rslora"] = o.use_rslora;
  return c.dump(2) + "\n";
}

}  // namespace

absl::Status MakeLoraAdapter(const LlamaConfig& config, const MakeLoraOptions& options) {
  if (options.out_dir.empty()) return absl::InvalidArgumentError("the adapter's out_dir is empty");
  if (options.rank < 1 || options.rank > kMaxRank) {
    return absl::InvalidArgumentError(
        absl::StrCat("LoRA rank ", options.rank, " must be in [1, ", kMaxRank, "]"));
  }
  if (!std::isfinite(options.alpha) || options.alpha <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("LoRA alpha ", options.alpha, " must be a finite number > 0"));
  }
  const std::vector<Module> all = ModulesOf(config);
  std::set<std::string> wanted;
  for (const std::string& name : options.target_modules) {
    const std::string module = ResolveModule(config, name);
    if (std::none_of(all.begin(), all.end(), [&](const Module& m) { return m.name == module; })) {
      std::vector<std::string> known;
      for (const Module& m : all) known.push_back(m.name);
      return absl::InvalidArgumentError(
          absl::StrCat("LoRA target module \"", name, "\" is not a projection of this model (",
                       config.model_type, ": ", absl::StrJoin(known, ", "), ")"));
    }
    wanted.insert(module);
  }
  if (wanted.empty()) return absl::InvalidArgumentError("no LoRA target modules");
  std::vector<Module> modules;
  std::vector<std::string> module_names;
  for (const Module& m : all) {
    if (wanted.count(m.name) != 0) {
      modules.push_back(m);
      module_names.push_back(m.name);
    }
  }
  std::vector<int32_t> layers = options.layers;
  std::sort(layers.begin(), layers.end());
  layers.erase(std::unique(layers.begin(), layers.end()), layers.end());
  for (int32_t l : layers) {
    if (l < 0 || l >= config.num_hidden_layers) {
      return absl::InvalidArgumentError(absl::StrCat("LoRA layer ", l, " is outside the model's ",
                                                     config.num_hidden_layers, " layers"));
    }
  }
  std::vector<int32_t> adapted = layers;
  if (adapted.empty()) {
    for (int32_t l = 0; l < config.num_hidden_layers; ++l) adapted.push_back(l);
  }

  const double r = options.rank;
  const double scale = options.use_rslora ? options.alpha / std::sqrt(r) : options.alpha / r;
  const double b_std = kLoraRelativeRms / (scale * std::sqrt(r));
  std::vector<TensorPlan> plans;
  for (int32_t l : adapted) {
    for (const Module& m : modules) {
      const std::string prefix =
          absl::StrCat("base_model.model.model.layers.", l, ".", m.parent, ".", m.name, ".");
      plans.push_back({prefix + "lora_A.weight",
                       {options.rank, m.in},
                       0.0,
                       1.0 / std::sqrt(static_cast<double>(m.in))});
      plans.push_back({prefix + "lora_B.weight", {m.out, options.rank}, 0.0, b_std});
    }
  }
  std::vector<std::vector<std::byte>> buffers(plans.size());
  std::vector<TensorToWrite> tensors;
  for (size_t i = 0; i < plans.size(); ++i) {
    buffers[i].resize(static_cast<size_t>(plans[i].numel()) * DTypeSize(options.dtype));
    FillTensor(plans[i], options.seed, options.dtype, buffers[i].data());
    tensors.push_back({plans[i].name, options.dtype, plans[i].shape, buffers[i]});
  }

  const std::filesystem::path dir(options.out_dir);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot create ", dir.string(), ": ", ec.message()));
  }
  // The config last: an earlier adapter's is removed first, so a generation killed part way
  // leaves no directory that reads as a complete adapter with mismatched halves.
  std::filesystem::remove(dir / "adapter_config.json", ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("cannot remove ", (dir / "adapter_config.json").string()));
  }
  RETURN_IF_ERROR(
      WriteSafetensors((dir / "adapter_model.safetensors").string(), tensors, {{"format", "pt"}}));
  return WriteFileAtomically((dir / "adapter_config.json").string(),
                             BuildAdapterConfigJson(options, module_names, layers));
}

absl::StatusOr<LlamaConfig> LlamaConfigForSize(std::string_view size) {
  ASSIGN_OR_RETURN(const ModelSpec spec, FindModelSpec(size));
  return ParseLlamaConfig(BuildConfigJson(spec, DType::kBF16, SpecialIds{}),
                          absl::StrCat("make_model size ", std::string(size)));
}

}  // namespace kvrm::modelgen
