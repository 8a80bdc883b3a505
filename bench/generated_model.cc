#include "bench/generated_model.h"

#include <algorithm>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "tools/modelgen/model_writer.h"

namespace kvrm::bench {

absl::StatusOr<std::unique_ptr<ModelBundle>> LoadGeneratedModel(const std::string& dir,
                                                                 const std::string& size,
                                                                 const std::string& name) {
  const std::string root =
      dir.empty() ? (std::filesystem::temp_directory_path() / name).string() : dir;
  const std::string at = absl::StrCat(root, "/", size);
  if (!std::filesystem::exists(at + "/config.json")) {
    modelgen::MakeModelOptions mo;
    mo.size = size;
    mo.out_dir = at;
    mo.threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    RETURN_IF_ERROR(modelgen::MakeModel(mo).status());
  }
  return ModelBundle::Load(at);
}

}  // namespace kvrm::bench
