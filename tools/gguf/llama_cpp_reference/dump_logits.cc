// llama.cpp's own forward pass over a GGUF file, for //tests:llama_cpp_interop_test: tokenizes a
// prompt with the file's tokenizer (BOS as the file says), decodes it in one batch with every
// position's logits kept, then `steps` greedy tokens one at a time, and writes
//   "KVLL", int32 n, int32 vocab, int32 prompt_tokens, n int32 token ids,
//   n x vocab f32 logits (row i: after token i)
// little-endian. Not built by Bazel: it links llama.cpp's libllama (README.md).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "llama.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s MODEL.gguf PROMPT STEPS OUT\n", argv[0]);
    return 2;
  }
  const std::string prompt = argv[2];
  const int steps = std::atoi(argv[3]);
  llama_backend_init();
  llama_model_params mp = llama_model_default_params();
  llama_model* model = llama_model_load_from_file(argv[1], mp);
  if (model == nullptr) return 1;
  const llama_vocab* vocab = llama_model_get_vocab(model);
  const int n_vocab = llama_vocab_n_tokens(vocab);
  std::vector<llama_token> tokens(prompt.size() + 8);
  const int n_prompt = llama_tokenize(vocab, prompt.data(), static_cast<int32_t>(prompt.size()),
                                      tokens.data(), static_cast<int32_t>(tokens.size()),
                                      /*add_special=*/true, /*parse_special=*/false);
  if (n_prompt <= 0) return 1;
  tokens.resize(n_prompt);
  llama_context_params cp = llama_context_default_params();
  cp.n_ctx = 512;
  cp.n_batch = 512;
  cp.n_threads = cp.n_threads_batch = 2;
  cp.type_k = GGML_TYPE_F32;  // kvrm's f32 KV pool: no f16 rounding of K and V
  cp.type_v = GGML_TYPE_F32;
  cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_DISABLED;
  llama_context* ctx = llama_init_from_model(model, cp);
  if (ctx == nullptr) return 1;
  std::vector<float> logits;
  llama_batch batch = llama_batch_init(n_prompt, 0, 1);
  for (int i = 0; i < n_prompt; ++i) {
    batch.token[i] = tokens[i];
    batch.pos[i] = i;
    batch.n_seq_id[i] = 1;
    batch.seq_id[i][0] = 0;
    batch.logits[i] = 1;
  }
  batch.n_tokens = n_prompt;
  if (llama_decode(ctx, batch) != 0) return 1;
  for (int i = 0; i < n_prompt; ++i) {
    const float* row = llama_get_logits_ith(ctx, i);
    logits.insert(logits.end(), row, row + n_vocab);
  }
  llama_batch_free(batch);
  for (int s = 0; s < steps; ++s) {
    const float* last = logits.data() + logits.size() - n_vocab;
    llama_token next = 0;
    for (int v = 1; v < n_vocab; ++v) {
      if (last[v] > last[next]) next = v;
    }
    tokens.push_back(next);
    llama_batch one = llama_batch_get_one(&tokens.back(), 1);
    if (llama_decode(ctx, one) != 0) return 1;
    const float* row = llama_get_logits_ith(ctx, -1);
    logits.insert(logits.end(), row, row + n_vocab);
  }
  FILE* f = std::fopen(argv[4], "wb");
  if (f == nullptr) return 1;
  const int32_t n = static_cast<int32_t>(tokens.size()), nv = n_vocab, np = n_prompt;
  std::fwrite("KVLL", 1, 4, f);
  std::fwrite(&n, 4, 1, f);
  std::fwrite(&nv, 4, 1, f);
  std::fwrite(&np, 4, 1, f);
  std::fwrite(tokens.data(), 4, tokens.size(), f);
  std::fwrite(logits.data(), 4, logits.size(), f);
  std::fclose(f);
  std::printf("%d prompt tokens, %d generated:", n_prompt, steps);
  for (llama_token t : tokens) std::printf(" %d", t);
  std::printf("\n");
  llama_free(ctx);
  llama_model_free(model);
  llama_backend_free();
  return 0;
}
