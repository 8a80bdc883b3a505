// Speculative decoding by prompt lookup (EngineOptions::speculative_tokens): drafts verified in
// the decode pass never change what is generated. The same requests (greedy and seeded
// sampling, penalties, logprobs, stop tokens, min_tokens, EOS) give identical tokens, logprobs,
// texts and finishes with drafts and without, under the static baseline and KV-RM (with
// fragmentation, compaction and swaps to the host tier), while drafts are proposed, accepted and
// rejected and the requests take fewer steps; every block comes back. The CPU backend's draft
// rows compute exactly the logits of the steps they stand for, and malformed drafts are refused.
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/logging.h"
#include "common/testing/alloc_counter.h"
#include "gtest/gtest.h"
#include "runtime/cpu_backend.h"
#include "runtime/engine.h"
#include "runtime/model_bundle.h"
#include "tests/test_server.h"

namespace kvrm {
namespace {

struct Output {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;  // the token's, then its top entries, in order
  std::vector<int32_t> top_ids;
  std::string text;
  FinishInfo info;
};

// A finished request's stream, its logprobs flattened for comparison.
Output ReadOutput(CollectingSink& sink) {
  Output out;
  out.tokens = sink.Wait(&out.info);
  const StreamChunk stream = sink.stream();
  out.text = stream.text;
  for (const TokenLogprobs& lp : stream.logprobs) {
    out.logprobs.push_back(lp.logprob);
    for (int32_t k = 0; k < lp.num_top; ++k) {
      out.logprobs.push_back(lp.top_logprobs[k]);
      out.top_ids.push_back(lp.top_ids[k]);
    }
  }
  return out;
}

// Prompts that repeat themselves (a phrase said again and again, with noise between), which
// prompt lookup drafts from, and plain random ones; sampling of every kind.
std::vector<std::unique_ptr<GenerationRequest>> Workload(int32_t vocab, int32_t eos) {
  std::mt19937 rng(4242);
  std::vector<std::unique_ptr<GenerationRequest>> out;
  for (int i = 0; i < 12; ++i) {
    auto r = std::make_unique<GenerationRequest>();
    r->request_id = "spec" + std::to_string(i);
    std::vector<int32_t> phrase(4 + rng() % 8);
    for (int32_t& t : phrase) t = 3 + static_cast<int32_t>(rng() % (vocab - 3));
    const int repeats = i % 4 == 3 ? 0 : 2 + static_cast<int>(rng() % 6);
    for (int k = 0; k < repeats; ++k) {
      r->prompt.insert(r->prompt.end(), phrase.begin(), phrase.end());
      if (rng() % 2) r->prompt.push_back(3 + static_cast<int32_t>(rng() % (vocab - 3)));
    }
    for (int k = 0, extra = 3 + static_cast<int>(rng() % 20); k < extra; ++k) {
      r->prompt.push_back(3 + static_cast<int32_t>(rng() % (vocab - 3)));
    }
    r->max_new_tokens = 20 + static_cast<int32_t>(rng() % 60);
    r->ignore_eos = true;
    r->sampling.seed = 77 + i;
    switch (i % 6) {
      case 0:
        break;  // greedy
      case 1:
        r->sampling.temperature = 0.8f;
        r->sampling.top_p = 0.9f;
        break;
      case 2:
        r->sampling.repetition_penalty = 1.3f;
        r->sampling.frequency_penalty = 0.2f;
        r->sampling.logprobs = true;
        r->sampling.top_logprobs = 3;
        break;
      case 3:
        r->sampling.temperature = 0.6f;
        r->sampling.top_k = 20;
        r->sampling.logprobs = true;
        break;
      case 4:
        // EOS and a stop token may end it, not before min_tokens.
        r->ignore_eos = false;
        r->min_tokens = 5;
        r->stop_token_ids = {phrase[1]};
        (void)eos;
        break;
      case 5:
        r->sampling.temperature = 1.0f;
        r->sampling.presence_penalty = 0.5f;
        break;
    }
    if (i == 6) {
      // A text stop sequence, found in the middle of a step's accepted tokens or not.
      r->stop_sequences = {"fyshysh"};  // its greedy text loops "uf" and then "ysh"
    }
    out.push_back(std::move(r));
  }
  return out;
}

struct WorkloadRun {
  std::vector<Output> outputs;
  EngineStats stats;
};

WorkloadRun RunWorkload(const ModelBundle& model, EngineOptions options) {
  options.threads = 2;
  absl::StatusOr<std::unique_ptr<Engine>> created = Engine::Create(&model, options);
  CHECK_OK(created.status());
  Engine& engine = **created;
  engine.Start();
  const int32_t eos = model.config.eos_token_ids.empty() ? 0 : model.config.eos_token_ids[0];
  std::vector<std::shared_ptr<CollectingSink>> sinks;
  for (std::unique_ptr<GenerationRequest>& r : Workload(model.config.vocab_size, eos)) {
    auto sink = std::make_shared<CollectingSink>();
    r->sink = sink;
    r->arrival = absl::Now();
    sinks.push_back(sink);
    CHECK_OK(engine.Submit(std::move(r)).status());
  }
  WorkloadRun run;
  for (const auto& sink : sinks) run.outputs.push_back(ReadOutput(*sink));
  EXPECT_TRUE(engine.WaitIdle(absl::Seconds(10)));
  for (int i = 0; i < 100; ++i) {  // blocks held for in-flight copies retire when idle
    run.stats = engine.Stats();
    if (run.stats.kv.blocks_reserved == 0 || options.kv_mode == KvMode::kStatic) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return run;
}

void ExpectSameOutputs(const WorkloadRun& want, const WorkloadRun& got, const std::string& what) {
  ASSERT_EQ(want.outputs.size(), got.outputs.size());
  for (size_t i = 0; i < want.outputs.size(); ++i) {
    const Output& a = want.outputs[i];
    const Output& b = got.outputs[i];
    EXPECT_EQ(a.tokens, b.tokens) << what << ": request " << i;
    EXPECT_EQ(a.logprobs, b.logprobs) << what << ": request " << i;
    EXPECT_EQ(a.top_ids, b.top_ids) << what << ": request " << i;
    EXPECT_EQ(a.text, b.text) << what << ": request " << i;
    EXPECT_EQ(a.info.reason, b.info.reason) << what << ": request " << i << " " << b.info.error;
    EXPECT_EQ(a.info.completion_tokens, b.info.completion_tokens) << what << ": request " << i;
    if (i == 6) {
      // Its stop sequence lies where the greedy text loops (drafts accepted): the stop is found
      // among a step's accepted tokens. (Chosen from the tiny model's output; if modelgen's model
      // changes, pick a substring of the new loop.)
      EXPECT_EQ(b.info.reason, FinishReason::kStop) << what << ": " << b.text;
    }
  }
}

class SpeculativeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { model_ = LoadTinyModel(); }
  static void TearDownTestSuite() { delete model_; }
  static ModelBundle* model_;
};
ModelBundle* SpeculativeTest::model_ = nullptr;

void ExpectDraftsVerified(const WorkloadRun& run, const std::string& what) {
  EXPECT_GT(run.stats.spec_decode_drafts_total, 0u) << what;
  EXPECT_GT(run.stats.spec_decode_accepted_tokens_total, 0u) << what;
  EXPECT_LT(run.stats.spec_decode_accepted_tokens_total, run.stats.spec_decode_draft_tokens_total)
      << what << ": some drafts must have been rejected for the test to cover that path";
  EXPECT_GE(run.stats.spec_decode_draft_tokens_total, run.stats.spec_decode_drafts_total) << what;
}

TEST_F(SpeculativeTest, DraftsNeverChangeTheOutputUnderEveryKvPolicy) {
  EngineOptions base;
  base.slots = 4;
  base.prefill_chunk = 32;
  base.max_new_tokens = 128;
  base.max_context = 256;

  struct Case {
    std::string name;
    EngineOptions options;
  };
  std::vector<Case> cases;
  {
    EngineOptions o = base;
    o.kv_mode = KvMode::kStatic;
    cases.push_back({"static", o});
  }
  {
    EngineOptions o = base;
    o.kv_mode = KvMode::kKvrm;
    cases.push_back({"kvrm", o});
  }
  {
    // Small blocks, two runs a slot and a tight pool: drafts cross blocks, compaction moves
    // blocks drafts write, and requests are paused to the host tier and resumed.
    EngineOptions o = base;
    o.kv_mode = KvMode::kKvrm;
    o.slots = 6;
    o.block_tokens = 4;
    o.max_runs = 2;
    o.kv_blocks = 120;
    cases.push_back({"kvrm fragmented", o});
  }
  {
    // Chunks apart from the decode pass, and no host tier (pauses recompute).
    EngineOptions o = base;
    o.kv_mode = KvMode::kKvrm;
    o.fuse_prefill = false;
    o.block_tokens = 4;
    o.kv_blocks = 120;
    o.kv_host_blocks = 0;
    cases.push_back({"kvrm apart, recompute", o});
  }
  for (const Case& c : cases) {
    const WorkloadRun without = RunWorkload(*model_, c.options);
    EXPECT_EQ(without.stats.spec_decode_drafts_total, 0u) << c.name;
    EngineOptions spec = c.options;
    spec.speculative_tokens = 5;
    spec.speculative_ngram = NgramDraftOptions{1, 3};
    const WorkloadRun with = RunWorkload(*model_, spec);
    ExpectSameOutputs(without, with, c.name);
    ExpectDraftsVerified(with, c.name);
    // Accepted drafts are tokens that took no step of their own.
    EXPECT_LT(with.stats.steps_total, without.stats.steps_total) << c.name;
    EXPECT_EQ(with.stats.kv.blocks_used, 0) << c.name;
    if (c.options.kv_mode == KvMode::kKvrm) {
      EXPECT_EQ(with.stats.kv.blocks_free, with.stats.kv.blocks_total) << c.name;
      EXPECT_EQ(with.stats.kv.host_blocks_used, 0) << c.name;
    }
    if (c.name == "kvrm fragmented") {
      EXPECT_GT(with.stats.preemptions_total, 0u) << "the case must pause requests";
      EXPECT_GT(with.stats.transfer_groups_total, 0u);
    }
    std::printf("%-22s steps %llu -> %llu, drafts %llu, draft tokens %llu, accepted %llu\n",
                c.name.c_str(), static_cast<unsigned long long>(without.stats.steps_total),
                static_cast<unsigned long long>(with.stats.steps_total),
                static_cast<unsigned long long>(with.stats.spec_decode_drafts_total),
                static_cast<unsigned long long>(with.stats.spec_decode_draft_tokens_total),
                static_cast<unsigned long long>(with.stats.spec_decode_accepted_tokens_total));
  }
}

TEST_F(SpeculativeTest, OptionsAreValidated) {
  const auto create = [&](EngineOptions o) {
    o.threads = 2;
    o.slots = 2;
    return Engine::Create(model_, o).status();
  };
  EngineOptions o;
  o.speculative_tokens = -1;
  EXPECT_TRUE(absl::IsInvalidArgument(create(o)));
  o.speculative_tokens = 33;
  EXPECT_TRUE(absl::IsInvalidArgument(create(o)));
  o.speculative_tokens = 4;
  o.speculative_ngram = NgramDraftOptions{3, 2};
  const absl::Status ngram = create(o);
  EXPECT_TRUE(absl::IsInvalidArgument(ngram));
  EXPECT_NE(ngram.message().find("prompt_lookup_min"), std::string::npos) << ngram;
  o.speculative_ngram = NgramDraftOptions{};
  o.far_history.enabled = true;
  o.far_history.window_tokens = 64;
  const absl::Status far = create(o);
  EXPECT_TRUE(absl::IsInvalidArgument(far));
  EXPECT_NE(far.message().find("far_history"), std::string::npos) << far;
  o.far_history = FarHistoryOptions{};
  EXPECT_TRUE(create(o).ok());
}

// The CPU backend's draft rows: each row's logits are bit for bit those of the one-token step it
// stands for (run after the previous one), and a draft the run table cannot hold, outside the
// vocabulary, or beyond the backend's width is refused.
TEST_F(SpeculativeTest, CpuDraftRowsComputeTheLogitsOfTheStepsTheyStandFor) {
  const LlamaConfig& config = model_->config;
  const int32_t vocab = config.vocab_size;
  CpuBackendOptions bo;
  bo.kv_blocks = 16;
  bo.kv_block_tokens = 16;
  bo.max_slots = 2;
  bo.max_chunk_tokens = 32;
  bo.max_draft_tokens = 4;
  bo.max_context = 128;
  bo.num_threads = 2;
  absl::StatusOr<std::unique_ptr<CpuBackend>> drafting =
      CpuBackend::Create(config, &model_->weights, bo);
  ASSERT_TRUE(drafting.ok()) << drafting.status();
  bo.max_draft_tokens = 0;
  absl::StatusOr<std::unique_ptr<CpuBackend>> plain =
      CpuBackend::Create(config, &model_->weights, bo);
  ASSERT_TRUE(plain.ok()) << plain.status();

  std::mt19937 rng(5);
  std::vector<int32_t> prompt(21);
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % vocab);
  const std::vector<int32_t> tokens = {7, 11, 13, 17, 19};  // input + 4 drafts
  // Slot 0 holds blocks 0-1, slot 1 blocks 4-5 (its own prompt, shorter).
  const KvRun runs0[] = {{0, 2}};
  const KvRun runs1[] = {{4, 2}};
  for (Backend* b : {static_cast<Backend*>(drafting->get()), static_cast<Backend*>(plain->get())}) {
    PrefillChunk c0{0, 0, prompt, runs0, 1};
    ASSERT_TRUE(b->Prefill(c0, nullptr).ok());
    PrefillChunk c1{1, 0, absl::MakeConstSpan(prompt).first(9), runs1, 1};
    ASSERT_TRUE(b->Prefill(c1, nullptr).ok());
  }
  // One step with drafts: slot 0 verifies 4 drafts (crossing into its second block), slot 1 2.
  StepDescriptor step;
  step.Resize(2, 2, 4);
  step.active = {1, 1};
  step.position = {21, 9};
  step.token = {tokens[0], tokens[0]};
  step.num_runs = {1, 1};
  step.runs[0] = runs0[0];
  step.runs[2] = runs1[0];
  step.num_draft = {4, 2};
  for (int j = 0; j < 4; ++j) step.draft[j] = step.draft[4 + j] = tokens[1 + j];
  std::vector<float> logits(2 * 5 * vocab, std::nanf(""));
  ASSERT_TRUE((*drafting)->Decode(step, logits.data()).ok());
  // Again (the same K/V rewritten): a step with drafts allocates nothing.
  const int64_t allocations = alloc_counter::AllocationCount();
  ASSERT_TRUE((*drafting)->Decode(step, logits.data()).ok());
  EXPECT_EQ(alloc_counter::AllocationCount() - allocations, 0);
  // The same tokens one step at a time.
  StepDescriptor one;
  one.Resize(2, 2);
  one.active = {1, 1};
  one.num_runs = {1, 1};
  one.runs[0] = runs0[0];
  one.runs[2] = runs1[0];
  std::vector<float> single(2 * vocab);
  for (int j = 0; j < 5; ++j) {
    one.active[1] = j <= 2;
    one.position = {21 + j, 9 + j};
    one.token = {tokens[j], tokens[j]};
    ASSERT_TRUE((*plain)->Decode(one, single.data()).ok());
    for (int32_t v = 0; v < vocab; ++v) {
      ASSERT_EQ(logits[(0 * 5 + j) * vocab + v], single[v]) << "slot 0 row " << j << " id " << v;
      if (j <= 2) {
        ASSERT_EQ(logits[(1 * 5 + j) * vocab + v], single[vocab + v])
            << "slot 1 row " << j << " id " << v;
      }
    }
  }
  // Malformed drafts.
  StepDescriptor bad = step;
  bad.num_draft = {4, 0};
  bad.position = {29, 9};  // 29 + 4 = 33 > the 32 tokens of slot 0's two blocks
  EXPECT_TRUE(absl::IsOutOfRange((*drafting)->Decode(bad, logits.data()))) << "past the runs";
  bad = step;
  bad.draft[1] = vocab;
  EXPECT_TRUE(absl::IsInvalidArgument((*drafting)->Decode(bad, logits.data()))) << "vocab";
  bad = step;
  bad.num_draft = {5, 0};
  EXPECT_TRUE(absl::IsInvalidArgument((*drafting)->Decode(bad, logits.data()))) << "too many";
  EXPECT_TRUE(absl::IsInvalidArgument((*plain)->Decode(step, logits.data())))
      << "a backend without draft rows";
}

}  // namespace
}  // namespace kvrm

namespace kvrm {
namespace {

// Through kvrmd's service: a text prompt that repeats itself streams the same completion with
// drafts as without, and GetServerInfo reports the settings and what was verified.
TEST(SpeculativeServiceTest, ServerInfoReportsDraftsAndTheStreamIsUnchanged) {
  const std::string prompt =
      "one two three four five six. one two three four five six. one two three four five six. "
      "one two three four five six. one two three";
  EngineOptions o;
  o.slots = 2;
  o.threads = 2;
  TestServer plain(o);
  o.speculative_tokens = 4;
  o.speculative_ngram = NgramDraftOptions{1, 4};
  TestServer spec(o);
  const StreamResult want = RunGenerate(plain.stub(), TextRequest(prompt, 48));
  const StreamResult got = RunGenerate(spec.stub(), TextRequest(prompt, 48));
  ASSERT_TRUE(want.status.ok()) << want.status.error_message();
  ASSERT_TRUE(got.status.ok()) << got.status.error_message();
  EXPECT_EQ(got.tokens, want.tokens);
  EXPECT_EQ(got.text, want.text);
  // A structured output (its mask applies to every verified row, its automaton advances token by
  // token) and a sampled request with penalties: the same streams too.
  v1::GenerateRequest constrained = TextRequest(prompt, 40);
  constrained.mutable_structured()->set_regex("(yes|no)(, (yes|no|maybe)){8,12}\\.");
  v1::GenerateRequest sampled = TextRequest(prompt, 40);
  sampled.mutable_sampling()->set_temperature(0.7f);
  sampled.mutable_sampling()->set_seed(99);
  sampled.mutable_sampling()->set_repetition_penalty(1.2f);
  const uint64_t accepted_before = spec.engine().Stats().spec_decode_accepted_tokens_total;
  for (const v1::GenerateRequest* request_ptr : {&constrained, &sampled}) {
    const v1::GenerateRequest& request = *request_ptr;
    const StreamResult a = RunGenerate(plain.stub(), request);
    const StreamResult b = RunGenerate(spec.stub(), request);
    ASSERT_TRUE(a.status.ok()) << a.status.error_message();
    ASSERT_TRUE(b.status.ok()) << b.status.error_message();
    EXPECT_EQ(b.tokens, a.tokens);
    EXPECT_EQ(b.text, a.text);
    EXPECT_EQ(b.finished.reason(), a.finished.reason());
    if (&request == &constrained) {
      // "yes, no, no, no, ..." repeats itself: drafts were verified against the mask.
      EXPECT_GT(spec.engine().Stats().spec_decode_accepted_tokens_total, accepted_before) << b.text;
    }
  }
  // Jump-forward: the keys and punctuation a constraint forces are drafted whatever prompt
  // lookup finds (here a text that does not repeat), and are accepted where the model spells
  // them as the draft does; the stream is the same.
  v1::GenerateRequest record = TextRequest("Fill in the record:", 40);
  record.mutable_structured()->set_regex(
      "\\{\"name\": \"[a-z]{1,6}\", \"answer\": \"(yes|no)\", \"id\": [0-9]{1,3}\\}");
  const uint64_t drafted_before = spec.engine().Stats().spec_decode_draft_tokens_total;
  const uint64_t accepted_jump = spec.engine().Stats().spec_decode_accepted_tokens_total;
  const StreamResult ra = RunGenerate(plain.stub(), record);
  const StreamResult rb = RunGenerate(spec.stub(), record);
  ASSERT_TRUE(ra.status.ok() && rb.status.ok()) << rb.status.error_message();
  EXPECT_EQ(rb.tokens, ra.tokens);
  EXPECT_EQ(rb.text, ra.text);
  EXPECT_EQ(rb.text.rfind("{\"name\": \"", 0), 0u) << rb.text;
  const uint64_t drafted = spec.engine().Stats().spec_decode_draft_tokens_total - drafted_before;
  const uint64_t accepted = spec.engine().Stats().spec_decode_accepted_tokens_total - accepted_jump;
  std::printf("record %s: %llu draft tokens, %llu accepted, %zu tokens\n", rb.text.c_str(),
              static_cast<unsigned long long>(drafted), static_cast<unsigned long long>(accepted),
              rb.tokens.size());
  EXPECT_GT(drafted, 0u);
  EXPECT_GT(accepted, 0u);
  for (TestServer* server : {&plain, &spec}) {
    grpc::ClientContext ctx;
    v1::ServerInfo si;
    ASSERT_TRUE(server->stub().GetServerInfo(&ctx, v1::GetServerInfoRequest(), &si).ok());
    const v1::SpeculativeDecodingInfo& sd = si.speculative_decoding();
    if (server == &plain) {
      EXPECT_EQ(sd.num_speculative_tokens(), 0);
      EXPECT_EQ(sd.draft_tokens_total(), 0u);
      continue;
    }
    EXPECT_EQ(sd.num_speculative_tokens(), 4);
    EXPECT_EQ(sd.prompt_lookup_min(), 1);
    EXPECT_EQ(sd.prompt_lookup_max(), 4);
    EXPECT_GT(sd.drafts_total(), 0u);
    EXPECT_GE(sd.draft_tokens_total(), sd.drafts_total());
    EXPECT_LE(sd.accepted_tokens_total(), sd.draft_tokens_total());
    EXPECT_EQ(sd.accepted_tokens_total(), spec.engine().Stats().spec_decode_accepted_tokens_total);
  }
}

}  // namespace
}  // namespace kvrm
