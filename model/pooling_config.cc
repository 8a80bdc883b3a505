#include "model/pooling_config.h"

#include <filesystem>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/json.h"
#include "common/status_macros.h"

namespace kvrm {
namespace {

absl::Status Invalid(const std::string& file, const std::string& why) {
  return absl::InvalidArgumentError(absl::StrCat(file, ": ", why));
}

}  // namespace

absl::StatusOr<std::optional<PoolingConfig>> LoadPoolingConfig(const std::string& dir) {
  const std::string modules_path = (std::filesystem::path(dir) / "modules.json").string();
  if (!std::filesystem::exists(modules_path)) return std::nullopt;
  ASSIGN_OR_RETURN(const Json modules, ReadJsonFile(modules_path));
  if (!modules.is_array()) return Invalid(modules_path, "not a list of modules");
  std::optional<std::string> pooling_dir;
  PoolingConfig config;
  for (size_t i = 0; i < modules.size(); ++i) {
    const Json& m = modules[i];
    const std::string at = absl::StrCat("[", i, "]");
    if (!m.is_object() || !m.contains("type") || !m["type"].is_string()) {
      return Invalid(modules_path, at + ".type: missing or not a string");
    }
    const std::string type = m["type"].get<std::string>();
    const std::string path =
        m.contains("path") && m["path"].is_string() ? m["path"].get<std::string>() : "";
    if (type == "sentence_transformers.models.Transformer") continue;
    if (type == "sentence_transformers.models.Pooling") {
      pooling_dir = path;
    } else if (type == "sentence_transformers.models.Normalize") {
      config.normalize = true;
    } else {
      return Invalid(modules_path, absl::StrCat(at, ".type: ", type,
                                                " is not computed by kvrm (Transformer, Pooling "
                                                "and Normalize are)"));
    }
  }
  if (!pooling_dir) return Invalid(modules_path, "no sentence_transformers.models.Pooling module");
  const std::string pooling_path =
      (std::filesystem::path(dir) / *pooling_dir / "config.json").string();
  ASSIGN_OR_RETURN(const Json p, ReadJsonFile(pooling_path));
  if (!p.is_object()) return Invalid(pooling_path, "not an object");
  const std::vector<std::pair<const char*, const char*>> modes = {
      {"pooling_mode_lasttoken", "last"},
      {"pooling_mode_mean_tokens", "mean"},
      {"pooling_mode_cls_token", "cls"},
      {"pooling_mode_max_tokens", nullptr},
      {"pooling_mode_mean_sqrt_len_tokens", nullptr},
      {"pooling_mode_weightedmean_tokens", nullptr},
  };
  for (const auto& [key, name] : modes) {
    if (!p.contains(key)) continue;
    if (!p[key].is_boolean()) return Invalid(pooling_path, absl::StrCat(key, ": not a boolean"));
    if (!p[key].get<bool>()) continue;
    if (name == nullptr) {
      return Invalid(pooling_path, absl::StrCat(key,
                                                ": this pooling is not computed by kvrm "
                                                "(last token, mean and cls are)"));
    }
    if (!config.pooling.empty()) {
      return Invalid(pooling_path,
                     absl::StrCat(key, ": a second pooling mode (after ", config.pooling, ")"));
    }
    config.pooling = name;
  }
  if (config.pooling.empty()) return Invalid(pooling_path, "no pooling_mode_* is true");
  // include_prompt false: an instruction's tokens are left out of the pool (INSTRUCTOR-style
  // models); kvrm pools every input token.
  if (p.contains("include_prompt") &&
      (!p["include_prompt"].is_boolean() || !p["include_prompt"].get<bool>())) {
    return Invalid(pooling_path, "include_prompt: only true (every token pooled) is computed");
  }
  config.source = pooling_path;
  return config;
}

}  // namespace kvrm
