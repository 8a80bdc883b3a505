// Fuzzes LoadLoraAdapter (model/lora.h) on arbitrary adapter directories: the input is
// adapter_config.json's text, a NUL byte, then adapter_model.safetensors' bytes, for a small
// fixed model. Whatever loads must be what the runtime may index without checks: every layer
// present, each adapted projection's rank within [1, kMaxLoraRank] with A [rank][in] and
// B [out][rank] of the base matrix's sizes, every value finite.
#include <unistd.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "fuzz/fuzz_util.h"
#include "model/config.h"
#include "model/lora.h"

namespace {

// A Llama of hidden 8, 2 query heads and 1 KV head of 4, intermediate 12, 2 layers.
kvrm::LlamaConfig SmallConfig() {
  kvrm::LlamaConfig c;
  c.model_type = "llama";
  c.vocab_size = 32;
  c.hidden_size = 8;
  c.intermediate_size = 12;
  c.num_hidden_layers = 2;
  c.num_attention_heads = 2;
  c.num_key_value_heads = 1;
  c.head_dim = 4;
  c.max_position_embeddings = 64;
  return c;
}

const std::string& AdapterDir() {
  static const std::string dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string d = std::string(tmp ? tmp : "/tmp") + "/kvrm_fuzz_lora_" + std::to_string(getpid());
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

void Write(const std::string& path, const uint8_t* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
}

int TestOneInput(const uint8_t* data, size_t size) {
  static const kvrm::LlamaConfig config = SmallConfig();
  const uint8_t* nul = static_cast<const uint8_t*>(std::memchr(data, 0, size));
  const size_t json_size = nul ? static_cast<size_t>(nul - data) : size;
  const std::string& dir = AdapterDir();
  Write(dir + "/adapter_config.json", data, json_size);
  if (nul) {
    Write(dir + "/adapter_model.safetensors", nul + 1, size - json_size - 1);
  } else {
    std::filesystem::remove(dir + "/adapter_model.safetensors");
  }
  absl::StatusOr<kvrm::LoraAdapter> adapter = kvrm::LoadLoraAdapter(config, "fuzz", dir);
  if (!adapter.ok()) {
    FUZZ_CHECK(!adapter.status().message().empty());
    return 0;
  }
  FUZZ_CHECK(adapter->layers.size() == static_cast<size_t>(config.num_hidden_layers));
  FUZZ_CHECK(adapter->rank >= 1 && adapter->rank <= kvrm::kMaxLoraRank);
  FUZZ_CHECK(std::isfinite(adapter->scale) && adapter->scale > 0);
  const int64_t d = config.hidden_size, ffn = config.intermediate_size;
  const int64_t q = int64_t{config.num_attention_heads} * config.head_dim;
  const int64_t kv = int64_t{config.num_key_value_heads} * config.head_dim;
  const int64_t out_of[kvrm::kNumLoraTargets] = {q, kv, kv, d, ffn, ffn, d};
  const int64_t in_of[kvrm::kNumLoraTargets] = {d, d, d, q, d, d, ffn};
  int adapted = 0;
  for (const kvrm::LoraLayer& layer : adapter->layers) {
    for (int t = 0; t < kvrm::kNumLoraTargets; ++t) {
      const kvrm::LoraMatrix& m = layer.m[t];
      if (m.rank == 0) {
        FUZZ_CHECK(m.a.empty() && m.b.empty());
        continue;
      }
      ++adapted;
      FUZZ_CHECK(m.rank >= 1 && m.rank <= kvrm::kMaxLoraRank);
      FUZZ_CHECK(m.in == in_of[t] && m.out == out_of[t]);
      FUZZ_CHECK(m.a.size() == static_cast<size_t>(m.rank * m.in));
      FUZZ_CHECK(m.b.size() == static_cast<size_t>(m.out * m.rank));
      for (float v : m.a) FUZZ_CHECK(std::isfinite(v));
      for (float v : m.b) FUZZ_CHECK(std::isfinite(v));
    }
  }
  FUZZ_CHECK(adapted > 0);
  FUZZ_CHECK(!adapter->target_modules.empty());
  return 0;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return kvrm::fuzz::RunWithKnownIssues([&] { TestOneInput(data, size); });
}
