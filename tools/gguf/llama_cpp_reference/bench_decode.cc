// llama.cpp's own single-stream decode speed on a GGUF file, beside kvrm's
// (bench/cpu_decode_bench --dtypes=file:PATH --slots=1): for each history length, that many
// random tokens are prefilled in one batch, then `steps` tokens are decoded one at a time (the
// greedy token of each, as a chat's decode does), timed; the best of `windows` runs is kept, as
// cpu_decode_bench keeps its fastest window. f32 K and V (kvrm's default pool), no flash
// attention, `threads` threads. Prints one line per history length: "context N: X ms/token".
// Not built by Bazel: it links llama.cpp's libllama (README.md).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "llama.h"

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s MODEL.gguf CONTEXTS(a,b) STEPS WINDOWS THREADS\n", argv[0]);
    return 2;
  }
  std::vector<int> contexts;
  for (char* p = argv[2]; *p != 0;) {
    contexts.push_back(static_cast<int>(std::strtol(p, &p, 10)));
    if (*p == ',') ++p;
  }
  const int steps = std::atoi(argv[3]), windows = std::atoi(argv[4]), threads = std::atoi(argv[5]);
  llama_log_set([](ggml_log_level, const char*, void*) {}, nullptr);
  llama_backend_init();
  llama_model* model = llama_model_load_from_file(argv[1], llama_model_default_params());
  if (model == nullptr) return 1;
  const int vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
  std::mt19937 rng(7);
  for (int context : contexts) {
    double best = 1e30;
    for (int w = 0; w < windows; ++w) {
      llama_context_params cp = llama_context_default_params();
      cp.n_ctx = context + steps + 16;
      cp.n_batch = cp.n_ubatch = 512;
      cp.n_threads = cp.n_threads_batch = threads;
      cp.type_k = GGML_TYPE_F32;
      cp.type_v = GGML_TYPE_F32;
      cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
      llama_context* ctx = llama_init_from_model(model, cp);
      if (ctx == nullptr) return 1;
      std::vector<llama_token> prompt(context);
      for (llama_token& t : prompt) t = static_cast<llama_token>(rng() % vocab);
      for (int at = 0; at < context; at += 512) {
        const int n = std::min(512, context - at);
        if (llama_decode(ctx, llama_batch_get_one(prompt.data() + at, n)) != 0) return 1;
      }
      llama_token next = static_cast<llama_token>(rng() % vocab);
      // Two warm-up steps, then the timed ones.
      std::chrono::steady_clock::time_point t0;
      for (int s = 0; s < steps + 2; ++s) {
        if (s == 2) t0 = std::chrono::steady_clock::now();
        if (llama_decode(ctx, llama_batch_get_one(&next, 1)) != 0) return 1;
        const float* logits = llama_get_logits_ith(ctx, -1);
        llama_token arg = 0;
        for (int v = 1; v < vocab; ++v) {
          if (logits[v] > logits[arg]) arg = v;
        }
        next = arg;
      }
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
          steps;
      best = std::min(best, ms);
      llama_free(ctx);
    }
    std::printf("context %d: %.3f ms/token\n", context, best);
  }
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
