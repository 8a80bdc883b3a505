// How far from the full computation far-history summaries take a model (docs/runtime.md, "Far-
// history summaries"). One long prompt, prefilled in chunks and then decoded greedily, on two CPU
// backends: exact (off) and far history on, for each window. Reported per window:
//   - teacher-forced: both backends read the same tokens (the exact run's greedy continuation);
//     top-1 agreement of their logits, max |far - exact| / max |exact| per step, KL(exact || far);
//   - free-running: each backend feeds back its own greedy tokens; tokens identical before the
//     first divergence, and the share of positions with identical tokens.
// The far backend is driven as the engine drives it (runtime/far_history.h): after each chunk or
// step, the summarized blocks leave the run table.
//
//   bazel run //bench:far_history_quality -- --size=small --prompt=2048 --windows=256,512,1024
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "common/logging.h"
#include "kernels/cpu/matmul.h"
#include "runtime/backend.h"
#include "runtime/cpu_backend.h"
#include "runtime/far_history.h"
#include "runtime/model_bundle.h"
#include "tools/modelgen/model_writer.h"

ABSL_FLAG(std::string, model, "",
          "a Hugging Face model directory to measure (default: generate --size, bf16)");
ABSL_FLAG(std::string, size, "small", "generated model shape (tools/modelgen): tiny or small");
ABSL_FLAG(std::string, model_dir, "", "where the bf16 model is generated (default: a temp dir)");
ABSL_FLAG(int32_t, prompt, 2048, "prompt tokens");
ABSL_FLAG(std::string, prompt_file, "",
          "text to tokenize (repeated up to --prompt tokens); default: random token ids");
ABSL_FLAG(int32_t, steps, 128, "greedy decode steps after the prompt");
ABSL_FLAG(int32_t, sinks, 16, "far history: sink tokens");
ABSL_FLAG(std::string, windows, "256,512,1024", "far history: window tokens to compare");
ABSL_FLAG(int32_t, block_tokens, 16, "KV block tokens");
ABSL_FLAG(int32_t, chunk, 256, "prefill chunk tokens");
ABSL_FLAG(int32_t, threads, 2, "CPU threads");
ABSL_FLAG(uint32_t, seed, 7, "seed of the random prompt");

namespace kvrm {
namespace {

int32_t ArgMax(const float* x, int64_t n) {
  return static_cast<int32_t>(std::max_element(x, x + n) - x);
}

// KL(p || q) of the softmaxes of logits a (p) and b (q), in nats.
double Kl(const float* a, const float* b, int64_t n) {
  const double ma = *std::max_element(a, a + n), mb = *std::max_element(b, b + n);
  double za = 0, zb = 0;
  for (int64_t i = 0; i < n; ++i) {
    za += std::exp(a[i] - ma);
    zb += std::exp(b[i] - mb);
  }
  double kl = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double la = a[i] - ma - std::log(za), lb = b[i] - mb - std::log(zb);
    kl += std::exp(la) * (la - lb);
  }
  return kl;
}

// One slot on its own backend; its history at blocks [0, blocks) of the pool. With far history
// on, the run table lists what the engine's would: the sinks and the blocks from the first one
// not yet summarized (the summarized ones stay in the pool here, unlisted, which the attention
// cannot tell from freed).
class Runner {
 public:
  Runner(const ModelBundle& m, const FarHistoryShape& far, int32_t max_context)
      : far_(far), bt_(absl::GetFlag(FLAGS_block_tokens)), vocab_(m.config.vocab_size) {
    CpuBackendOptions o;
    o.kv_block_tokens = bt_;
    o.kv_blocks = (max_context + bt_ - 1) / bt_;
    o.max_slots = 1;
    o.max_chunk_tokens = absl::GetFlag(FLAGS_chunk);
    o.max_context = max_context;
    o.num_threads = absl::GetFlag(FLAGS_threads);
    o.far_history = far;
    auto backend = CpuBackend::Create(m.config, &m.weights, o);
    CHECK_OK(backend.status());
    backend_ = std::move(*backend);
    blocks_ = static_cast<int32_t>(o.kv_blocks);
    step_.Resize(1, 2);
    step_.far = far;
    step_.active[0] = 1;
    logits_.resize(vocab_);
  }

  // Prefills `prompt`; returns the logits after its last token.
  const std::vector<float>& Prefill(const std::vector<int32_t>& prompt) {
    const int32_t chunk = absl::GetFlag(FLAGS_chunk);
    const int32_t n = static_cast<int32_t>(prompt.size());
    for (int32_t start = 0; start < n; start += chunk) {
      const int32_t len = std::min(chunk, n - start);
      PrefillChunk pc{0, start, absl::MakeConstSpan(prompt).subspan(start, len), nullptr, 0};
      pc.far = far_;
      pc.far_dropped = Dropped(start);
      pc.num_runs = KeptRuns(pc.far_dropped, runs_);
      pc.runs = runs_;
      CHECK_OK(backend_->Prefill(pc, start + len == n ? logits_.data() : nullptr));
    }
    return logits_;
  }

  // Decodes `token` at `position`; returns the logits.
  const std::vector<float>& Decode(int32_t token, int32_t position) {
    step_.position[0] = position;
    step_.token[0] = token;
    step_.far_dropped[0] = Dropped(position);
    step_.far_summaries[0] = far_.SummariesAt(position, bt_);
    step_.num_runs[0] = KeptRuns(step_.far_dropped[0], step_.SlotRuns(0).data());
    CHECK_OK(backend_->Decode(step_, logits_.data()));
    return logits_;
  }

 private:
  // Blocks already freed when position `pos` is processed: those of the summaries position
  // pos - 1 read (the engine frees them after that step or chunk).
  int32_t Dropped(int32_t pos) const { return pos == 0 ? 0 : far_.SummariesAt(pos - 1, bt_); }
  int32_t KeptRuns(int32_t dropped, KvRun* runs) const {
    if (dropped == 0) {
      runs[0] = KvRun{0, blocks_};
      return 1;
    }
    int32_t n = 0;
    if (far_.sink_blocks > 0) runs[n++] = KvRun{0, far_.sink_blocks};
    const int32_t first = far_.sink_blocks + dropped;
    runs[n++] = KvRun{first, blocks_ - first};
    return n;
  }

  const FarHistoryShape far_;
  const int32_t bt_;
  const int64_t vocab_;
  std::unique_ptr<CpuBackend> backend_;
  int32_t blocks_ = 0;
  KvRun runs_[2];
  StepDescriptor step_;
  std::vector<float> logits_;
};

std::vector<int32_t> MakePrompt(const ModelBundle& m, int32_t n) {
  std::vector<int32_t> prompt;
  const std::string file = absl::GetFlag(FLAGS_prompt_file);
  if (!file.empty()) {
    std::ifstream in(file);
    CHECK(in) << "cannot read " << file;
    std::stringstream text;
    text << in.rdbuf();
    absl::StatusOr<std::vector<int32_t>> ids = m.tokenizer->Encode(text.str(), true);
    CHECK_OK(ids.status());
    CHECK(!ids->empty()) << file << " has no tokens";
    while (static_cast<int32_t>(prompt.size()) < n) {
      prompt.insert(prompt.end(), ids->begin(), ids->end());
    }
  } else {
    std::mt19937 rng(absl::GetFlag(FLAGS_seed));
    std::uniform_int_distribution<int32_t> dist(0, m.config.vocab_size - 1);
    for (int32_t i = 0; i < n; ++i) prompt.push_back(dist(rng));
  }
  prompt.resize(n);
  return prompt;
}

int Main() {
  SetActiveCpuIsa(AvailableCpuIsas().back());
  std::string dir = absl::GetFlag(FLAGS_model_dir);
  if (dir.empty()) {
    dir = (std::filesystem::temp_directory_path() / "kvrm_far_history_quality").string();
  }
  modelgen::MakeModelOptions mo;
  mo.size = absl::GetFlag(FLAGS_size);
  mo.dtype = DType::kBF16;
  mo.out_dir = (std::filesystem::path(dir) / mo.size).string();
  mo.threads = absl::GetFlag(FLAGS_threads);
  std::string model_dir = absl::GetFlag(FLAGS_model);
  if (model_dir.empty()) {
    model_dir = mo.out_dir;
    if (!std::filesystem::exists(std::filesystem::path(mo.out_dir) / "config.json")) {
      std::printf("generating the %s bf16 model in %s...\n", mo.size.c_str(), mo.out_dir.c_str());
      CHECK_OK(modelgen::MakeModel(mo).status());
    }
  }
  absl::StatusOr<std::unique_ptr<ModelBundle>> loaded = ModelBundle::Load(model_dir);
  CHECK_OK(loaded.status());
  const ModelBundle& m = **loaded;
  const int32_t prompt_len = absl::GetFlag(FLAGS_prompt), steps = absl::GetFlag(FLAGS_steps);
  const int32_t max_context = prompt_len + steps + 1;
  CHECK(max_context <= m.config.max_position_embeddings) << "prompt + steps past the model";
  const int64_t vocab = m.config.vocab_size;
  const int32_t bt = absl::GetFlag(FLAGS_block_tokens);
  const std::vector<int32_t> prompt = MakePrompt(m, prompt_len);

  // The exact run: its greedy tokens are the teacher-forced inputs of every far run.
  std::vector<std::vector<float>> exact_logits;
  std::vector<int32_t> exact_tokens;
  {
    Runner exact(m, FarHistoryShape{}, max_context);
    exact_logits.push_back(exact.Prefill(prompt));
    for (int32_t k = 0; k < steps; ++k) {
      exact_tokens.push_back(ArgMax(exact_logits.back().data(), vocab));
      exact_logits.push_back(exact.Decode(exact_tokens.back(), prompt_len + k));
    }
  }
  std::printf("far-history quality: %s model (%s), %d-token %s prompt, %d greedy steps, "
              "%d sink tokens, %d-token blocks\n",
              m.name.c_str(), std::string(DTypeName(m.weights.dtype)).c_str(), prompt_len,
              absl::GetFlag(FLAGS_prompt_file).empty() ? "random" : "text", steps,
              absl::GetFlag(FLAGS_sinks), bt);
  // How varied the reference continuation is: a degenerate one (a repeated token) makes token
  // agreement easy and says little.
  std::vector<int32_t> distinct = exact_tokens;
  std::sort(distinct.begin(), distinct.end());
  distinct.erase(std::unique(distinct.begin(), distinct.end()), distinct.end());
  std::printf("exact greedy continuation: %zu distinct tokens in %d\n", distinct.size(), steps);
  std::printf("%8s %12s %10s %14s %14s %12s %14s %12s\n", "window", "summarized", "top1 agree",
              "max|dlogit|rel", "mean|dlogit|rel", "mean KL", "free-run same", "first diff");
  for (absl::string_view w : absl::StrSplit(absl::GetFlag(FLAGS_windows), ',', absl::SkipEmpty())) {
    FarHistoryOptions fo;
    fo.enabled = true;
    fo.sink_tokens = absl::GetFlag(FLAGS_sinks);
    CHECK(absl::SimpleAtoi(w, &fo.window_tokens)) << "bad window " << w;
    absl::StatusOr<FarHistoryShape> far = ResolveFarHistory(fo, bt);
    CHECK_OK(far.status());
    // Teacher-forced.
    int agree = 0;
    double max_rel = 0, sum_rel = 0, sum_kl = 0;
    {
      Runner r(m, *far, max_context);
      for (int32_t k = 0; k <= steps; ++k) {
        const std::vector<float>& got =
            k == 0 ? r.Prefill(prompt) : r.Decode(exact_tokens[k - 1], prompt_len + k - 1);
        const std::vector<float>& ref = exact_logits[k];
        double scale = 0, diff = 0;
        for (int64_t i = 0; i < vocab; ++i) {
          scale = std::max(scale, std::abs(static_cast<double>(ref[i])));
          diff = std::max(diff, std::abs(static_cast<double>(got[i]) - ref[i]));
        }
        const double rel = diff / std::max(1.0, scale);
        max_rel = std::max(max_rel, rel);
        sum_rel += rel;
        sum_kl += Kl(ref.data(), got.data(), vocab);
        agree += ArgMax(got.data(), vocab) == ArgMax(ref.data(), vocab);
      }
    }
    // Free-running.
    int same = 0, first_diff = -1;
    {
      Runner r(m, *far, max_context);
      int32_t token = ArgMax(r.Prefill(prompt).data(), vocab);
      for (int32_t k = 0; k < steps; ++k) {
        if (token == exact_tokens[k]) {
          ++same;
        } else if (first_diff < 0) {
          first_diff = k;
        }
        token = ArgMax(r.Decode(token, prompt_len + k).data(), vocab);
      }
    }
    const int32_t total_blocks = (max_context - 1 + bt - 1) / bt;
    const int32_t summarized = far->SummariesAt(max_context - 2, bt);
    const int rows = steps + 1;
    std::printf("%8d %5d/%-6d %9.1f%% %14.3g %14.3g %12.3g %13.1f%% %12s\n", fo.window_tokens,
                summarized, total_blocks, 100.0 * agree / rows, max_rel, sum_rel / rows,
                sum_kl / rows, 100.0 * same / steps,
                first_diff < 0 ? "none" : absl::StrCat(first_diff).c_str());
  }
  return 0;
}

}  // namespace
}  // namespace kvrm

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return kvrm::Main();
}
