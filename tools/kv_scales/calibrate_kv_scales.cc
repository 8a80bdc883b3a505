// calibrate_kv_scales: static FP8 KV cache scales for a Hugging Face checkpoint that has none.
//
//   bazel run //tools/kv_scales:calibrate_kv_scales -- --model_dir=DIR [--texts=FILE]
//       [--format=fp8|fp8_e5m2] [--max_tokens=N] [--dry_run] [--json=FILE]
//
// Runs the calibration text (built-in, or FILE's paragraphs, separated by blank lines) through
// the CPU engine with an f32 cache, takes each layer's largest |key| and |value|, and writes
// amax / 448 (E4M3; 57344 for E5M2) as model.layers.N.self_attn.k_scale / v_scale into the
// checkpoint, where kvrmd --kv_dtype=fp8 reads them. Prints the per-layer table.
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/json.h"
#include "runtime/kv_pool.h"
#include "runtime/model_bundle.h"
#include "tools/kv_scales/kv_scales.h"

ABSL_FLAG(std::string, model_dir, "", "the Hugging Face model directory (written in place)");
ABSL_FLAG(std::string, texts, "",
          "calibration text: a file of paragraphs separated by blank lines (default: built-in "
          "prose, dialogue, code, numbers and other scripts)");
ABSL_FLAG(std::string, format, "fp8", "the cache's FP8 format: fp8 (= fp8_e4m3) or fp8_e5m2");
ABSL_FLAG(int32_t, max_tokens, 0, "tokens of each text at most (0: the model's context)");
ABSL_FLAG(int32_t, threads, 2, "CPU threads");
ABSL_FLAG(bool, dry_run, false, "print the scales, write nothing");
ABSL_FLAG(std::string, json, "", "also write the table to this JSON file");

namespace kvrm {
namespace {

absl::StatusOr<std::vector<std::string>> ReadTexts(const std::string& path) {
  if (path.empty()) return DefaultCalibrationTexts();
  std::ifstream f(path);
  if (!f) return absl::NotFoundError(absl::StrCat("--texts=", path, ": cannot read"));
  std::stringstream all;
  all << f.rdbuf();
  std::vector<std::string> texts;
  for (absl::string_view p : absl::StrSplit(all.str(), "\n\n", absl::SkipWhitespace())) {
    texts.emplace_back(absl::StripAsciiWhitespace(p));
  }
  if (texts.empty()) return absl::InvalidArgumentError(absl::StrCat("--texts=", path, ": empty"));
  return texts;
}

int Run() {
  const std::string dir = absl::GetFlag(FLAGS_model_dir);
  if (dir.empty()) {
    std::fprintf(stderr, "calibrate_kv_scales: --model_dir is required\n");
    return 2;
  }
  KvScaleOptions options;
  absl::StatusOr<DType> format = ParseKvDtype(absl::GetFlag(FLAGS_format));
  if (!format.ok() || !IsFp8(*format)) {
    std::fprintf(stderr, "calibrate_kv_scales: --format=%s: fp8, fp8_e4m3 or fp8_e5m2\n",
                 absl::GetFlag(FLAGS_format).c_str());
    return 2;
  }
  options.format = *format;
  options.threads = absl::GetFlag(FLAGS_threads);
  absl::StatusOr<std::unique_ptr<ModelBundle>> model = ModelBundle::Load(dir);
  if (!model.ok()) {
    std::fprintf(stderr, "calibrate_kv_scales: %s\n", model.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<std::vector<std::string>> texts = ReadTexts(absl::GetFlag(FLAGS_texts));
  if (!texts.ok()) {
    std::fprintf(stderr, "calibrate_kv_scales: %s\n", texts.status().ToString().c_str());
    return 2;
  }
  const int32_t context = (*model)->config.max_position_embeddings;
  const int32_t cap = absl::GetFlag(FLAGS_max_tokens) > 0
                          ? std::min(absl::GetFlag(FLAGS_max_tokens), context)
                          : context;
  std::vector<std::vector<int32_t>> sequences;
  for (const std::string& t : *texts) {
    absl::StatusOr<std::vector<int32_t>> ids = (*model)->tokenizer->Encode(t, true);
    if (!ids.ok()) {
      std::fprintf(stderr, "calibrate_kv_scales: %s\n", ids.status().ToString().c_str());
      return 1;
    }
    if (static_cast<int32_t>(ids->size()) > cap) ids->resize(cap);
    if (!ids->empty()) sequences.push_back(std::move(*ids));
  }
  absl::StatusOr<KvScaleCalibration> c = CalibrateKvScales(**model, sequences, options);
  if (!c.ok()) {
    std::fprintf(stderr, "calibrate_kv_scales: %s\n", c.status().ToString().c_str());
    return 1;
  }
  std::printf("%lld texts, %lld tokens; scale = amax / %g (%s)\n\n",
              static_cast<long long>(c->sequences), static_cast<long long>(c->tokens),
              static_cast<double>(Fp8MaxFinite(options.format)),
              std::string(DTypeName(options.format)).c_str());
  std::printf("%5s %12s %12s %12s %12s\n", "layer", "amax |k|", "amax |v|", "k_scale", "v_scale");
  Json rows = Json::array();
  for (size_t l = 0; l < c->amax.size(); ++l) {
    std::printf("%5zu %12.5g %12.5g %12.5g %12.5g\n", l, c->amax[l].first, c->amax[l].second,
                c->scales[l].first, c->scales[l].second);
    rows.push_back({{"layer", l},
                    {"amax_k", c->amax[l].first},
                    {"amax_v", c->amax[l].second},
                    {"k_scale", c->scales[l].first},
                    {"v_scale", c->scales[l].second}});
  }
  if (const std::string json = absl::GetFlag(FLAGS_json); !json.empty()) {
    std::ofstream(json) << Json{{"model_dir", dir},
                                {"format", std::string(DTypeName(options.format))},
                                {"texts", c->sequences},
                                {"tokens", c->tokens},
                                {"layers", rows}}
                               .dump(2)
                        << "\n";
  }
  if (absl::GetFlag(FLAGS_dry_run)) return 0;
  if (absl::Status s = WriteKvScales(**model, *c); !s.ok()) {
    std::fprintf(stderr, "calibrate_kv_scales: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("\nwrote %d layers' k_scale / v_scale into %s\n", (*model)->config.num_hidden_layers,
              dir.c_str());
  return 0;
}

}  // namespace
}  // namespace kvrm

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return kvrm::Run();
}
