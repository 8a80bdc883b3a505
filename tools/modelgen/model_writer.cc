#include "tools/modelgen/model_writer.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/json.h"
#include "common/status_macros.h"
#include "model/safetensors_writer.h"
#include "tools/modelgen/hf_config.h"
#include "tools/modelgen/pretokenizer.h"
#include "tools/modelgen/prng.h"
#include "tools/modelgen/synthetic_corpus.h"
#include "tools/modelgen/tokenizer_json.h"
#include "tools/modelgen/weight_init.h"

namespace kvrm::modelgen {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

absl::Status WriteTextFile(const std::filesystem::path& path, const std::string& text) {
  return WriteFileAtomically(path.string(), text);
}

// The files an earlier generation into `dir` may have left: config.json first (with it gone the
// directory no longer reads as a finished model while this one is written), and every weights
// file of either layout, so that a single file written now is not shadowed by old shards (or
// the reverse) with a different seed or dtype.
absl::Status RemoveEarlierModel(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::remove(dir / "config.json", ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot remove ", (dir / "config.json").string()));
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (name == "model.safetensors" || name == "model.safetensors.index.json" ||
        (absl::StartsWith(name, "model-") && absl::EndsWith(name, ".safetensors"))) {
      std::filesystem::remove(entry.path(), ec);
      if (ec) return absl::InternalError(absl::StrCat("cannot remove ", entry.path().string()));
    }
  }
  if (ec) return absl::InternalError(absl::StrCat("cannot list ", dir.string(), ": ", ec.message()));
  return absl::OkStatus();
}

// Generates every tensor on `threads` workers. Each tensor's values depend only on (seed,
// name), so the bytes are the same whatever the thread count or scheduling.
std::vector<std::vector<std::byte>> GenerateWeights(const std::vector<TensorPlan>& plans,
                                                    uint64_t seed, DType dtype, int threads) {
  std::vector<std::vector<std::byte>> buffers(plans.size());
  // Largest first, so the last tensor a worker picks up is small.
  std::vector<size_t> order(plans.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return plans[a].numel() > plans[b].numel(); });
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t k = next++; k < order.size(); k = next++) {
      const TensorPlan& plan = plans[order[k]];
      std::vector<std::byte>& buf = buffers[order[k]];
      buf.resize(static_cast<size_t>(plan.numel()) * DTypeSize(dtype));
      FillTensor(plan, seed, dtype, buf.data());
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::max(1, threads); ++t) pool.emplace_back(worker);
  worker();
  for (std::thread& t : pool) t.join();
  return buffers;
}

}  // namespace

absl::StatusOr<BpeModel> TrainModelTokenizer(const ModelSpec& spec, uint64_t seed) {
  const int num_merges = spec.vocab_size - 256 - static_cast<int>(kSpecialTokens.size());
  if (num_merges < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("vocab_size ", spec.vocab_size, " is below 256 bytes + special tokens"));
  }
  const std::string corpus =
      BuildSyntheticCorpus(CorpusOptionsForMerges(DeriveSeed(seed, "corpus"), num_merges));
  ASSIGN_OR_RETURN(std::unique_ptr<PreTokenizer> pre, PreTokenizer::Create());
  WordCounts counts;
  pre->Count(corpus, &counts);
  return TrainBpe(counts, BpeTrainerOptions{.num_merges = num_merges, .min_frequency = 2});
}

absl::StatusOr<MakeModelSummary> MakeModel(const MakeModelOptions& options) {
  const Clock::time_point start = Clock::now();
  ASSIGN_OR_RETURN(const ModelSpec spec, FindModelSpec(options.size));
  if (options.out_dir.empty()) return absl::InvalidArgumentError("--out is required");
  if (options.shards < 1) return absl::InvalidArgumentError("--shards must be >= 1");
  std::error_code ec;
  std::filesystem::create_directories(options.out_dir, ec);
  if (ec) {
    return absl::InternalError(absl::StrCat("cannot create ", options.out_dir, ": ", ec.message()));
  }
  const std::filesystem::path dir(options.out_dir);
  RETURN_IF_ERROR(RemoveEarlierModel(dir));
  MakeModelSummary summary;
  summary.spec = spec;

  // The tokenizer trains on one thread while the weights are generated on the others.
  absl::StatusOr<BpeModel> bpe;
  std::thread tokenizer_thread([&] {
    const Clock::time_point t0 = Clock::now();
    bpe = TrainModelTokenizer(spec, options.seed);
    summary.tokenizer_seconds = Seconds(t0);
  });
  const Clock::time_point t0 = Clock::now();
  const std::vector<TensorPlan> plans = PlanTensors(spec);
  const std::vector<std::vector<std::byte>> buffers =
      GenerateWeights(plans, options.seed, options.dtype, options.threads);
  summary.weights_seconds = Seconds(t0);
  tokenizer_thread.join();
  if (!bpe.ok()) return bpe.status();

  std::vector<TensorToWrite> tensors;
  for (size_t i = 0; i < plans.size(); ++i) {
    tensors.push_back({plans[i].name, options.dtype, plans[i].shape, buffers[i]});
    summary.parameters += plans[i].numel();
    summary.weight_bytes += static_cast<int64_t>(buffers[i].size());
  }
  RETURN_IF_ERROR(WriteSafetensorsSharded(dir.string(), tensors, options.shards));

  SpecialIds ids;
  ids.bos = SpecialTokenId(*bpe, kBosIndex);
  ids.eos = {SpecialTokenId(*bpe, kEosIndex), SpecialTokenId(*bpe, kEotIndex)};
  ids.pad = SpecialTokenId(*bpe, kPadIndex);
  RETURN_IF_ERROR(
      WriteTextFile(dir / "generation_config.json", BuildGenerationConfigJson(ids)));
  RETURN_IF_ERROR(WriteTextFile(dir / "tokenizer.json", BuildTokenizerJson(*bpe)));
  RETURN_IF_ERROR(WriteTextFile(dir / "tokenizer_config.json",
                                BuildTokenizerConfigJson(*bpe, spec.max_position_embeddings)));
  // Last: its presence says the directory is complete (kvrmd's builtin: cache checks for it).
  RETURN_IF_ERROR(WriteTextFile(dir / "config.json", BuildConfigJson(spec, options.dtype, ids)));
  summary.num_merges = static_cast<int>(bpe->merges.size());
  summary.total_seconds = Seconds(start);
  return summary;
}

absl::StatusOr<bool> UpgradeModelDir(const std::string& dir) {
  const std::filesystem::path path = std::filesystem::path(dir) / "tokenizer_config.json";
  ASSIGN_OR_RETURN(Json config, ReadJsonFile(path.string()));
  if (!config.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path.string(), ": expected a JSON object"));
  }
  // No template (written before chat support), or the built-in one from before tools.
  if (config.contains("chat_template") &&
      !(config["chat_template"].is_string() &&
        config["chat_template"].get<std::string>() == kChatTemplateV1)) {
    return false;
  }
  config["chat_template"] = std::string(kChatTemplate);
  // Written beside and renamed over, so a reader never sees half a file.
  const std::filesystem::path tmp = path.string() + ".tmp";
  RETURN_IF_ERROR(WriteTextFile(tmp, config.dump(2) + "\n"));
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) return absl::InternalError(absl::StrCat(path.string(), ": ", ec.message()));
  return true;
}

}  // namespace kvrm::modelgen
