#include "tools/cli/format.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "google/protobuf/util/json_util.h"

namespace kvrm::cli {
namespace {

using Rows = std::vector<std::pair<std::string, std::string>>;

void AppendSection(absl::string_view title, const Rows& rows, std::string* out) {
  size_t width = 0;
  for (const auto& row : rows) width = std::max(width, row.first.size());
  absl::StrAppend(out, title, "\n");
  for (const auto& [key, value] : rows) {
    absl::StrAppendFormat(out, "  %-*s  %s\n", static_cast<int>(width), key, value);
  }
}

// "873472 (0.87M)": exact for scripts reading the table, rounded for people.
std::string WithMagnitude(int64_t n) {
  if (n >= 1000000000) return absl::StrFormat("%d (%.2fB)", n, n / 1e9);
  if (n >= 1000000) return absl::StrFormat("%d (%.2fM)", n, n / 1e6);
  return absl::StrCat(n);
}

std::string Quoted(absl::string_view text) {
  return absl::StrCat("\"", absl::Utf8SafeCEscape(text), "\"");
}

}  // namespace

absl::StatusOr<std::string> ToJsonLine(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = false;
  options.always_print_primitive_fields = true;
  options.preserve_proto_field_names = true;
  std::string json;
  const auto status = google::protobuf::util::MessageToJsonString(message, &json, options);
  if (!status.ok()) {
    return absl::InternalError(absl::StrCat("JSON conversion failed: ", status.ToString()));
  }
  return json;
}

std::string FinishReasonName(v1::FinishReason reason) {
  const std::string& name = v1::FinishReason_Name(reason);
  if (name.empty()) return absl::StrCat("REASON_", static_cast<int>(reason));
  return std::string(absl::StripPrefix(name, "FINISH_REASON_"));
}

std::string FormatPrefixCache(const v1::PrefixCacheInfo& pc) {
  if (!pc.enabled()) return "off";
  const uint64_t q = pc.queried_tokens_total();
  std::string line =
      absl::StrFormat("on, %d of %d prompt tokens hit (%.1f%%), %d blocks cached, %d evicted",
                      pc.hit_tokens_total(), q, q > 0 ? 100.0 * pc.hit_tokens_total() / q : 0.0,
                      pc.cached_blocks(), pc.evicted_blocks_total());
  if (pc.partial_blocks_enabled()) {
    absl::StrAppendFormat(&line, " (%d of the hits from blocks copied in part)",
                          pc.copied_tokens_total());
  }
  if (pc.offload_enabled()) {
    absl::StrAppendFormat(&line, "; host tier: %d tokens hit, %d blocks cached, %d offloaded",
                          pc.host_hit_tokens_total(), pc.host_cached_blocks(),
                          pc.offloaded_blocks_total());
  }
  return line;
}

std::string FormatSummary(const v1::Finished& finished) {
  const double total_ms = finished.total_time_ms();
  const int32_t completion = finished.usage().completion_tokens();
  std::string line = absl::StrFormat(
      "finish=%s prompt_tokens=%d completion_tokens=%d queue_ms=%.1f ttft_ms=%.1f total_ms=%.1f "
      "tokens/s=%.1f",
      FinishReasonName(finished.reason()), finished.usage().prompt_tokens(), completion,
      finished.queue_time_ms(), finished.time_to_first_token_ms(), total_ms,
      total_ms > 0 ? completion * 1000.0 / total_ms : 0.0);
  if (finished.usage().cached_prompt_tokens() > 0) {
    absl::StrAppend(&line, " cached_prompt_tokens=", finished.usage().cached_prompt_tokens());
  }
  if (!finished.matched_stop().empty()) {
    absl::StrAppend(&line, " matched_stop=", Quoted(finished.matched_stop()));
  }
  if (!finished.error().empty()) absl::StrAppend(&line, " error=", Quoted(finished.error()));
  if (finished.cumulative_logprob() != 0) {  // a beam's
    absl::StrAppendFormat(&line, " cumulative_logprob=%.4f", finished.cumulative_logprob());
  }
  return line;
}

std::string FormatToolCalls(const v1::Finished& finished) {
  std::string out;
  for (const v1::ToolCall& c : finished.tool_calls()) {
    absl::StrAppend(&out, "tool call ", c.name(), " ", c.arguments(), " (", c.id(), ")\n");
  }
  return out;
}

namespace {

// " top: id "text" logprob ..." for a token's alternatives (nothing without any), then the
// line's end.
void AppendAlternatives(const v1::TokenLogprob& token, std::string* out) {
  if (token.top_size() > 0) {
    absl::StrAppend(out, " top:");
    for (const v1::TopLogprob& top : token.top()) {
      absl::StrAppendFormat(out, " %d %s %.4f", top.token_id(), Quoted(top.text()), top.logprob());
    }
  }
  absl::StrAppend(out, "\n");
}

}  // namespace

std::string FormatLogprobs(absl::Span<const v1::TokenLogprob> logprobs) {
  std::string out;
  for (const v1::TokenLogprob& token : logprobs) {
    absl::StrAppendFormat(&out, "token %d logprob %.4f", token.token_id(), token.logprob());
    AppendAlternatives(token, &out);
  }
  return out;
}

std::string FormatPromptLogprobs(absl::Span<const v1::TokenLogprob> logprobs) {
  std::string out;
  double sum = 0;
  for (size_t i = 0; i < logprobs.size(); ++i) {
    const v1::TokenLogprob& token = logprobs[i];
    if (i == 0) {
      absl::StrAppendFormat(&out, "prompt token %d (first: not scored)\n", token.token_id());
      continue;
    }
    sum += token.logprob();
    absl::StrAppendFormat(&out, "prompt token %d logprob %.4f rank %d", token.token_id(),
                          token.logprob(), token.rank());
    AppendAlternatives(token, &out);
  }
  const size_t scored = logprobs.empty() ? 0 : logprobs.size() - 1;
  if (scored > 0) {
    absl::StrAppendFormat(&out, "prompt: %d tokens scored, logprob sum %.4f, perplexity %.4f\n",
                          scored, sum, std::exp(-sum / static_cast<double>(scored)));
  }
  return out;
}

std::string FormatTokens(const v1::TokenizeResponse& response, bool pieces) {
  if (!pieces) return absl::StrCat(absl::StrJoin(response.token_ids(), " "), "\n");
  std::string out;
  for (int i = 0; i < response.token_ids_size(); ++i) {
    absl::StrAppendFormat(&out, "%d\t%d\t%s\n", i, response.token_ids(i),
                          i < response.pieces_size() ? Quoted(response.pieces(i)) : "");
  }
  return out;
}

std::string FormatStructuredOutput(const v1::StructuredOutputInfo& info) {
  return absl::StrFormat("%d constraints cached (%.1f MiB); %d compiled (%d refused) in %.2f s, "
                         "%d cache hits",
                         info.cached_constraints(), info.cached_bytes() / 1048576.0,
                         info.compiles_total(), info.refusals_total(),
                         info.compile_seconds_total(), info.cache_hits_total());
}

std::string FormatSpeculativeDecoding(const v1::SpeculativeDecodingInfo& info) {
  if (info.num_speculative_tokens() == 0) return "off";
  const uint64_t drafted = info.draft_tokens_total();
  return absl::StrFormat(
      "up to %d prompt-lookup tokens (%d-%d-grams); %d of %d draft tokens accepted (%.1f%%), "
      "%.2f a draft",
      info.num_speculative_tokens(), info.prompt_lookup_min(), info.prompt_lookup_max(),
      info.accepted_tokens_total(), drafted,
      drafted ? 100.0 * info.accepted_tokens_total() / drafted : 0.0,
      info.drafts_total() ? static_cast<double>(info.accepted_tokens_total()) / info.drafts_total()
                          : 0.0);
}

std::string FormatInfo(const v1::ModelInfo& model, const v1::ServerInfo& server) {
  std::vector<std::string> adapters;
  for (const v1::LoraAdapterInfo& a : model.lora_adapters()) {
    adapters.push_back(absl::StrCat(a.name(), " (rank ", a.rank(), ", ",
                                    absl::StrJoin(a.target_modules(), ","), ")"));
  }
  const Rows model_rows = {
      {"name", model.name()},
      {"architecture", model.architecture()},
      {"dtype", model.dtype()},
      {"weights_format", model.weights_format()},
      {"weight_quantization",
       model.weight_quantization().empty() ? "none" : model.weight_quantization()},
      {"parameters", model.num_experts() > 0
                         ? absl::StrCat(WithMagnitude(model.num_parameters()), "; ",
                                        WithMagnitude(model.num_active_parameters()), " active (",
                                        model.num_experts_per_tok(), " of ", model.num_experts(),
                                        " experts of ", model.moe_intermediate_size(), ")")
                         : WithMagnitude(model.num_parameters())},
      {"layers", absl::StrCat(model.num_layers())},
      {"hidden_size", absl::StrCat(model.hidden_size())},
      {"intermediate_size", absl::StrCat(model.intermediate_size())},
      {"attention_heads", absl::StrCat(model.num_attention_heads())},
      {"key_value_heads", absl::StrCat(model.num_key_value_heads())},
      {"vocab_size", absl::StrCat(model.vocab_size())},
      {"max_context", absl::StrCat(model.max_context())},
      {"bos_token_id", absl::StrCat(model.bos_token_id())},
      {"eos_token_ids", absl::StrJoin(model.eos_token_ids(), ",")},
      {"max_new_tokens_limit", absl::StrCat(model.max_new_tokens_limit())},
      {"chat_template", model.chat_template() ? "yes" : "no (chat requests refused)"},
      {"tool_call_parser", model.tool_call_parser()},
      {"embeddings", model.pooling().empty()
                         ? std::string("refused (the device returns no hidden states)")
                     : !model.embed_refusal().empty()
                         ? absl::StrCat("refused: ", model.embed_refusal())
                         : absl::StrCat(model.pooling(), " pooling",
                                        model.embedding_normalize() ? ", normalized" : "")},
      {"classifier",
       !model.classifier_refusal().empty() ? absl::StrCat("refused: ", model.classifier_refusal())
       : model.num_labels() == 0
           ? std::string("none")
           : absl::StrCat(model.num_labels(), " label", model.num_labels() == 1 ? "" : "s", ": ",
                          absl::StrJoin(model.labels(), ", "))},
      {"score", model.score_method() == v1::SCORE_METHOD_CROSS_ENCODER ? "cross-encoder"
                : model.score_method() == v1::SCORE_METHOD_EMBEDDING_SIMILARITY
                    ? "embedding similarity"
                    : "refused"},
      {"reasoning_parser", model.reasoning_parser()},
      {"lora_adapters", adapters.empty() ? "none" : absl::StrJoin(adapters, "; ")},
      {"lora_slots", model.max_loras() == 0
                         ? std::string("none")
                         : absl::StrCat(model.lora_adapters_size(), " of ", model.max_loras(),
                                        " taken, rank <= ", model.max_lora_rank(), ", ",
                                        model.lora_dtype(), " factors, loads while serving ",
                                        model.runtime_lora_updating() ? "allowed" : "off")},
  };
  const v1::KvUsage& kv = server.kv();
  const Rows server_rows = {
      {"version", server.version()},
      {"state", server.state()},
      {"device", server.device()},
      {"kv_mode", server.kv_mode()},
      {"kv_dtype", server.kv_dtype()},
      {"mixed_steps", server.mixed_steps() ? "on" : "off"},
      {"device_sampling", server.device_sampling() ? "on" : "off"},
      {"prefix_cache", FormatPrefixCache(server.prefix_cache())},
      {"structured", FormatStructuredOutput(server.structured_output())},
      {"speculative", FormatSpeculativeDecoding(server.speculative_decoding())},
      {"tensor_parallel", absl::StrCat(server.tensor_parallel())},
      {"slots", absl::StrCat(server.slots_in_use(), " in use / ", server.slots_total())},
      {"queue", absl::StrCat(server.queue_depth(), " waiting / limit ", server.queue_limit())},
      {"kv_blocks", absl::StrCat(kv.blocks_used(), " used, ", kv.blocks_reserved(), " reserved, ",
                                 kv.blocks_free(), " free / ", kv.blocks_total())},
      {"kv_block", absl::StrCat(kv.block_tokens(), " tokens, ", kv.bytes_per_block(), " bytes")},
      {"kv_host_blocks", absl::StrCat(kv.host_blocks_used())},
      {"window_release",
       kv.window_release_tokens() == 0
           ? std::string("off")
           : absl::StrCat("behind a ", kv.window_release_tokens(), "-token window, ",
                          kv.window_released_blocks_total(), " blocks released")},
      {"requests_total", absl::StrCat(server.requests_total())},
      {"tokens_generated", absl::StrCat(server.tokens_generated_total())},
      {"uptime_s", absl::StrFormat("%.1f", server.uptime_s())},
  };
  std::string out;
  AppendSection("model", model_rows, &out);
  AppendSection("server", server_rows, &out);
  return out;
}

}  // namespace kvrm::cli
