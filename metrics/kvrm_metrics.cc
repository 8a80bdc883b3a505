#include "metrics/kvrm_metrics.h"

#include <algorithm>

namespace kvrm {

const std::vector<double>& TtftBuckets() {
  // vLLM's time_to_first_token_seconds bounds (they already start at 1 ms).
  static const std::vector<double> b = {0.001, 0.005, 0.01, 0.02,  0.04,  0.06,  0.08, 0.1,
                                        0.25,  0.5,   0.75, 1.0,   2.5,   5.0,   7.5,  10.0,
                                        20.0,  40.0,  80.0, 160.0, 640.0, 2560.0};
  return b;
}

const std::vector<double>& InterTokenBuckets() {
  // vLLM's inter_token_latency_seconds bounds, with 1, 2.5 and 5 ms added below its 10 ms:
  // a small model on a fast device decodes faster than vLLM's first bucket.
  static const std::vector<double> b = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1,
                                        0.15,  0.2,    0.3,   0.4,  0.5,   0.75, 1.0,   2.5,
                                        5.0,   7.5,    10.0,  20.0, 40.0,  80.0};
  return b;
}

const std::vector<double>& RequestLatencyBuckets() {
  // vLLM's request latency bounds (from 0.3 s) with finer ones below 300 ms, so short requests,
  // queue times and prefill times resolve.
  static const std::vector<double> b = {0.001, 0.0025, 0.005, 0.01,   0.025, 0.05, 0.1,  0.2,
                                        0.3,   0.5,    0.8,   1.0,    1.5,   2.0,  2.5,  5.0,
                                        10.0,  15.0,   20.0,  30.0,   40.0,  50.0, 60.0, 120.0,
                                        240.0, 480.0,  960.0, 1920.0, 7680.0};
  return b;
}

const std::vector<double>& StepDurationBuckets() {
  static const std::vector<double> b = {0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032,
                                        0.064,  0.128, 0.256, 0.512, 1.024, 2.048, 4.096};
  return b;
}

const std::vector<double>& CompileBuckets() {
  static const auto* b =
      new std::vector<double>{0.0001, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0};
  return *b;
}

namespace {

const std::vector<double>& TransferGroupBuckets() {
  static const std::vector<double> b = {0, 1, 2, 4, 8, 16, 32, 64, 128, 256};
  return b;
}

const std::vector<double>& TransferByteBuckets() {
  // 0, then 4 KiB to 4 GiB by factors of 4.
  static const std::vector<double> b = [] {
    std::vector<double> v = {0};
    for (double x = 4096; x <= 4294967296.0; x *= 4) v.push_back(x);
    return v;
  }();
  return b;
}

const std::vector<double>& TransportWaitBuckets() {
  static const std::vector<double> b = {0,     0.0001, 0.00025, 0.0005, 0.001, 0.0025,
                                        0.005, 0.01,   0.025,   0.05,   0.1,   0.25};
  return b;
}

// vLLM's finished_reason values where they exist ("stop", "length", "abort").
const char* SuccessReason(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kEos:
      return "stop";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kCancelled:
      return "abort";
    case FinishReason::kTimeLimit:
      return "time_limit";
    case FinishReason::kError:
      return "error";
  }
  return "error";
}

double Seconds(absl::Duration d) { return absl::ToDoubleSeconds(d); }

// Growth of a cumulative total; 0 if it went backwards (never expected; keeps counters sane).
double Delta(uint64_t now, uint64_t before) {
  return now > before ? static_cast<double>(now - before) : 0.0;
}

}  // namespace

KvrmMetrics::KvrmMetrics(MetricRegistry* r, const KvrmMetricsOptions& options)
    : model_name_(options.model_name), kv_mode_(options.kv_mode) {
  const std::vector<std::string> base = {"model_name", "kv_mode"};
  auto labels = [&](std::vector<std::string> extra) {
    std::vector<std::string> all = base;
    all.insert(all.end(), extra.begin(), extra.end());
    return all;
  };
  auto values = [&](std::vector<std::string> extra) {
    std::vector<std::string> all = {options.model_name, options.kv_mode};
    all.insert(all.end(), extra.begin(), extra.end());
    return all;
  };
  auto histogram = [&](const std::string& name, const std::string& help,
                       const std::vector<double>& bounds) {
    return &r->AddHistogram(name, help, base, bounds).WithLabels(values({}));
  };
  auto gauge = [&](const std::string& name, const std::string& help) {
    return &r->AddGauge(name, help, base).WithLabels(values({}));
  };
  auto counter = [&](const std::string& name, const std::string& help) {
    return &r->AddCounter(name, help, base).WithLabels(values({}));
  };

  ttft_ = histogram("kvrm:time_to_first_token_seconds",
                    "Time from arrival to the first generated token, in seconds.", TtftBuckets());
  inter_token_ = histogram("kvrm:inter_token_latency_seconds",
                           "Time between consecutive generated tokens of a request, in seconds.",
                           InterTokenBuckets());
  time_per_output_token_ = histogram(
      "kvrm:time_per_output_token_seconds",
      "Same as kvrm:inter_token_latency_seconds (vLLM's former name, kept for dashboards).",
      InterTokenBuckets());
  e2e_ = histogram("kvrm:e2e_request_latency_seconds",
                   "Time from arrival to the end of a request (any finish reason), in seconds.",
                   RequestLatencyBuckets());
  queue_time_ = histogram("kvrm:request_queue_time_seconds",
                          "Time a request waited for a slot, in seconds.", RequestLatencyBuckets());
  prefill_time_ =
      histogram("kvrm:request_prefill_time_seconds",
                "Time from admission to the first token, in seconds.", RequestLatencyBuckets());
  decode_time_ = histogram("kvrm:request_decode_time_seconds",
                           "Time from the first token to the end of a request, in seconds.",
                           RequestLatencyBuckets());
  running_ = gauge("kvrm:num_requests_running", "Requests holding a slot.");
  waiting_ = gauge("kvrm:num_requests_waiting", "Requests queued for a slot.");
  kv_usage_ =
      gauge("kvrm:kv_cache_usage_perc", "Fraction of device KV blocks holding live KV (0 to 1).");
  prompt_tokens_ = counter("kvrm:prompt_tokens_total", "Prompt tokens of admitted requests.");
  generation_tokens_ = counter("kvrm:generation_tokens_total", "Generated tokens.");
  if (options.lora_slots > 0) {
    lora_requests_family_ = &r->AddCounter("kvrm:lora_requests_total",
                                           "Finished requests by LoRA adapter (any finish reason).",
                                           labels({"lora_adapter"}));
    lora_tokens_family_ = &r->AddCounter("kvrm:lora_generation_tokens_total",
                                         "Tokens generated by finished requests, by LoRA adapter.",
                                         labels({"lora_adapter"}));
    lora_requests_.assign(options.lora_slots, nullptr);
    lora_tokens_.assign(options.lora_slots, nullptr);
    lora_loaded_ = gauge("kvrm:lora_adapters_loaded", "LoRA adapters being served.");
    lora_loads_ = counter("kvrm:lora_adapter_loads_total",
                          "LoRA adapters put in a slot (at start-up, then loads while serving).");
  }
  Family<Counter>& success =
      r->AddCounter("kvrm:request_success_total", "Finished requests by finish reason.",
                    labels({"finished_reason"}));
  for (FinishReason f :
       {FinishReason::kLength, FinishReason::kEos, FinishReason::kStop, FinishReason::kCancelled,
        FinishReason::kTimeLimit, FinishReason::kError}) {
    success_[static_cast<int>(f)] = &success.WithLabels(values({SuccessReason(f)}));
  }
  embeddings_ = counter("kvrm:embedding_requests_total",
                        "Pooled inputs finished: embeddings, classifications, scored pairs (Embed, "
                        "Classify, Score; each input one request, also counted in "
                        "request_success_total).");
  embedding_tokens_ = counter("kvrm:embedding_prompt_tokens_total",
                              "Prompt tokens of the pooled inputs that finished.");
  device_sampled_ = counter("kvrm:device_sampled_tokens_total",
                            "Tokens sampled inside the decode step on the device "
                            "(--device_sampling); the rest were sampled on the host.");
  preemptions_ = counter("kvrm:num_preemptions_total",
                         "Requests preempted (KV swapped to host or dropped for recompute).");
  Family<Counter>& rejected =
      r->AddCounter("kvrm:requests_rejected_total",
                    "Requests refused at submission: queue_full (RESOURCE_EXHAUSTED), draining "
                    "(UNAVAILABLE) or other.",
                    labels({"reason"}));
  rejected_ = {&rejected.WithLabels(values({"queue_full"})),
               &rejected.WithLabels(values({"draining"})), &rejected.WithLabels(values({"other"}))};

  Family<Gauge>& reserved = r->AddGauge(
      "kvrm:kv_reserved_bytes", "KV bytes set aside for requests, per tier.", labels({"tier"}));
  Family<Gauge>& used =
      r->AddGauge("kvrm:kv_used_bytes", "KV bytes holding live KV, per tier.", labels({"tier"}));
  Family<Gauge>& free =
      r->AddGauge("kvrm:kv_free_bytes", "KV bytes free to reserve, per tier.", labels({"tier"}));
  for (Tier* t : {&device_, &host_}) {
    const std::string tier = t == &device_ ? "device" : "host";
    *t = Tier{&reserved.WithLabels(values({tier})), &used.WithLabels(values({tier})),
              &free.WithLabels(values({tier}))};
  }
  transfer_groups_ =
      counter("kvrm:transfer_groups_total", "Merged KV copy groups issued between tiers.");
  transfer_bytes_ = counter("kvrm:transfer_bytes_total", "KV bytes moved between tiers.");
  transfer_groups_per_step_ =
      histogram("kvrm:transfer_groups_per_step", "KV copy groups issued per engine step.",
                TransferGroupBuckets());
  transfer_bytes_per_step_ = histogram("kvrm:transfer_bytes_per_step",
                                       "KV bytes moved per engine step.", TransferByteBuckets());
  descriptor_commits_ = counter("kvrm:descriptor_commits_total",
                                "Step descriptors committed (one a step that runs).");
  transport_wait_ = counter("kvrm:transport_wait_seconds_total",
                            "Time the step replay waited on KV transport, in seconds.");
  transport_drain_wait_ = counter(
      "kvrm:transport_drain_wait_seconds_total",
      "Time KV growth waited for in-flight copies to give back the blocks they held (KV "
      "pressure), in seconds; not counted in kvrm:transport_wait_seconds_total.");
  transport_wait_per_step_ =
      histogram("kvrm:step_transport_wait_seconds",
                "Time one engine step waited on KV transport, in seconds.", TransportWaitBuckets());
  Family<Histogram>& step = r->AddHistogram(
      "kvrm:step_duration_seconds",
      "Duration of one engine forward pass: prefill chunks, a decode step, or both in one "
      "pass (mixed), in seconds.",
      labels({"phase"}), StepDurationBuckets());
  prefill_step_ = &step.WithLabels(values({"prefill"}));
  decode_step_ = &step.WithLabels(values({"decode"}));
  mixed_step_ = &step.WithLabels(values({"mixed"}));
  steps_ = counter("kvrm:engine_steps_total", "Engine loop iterations that did work.");
  Family<Gauge>& slots = r->AddGauge("kvrm:slots", "Decode slots by state.", labels({"state"}));
  slots_free_ = &slots.WithLabels(values({"free"}));
  slots_prefilling_ = &slots.WithLabels(values({"prefilling"}));
  slots_decoding_ = &slots.WithLabels(values({"decoding"}));
  // Far-history summaries make attention approximate: say so where dashboards look.
  gauge("kvrm:far_history_enabled",
        "1 when far-history summaries are on (attention over distant blocks is approximate), "
        "else 0.")
      ->Set(options.far_history ? 1 : 0);
  far_summarized_ = counter("kvrm:far_history_blocks_summarized_total",
                            "KV blocks replaced by a far-history summary and freed.");
  window_released_ = counter("kvrm:kv_window_released_blocks_total",
                             "KV blocks wholly behind a sliding window (a model whose every "
                             "layer slides) given back to the pool.");
  // Prefix caching (vLLM's prefix_cache_queries / prefix_cache_hits, in tokens): the hit rate
  // is hits / queries.
  prefix_queries_ = counter("kvrm:prefix_cache_queries_total",
                            "Prompt tokens looked up in the prefix cache.");
  prefix_hits_ = counter("kvrm:prefix_cache_hits_total",
                         "Prompt tokens found in the prefix cache (their prefill skipped).");
  prefix_evictions_ = counter("kvrm:prefix_cache_evictions_total",
                              "Cached KV blocks whose space was taken for other KV.");
  prefix_cached_ = gauge("kvrm:prefix_cache_bytes",
                         "KV bytes of finished histories kept for reuse (also counted free).");
  // Offload to the host tier (--prefix_cache_offload).
  prefix_host_hits_ = counter("kvrm:prefix_cache_host_hits_total",
                              "Prompt tokens copied back from the host tier's prefix cache "
                              "(also counted in kvrm:prefix_cache_hits_total).");
  prefix_copied_ = counter("kvrm:prefix_cache_copied_tokens_total",
                           "Prompt tokens that came from a cached KV block copied for part of "
                           "its tokens (also counted in kvrm:prefix_cache_hits_total).");
  prefix_offloaded_ = counter("kvrm:prefix_cache_offloaded_blocks_total",
                              "Prefix-cache KV blocks copied to the host tier on eviction.");
  prefix_host_cached_ = gauge("kvrm:prefix_cache_host_bytes",
                              "KV bytes of the prefix cache held in the host tier.");
  // Speculative decoding (vLLM's spec_decode counters): the acceptance rate is accepted / draft
  // tokens, and a draft's mean accepted length accepted / drafts.
  spec_drafts_ = counter("kvrm:spec_decode_num_drafts_total",
                         "Drafts verified (one per request and step that carried draft tokens).");
  spec_draft_tokens_ = counter("kvrm:spec_decode_num_draft_tokens_total",
                               "Draft tokens verified in decode passes.");
  spec_accepted_ = counter("kvrm:spec_decode_num_accepted_tokens_total",
                           "Draft tokens accepted: generated without a step of their own.");
  thinking_budget_ends_ =
      counter("kvrm:thinking_budget_ends_total",
              "Thinking blocks whose end a request's thinking budget wrote (the model had not "
              "closed them within the budget).");
  prefill_chunks_ =
      counter("kvrm:prefill_chunks_total",
              "Prompt chunks prefilled; over the steps that prefilled (the counts of "
              "kvrm:step_duration_seconds{phase=\"prefill\"} and {phase=\"mixed\"}), prompts "
              "per step.");
  prefix_resets_ = counter("kvrm:prefix_cache_resets_total",
                           "Prefix-cache resets (ResetPrefixCache, POST /reset_prefix_cache).");
  stream_chunks_merged_ =
      counter("kvrm:stream_chunks_merged_total",
              "Output chunks merged into a queued response message because the client read "
              "its stream slower than its tokens came.");
  Family<Counter>& structured =
      r->AddCounter("kvrm:structured_output_requests_total",
                    "Requests with a structured-output constraint, by kind.", labels({"kind"}));
  structured_.requests = {
      &structured.WithLabels(values({"regex"})), &structured.WithLabels(values({"json_schema"})),
      &structured.WithLabels(values({"json_object"})), &structured.WithLabels(values({"choice"})),
      &structured.WithLabels(values({"grammar"}))};
  structured_.compiles = counter("kvrm:structured_output_compiles_total",
                                 "Structured-output constraints compiled into token masks (cache "
                                 "misses), refused ones included.");
  structured_.refusals = counter("kvrm:structured_output_refusals_total",
                                 "Structured-output constraints refused at compile "
                                 "(INVALID_ARGUMENT: malformed, unsupported or too large).");
  structured_.cache_hits = counter("kvrm:structured_output_cache_hits_total",
                                   "Structured-output constraints found already compiled.");
  structured_.compile_seconds =
      histogram("kvrm:structured_output_compile_seconds",
                "Time to compile one structured-output constraint, in seconds.",
                CompileBuckets());
  Family<Counter>& tool_requests =
      r->AddCounter("kvrm:tool_call_requests_total",
                    "Chat requests that offered tools, by tool_choice.", labels({"choice"}));
  tool_calls_.requests = {&tool_requests.WithLabels(values({"auto"})),
                          &tool_requests.WithLabels(values({"none"})),
                          &tool_requests.WithLabels(values({"required"})),
                          &tool_requests.WithLabels(values({"function"}))};
  tool_calls_.calls = counter("kvrm:tool_calls_total", "Function calls returned in replies.");
  tool_calls_.parse_failures =
      counter("kvrm:tool_call_parse_failures_total",
              "Replies whose held function-call text did not parse and was returned as text.");

  Family<Counter>& http_requests = r->AddCounter(
      "kvrm:http_requests_total",
      "Requests to the OpenAI-compatible HTTP API, by handler (the route) and HTTP status (499: the client "
      "hung up before the reply began).",
      labels({"handler", "code"}));
  Family<Histogram>& http_duration = r->AddHistogram(
      "kvrm:http_request_duration_seconds",
      "Time from a request's headers to its reply's last byte (a stream's end), in seconds.",
      labels({"handler"}), RequestLatencyBuckets());
  http_api_.requests_family_ = &http_requests;
  http_api_.base_values_ = values({});
  for (int e = 0; e < kHttpRoutes; ++e) {
    const std::string endpoint = HttpRouteName(static_cast<HttpRoute>(e));
    for (size_t c = 0; c < HttpApiMetrics::kCodes.size(); ++c) {
      http_api_.requests_[e][c] = &http_requests.WithLabels(
          values({endpoint, std::to_string(HttpApiMetrics::kCodes[c])}));
    }
    http_api_.duration_[e] = &http_duration.WithLabels(values({endpoint}));
  }
  http_api_.connections_ =
      gauge("kvrm:http_connections", "Open connections to the OpenAI-compatible HTTP API.");
  http_api_.client_disconnects_ =
      counter("kvrm:http_client_disconnects_total",
              "HTTP API requests cancelled because the client hung up before their end.");
}

const char* HttpRouteName(HttpRoute route) {
  switch (route) {
    case HttpRoute::kChatCompletions:
      return "chat_completions";
    case HttpRoute::kCompletions:
      return "completions";
    case HttpRoute::kModels:
      return "models";
    case HttpRoute::kTokenize:
      return "tokenize";
    case HttpRoute::kDetokenize:
      return "detokenize";
    case HttpRoute::kHealth:
      return "health";
    case HttpRoute::kMetrics:
      return "metrics";
    case HttpRoute::kVersion:
      return "version";
    case HttpRoute::kLoraAdapters:
      return "lora_adapters";
    case HttpRoute::kResponses:
      return "responses";
    case HttpRoute::kEmbeddings:
      return "embeddings";
    case HttpRoute::kClassify:
      return "classify";
    case HttpRoute::kScore:
      return "score";
    case HttpRoute::kRerank:
      return "rerank";
    case HttpRoute::kMessages:
      return "messages";
    case HttpRoute::kResetPrefixCache:
      return "reset_prefix_cache";
    case HttpRoute::kOther:
      break;
  }
  return "other";
}

void HttpApiMetrics::Record(HttpRoute route, int code, double seconds) const {
  const int e = std::clamp(static_cast<int>(route), 0, kHttpRoutes - 1);
  duration_[e]->Observe(seconds);
  for (size_t c = 0; c < kCodes.size(); ++c) {
    if (kCodes[c] == code) {
      requests_[e][c]->Add();
      return;
    }
  }
  std::vector<std::string> v = base_values_;
  v.push_back(HttpRouteName(route));
  v.push_back(std::to_string(code));
  requests_family_->WithLabels(v).Add();
}

void KvrmMetrics::OnAdmitted(const GenerationRequest& request, absl::Duration queue_time) {
  queue_time_->Observe(Seconds(queue_time));
  prompt_tokens_->Add(static_cast<double>(request.prompt.size()));
}

void KvrmMetrics::OnFirstToken(const GenerationRequest&, absl::Duration ttft) {
  ttft_->Observe(Seconds(ttft));
  generation_tokens_->Add();
  ++decoding_;
}

void KvrmMetrics::OnNextToken(const GenerationRequest&, absl::Duration gap) {
  const double s = Seconds(gap);
  inter_token_->Observe(s);
  time_per_output_token_->Observe(s);
  generation_tokens_->Add();
}

void KvrmMetrics::OnLoraAdapter(int32_t slot, const LoraAdapter* adapter) {
  if (slot < 0 || slot >= static_cast<int32_t>(lora_requests_.size())) return;
  // An adapter loaded again under a name continues its series (counters of a name only grow).
  lora_requests_[slot] = nullptr;
  lora_tokens_[slot] = nullptr;
  if (adapter != nullptr) {
    lora_requests_[slot] =
        &lora_requests_family_->WithLabels({model_name_, kv_mode_, adapter->name});
    lora_tokens_[slot] = &lora_tokens_family_->WithLabels({model_name_, kv_mode_, adapter->name});
  }
  if (adapter != nullptr) lora_loads_->Add();
  lora_loaded_->Set(static_cast<double>(
      std::count_if(lora_requests_.begin(), lora_requests_.end(), [](Counter* c) { return c; })));
}

void KvrmMetrics::OnFinished(const GenerationRequest& request, const FinishInfo& info) {
  success_[static_cast<int>(info.reason)]->Add();
  if (request.lora_adapter >= 0 &&
      request.lora_adapter < static_cast<int32_t>(lora_requests_.size()) &&
      lora_requests_[request.lora_adapter] != nullptr) {
    lora_requests_[request.lora_adapter]->Add();
    lora_tokens_[request.lora_adapter]->Add(info.completion_tokens);
  }
  e2e_->Observe(info.total_time_ms / 1e3);
  if (request.pooling != Pooling::kNone && info.reason == FinishReason::kStop) {
    embeddings_->Add();
    embedding_tokens_->Add(info.prompt_tokens);
  }
  if (info.completion_tokens > 0) {
    // Only requests that reached a first token were decoding (FinishQueued and slots ended in
    // prefill report none).
    --decoding_;
    prefill_time_->Observe(std::max(0.0, info.time_to_first_token_ms - info.queue_time_ms) / 1e3);
    decode_time_->Observe(std::max(0.0, info.total_time_ms - info.time_to_first_token_ms) / 1e3);
  }
}

void KvrmMetrics::OnRejected(const absl::Status& status) {
  const int i = status.code() == absl::StatusCode::kResourceExhausted ? 0
                : status.code() == absl::StatusCode::kUnavailable     ? 1
                                                                      : 2;
  rejected_[i]->Add();
}

void KvrmMetrics::OnPrefillChunk(int32_t, absl::Duration duration) {
  prefill_step_->Observe(Seconds(duration));
}

void KvrmMetrics::OnDecodeStep(int32_t, absl::Duration duration) {
  decode_step_->Observe(Seconds(duration));
}

void KvrmMetrics::OnMixedStep(int32_t, int32_t, absl::Duration duration) {
  mixed_step_->Observe(Seconds(duration));
}

void KvrmMetrics::OnStats(const EngineStats& s) {
  running_->Set(s.slots_in_use);
  waiting_->Set(s.queue_depth);
  const KvStats& kv = s.kv;
  kv_usage_->Set(kv.blocks_total > 0 ? static_cast<double>(kv.blocks_used) / kv.blocks_total : 0.0);
  const double block = static_cast<double>(kv.bytes_per_block);
  device_.reserved->Set(block * kv.blocks_reserved);
  device_.used->Set(block * kv.blocks_used);
  device_.free->Set(block * kv.blocks_free);
  // The host tier holds the KV of swapped-out requests: all of it is both reserved and live.
  // KvStats reports no host capacity, so free stays 0.
  host_.reserved->Set(block * kv.host_blocks_used);
  host_.used->Set(block * kv.host_blocks_used);

  const int32_t decoding = std::clamp(decoding_, 0, s.slots_in_use);
  slots_decoding_->Set(decoding);
  slots_prefilling_->Set(s.slots_in_use - decoding);
  slots_free_->Set(s.slots_total - s.slots_in_use);

  // Cumulative engine totals become counter increments. Per-step histograms get one
  // observation per publication in which engine steps ran, of what moved since the last such
  // publication (divided among the steps when several ran).
  transfer_groups_->Add(Delta(s.transfer_groups_total, last_.transfer_groups_total));
  transfer_bytes_->Add(Delta(s.transfer_bytes_total, last_.transfer_bytes_total));
  transport_wait_->Add(
      std::max(0.0, s.transport_wait_seconds_total - last_.transport_wait_seconds_total));
  transport_drain_wait_->Add(std::max(
      0.0, s.transport_drain_wait_seconds_total - last_.transport_drain_wait_seconds_total));
  descriptor_commits_->Add(Delta(s.descriptor_commits_total, last_.descriptor_commits_total));
  preemptions_->Add(Delta(s.preemptions_total, last_.preemptions_total));
  device_sampled_->Add(
      Delta(s.device_sampled_tokens_total, last_.device_sampled_tokens_total));
  far_summarized_->Add(
      Delta(s.far_blocks_summarized_total, last_.far_blocks_summarized_total));
  window_released_->Add(Delta(s.window_blocks_released_total, last_.window_blocks_released_total));
  prefix_queries_->Add(Delta(s.prefix_cache_queries_total, last_.prefix_cache_queries_total));
  prefix_hits_->Add(Delta(s.prefix_cache_hits_total, last_.prefix_cache_hits_total));
  prefix_evictions_->Add(
      Delta(s.prefix_cache_evictions_total, last_.prefix_cache_evictions_total));
  prefix_cached_->Set(block * kv.blocks_cached);
  prefix_host_hits_->Add(
      Delta(s.prefix_cache_host_hits_total, last_.prefix_cache_host_hits_total));
  prefix_copied_->Add(
      Delta(s.prefix_cache_copied_tokens_total, last_.prefix_cache_copied_tokens_total));
  prefix_offloaded_->Add(Delta(s.prefix_cache_offloaded_blocks_total,
                               last_.prefix_cache_offloaded_blocks_total));
  prefix_host_cached_->Set(block * kv.host_blocks_cached);
  spec_drafts_->Add(Delta(s.spec_decode_drafts_total, last_.spec_decode_drafts_total));
  spec_draft_tokens_->Add(
      Delta(s.spec_decode_draft_tokens_total, last_.spec_decode_draft_tokens_total));
  spec_accepted_->Add(
      Delta(s.spec_decode_accepted_tokens_total, last_.spec_decode_accepted_tokens_total));
  thinking_budget_ends_->Add(Delta(s.thinking_budget_ends_total, last_.thinking_budget_ends_total));
  prefill_chunks_->Add(Delta(s.prefill_chunks_total, last_.prefill_chunks_total));
  prefix_resets_->Add(Delta(s.prefix_cache_resets_total, last_.prefix_cache_resets_total));
  if (s.steps_total > step_base_.steps_total) {
    const double steps = Delta(s.steps_total, step_base_.steps_total);
    steps_->Add(steps);
    transfer_groups_per_step_->Observe(
        Delta(s.transfer_groups_total, step_base_.transfer_groups_total) / steps);
    transfer_bytes_per_step_->Observe(
        Delta(s.transfer_bytes_total, step_base_.transfer_bytes_total) / steps);
    transport_wait_per_step_->Observe(
        std::max(0.0, s.transport_wait_seconds_total - step_base_.transport_wait_seconds_total) /
        steps);
    step_base_ = s;
  }
  last_ = s;
}

}  // namespace kvrm
