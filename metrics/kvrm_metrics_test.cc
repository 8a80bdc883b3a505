#include "metrics/kvrm_metrics.h"

#include <atomic>
#include <cstdlib>
#include <new>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/testing/alloc_counter.h"
#include "gtest/gtest.h"

namespace kvrm {
namespace {

constexpr char kLabels[] = "model_name=\"tiny\",kv_mode=\"static\"";

// The value of the sample whose line starts with `series` followed by a space.
double Sample(const std::string& text, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (absl::StartsWith(line, series + " ")) {
      double v = 0;
      EXPECT_TRUE(absl::SimpleAtod(line.substr(series.size() + 1), &v)) << line;
      return v;
    }
  }
  ADD_FAILURE() << "no sample " << series;
  return -1;
}

std::string Series(const std::string& name, const std::string& extra = "") {
  return absl::StrCat(name, "{", kLabels, extra.empty() ? "" : ",", extra, "}");
}

class KvrmMetricsTest : public ::testing::Test {
 protected:
  KvrmMetricsTest() : metrics_(&registry_, KvrmMetricsOptions{"tiny", "static"}) {
    request_.prompt = {1, 2, 3, 4, 5};
  }
  double Get(const std::string& name, const std::string& extra = "") {
    return Sample(registry_.Render(), Series(name, extra));
  }
  MetricRegistry registry_;
  KvrmMetrics metrics_;
  GenerationRequest request_;
};

TEST_F(KvrmMetricsTest, RequestLifecycleFillsTheVllmFamilies) {
  metrics_.OnAdmitted(request_, absl::Milliseconds(3));
  metrics_.OnFirstToken(request_, absl::Milliseconds(15));
  metrics_.OnNextToken(request_, absl::Milliseconds(4));
  metrics_.OnNextToken(request_, absl::Milliseconds(40));
  FinishInfo info;
  info.reason = FinishReason::kEos;
  info.prompt_tokens = 5;
  info.completion_tokens = 3;
  info.queue_time_ms = 3;
  info.time_to_first_token_ms = 15;
  info.total_time_ms = 59;
  metrics_.OnFinished(request_, info);

  EXPECT_EQ(Get("kvrm:prompt_tokens_total"), 5);
  EXPECT_EQ(Get("kvrm:generation_tokens_total"), 3);
  EXPECT_EQ(Get("kvrm:request_success_total", "finished_reason=\"stop\""), 1);
  EXPECT_EQ(Get("kvrm:request_success_total", "finished_reason=\"length\""), 0);
  EXPECT_EQ(Get("kvrm:time_to_first_token_seconds_bucket", "le=\"0.01\""), 0);
  EXPECT_EQ(Get("kvrm:time_to_first_token_seconds_bucket", "le=\"0.02\""), 1);
  EXPECT_DOUBLE_EQ(Get("kvrm:time_to_first_token_seconds_sum"), 0.015);
  EXPECT_EQ(Get("kvrm:inter_token_latency_seconds_count"), 2);
  EXPECT_EQ(Get("kvrm:inter_token_latency_seconds_bucket", "le=\"0.005\""), 1);
  EXPECT_EQ(Get("kvrm:time_per_output_token_seconds_count"), 2);
  EXPECT_EQ(Get("kvrm:request_queue_time_seconds_bucket", "le=\"0.0025\""), 0);
  EXPECT_EQ(Get("kvrm:request_queue_time_seconds_bucket", "le=\"0.005\""), 1);
  // prefill = ttft - queue = 12 ms; decode = total - ttft = 44 ms; e2e = 59 ms.
  EXPECT_DOUBLE_EQ(Get("kvrm:request_prefill_time_seconds_sum"), 0.012);
  EXPECT_DOUBLE_EQ(Get("kvrm:request_decode_time_seconds_sum"), 0.044);
  EXPECT_DOUBLE_EQ(Get("kvrm:e2e_request_latency_seconds_sum"), 0.059);
  EXPECT_EQ(Get("kvrm:e2e_request_latency_seconds_bucket", "le=\"0.05\""), 0);
  EXPECT_EQ(Get("kvrm:e2e_request_latency_seconds_bucket", "le=\"0.1\""), 1);
}

TEST_F(KvrmMetricsTest, EmbeddingsCountTheirInputsAndTokensOnlyWhenTheyFinishWithAVector) {
  FinishInfo info;
  info.reason = FinishReason::kEos;
  info.prompt_tokens = 5;
  info.completion_tokens = 2;
  metrics_.OnFinished(request_, info);  // a generation: not an embedding
  GenerationRequest embed = request_;
  embed.pooling = Pooling::kMean;
  info.reason = FinishReason::kStop;
  info.completion_tokens = 0;
  metrics_.OnFinished(embed, info);
  info.prompt_tokens = 7;
  metrics_.OnFinished(embed, info);
  info.reason = FinishReason::kCancelled;  // no vector
  metrics_.OnFinished(embed, info);
  EXPECT_EQ(Get("kvrm:embedding_requests_total"), 2);
  EXPECT_EQ(Get("kvrm:embedding_prompt_tokens_total"), 12);
  EXPECT_EQ(Get("kvrm:request_success_total", "finished_reason=\"stop\""), 3);
}

TEST_F(KvrmMetricsTest, QueuedCancellationCountsAsAbortWithoutPrefillOrDecode) {
  FinishInfo info;
  info.reason = FinishReason::kCancelled;
  info.queue_time_ms = 7;
  info.total_time_ms = 7;
  metrics_.OnFinished(request_, info);
  EXPECT_EQ(Get("kvrm:request_success_total", "finished_reason=\"abort\""), 1);
  EXPECT_EQ(Get("kvrm:e2e_request_latency_seconds_count"), 1);
  EXPECT_EQ(Get("kvrm:request_prefill_time_seconds_count"), 0);
  EXPECT_EQ(Get("kvrm:request_decode_time_seconds_count"), 0);
}

TEST_F(KvrmMetricsTest, RejectionsByReason) {
  metrics_.OnRejected(absl::ResourceExhaustedError("queue full"));
  metrics_.OnRejected(absl::ResourceExhaustedError("queue full"));
  metrics_.OnRejected(absl::UnavailableError("draining"));
  EXPECT_EQ(Get("kvrm:requests_rejected_total", "reason=\"queue_full\""), 2);
  EXPECT_EQ(Get("kvrm:requests_rejected_total", "reason=\"draining\""), 1);
  EXPECT_EQ(Get("kvrm:requests_rejected_total", "reason=\"other\""), 0);
}

TEST_F(KvrmMetricsTest, StatsBecomeGaugesSlotStatesAndCounterIncrements) {
  EngineStats s;
  s.slots_total = 8;
  s.slots_in_use = 3;
  s.queue_depth = 5;
  s.kv.blocks_total = 100;
  s.kv.blocks_used = 25;
  s.kv.blocks_reserved = 60;
  s.kv.blocks_free = 40;
  s.kv.bytes_per_block = 1024;
  s.kv.host_blocks_used = 7;
  s.steps_total = 10;
  s.transfer_groups_total = 4;
  s.transfer_bytes_total = 8192;
  s.transport_wait_seconds_total = 0.002;
  s.transport_drain_wait_seconds_total = 0.0005;
  s.descriptor_commits_total = 9;
  s.preemptions_total = 1;
  s.device_sampled_tokens_total = 11;
  metrics_.OnFirstToken(request_, absl::Milliseconds(1));  // one slot decoding
  metrics_.OnStats(s);
  EXPECT_EQ(Get("kvrm:num_requests_running"), 3);
  EXPECT_EQ(Get("kvrm:num_requests_waiting"), 5);
  EXPECT_DOUBLE_EQ(Get("kvrm:kv_cache_usage_perc"), 0.25);
  EXPECT_EQ(Get("kvrm:kv_reserved_bytes", "tier=\"device\""), 60 * 1024);
  EXPECT_EQ(Get("kvrm:kv_used_bytes", "tier=\"device\""), 25 * 1024);
  EXPECT_EQ(Get("kvrm:kv_free_bytes", "tier=\"device\""), 40 * 1024);
  EXPECT_EQ(Get("kvrm:kv_used_bytes", "tier=\"host\""), 7 * 1024);
  EXPECT_EQ(Get("kvrm:slots", "state=\"free\""), 5);
  EXPECT_EQ(Get("kvrm:slots", "state=\"decoding\""), 1);
  EXPECT_EQ(Get("kvrm:slots", "state=\"prefilling\""), 2);
  EXPECT_EQ(Get("kvrm:engine_steps_total"), 10);
  EXPECT_EQ(Get("kvrm:transfer_groups_total"), 4);
  EXPECT_EQ(Get("kvrm:transfer_bytes_total"), 8192);
  EXPECT_DOUBLE_EQ(Get("kvrm:transport_wait_seconds_total"), 0.002);
  EXPECT_DOUBLE_EQ(Get("kvrm:transport_drain_wait_seconds_total"), 0.0005);
  EXPECT_EQ(Get("kvrm:descriptor_commits_total"), 9);
  EXPECT_EQ(Get("kvrm:num_preemptions_total"), 1);
  EXPECT_EQ(Get("kvrm:device_sampled_tokens_total"), 11);

  // A publication without a step adds to the counters but not to the per-step histograms.
  s.transfer_groups_total = 6;
  metrics_.OnStats(s);
  EXPECT_EQ(Get("kvrm:transfer_groups_total"), 6);
  EXPECT_EQ(Get("kvrm:transfer_groups_per_step_count"), 1);
  // The next step's observation covers everything since the last step: 6 - 4 + 1 groups.
  s.steps_total = 11;
  s.transfer_groups_total = 7;
  metrics_.OnStats(s);
  EXPECT_EQ(Get("kvrm:transfer_groups_total"), 7);
  EXPECT_EQ(Get("kvrm:transfer_groups_per_step_count"), 2);
  EXPECT_DOUBLE_EQ(Get("kvrm:transfer_groups_per_step_sum"), 0.4 + 3);  // 4 over 10 steps, 3
  EXPECT_EQ(Get("kvrm:engine_steps_total"), 11);
}

TEST_F(KvrmMetricsTest, StepDurationsByPhase) {
  metrics_.OnPrefillChunk(64, absl::Milliseconds(30));
  metrics_.OnDecodeStep(4, absl::Microseconds(900));
  metrics_.OnDecodeStep(4, absl::Microseconds(1100));
  metrics_.OnMixedStep(4, 16, absl::Milliseconds(7));
  EXPECT_EQ(Get("kvrm:step_duration_seconds_count", "phase=\"prefill\""), 1);
  EXPECT_EQ(Get("kvrm:step_duration_seconds_count", "phase=\"decode\""), 2);
  EXPECT_EQ(Get("kvrm:step_duration_seconds_count", "phase=\"mixed\""), 1);
  EXPECT_DOUBLE_EQ(Get("kvrm:step_duration_seconds_sum", "phase=\"mixed\""), 0.007);
  EXPECT_EQ(Get("kvrm:step_duration_seconds_bucket", "phase=\"decode\",le=\"0.001\""), 1);
}

TEST_F(KvrmMetricsTest, BucketLayoutsKeepVllmBoundsAndResolveBelow300ms) {
  for (const std::vector<double>* b :
       {&TtftBuckets(), &InterTokenBuckets(), &RequestLatencyBuckets()}) {
    EXPECT_LE(b->front(), 0.001);
    int below_300ms = 0;
    for (double x : *b) below_300ms += x < 0.3;
    EXPECT_GE(below_300ms, 6);
  }
  // vLLM's request latency bounds are all present, so le-based dashboard queries still match.
  for (double x : {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
                   30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}) {
    EXPECT_TRUE(std::count(RequestLatencyBuckets().begin(), RequestLatencyBuckets().end(), x)) << x;
  }
}

TEST_F(KvrmMetricsTest, HooksDoNotAllocate) {
  if (!alloc_counter::kAvailable) GTEST_SKIP() << "allocation counting is off under sanitizers";
  EngineStats s;
  s.slots_total = 4;
  s.slots_in_use = 2;
  s.kv.blocks_total = 10;
  FinishInfo info;
  info.reason = FinishReason::kLength;
  info.completion_tokens = 2;
  info.total_time_ms = 5;
  const int64_t before = alloc_counter::AllocationCount();
  for (int i = 0; i < 100; ++i) {
    metrics_.OnAdmitted(request_, absl::Milliseconds(1));
    metrics_.OnFirstToken(request_, absl::Milliseconds(2));
    metrics_.OnNextToken(request_, absl::Milliseconds(1));
    metrics_.OnPrefillChunk(16, absl::Milliseconds(1));
    metrics_.OnDecodeStep(2, absl::Milliseconds(1));
    metrics_.OnRejected(absl::ResourceExhaustedError(""));
    ++s.steps_total;
    metrics_.OnStats(s);
    metrics_.OnFinished(request_, info);
  }
  EXPECT_EQ(alloc_counter::AllocationCount() - before, 0);
  // A scrape, by contrast, does allocate: the counter is live.
  const int64_t before_render = alloc_counter::AllocationCount();
  const std::string text = registry_.Render();
  EXPECT_GT(alloc_counter::AllocationCount() - before_render, 0);
  EXPECT_TRUE(absl::StrContains(text, "kvrm:engine_steps_total{"));
}

// Far-history summaries make attention approximate: the gauge says whether they are on, the
// counter how many blocks they replaced.
TEST_F(KvrmMetricsTest, FarHistoryOffByDefault) {
  EXPECT_EQ(Get("kvrm:far_history_enabled"), 0);
  EXPECT_EQ(Get("kvrm:far_history_blocks_summarized_total"), 0);
}

TEST(KvrmMetricsFarHistoryTest, EnabledGaugeAndSummarizedBlocks) {
  MetricRegistry registry;
  KvrmMetricsOptions options{"tiny", "kvrm"};
  options.far_history = true;
  KvrmMetrics metrics(&registry, options);
  EngineStats s;
  s.far_blocks_summarized_total = 12;
  metrics.OnStats(s);
  s.far_blocks_summarized_total = 15;
  metrics.OnStats(s);
  const std::string labels = "{model_name=\"tiny\",kv_mode=\"kvrm\"}";
  EXPECT_EQ(Sample(registry.Render(), "kvrm:far_history_enabled" + labels), 1);
  EXPECT_EQ(Sample(registry.Render(), "kvrm:far_history_blocks_summarized_total" + labels), 15);
}

TEST(KvrmMetricsWindowReleaseTest, ReleasedBlocksCountTheEngineTotal) {
  MetricRegistry registry;
  KvrmMetrics metrics(&registry, KvrmMetricsOptions{"tiny", "kvrm"});
  EngineStats s;
  s.window_blocks_released_total = 7;
  metrics.OnStats(s);
  s.window_blocks_released_total = 31;
  metrics.OnStats(s);
  const std::string labels = "{model_name=\"tiny\",kv_mode=\"kvrm\"}";
  EXPECT_EQ(Sample(registry.Render(), "kvrm:kv_window_released_blocks_total" + labels), 31);
}

TEST(KvrmMetricsLoraTest, FinishedRequestsAndTokensByAdapter) {
  MetricRegistry registry;
  KvrmMetricsOptions options{"tiny", "kvrm"};
  options.lora_slots = 3;
  KvrmMetrics metrics(&registry, options);
  LoraAdapter sql, chat;
  sql.name = "sql";
  chat.name = "chat";
  metrics.OnLoraAdapter(0, &sql);
  metrics.OnLoraAdapter(1, &chat);
  GenerationRequest request;
  FinishInfo info;
  for (const auto& [adapter, tokens] :
       {std::pair{1, 7}, std::pair{1, 5}, std::pair{-1, 9}, std::pair{0, 2}, std::pair{2, 4}}) {
    request.lora_adapter = adapter;  // slot 2 is empty: counted nowhere
    info.completion_tokens = tokens;
    metrics.OnFinished(request, info);
  }
  std::string text = registry.Render();
  const std::string base = "{model_name=\"tiny\",kv_mode=\"kvrm\"}";
  const std::string sql_labels = "{model_name=\"tiny\",kv_mode=\"kvrm\",lora_adapter=\"sql\"}";
  const std::string chat_labels = "{model_name=\"tiny\",kv_mode=\"kvrm\",lora_adapter=\"chat\"}";
  EXPECT_EQ(Sample(text, "kvrm:lora_requests_total" + sql_labels), 1);
  EXPECT_EQ(Sample(text, "kvrm:lora_requests_total" + chat_labels), 2);
  EXPECT_EQ(Sample(text, "kvrm:lora_generation_tokens_total" + sql_labels), 2);
  EXPECT_EQ(Sample(text, "kvrm:lora_generation_tokens_total" + chat_labels), 12);
  EXPECT_EQ(Sample(text, "kvrm:lora_adapters_loaded" + base), 2);
  EXPECT_EQ(Sample(text, "kvrm:lora_adapter_loads_total" + base), 2);

  // Unloaded, then "sql" loaded again into slot 1: its series go on from where they were.
  metrics.OnLoraAdapter(1, nullptr);
  metrics.OnLoraAdapter(0, nullptr);
  text = registry.Render();
  EXPECT_EQ(Sample(text, "kvrm:lora_adapters_loaded" + base), 0);
  metrics.OnLoraAdapter(1, &sql);
  request.lora_adapter = 1;
  info.completion_tokens = 3;
  metrics.OnFinished(request, info);
  text = registry.Render();
  EXPECT_EQ(Sample(text, "kvrm:lora_requests_total" + sql_labels), 2);
  EXPECT_EQ(Sample(text, "kvrm:lora_generation_tokens_total" + sql_labels), 5);
  EXPECT_EQ(Sample(text, "kvrm:lora_requests_total" + chat_labels), 2);
  EXPECT_EQ(Sample(text, "kvrm:lora_adapters_loaded" + base), 1);
  EXPECT_EQ(Sample(text, "kvrm:lora_adapter_loads_total" + base), 3);
}

TEST_F(KvrmMetricsTest, NoLoraSeriesWithoutAdapters) {
  EXPECT_EQ(registry_.Render().find("kvrm:lora_"), std::string::npos);
}

TEST(KvrmMetricsPrefixCacheTest, CountsQueriedAndHitTokensEvictionsAndCachedBytes) {
  MetricRegistry registry;
  KvrmMetrics metrics(&registry, KvrmMetricsOptions{"tiny", "kvrm"});
  EngineStats s;
  s.kv.bytes_per_block = 1000;
  s.prefix_cache_queries_total = 300;
  s.prefix_cache_hits_total = 128;
  s.kv.blocks_cached = 7;
  metrics.OnStats(s);
  s.prefix_cache_queries_total = 450;
  s.prefix_cache_hits_total = 160;
  s.prefix_cache_evictions_total = 3;
  s.prefix_cache_copied_tokens_total = 21;
  s.kv.blocks_cached = 5;
  metrics.OnStats(s);
  const std::string text = registry.Render();
  const std::string labels = "{model_name=\"tiny\",kv_mode=\"kvrm\"}";
  EXPECT_EQ(Sample(text, "kvrm:prefix_cache_queries_total" + labels), 450);
  EXPECT_EQ(Sample(text, "kvrm:prefix_cache_hits_total" + labels), 160);
  EXPECT_EQ(Sample(text, "kvrm:prefix_cache_evictions_total" + labels), 3);
  EXPECT_EQ(Sample(text, "kvrm:prefix_cache_bytes" + labels), 5000);
  EXPECT_EQ(Sample(text, "kvrm:prefix_cache_copied_tokens_total" + labels), 21);
}

}  // namespace
}  // namespace kvrm
