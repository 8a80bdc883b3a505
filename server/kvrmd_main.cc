// kvrmd: the kvrm LLM serving daemon.
//
//   kvrmd --model=/path/to/hf-model-dir --listen=0.0.0.0:50051 --slots=8
//   kvrmd                                # serves the built-in model, generated on first run
//
// SIGTERM / SIGINT drain: health NOT_SERVING at once, new requests UNAVAILABLE, in-flight ones
// get --drain_grace_s to finish, then exit 0.
//
// Plain HTTP on --metrics_port (default 9400): /metrics (Prometheus), /healthz, /readyz (503
// from SIGTERM on). See docs/metrics.md.
#include <signal.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/json.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "kernels/cpu/matmul.h"
#include "metrics/http_server.h"
#include "metrics/kvrm_metrics.h"
#include "model/pooling_config.h"
#include "runtime/engine.h"
#include "runtime/kv_pool.h"
#include "runtime/model_bundle.h"
#include "server/device_backend.h"
#include "server/kvrm_server.h"
#include "server/openai_http.h"
#include "tools/modelgen/lora_writer.h"
#include "tools/modelgen/model_writer.h"

ABSL_FLAG(std::string, model, "builtin:small",
          "Hugging Face model directory, a GGUF file (llama.cpp's format; on the CPU its quantized "
          "weights are multiplied as blocks of exactly their values, see --quantization; on the "
          "GPU dequantized to bf16 at load), or builtin:tiny / builtin:small (generated into "
          "--model_cache on first use; also builtin:tiny-qwen2 / tiny-qwen3 / tiny-phi3 / "
          "tiny-granite / tiny-biased / tiny-gemma2 / tiny-gemma3 / tiny-mistral-sw / "
          "tiny-smollm3, the tiny "
          "shape in those architectures)");
ABSL_FLAG(std::string, lora_modules, "",
          "LoRA adapters served beside the base model, name=DIR[,name=DIR...]: each "
          "DIR a PEFT adapter (adapter_config.json, adapter_model.safetensors); requests pick one "
          "by name (GenerateRequest.lora_adapter; the HTTP API's `model`). DIR `builtin`: a "
          "deterministic random adapter for the served model, generated into --model_cache");
ABSL_FLAG(int32_t, max_loras, 0,
          "LoRA adapter slots: the --lora_modules take the first, adapters loaded "
          "while serving (--allow_runtime_lora_updating) the others; 0: as many as --lora_modules");
ABSL_FLAG(
    int32_t, max_lora_rank, 0,
    "the largest rank (r) a LoRA adapter may have (sizes each thread's scratch); 0: the "
    "largest of the --lora_modules', and at least 16 when --max_loras leaves slots for loads");
ABSL_FLAG(std::string, lora_dir, "",
          "LoRA adapters on demand: a request naming an adapter that is not served, "
          "whose name is a directory of DIR holding a PEFT adapter, has it loaded first into a "
          "free --max_loras slot, or the least recently used on-demand adapter's slot while no "
          "request runs with it");
ABSL_FLAG(std::string, lora_dtype, "auto",
          "what LoRA adapters' factors are kept and read in: bfloat16 (half the memory and "
          "bytes a step; each value rounded to nearest), float32, or auto (the model's: "
          "float32 for an f32 model, else bfloat16; always bfloat16 with --device=cuda), as "
          "vLLM's --lora-dtype");
ABSL_FLAG(bool, allow_runtime_lora_updating, false,
          "allow LoadLoraAdapter / UnloadLoraAdapter (gRPC) and POST /v1/load_lora_adapter, "
          "/v1/unload_lora_adapter (HTTP): a client then has the server read a directory it "
          "names, so turn it on only with --auth_tokens_file or on a trusted network");
ABSL_FLAG(int32_t, thinking_budget, -1,
          "the thinking budget of chat requests that give none (chat.thinking_budget, "
          "thinking_token_budget, as llama.cpp's --reasoning-budget): past this many tokens of "
          "thinking a model that thinks has its block's end written for it and answers; -1: "
          "none, 0: the thinking ends as soon as it begins");
ABSL_FLAG(bool, allow_prefix_cache_reset, false,
          "allow ResetPrefixCache (gRPC) and POST /reset_prefix_cache (HTTP, vLLM's): a client "
          "then can empty the prefix cache, so every later prompt is prefilled cold; for "
          "benchmarks, or with --auth_tokens_file");
ABSL_FLAG(std::string, model_cache, "",
          "where built-in models are generated (default $KVRM_HOME/models or "
          "~/.cache/kvrm/models)");
ABSL_FLAG(std::string, chat_template, "",
          "Jinja2 chat template file for GenerateRequest.chat, instead of the model's "
          "(tokenizer_config.json's chat_template or chat_template.jinja)");
ABSL_FLAG(std::string, tool_call_parser, "auto",
          "how replies to chat requests with tools are read for function calls (tool_choice "
          "AUTO): hermes, llama3_json, mistral, granite, qwen3_coder, glm45, minimax_m2, "
          "minimax, deepseek_v3 (or deepseek_v31), deepseek_v32, kimi_k2, pythonic (or "
          "llama4_pythonic), none, or auto (the "
          "format the chat template writes)");
ABSL_FLAG(std::string, reasoning_parser, "auto",
          "how replies to chat requests are split into reasoning and answer: think (the model "
          "thinks in a <think> block, sent as reasoning_text / OpenAI's reasoning_content; also "
          "deepseek_r1, qwen3), harmony (gpt-oss's analysis channel; also openai_gptoss), "
          "none, or auto (harmony when the chat template writes harmony messages, think when "
          "it writes </think>)");
ABSL_FLAG(std::string, listen, "0.0.0.0:50051", "gRPC address; port 0 picks a free port");
ABSL_FLAG(std::string, port_file, "", "write the bound gRPC port to this file once serving");
ABSL_FLAG(int32_t, slots, 8, "fixed decode slots (rows of the decode step)");
ABSL_FLAG(int32_t, max_context, 0, "max positions per request (0: the model's)");
ABSL_FLAG(int32_t, max_new_tokens, 4096, "largest max_new_tokens a request may ask for");
ABSL_FLAG(int32_t, max_queue, 256, "waiting requests beyond this get RESOURCE_EXHAUSTED");
ABSL_FLAG(int32_t, prefill_chunk, 256, "prompt tokens per prefill chunk");
ABSL_FLAG(int32_t, kv_block_tokens, 16, "tokens per KV block");
ABSL_FLAG(std::string, kv_mode, "kvrm",
          "KV policy: kvrm (paged, extent placement, merge-staged transport) or static (every "
          "slot reserves max context at start-up: the static-graph baseline)");
ABSL_FLAG(int64_t, kv_blocks, 0,
          "KV budget in blocks (0: slots x ceil(max_context / kv_block_tokens); with "
          "--kv_window_release, slots x the window's working set)");
ABSL_FLAG(int64_t, kv_host_blocks, -1, "host-tier blocks for paused requests (-1: = kv_blocks)");
ABSL_FLAG(std::string, kv_dtype, "f32",
          "KV cache element type: f32; bf16 (half the bytes per token: twice the tokens per "
          "block of memory, half the attention reads; CPU and CUDA devices); fp8 = fp8_e4m3, or "
          "fp8_e5m2 (a quarter of f32's bytes; keys and values divided by the checkpoint's "
          "k_scale / v_scale, else 1; CPU device)");
ABSL_FLAG(std::string, quantization, "auto",
          "how the linear weights are multiplied on the CPU: auto (a GGUF file's quantized "
          "matrices as blocks of exactly their values: q4_K and q6_K as they are, 4.5 and 6.6 "
          "bits a weight; the "
          "others as 8-bit blocks; the rest is dtype), q8_0 or q4_K (every linear weight "
          "quantized at load: 8.5 or 4.5 bits a weight, q4_K with ggml's reference quantizer, "
          "q8_0 where rows are not whole 256-value blocks; CPU device; a quantized checkpoint's "
          "matrices that are not exactly blocks, FP8 or NF4 ones, are quantized again to q4_K "
          "rather than q8_0), or none (everything in dtype)");
ABSL_FLAG(int32_t, kv_max_runs, 8, "run-table width R of the step descriptor");
ABSL_FLAG(std::string, kv_reserve, "prompt",
          "admission reservation (kvrm mode): prompt (grow on demand; pause others under "
          "pressure) or prompt_output (set aside prompt + max_new_tokens)");
ABSL_FLAG(bool, far_history, false,
          "far-history summaries (kvrm mode; approximate, see docs/runtime.md): attend exactly to "
          "the first --far_history_sinks and the last --far_history_window tokens and to one "
          "summary (mean K and V) per block in between, so a decoding request holds at most "
          "sinks + window + 1 KV blocks. Off: the full attention");
ABSL_FLAG(int32_t, far_history_sinks, 16,
          "--far_history: tokens at the start of a history always attended (rounded up to blocks)");
ABSL_FLAG(int32_t, far_history_window, 1024,
          "--far_history: most recent tokens attended exactly (rounded up to blocks)");
ABSL_FLAG(bool, kv_window_release, true,
          "a model whose every layer attends within a sliding window shorter than the context "
          "(Mistral 7B v0.1, Phi-3-mini): give a history's KV blocks wholly behind the window "
          "back to the pool as it moves on, so a request holds about window + one chunk of "
          "blocks whatever its length (exact; kvrm mode). Off: keep every block");
ABSL_FLAG(int32_t, speculative_tokens, 0,
          "speculative decoding by prompt lookup (CPU device): up to this many draft tokens per "
          "request and step, taken from an earlier occurrence of its last tokens and verified "
          "in the decode pass; outputs are unchanged, a request gains the drafts that match. "
          "0: off");
ABSL_FLAG(int32_t, prompt_lookup_min, 2,
          "--speculative_tokens: shortest n-gram of a history's last tokens looked up");
ABSL_FLAG(int32_t, prompt_lookup_max, 4,
          "--speculative_tokens: longest n-gram looked up (the longest that matches wins)");
ABSL_FLAG(int32_t, step_token_budget, 0,
          "tokens per engine step, decode rows plus the prefill chunks (0: slots + prefill_chunk)");
ABSL_FLAG(int32_t, max_prefills_per_step, 0,
          "prompts one engine step may prefill together (the step's prefill tokens left after "
          "a prompt's last chunk go to the next, in one pass; CPU device): 0 as many as fit, 1 "
          "one prompt a step");
ABSL_FLAG(double, max_prefill_stall, 0.5,
          "most a prefill chunk may lengthen a step that also decodes, as a fraction of a "
          "decode step (measured); 0: off, the chunk takes --step_token_budget");
ABSL_FLAG(bool, fuse_prefill, true,
          "run a step's prefill chunk in the same pass as its decode rows, reading the weights "
          "once for both (CPU: one pass; CUDA: the mixed graph)");
ABSL_FLAG(bool, device_sampling, true,
          "sample decode rows inside the decode graph where the backend can (CUDA): "
          "tokens come back instead of logits; rows with penalties, logit_bias, logprobs or a "
          "pending min_tokens are sampled on the host");
ABSL_FLAG(bool, prefix_caching, true,
          "reuse the KV of earlier histories for prompts that start with the same tokens "
          "(kvrm mode; off with --far_history)");
ABSL_FLAG(bool, prefix_cache_offload, true,
          "copy prefix-cache blocks evicted from the device to the host tier "
          "(--kv_host_blocks, shared with paused requests) and back on a hit");
ABSL_FLAG(bool, prefix_cache_partial_blocks, true,
          "after a prompt's whole cached blocks, copy a cached block for the tokens the prompt "
          "shares with its start (an ended history's last block, a whole block of another); "
          "false: whole blocks only, as vLLM");
ABSL_FLAG(double, prefix_cache_offload_shed, 0,
          "drop evicted blocks instead of offloading them while steps spend more than this "
          "share of their time waiting on copies (a slow host link); 0: never");
ABSL_FLAG(int32_t, threads, 0, "CPU threads, all ranks together (0: all cores)");
ABSL_FLAG(int32_t, tp, 1, "tensor-parallel ranks (Megatron split; CPU: rank threads)");
ABSL_FLAG(std::string, device, "auto",
          "cpu, cuda (bf16 CUDA graphs; --tp GPUs) or auto (cuda when a GPU is visible)");
ABSL_FLAG(std::string, cpu_isa, "auto",
          "CPU kernel path: auto (the best this processor runs), generic, avx2, avx512 or "
          "avx512_bf16 (bf16 weights take bf16-rounded activations, as GPU bf16 GEMMs do: about "
          "2x batched decode and prefill; avx512 keeps f32 activations)");
ABSL_FLAG(double, drain_grace_s, 30, "seconds in-flight requests get to finish on SIGTERM");
ABSL_FLAG(std::string, metrics_listen, "0.0.0.0", "host of the HTTP /metrics, /healthz, /readyz");
ABSL_FLAG(int32_t, metrics_port, 9400, "HTTP metrics port; 0 picks a free port, -1 disables");
ABSL_FLAG(std::string, metrics_port_file, "", "write the bound metrics port to this file");
ABSL_FLAG(int32_t, http_port, 8000,
          "OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions, /v1/models); "
          "0 picks a free port, -1 disables");
ABSL_FLAG(std::string, http_listen, "0.0.0.0", "host of the OpenAI-compatible HTTP API");
ABSL_FLAG(std::string, http_port_file, "", "write the bound HTTP API port to this file");
ABSL_FLAG(int32_t, http_idle_timeout_s, 120,
          "HTTP API: a keep-alive connection with no request in flight is closed after this");
ABSL_FLAG(int32_t, http_max_connections, 512,
          "HTTP API: connections served at once (a thread each, idle keep-alive ones included "
          "until --http_idle_timeout_s); beyond it new connections are refused");
ABSL_FLAG(int32_t, responses_store, 0,
          "HTTP API: keep this many /v1/responses responses (made with store, the default) in "
          "memory for previous_response_id and GET / DELETE /v1/responses/{id}, least recently "
          "used out, at most --responses_store_mib together; 0: keep none (stateless, as vLLM "
          "without its store)");
ABSL_FLAG(int32_t, responses_store_mib, 256, "HTTP API: memory of --responses_store, in MiB");
ABSL_FLAG(bool, http_metrics, false,
          "HTTP API: also serve GET /metrics on --http_port (where vLLM serves its metrics); "
          "off by default so that metrics stay on the internal --metrics_port");
ABSL_FLAG(std::string, otlp_traces_endpoint, "",
          "OpenTelemetry tracing (vLLM's flag): an OTLP/gRPC receiver (host:4317, or "
          "http:// / https:// host:port) that gets a span per Generate call (and per HTTP "
          "generation request), joined to the caller's W3C traceparent; default: "
          "$OTEL_EXPORTER_OTLP_TRACES_ENDPOINT, else $OTEL_EXPORTER_OTLP_ENDPOINT, else none. "
          "The resource is $OTEL_SERVICE_NAME (default kvrmd) and $OTEL_RESOURCE_ATTRIBUTES");
ABSL_FLAG(double, otlp_traces_sample_ratio, 1.0,
          "tracing: the fraction of requests without a caller's trace that are traced (a "
          "caller's sampled flag decides for its own)");
ABSL_FLAG(std::string, served_model_name, "",
          "the model's id in the HTTP API (requests' \"model\", /v1/models); default: the "
          "model directory's name. A comma-separated list gives it more names (as vLLM's "
          "--served-model-name takes several): the first is its id, every one is accepted in "
          "requests and listed by /v1/models");
ABSL_FLAG(std::string, pooling, "",
          "embeddings (Embed, POST /v1/embeddings): how a request without a pooling pools the "
          "final hidden states: last, mean or cls; default: the model's sentence-transformers "
          "files (modules.json), else last (decoder embedding models)");
ABSL_FLAG(std::vector<std::string>, classifier_from_tokens, {},
          "serve the model as a classifier (Classify, Score, /v1/rerank) whose head is the LM "
          "head's rows of these tokens (vLLM's classifier_from_token): two tokens a,b give one "
          "label, b's probability against a (Qwen3-Reranker: no,yes); one, its logit; more, one "
          "label each. Default: a *ForSequenceClassification checkpoint's score.weight, if any");
ABSL_FLAG(std::string, embedding_normalize, "",
          "embeddings: true or false, whether vectors are scaled to unit length by default; "
          "default: the model's (a Normalize module in modules.json), else true");
ABSL_FLAG(std::string, log_level, "info", "info, warning or error");
// Transport security and limits (docs/security.md).
ABSL_FLAG(std::string, tls_cert, "", "PEM server certificate chain: serve gRPC over TLS");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert");
ABSL_FLAG(std::string, tls_client_ca, "",
          "PEM CA bundle: require client certificates signed by it (mutual TLS)");
ABSL_FLAG(std::string, auth_tokens_file, "",
          "bearer tokens, one per line (# comments): kvrm.v1.Kvrm calls need "
          "'authorization: Bearer <token>'; health and reflection stay open");
ABSL_FLAG(int32_t, max_message_bytes, 4 << 20,
          "largest gRPC message either way; larger requests get RESOURCE_EXHAUSTED");
ABSL_FLAG(int32_t, max_concurrent_streams, 1024, "concurrent gRPC streams per connection");
ABSL_FLAG(int32_t, grpc_max_connection_age_s, 0,
          "send each gRPC connection a GOAWAY after this long (streams on it finish; new calls "
          "reconnect and re-resolve DNS, so replicas added later get traffic from existing "
          "clients); 0: never");

namespace kvrm {
namespace {

constexpr char kVersion[] = "0.1.0";

// Where built-in models and adapters are generated.
std::string ModelCacheDir() {
  std::string cache = absl::GetFlag(FLAGS_model_cache);
  if (cache.empty()) {
    const char* home = std::getenv("KVRM_HOME");
    const char* user_home = std::getenv("HOME");
    cache = home ? absl::StrCat(home, "/models")
                 : absl::StrCat(user_home ? user_home : "/tmp", "/.cache/kvrm/models");
  }
  return cache;
}

absl::StatusOr<std::string> ResolveModel(const std::string& spec) {
  if (!absl::StartsWith(spec, "builtin:")) return spec;
  const std::string size = spec.substr(8);
  const std::string dir = absl::StrCat(ModelCacheDir(), "/kvrm-", size);
  if (std::filesystem::exists(dir + "/config.json") &&
      std::filesystem::exists(dir + "/tokenizer.json")) {
    // A directory generated by an earlier kvrmd: add what this version's generator writes.
    ASSIGN_OR_RETURN(const bool upgraded, modelgen::UpgradeModelDir(dir));
    if (upgraded) {
      LOG(INFO) << "wrote the current chat template into the cached built-in model in " << dir;
    }
    return dir;
  }
  LOG(INFO) << "generating built-in model '" << size << "' into " << dir;
  modelgen::MakeModelOptions o;
  o.size = size;
  o.out_dir = dir;
  o.dtype = DType::kBF16;
  ASSIGN_OR_RETURN(modelgen::MakeModelSummary summary, modelgen::MakeModel(o));
  LOG(INFO) << "generated " << summary.parameters << " parameters in " << summary.total_seconds
            << " s";
  return dir;
}

// --lora_modules: loads each name=DIR into model->lora_adapters. INVALID_ARGUMENT for a
// malformed list or name; the loader's errors name the adapter.
absl::Status LoadLoraModules(const std::string& flag, ModelBundle* model) {
  if (flag.empty()) return absl::OkStatus();
  for (absl::string_view entry : absl::StrSplit(flag, ',')) {
    const size_t eq = entry.find('=');
    if (eq == absl::string_view::npos || eq == 0 || eq + 1 == entry.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("`", entry, "`: each entry is name=DIR (or name=builtin)"));
    }
    const std::string name(entry.substr(0, eq));
    std::string dir(entry.substr(eq + 1));
    const bool name_ok = name.size() <= 64 && std::all_of(name.begin(), name.end(), [](char c) {
      return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' ||
             c == '.' || c == '/' || c == ':';
    });
    if (!name_ok) {
      return absl::InvalidArgumentError(absl::StrCat(
          "adapter name `", name, "`: at most 64 letters, digits and - _ . / :"));
    }
    for (const LoraAdapter& a : model->lora_adapters) {
      if (a.name == name) {
        return absl::InvalidArgumentError(absl::StrCat("adapter name `", name, "` given twice"));
      }
    }
    if (dir == "builtin") {
      // Deterministic for the adapter's name and the model's shape; generated once.
      std::string file = absl::StrCat("lora-", model->name, "-", name);
      std::replace(file.begin(), file.end(), '/', '_');
      dir = absl::StrCat(ModelCacheDir(), "/", file);
      if (!std::filesystem::exists(dir + "/adapter_model.safetensors")) {
        modelgen::MakeLoraOptions o;
        o.out_dir = dir;
        o.seed = 1469598103934665603ull;  // FNV-1a of the name: the same weights every run
        for (unsigned char c : name) o.seed = (o.seed ^ c) * 1099511628211ull;
        o.base_model = model->name;
        LOG(INFO) << "generating built-in LoRA adapter '" << name << "' into " << dir;
        RETURN_IF_ERROR(modelgen::MakeLoraAdapter(model->config, o));
      }
    }
    absl::StatusOr<LoraAdapter> adapter = LoadLoraAdapter(model->config, name, dir);
    if (!adapter.ok()) {
      return absl::Status(adapter.status().code(),
                          absl::StrCat("adapter `", name, "` (", dir, "): ",
                                       adapter.status().message()));
    }
    LOG(INFO) << "LoRA adapter '" << name << "': rank " << adapter->rank << ", "
              << absl::StrJoin(adapter->target_modules, ",") << ", "
              << adapter->num_parameters << " parameters, from " << dir;
    model->lora_adapters.push_back(std::move(*adapter));
  }
  return absl::OkStatus();
}

// Written atomically (rename), so a reader never sees a partial number.
void WritePortFile(const std::string& path, int port) {
  if (path.empty()) return;
  std::ofstream(path + ".tmp") << port << "\n";
  std::filesystem::rename(path + ".tmp", path);
}

int Run() {
  const std::string level = absl::GetFlag(FLAGS_log_level);
  SetMinLogSeverity(level == "error"     ? LogSeverity::kError
                    : level == "warning" ? LogSeverity::kWarning
                                         : LogSeverity::kInfo);
  absl::StatusOr<DeviceChoice> device = ChooseDevice(absl::GetFlag(FLAGS_device));
  if (!device.ok()) {
    std::fprintf(stderr, "kvrmd: %s\n", std::string(device.status().message()).c_str());
    return 2;
  }
  if (const std::string name = absl::GetFlag(FLAGS_cpu_isa); name != "auto") {
    CpuIsa isa;
    if (!ParseCpuIsa(name, &isa)) {
      std::fprintf(stderr, "kvrmd: --cpu_isa=%s: this processor runs auto, %s\n", name.c_str(),
                   AvailableCpuIsaNames().c_str());
      return 2;
    }
    SetActiveCpuIsa(isa);
  }
  if (absl::GetFlag(FLAGS_kv_mode) != "static" && absl::GetFlag(FLAGS_kv_mode) != "kvrm") {
    std::fprintf(stderr, "kvrmd: --kv_mode=%s: use kvrm or static\n",
                 absl::GetFlag(FLAGS_kv_mode).c_str());
    return 2;
  }
  if (absl::GetFlag(FLAGS_thinking_budget) < -1) {
    std::fprintf(stderr, "kvrmd: --thinking_budget=%d: use -1 (none) or a number of tokens\n",
                 absl::GetFlag(FLAGS_thinking_budget));
    return 2;
  }
  // Signals are taken synchronously by this thread only: block them before any thread starts.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  absl::StatusOr<std::string> dir = ResolveModel(absl::GetFlag(FLAGS_model));
  if (!dir.ok()) {
    std::fprintf(stderr, "kvrmd: cannot prepare model: %s\n", dir.status().ToString().c_str());
    return 1;
  }
  const std::string quantization = absl::GetFlag(FLAGS_quantization);
  if (quantization != "auto" && quantization != "q8_0" && quantization != "q4_K" &&
      quantization != "none") {
    std::fprintf(stderr, "kvrmd: --quantization=%s: use auto, q8_0, q4_K or none\n",
                 quantization.c_str());
    return 2;
  }
  ModelBundle::LoadOptions load;
  load.as_q8 = quantization != "none";
  // CUDA widens every weight to bf16: FP8 checkpoints go there directly, not through q8_0.
  load.requantize_non_integer = device->device == "cpu";
  // A checkpoint's matrices that are not exactly blocks (FP8, NF4 / FP4, ...) are quantized
  // again: to q4_K when that is what was asked for.
  // (On the CPU: CUDA widens every weight to bf16, and q8_0 rounds less on the way.)
  if (quantization == "q4_K" && device->device == "cpu") load.requantize_as = WeightFormat::kQ4K;
  absl::StatusOr<std::unique_ptr<ModelBundle>> model = ModelBundle::Load(*dir, load);
  if (!model.ok()) {
    std::fprintf(stderr, "kvrmd: cannot load model from %s: %s\n", dir->c_str(),
                 model.status().ToString().c_str());
    return 1;
  }
  if (const std::string path = absl::GetFlag(FLAGS_chat_template); !path.empty()) {
    if (absl::Status st = OverrideChatTemplate(path, &(*model)->chat); !st.ok()) {
      std::fprintf(stderr, "kvrmd: %s\n", std::string(st.message()).c_str());
      return 1;
    }
  }
  if (const std::string parser = absl::GetFlag(FLAGS_tool_call_parser); parser != "auto") {
    absl::StatusOr<ToolCallFormat> format = ToolCallFormatFromName(parser);
    if (!format.ok()) {
      std::fprintf(stderr, "kvrmd: --tool_call_parser=%s: %s\n", parser.c_str(),
                   std::string(format.status().message()).c_str());
      return 2;
    }
    (*model)->chat.tool_call_format = *format;
  }
  if (const std::string parser = absl::GetFlag(FLAGS_reasoning_parser); parser != "auto") {
    absl::StatusOr<ReasoningFormat> format = ReasoningFormatFromName(parser);
    if (!format.ok()) {
      std::fprintf(stderr, "kvrmd: --reasoning_parser=%s: %s\n", parser.c_str(),
                   std::string(format.status().message()).c_str());
      return 2;
    }
    (*model)->chat.reasoning_format = *format;
    if (*format == ReasoningFormat::kHarmony && absl::GetFlag(FLAGS_tool_call_parser) == "auto") {
      // HarmonyStream hands calls to the tool-call stream as Hermes markup.
      (*model)->chat.tool_call_format = ToolCallFormat::kHermes;
    }
  }
  if (absl::Status st = LoadLoraModules(absl::GetFlag(FLAGS_lora_modules), model->get());
      !st.ok()) {
    std::fprintf(stderr, "kvrmd: --lora_modules=%s: %s\n",
                 absl::GetFlag(FLAGS_lora_modules).c_str(), std::string(st.message()).c_str());
    return st.code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
  }
  EngineOptions eo;
  eo.slots = absl::GetFlag(FLAGS_slots);
  eo.max_context = absl::GetFlag(FLAGS_max_context);
  eo.max_new_tokens = absl::GetFlag(FLAGS_max_new_tokens);
  eo.max_queue = absl::GetFlag(FLAGS_max_queue);
  eo.prefill_chunk = absl::GetFlag(FLAGS_prefill_chunk);
  eo.block_tokens = absl::GetFlag(FLAGS_kv_block_tokens);
  eo.kv_mode = absl::GetFlag(FLAGS_kv_mode) == "static" ? KvMode::kStatic : KvMode::kKvrm;
  eo.kv_blocks = absl::GetFlag(FLAGS_kv_blocks);
  eo.kv_host_blocks = absl::GetFlag(FLAGS_kv_host_blocks);
  if (absl::StatusOr<DType> kv = ParseKvDtype(absl::GetFlag(FLAGS_kv_dtype)); kv.ok()) {
    eo.kv_dtype = *kv;
  } else {
    std::fprintf(stderr, "kvrmd: %s\n", std::string(kv.status().message()).c_str());
    return 2;
  }
  eo.quantization = quantization == "q8_0"   ? WeightFormat::kQ8_0
                    : quantization == "q4_K" ? WeightFormat::kQ4K
                                             : WeightFormat::kDense;
  eo.max_runs = absl::GetFlag(FLAGS_kv_max_runs);
  eo.step_token_budget = absl::GetFlag(FLAGS_step_token_budget);
  eo.max_prefill_stall = absl::GetFlag(FLAGS_max_prefill_stall);
  eo.max_prefills_per_step = absl::GetFlag(FLAGS_max_prefills_per_step);
  eo.fuse_prefill = absl::GetFlag(FLAGS_fuse_prefill);
  eo.device_sampling = absl::GetFlag(FLAGS_device_sampling);
  eo.prefix_caching = absl::GetFlag(FLAGS_prefix_caching);
  eo.prefix_cache_offload = absl::GetFlag(FLAGS_prefix_cache_offload);
  eo.prefix_cache_partial_blocks = absl::GetFlag(FLAGS_prefix_cache_partial_blocks);
  eo.offload_shed_wait_share = absl::GetFlag(FLAGS_prefix_cache_offload_shed);
  if (eo.offload_shed_wait_share < 0 || eo.offload_shed_wait_share >= 1) {
    std::fprintf(stderr, "kvrmd: --prefix_cache_offload_shed=%g must be in [0, 1)\n",
                 eo.offload_shed_wait_share);
    return 2;
  }
  if (eo.max_prefill_stall < 0) {
    std::fprintf(stderr, "kvrmd: --max_prefill_stall=%g must be >= 0\n", eo.max_prefill_stall);
    return 2;
  }
  if (absl::GetFlag(FLAGS_kv_reserve) == "prompt_output") {
    eo.reserve = ReservePolicy::kPromptAndOutput;
  } else if (absl::GetFlag(FLAGS_kv_reserve) != "prompt") {
    std::fprintf(stderr, "kvrmd: --kv_reserve=%s: use prompt or prompt_output\n",
                 absl::GetFlag(FLAGS_kv_reserve).c_str());
    return 2;
  }
  eo.far_history.enabled = absl::GetFlag(FLAGS_far_history);
  eo.far_history.sink_tokens = absl::GetFlag(FLAGS_far_history_sinks);
  eo.far_history.window_tokens = absl::GetFlag(FLAGS_far_history_window);
  eo.window_release = absl::GetFlag(FLAGS_kv_window_release);
  eo.speculative_tokens = absl::GetFlag(FLAGS_speculative_tokens);
  eo.speculative_ngram.min_ngram = absl::GetFlag(FLAGS_prompt_lookup_min);
  eo.speculative_ngram.max_ngram = absl::GetFlag(FLAGS_prompt_lookup_max);
  if (absl::Status st = CheckSpeculativeOptions(eo.speculative_tokens, eo.speculative_ngram);
      !st.ok()) {
    std::fprintf(stderr, "kvrmd: %s\n", std::string(st.message()).c_str());
    return 2;
  }
  eo.threads = absl::GetFlag(FLAGS_threads);
  eo.tensor_parallel = absl::GetFlag(FLAGS_tp);
  eo.max_loras = absl::GetFlag(FLAGS_max_loras);
  eo.max_lora_rank = absl::GetFlag(FLAGS_max_lora_rank);
  if (absl::StatusOr<std::optional<DType>> d = ParseLoraDtype(absl::GetFlag(FLAGS_lora_dtype));
      d.ok()) {
    eo.lora_dtype = *d;
    // The GPU's adapter products take bf16 factors whatever the model's dtype
    // (CudaBackendOptions: it keeps them in bf16 whatever it is asked).
    if (device->device == "cuda") {
      if (eo.lora_dtype == DType::kF32) {
        std::fprintf(stderr,
                     "kvrmd: --lora_dtype=float32: the CUDA device keeps LoRA factors in bfloat16 "
                     "(its products take bf16 inputs); use bfloat16 or auto\n");
        return 2;
      }
      eo.lora_dtype = DType::kBF16;
    }
  } else {
    std::fprintf(stderr, "kvrmd: %s\n", std::string(d.status().message()).c_str());
    return 2;
  }
  if (const std::string dir = absl::GetFlag(FLAGS_lora_dir);
      !dir.empty() && !std::filesystem::is_directory(dir)) {
    std::fprintf(stderr, "kvrmd: --lora_dir=%s: not a directory\n", dir.c_str());
    return 2;
  }
  // Loads while serving, or on demand, need slots to load into.
  const bool no_slots = eo.max_loras <= 0 && (*model)->lora_adapters.empty();
  if (no_slots && absl::GetFlag(FLAGS_allow_runtime_lora_updating)) {
    std::fprintf(stderr,
                 "kvrmd: --allow_runtime_lora_updating: give --max_loras, the adapter slots "
                 "loads may take\n");
    return 2;
  }
  if (no_slots && !absl::GetFlag(FLAGS_lora_dir).empty()) {
    std::fprintf(stderr,
                 "kvrmd: --lora_dir=%s: give --max_loras, the adapter slots loads may take\n",
                 absl::GetFlag(FLAGS_lora_dir).c_str());
    return 2;
  }
  eo.backend_factory = device->factory;
  if (const std::vector<std::string> tokens = absl::GetFlag(FLAGS_classifier_from_tokens);
      !tokens.empty()) {
    ModelBundle& m = **model;
    if (!m.weights.has_lm_head) {
      std::fprintf(stderr, "kvrmd: --classifier_from_tokens: the model has no LM head\n");
      return 2;
    }
    absl::StatusOr<ClassifierHead> head =
        ClassifierFromTokens(m.weights.lm_head, *m.tokenizer, tokens);
    if (!head.ok()) {
      std::fprintf(stderr, "kvrmd: --classifier_from_tokens: %s\n",
                   std::string(head.status().message()).c_str());
      return 2;
    }
    if (m.classifier)
      LOG(INFO) << "--classifier_from_tokens replaces the checkpoint's score.weight";
    m.classifier = *std::move(head);
    m.classifier_error.clear();
  }
  if (const std::optional<ClassifierHead>& head = (*model)->classifier) {
    LOG(INFO) << "classification head: " << head->num_labels << " label"
              << (head->num_labels == 1 ? "" : "s") << " (" << head->source << ")"
              << (head->num_labels == 1 ? ", a cross-encoder for Score" : "");
  }
  // The registry and the observer outlive the engine and the HTTP server (declared first).
  MetricRegistry registry;
  KvrmMetricsOptions metrics_options{(*model)->name, absl::GetFlag(FLAGS_kv_mode),
                                     absl::GetFlag(FLAGS_far_history)};
  metrics_options.lora_slots =
      std::max(eo.max_loras, static_cast<int32_t>((*model)->lora_adapters.size()));
  KvrmMetrics metrics(&registry, metrics_options);
  eo.observer = &metrics;
  std::unique_ptr<MetricsHttpServer> http;
  if (absl::GetFlag(FLAGS_metrics_port) >= 0) {
    absl::StatusOr<std::unique_ptr<MetricsHttpServer>> h = MetricsHttpServer::Start(
        &registry, {absl::GetFlag(FLAGS_metrics_listen), absl::GetFlag(FLAGS_metrics_port)});
    if (!h.ok()) {
      std::fprintf(stderr, "kvrmd: %s\n", h.status().ToString().c_str());
      return 1;
    }
    http = std::move(*h);
    WritePortFile(absl::GetFlag(FLAGS_metrics_port_file), http->port());
  }
  // Tracing: it outlives the server, whose service records into it (declared before it).
  std::unique_ptr<Tracer> tracer;
  {
    std::string endpoint = absl::GetFlag(FLAGS_otlp_traces_endpoint);
    if (endpoint.empty()) {
      // OpenTelemetry's variables, as vLLM reads them: OTLP/gRPC unless a protocol says
      // otherwise, and then tracing stays off (kvrmd speaks gRPC only), said once.
      const char* from = nullptr;
      for (const char* env :
           {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"}) {
        if (const char* v = std::getenv(env); from == nullptr && v != nullptr && *v != '\0') {
          endpoint = v;
          from = env;
        }
      }
      std::string protocol = "grpc";
      for (const char* env :
           {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"}) {
        if (const char* v = std::getenv(env); v != nullptr && *v != '\0') {
          protocol = v;
          break;
        }
      }
      if (from != nullptr && protocol != "grpc") {
        LOG(WARNING) << "tracing: off: $" << from << " is set with OTLP protocol \"" << protocol
                     << "\", and kvrmd sends OTLP/gRPC only (--otlp_traces_endpoint names a "
                        "gRPC receiver)";
        endpoint.clear();
      } else if (from != nullptr) {
        LOG(INFO) << "tracing: on from $" << from;
      }
    }
    if (!endpoint.empty()) {
      TracerOptions to;
      to.endpoint = endpoint;
      to.service_version = kVersion;
      if (const char* v = std::getenv("OTEL_SERVICE_NAME"); v != nullptr && *v != '\0') {
        to.service_name = v;
      }
      if (const char* v = std::getenv("OTEL_RESOURCE_ATTRIBUTES"); v != nullptr) {
        absl::StatusOr<std::vector<std::pair<std::string, std::string>>> attributes =
            ParseResourceAttributes(v);
        if (!attributes.ok()) {
          std::fprintf(stderr, "kvrmd: %s\n", attributes.status().ToString().c_str());
          return 2;
        }
        to.resource_attributes = *std::move(attributes);
        for (const auto& [key, value] : to.resource_attributes) {
          if (key == "service.name" && std::getenv("OTEL_SERVICE_NAME") == nullptr) {
            to.service_name = value;  // OTEL_SERVICE_NAME wins over it, as OpenTelemetry's SDKs
          }
        }
      }
      to.sample_ratio = absl::GetFlag(FLAGS_otlp_traces_sample_ratio);
      to.exported = &registry
                         .AddCounter("kvrm:otlp_spans_exported_total",
                                     "spans sent to --otlp_traces_endpoint and accepted")
                         .WithLabels({});
      to.dropped = &registry
                        .AddCounter("kvrm:otlp_spans_dropped_total",
                                    "spans not sent: the queue was full, or the receiver refused "
                                    "them or stayed unreachable through the retries")
                        .WithLabels({});
      to.export_failures = &registry
                                .AddCounter("kvrm:otlp_export_failures_total",
                                            "Export calls to --otlp_traces_endpoint that failed "
                                            "(each retry counts)")
                                .WithLabels({});
      absl::StatusOr<std::unique_ptr<Tracer>> t = Tracer::Start(std::move(to));
      if (!t.ok()) {
        std::fprintf(stderr, "kvrmd: %s\n", t.status().ToString().c_str());
        return 2;
      }
      tracer = std::move(*t);
      LOG(INFO) << "tracing: OTLP spans to " << endpoint << ", "
                << absl::GetFlag(FLAGS_otlp_traces_sample_ratio)
                << " of the requests without a caller's trace";
    }
  }
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(model->get(), eo);
  if (!engine.ok()) {
    std::fprintf(stderr, "kvrmd: %s\n", engine.status().ToString().c_str());
    return 1;
  }
  // The backend holds the --lora_modules' shares now (Engine::Create reads the adapters' values
  // only there): their f32 copies as loaded are not needed (640 MB for a rank-64 adapter of every
  // projection of a 7B model).
  for (LoraAdapter& a : (*model)->lora_adapters) std::vector<LoraLayer>().swap(a.layers);
  (*engine)->Start();
  ServerOptions so;
  so.listen = absl::GetFlag(FLAGS_listen);
  so.tls_cert = absl::GetFlag(FLAGS_tls_cert);
  so.tls_key = absl::GetFlag(FLAGS_tls_key);
  so.tls_client_ca = absl::GetFlag(FLAGS_tls_client_ca);
  so.auth_tokens_file = absl::GetFlag(FLAGS_auth_tokens_file);
  so.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  so.max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams);
  so.max_connection_age_s = absl::GetFlag(FLAGS_grpc_max_connection_age_s);
  so.info.version = kVersion;
  so.info.device = device->device;
  so.info.kv_mode = absl::GetFlag(FLAGS_kv_mode);
  so.info.default_thinking_budget = absl::GetFlag(FLAGS_thinking_budget);
  so.info.tensor_parallel = eo.tensor_parallel;
  so.merged_chunks_counter = metrics.stream_chunks_merged();
  so.structured_metrics = &metrics.structured_outputs();
  so.tool_call_metrics = &metrics.tool_calls();
  so.runtime_lora_updating = absl::GetFlag(FLAGS_allow_runtime_lora_updating);
  so.prefix_cache_reset = absl::GetFlag(FLAGS_allow_prefix_cache_reset);
  so.lora_dir = absl::GetFlag(FLAGS_lora_dir);
  so.tracer = tracer.get();
  // --served_model_name: the model's id, then its other names.
  std::vector<std::string> served_names;
  for (absl::string_view name :
       absl::StrSplit(absl::GetFlag(FLAGS_served_model_name), ',', absl::SkipWhitespace())) {
    served_names.emplace_back(absl::StripAsciiWhitespace(name));
  }
  if (served_names.empty()) served_names.push_back((*model)->name);
  so.info.served_model_name = served_names[0];
  so.info.served_model_aliases.assign(served_names.begin() + 1, served_names.end());
  {
    // Embed's defaults: the flags, else the model directory's sentence-transformers modules.
    absl::StatusOr<std::optional<PoolingConfig>> st = LoadPoolingConfig(*dir);
    const std::string pooling = absl::GetFlag(FLAGS_pooling);
    const std::string normalize = absl::GetFlag(FLAGS_embedding_normalize);
    if (!st.ok() && (pooling.empty() || normalize.empty())) {
      // Generation is unaffected; embeddings would come out other than the model's.
      so.info.embed_refusal = absl::StrCat(
          st.status().message(),
          " (kvrmd --pooling and --embedding_normalize serve embeddings from it anyway)");
      LOG(WARNING) << "embeddings refused: " << so.info.embed_refusal;
    }
    const std::optional<PoolingConfig> model_pooling = st.ok() ? *st : std::nullopt;
    const std::string name = !pooling.empty() ? pooling
                             : model_pooling  ? model_pooling->pooling
                                              : "last";
    absl::StatusOr<Pooling> parsed = ParsePooling(name);
    if (!parsed.ok()) {
      std::fprintf(stderr, "kvrmd: --pooling=%s: use last, mean or cls\n", name.c_str());
      return 1;
    }
    so.info.pooling = *parsed;
    if (normalize.empty()) {
      so.info.embedding_normalize = model_pooling ? model_pooling->normalize : true;
    } else if (normalize == "true" || normalize == "false") {
      so.info.embedding_normalize = normalize == "true";
    } else {
      std::fprintf(stderr, "kvrmd: --embedding_normalize=%s: use true or false\n",
                   normalize.c_str());
      return 1;
    }
    if (model_pooling) {
      LOG(INFO) << "embeddings: " << model_pooling->pooling << " pooling"
                << (model_pooling->normalize ? ", normalized" : "") << " (" << model_pooling->source
                << ")";
    }
  }
  absl::StatusOr<std::unique_ptr<KvrmServer>> server = KvrmServer::Start(engine->get(), so);
  if (!server.ok()) {
    std::fprintf(stderr, "kvrmd: %s\n", server.status().ToString().c_str());
    return 1;
  }
  const ModelBundle& m = **model;
  std::unique_ptr<OpenAiHttpServer> openai;
  if (absl::GetFlag(FLAGS_http_port) >= 0) {
    OpenAiHttpOptions ho;
    ho.host = absl::GetFlag(FLAGS_http_listen);
    ho.port = absl::GetFlag(FLAGS_http_port);
    ho.idle_timeout_s = absl::GetFlag(FLAGS_http_idle_timeout_s);
    ho.connection_limit = absl::GetFlag(FLAGS_http_max_connections);
    // A body within the gRPC message limit makes calls within it (JSON is the larger encoding).
    ho.max_body_bytes = static_cast<size_t>(so.max_message_bytes);
    ho.served_model_name = so.info.served_model_name;
    ho.served_model_aliases = so.info.served_model_aliases;
    for (const LoraAdapter& a : m.lora_adapters) {
      if (std::find(served_names.begin(), served_names.end(), a.name) != served_names.end()) {
        std::fprintf(stderr,
                     "kvrmd: --lora_modules: adapter `%s` has the served model's name; the HTTP "
                     "API's `model` could not tell them apart\n",
                     a.name.c_str());
        return 2;
      }
    }
    if (const std::string dir = absl::GetFlag(FLAGS_lora_dir); !dir.empty()) {
      ho.lora_adapter_loadable = [dir](const std::string& name) {
        return !OnDemandLoraPath(dir, name).empty();
      };
    }
    ho.lora_adapters = [engine = engine->get()] {
      std::vector<std::string> names;
      for (const ServedLoraAdapter& a : engine->LoraAdapters()) names.push_back(a.adapter.name);
      return names;
    };
    ho.max_context = (*engine)->options().max_context;
    ho.defaults.chat_max_tokens = (*engine)->options().max_new_tokens;
    ho.defaults.completion_max_tokens = std::min(16, (*engine)->options().max_new_tokens);
    ho.tokenizer = m.tokenizer.get();
    ho.metrics = &metrics.http_api();
    if (absl::GetFlag(FLAGS_http_metrics)) ho.registry = &registry;
    ho.version = kVersion;
    if (absl::GetFlag(FLAGS_responses_store) < 0 || absl::GetFlag(FLAGS_responses_store_mib) < 1) {
      std::fprintf(stderr,
                   "kvrmd: --responses_store must be >= 0 and --responses_store_mib >= 1\n");
      return 2;
    }
    ho.responses_store_entries = absl::GetFlag(FLAGS_responses_store);
    ho.responses_store_bytes = int64_t{absl::GetFlag(FLAGS_responses_store_mib)} << 20;
    if (!so.tls_cert.empty()) {
      if (!so.tls_client_ca.empty()) {
        std::fprintf(stderr,
                     "kvrmd: --tls_client_ca: the HTTP API does not verify client certificates; "
                     "turn it off with --http_port=-1 to serve gRPC with mutual TLS\n");
        return 1;
      }
      // Both files were read and checked by the gRPC server's start.
      ho.tls_cert_pem = *ReadFileToString(so.tls_cert);
      ho.tls_key_pem = *ReadFileToString(so.tls_key);
    }
    absl::StatusOr<std::unique_ptr<OpenAiHttpServer>> h =
        OpenAiHttpServer::Start((*server)->InProcessChannel(), ho);
    if (!h.ok()) {
      std::fprintf(stderr, "kvrmd: %s\n", h.status().ToString().c_str());
      return 1;
    }
    openai = std::move(*h);
    LOG(INFO) << "OpenAI-compatible HTTP API on " << (so.tls_cert.empty() ? "http" : "https")
              << "://" << ho.host << ":" << openai->port() << "/v1, model \""
              << ho.served_model_name << "\"";
    WritePortFile(absl::GetFlag(FLAGS_http_port_file), openai->port());
  }
  LOG(INFO) << "kvrmd " << kVersion << " serving " << m.name << " (" << m.weights.num_parameters
            << " parameters, " << DTypeName(m.weights.dtype) << ", " << m.weights_format
            << ((*engine)->weight_quantization().empty()
                    ? ""
                    : ", multiplied as " + (*engine)->weight_quantization())
            << ") on port " << (*server)->port()
            << ": " << eo.slots << " slots, max context " << (*engine)->options().max_context
            << ", kv-mode " << so.info.kv_mode << ", kv " << DTypeName(eo.kv_dtype)
            << ", mixed steps " << ((*engine)->fuses_prefill() ? "on" : "off")
            << ", prefix caching "
            << (!(*engine)->options().prefix_caching        ? "off"
                : (*engine)->options().prefix_cache_offload ? "on (+ host tier)"
                                                            : "on")
            << ", device " << device->device
            << (device->device == "cpu" ? ", " + std::string(CpuIsaName(ActiveCpuIsa())) : "");
  if (!m.weights.has_lm_head) {
    LOG(INFO) << "the checkpoint has no LM head (lm_head.weight): embeddings"
              << (m.classifier ? ", classification and scoring" : "")
              << " only; Generate is refused";
  }
  if ((*engine)->options().window_release) {
    LOG(INFO) << "window release: every layer attends within " << m.config.sliding_window
              << " positions; blocks behind a request's window go back to the pool ("
              << (*engine)->options().kv_blocks << " KV blocks)";
  }
  if (IsFp8(eo.kv_dtype)) {
    LOG(INFO) << "FP8 KV cache: keys and values divided by "
              << (m.weights.kv_cache_scales.empty()
                      ? absl::StrCat("1 (the checkpoint has no k_scale / v_scale; beyond the "
                                     "format's range, +-",
                                     Fp8MaxFinite(eo.kv_dtype), ", they saturate)")
                      : "the checkpoint's " + m.weights.kv_cache_scales + " per layer");
  }
  if (m.chat.chat_template != nullptr) {
    LOG(INFO) << "chat requests use the chat template from " << m.chat.source
              << "; tool calls are parsed as " << ToolCallFormatName(m.chat.tool_call_format)
              << ", reasoning as " << ReasoningFormatName(m.chat.reasoning_format);
  } else {
    LOG(INFO) << "chat requests are refused: " << m.chat.status.message();
  }
  if (const FarHistoryShape& far = (*engine)->far_history(); far.enabled()) {
    LOG(INFO) << "far-history summaries ON (approximate attention): " << far.sink_blocks
              << " sink + " << far.window_blocks << " window blocks of " << eo.block_tokens
              << " tokens exact, one summary per block in between";
  }
  if (eo.speculative_tokens > 0) {
    LOG(INFO) << "speculative decoding ON: up to " << eo.speculative_tokens
              << " prompt-lookup draft tokens per request and step (n-grams of "
              << eo.speculative_ngram.min_ngram << " to " << eo.speculative_ngram.max_ngram
              << " tokens)";
  }
  if (http) {
    LOG(INFO) << "metrics on http://" << absl::GetFlag(FLAGS_metrics_listen) << ":" << http->port()
              << "/metrics";
    http->SetReady(true);
  }
  WritePortFile(absl::GetFlag(FLAGS_port_file), (*server)->port());
  int sig = 0;
  sigwait(&signals, &sig);
  LOG(INFO) << "received " << (sig == SIGTERM ? "SIGTERM" : "SIGINT");
  // Probes see the drain at once; /metrics keeps answering until exit.
  if (http) http->SetReady(false);
  if (openai) openai->BeginDrain();
  (*server)->Drain(absl::Seconds(absl::GetFlag(FLAGS_drain_grace_s)), [&openai] {
    // The engine is idle: HTTP replies get to send their last events (and [DONE]) before the
    // gRPC server's shutdown cancels the in-process calls they read them from.
    if (openai && !openai->WaitIdle(absl::Seconds(5))) {
      LOG(WARNING) << "HTTP replies still being sent after 5 s: closing them";
    }
  });
  openai.reset();  // its calls ended with the drain; before the server its channel goes to
  server->reset();
  engine->reset();
  return 0;
}

}  // namespace
}  // namespace kvrm

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage("kvrm LLM serving daemon. See README.md and docs/operations.md.");
  absl::ParseCommandLine(argc, argv);
  return kvrm::Run();
}
