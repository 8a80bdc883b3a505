// Embeddings (GenerationRequest::pooling): a prompt's final hidden states pooled (last token,
// mean, first token) against the float64 reference Llama's final-norm output; prefilled in
// chunks, beside decoding requests whose tokens they do not change; last-token pooling from the
// prefix cache, mean pooling never; under tensor parallelism; and what is refused.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "common/json.h"
#include "common/logging.h"
#include "common/subprocess.h"
#include "gtest/gtest.h"
#include "model/pooling_config.h"
#include "model/safetensors_writer.h"
#include "runtime/engine.h"
#include "runtime/model_bundle.h"
#include "server/request_validation.h"
#include "tests/reference_llama.h"
#include "tests/test_server.h"

namespace kvrm {
namespace {

struct Embedded {
  std::vector<float> embedding;
  std::vector<int32_t> tokens;
  FinishInfo info;
};

std::shared_ptr<CollectingSink> Submit(Engine& engine, const std::vector<int32_t>& prompt,
                                       Pooling pooling, int32_t max_new_tokens = 1) {
  auto r = std::make_unique<GenerationRequest>();
  r->request_id = "embed";
  r->prompt = prompt;
  r->max_new_tokens = max_new_tokens;
  r->ignore_eos = true;
  r->pooling = pooling;
  r->arrival = absl::Now();
  auto sink = std::make_shared<CollectingSink>();
  r->sink = sink;
  CHECK_OK(engine.Submit(std::move(r)).status());
  return sink;
}

Embedded Read(CollectingSink& sink) {
  Embedded out;
  out.tokens = sink.Wait(&out.info);
  out.embedding = sink.stream().embedding;
  return out;
}

std::vector<double> Pool(const std::vector<std::vector<double>>& hidden, Pooling pooling) {
  if (pooling == Pooling::kLast) return hidden.back();
  if (pooling == Pooling::kCls) return hidden.front();
  std::vector<double> mean(hidden[0].size(), 0.0);
  for (const std::vector<double>& row : hidden) {
    for (size_t c = 0; c < row.size(); ++c) mean[c] += row[c];
  }
  for (double& v : mean) v /= static_cast<double>(hidden.size());
  return mean;
}

// |got - want| at most 1e-4 of want's largest magnitude, element by element (the final hidden
// states agree to ~1e-6 of their scale on this model, as the logits do in forward_test); returns
// that largest relative difference.
double ExpectNear(const std::vector<float>& got, const std::vector<double>& want,
                  const char* what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  if (got.size() != want.size()) return 1;
  double scale = 0, worst = 0;
  for (double v : want) scale = std::max(scale, std::abs(v));
  for (size_t c = 0; c < want.size(); ++c) worst = std::max(worst, std::abs(got[c] - want[c]));
  EXPECT_GT(scale, 0.0) << what;
  EXPECT_LE(worst, 1e-4 * scale) << what;
  std::printf("%s: max |embedding - float64 reference| %.2e of scale %.3f\n", what, worst, scale);
  return worst / scale;
}

// The unit vector of `v`'s first `dims` components (0: all), in double.
std::vector<double> Finished(std::vector<double> v, size_t dims = 0) {
  if (dims > 0) v.resize(dims);
  double sum = 0;
  for (double x : v) sum += x * x;
  for (double& x : v) x /= std::sqrt(sum);
  return v;
}

std::vector<float> Values(const v1::Embedding& e) {
  return std::vector<float>(e.values().begin(), e.values().end());
}

class EmbeddingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    model_ = LoadTinyModel();
    absl::StatusOr<std::unique_ptr<ReferenceLlama>> ref =
        ReferenceLlama::Create(model_->config, *model_->files);
    CHECK_OK(ref.status());
    ref_ = ref->release();
  }
  static void TearDownTestSuite() {
    delete ref_;
    delete model_;
  }
  static std::vector<int32_t> RandomPrompt(std::mt19937& rng, size_t n) {
    std::vector<int32_t> p(n);
    for (int32_t& t : p) t = static_cast<int32_t>(rng() % model_->config.vocab_size);
    return p;
  }
  static ModelBundle* model_;
  static ReferenceLlama* ref_;
};
ModelBundle* EmbeddingTest::model_ = nullptr;
ReferenceLlama* EmbeddingTest::ref_ = nullptr;

TEST_F(EmbeddingTest, EachPoolingIsTheFloat64ReferencesBesideDecodingRequests) {
  std::mt19937 rng(31);
  const std::vector<int32_t> prompt = RandomPrompt(rng, 87);  // three chunks of 32
  const std::vector<std::vector<double>> hidden = ref_->FinalHidden(prompt);
  ASSERT_EQ(hidden.size(), prompt.size());
  ASSERT_EQ(static_cast<int32_t>(hidden[0].size()), model_->config.hidden_size);

  EngineOptions o;
  o.slots = 3;
  o.threads = 2;
  o.prefill_chunk = 32;
  o.block_tokens = 16;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(model_, o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  (*engine)->Start();
  const std::vector<int32_t> other = RandomPrompt(rng, 40);
  const std::vector<int32_t> alone = Read(*Submit(**engine, other, Pooling::kNone, 30)).tokens;
  ASSERT_EQ(alone.size(), 30u);
  for (Pooling pooling : {Pooling::kLast, Pooling::kMean, Pooling::kCls}) {
    // A request decoding alongside: the embedding's chunks ride in its decode passes.
    auto beside_sink = Submit(**engine, other, Pooling::kNone, 30);
    const Embedded e = Read(*Submit(**engine, prompt, pooling));
    EXPECT_EQ(Read(*beside_sink).tokens, alone) << PoolingName(pooling);
    EXPECT_TRUE(e.tokens.empty()) << PoolingName(pooling);
    EXPECT_EQ(e.info.reason, FinishReason::kStop);
    EXPECT_EQ(e.info.completion_tokens, 0);
    EXPECT_EQ(e.info.prompt_tokens, static_cast<int32_t>(prompt.size()));
    ExpectNear(e.embedding, Pool(hidden, pooling), PoolingName(pooling));
  }
  // Last-token pooling takes the cached prompt (the last block is prefilled) and gives the same
  // vector; mean pooling needs every row, so never takes it.
  const Embedded cached = Read(*Submit(**engine, prompt, Pooling::kLast));
  EXPECT_GT(cached.info.cached_prompt_tokens, 0);
  ExpectNear(cached.embedding, hidden.back(), "last, from the prefix cache");
  const Embedded mean = Read(*Submit(**engine, prompt, Pooling::kMean));
  EXPECT_EQ(mean.info.cached_prompt_tokens, 0);
  ExpectNear(mean.embedding, Pool(hidden, Pooling::kMean), "mean, again");
  // A one-token prompt: every pooling is that token's state.
  const std::vector<std::vector<double>> one = ref_->FinalHidden({prompt[0]});
  for (Pooling pooling : {Pooling::kLast, Pooling::kMean, Pooling::kCls}) {
    ExpectNear(Read(*Submit(**engine, {prompt[0]}, pooling)).embedding, one[0], "one token");
  }
  ASSERT_TRUE((*engine)->WaitIdle(absl::Seconds(30)));
  EXPECT_EQ((*engine)->Stats().kv.blocks_used, 0);  // (every slot's blocks given back)
}

TEST_F(EmbeddingTest, ManyAtOnceUnderTensorParallelismEachGetsItsOwn) {
  std::mt19937 rng(5);
  EngineOptions o;
  o.slots = 4;
  o.threads = 2;
  o.tensor_parallel = 2;
  o.prefill_chunk = 48;
  o.block_tokens = 16;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(model_, o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  (*engine)->Start();
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::shared_ptr<CollectingSink>> sinks;
  for (int i = 0; i < 10; ++i) {
    prompts.push_back(RandomPrompt(rng, 5 + rng() % 120));
    sinks.push_back(Submit(**engine, prompts.back(), i % 2 ? Pooling::kMean : Pooling::kLast));
  }
  for (int i = 0; i < 10; ++i) {
    const Embedded e = Read(*sinks[i]);
    ExpectNear(e.embedding,
               Pool(ref_->FinalHidden(prompts[i]), i % 2 ? Pooling::kMean : Pooling::kLast),
               i % 2 ? "tp 2, mean" : "tp 2, last");
  }
}

// An embedding paused mid-prompt by a higher-priority request (a prompt's KV is dropped and
// recomputed when it resumes, with a host tier or without) still pools every row once: the mean
// is the reference's.
TEST_F(EmbeddingTest, APausedEmbeddingPoolsEveryRowOnce) {
  std::mt19937 rng(11);
  const std::vector<int32_t> prompt = RandomPrompt(rng, 300);  // 19 blocks of 16
  const std::vector<int32_t> other = RandomPrompt(rng, 100);
  const std::vector<std::vector<double>> hidden = ref_->FinalHidden(prompt);
  for (const int64_t host_blocks : {int64_t{64}, int64_t{0}}) {
    SCOPED_TRACE(host_blocks > 0 ? "host tier" : "no host tier");
    EngineOptions o;
    o.slots = 2;
    o.threads = 2;
    o.prefill_chunk = 32;
    o.block_tokens = 16;
    o.kv_mode = KvMode::kKvrm;
    o.max_context = 320;
    o.kv_blocks = 24;
    o.kv_host_blocks = host_blocks;
    for (Pooling pooling : {Pooling::kMean, Pooling::kLast, Pooling::kCls}) {
      SCOPED_TRACE(PoolingName(pooling));
      // (A fresh engine: last-token pooling would find the prompt cached by the one before.)
      absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(model_, o);
      ASSERT_TRUE(engine.ok()) << engine.status();
      auto embed = Submit(**engine, prompt, pooling);
      for (int i = 0; i < 3; ++i) (*engine)->StepForTest();
      ASSERT_EQ((*engine)->slot_state(0), SlotState::kPrefilling);
      const uint64_t preempted = (*engine)->Stats().preemptions_total;
      // Higher priority, and no room for it beside the whole prompt: the embedding pauses.
      auto r = std::make_unique<GenerationRequest>();
      r->prompt = other;
      r->max_new_tokens = 8;
      r->ignore_eos = true;
      r->priority = 10;
      auto high = std::make_shared<CollectingSink>();
      r->sink = high;
      ASSERT_TRUE((*engine)->Submit(std::move(r)).ok());
      for (int steps = 0; !embed->done() || !high->done(); ++steps) {
        ASSERT_LT(steps, 2000);
        (*engine)->StepForTest();
      }
      EXPECT_GT((*engine)->Stats().preemptions_total, preempted);
      EXPECT_EQ(Read(*high).tokens.size(), 8u);
      ExpectNear(Read(*embed).embedding, Pool(hidden, pooling), "paused mid-prompt");
    }
  }
}

// A base model's checkpoint, as sentence-transformers saves an embedding model (MistralModel,
// Qwen3Model: tensors without the "model." prefix, no lm_head.weight) with its modules.json:
// loaded, served with the pooling its files name, the same vectors as the causal-LM layout of
// the same weights, and Generate refused.
TEST_F(EmbeddingTest, ABaseModelCheckpointServesEmbeddingsOnly) {
  namespace fs = std::filesystem;
  const fs::path src = model_->files->dir();
  const fs::path dir = fs::path(TestTmpDir()) / "base-model";
  fs::remove_all(dir);
  fs::create_directories(dir / "1_Pooling");
  for (const fs::directory_entry& e : fs::directory_iterator(src)) {
    const std::string name = e.path().filename().string();
    if (name == "config.json" || absl::EndsWith(name, ".safetensors") ||
        absl::EndsWith(name, ".index.json")) {
      continue;
    }
    fs::copy(e.path(), dir / name, fs::copy_options::recursive);
  }
  absl::StatusOr<Json> config = ReadJsonFile((src / "config.json").string());
  ASSERT_TRUE(config.ok()) << config.status();
  (*config)["architectures"] = {"LlamaModel"};
  (*config)["tie_word_embeddings"] = false;  // and no lm_head.weight: no LM head at all
  ASSERT_TRUE(WriteFileAtomically((dir / "config.json").string(), config->dump()).ok());
  std::vector<TensorToWrite> tensors;
  for (const std::string& name : model_->files->TensorNames()) {
    absl::StatusOr<TensorView> t = model_->files->Get(name);
    ASSERT_TRUE(t.ok()) << t.status();
    ASSERT_NE(name, "lm_head.weight");
    ASSERT_TRUE(absl::StartsWith(name, "model.")) << name;
    tensors.push_back(
        TensorToWrite{name.substr(6), t->dtype, t->shape, absl::MakeConstSpan(t->data, t->nbytes)});
  }
  ASSERT_TRUE(WriteSafetensors((dir / "model.safetensors").string(), tensors).ok());
  ASSERT_TRUE(
      WriteFileAtomically((dir / "modules.json").string(),
                          R"([{"path": "", "type": "sentence_transformers.models.Transformer"},
                                      {"path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
                                      {"path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}])")
          .ok());
  ASSERT_TRUE(WriteFileAtomically((dir / "1_Pooling" / "config.json").string(),
                                  R"({"pooling_mode_mean_tokens": true})")
                  .ok());

  absl::StatusOr<std::unique_ptr<ModelBundle>> base = ModelBundle::Load(dir.string());
  ASSERT_TRUE(base.ok()) << base.status();
  EXPECT_FALSE((*base)->weights.has_lm_head);
  EXPECT_TRUE(model_->weights.has_lm_head);
  absl::StatusOr<std::optional<PoolingConfig>> pooling = LoadPoolingConfig(dir.string());
  ASSERT_TRUE(pooling.ok() && pooling->has_value()) << pooling.status();
  ServerOptions so;
  ASSERT_TRUE(ParsePooling((*pooling)->pooling).ok());
  so.info.pooling = *ParsePooling((*pooling)->pooling);
  so.info.embedding_normalize = (*pooling)->normalize;
  EngineOptions o;
  o.slots = 2;
  o.threads = 2;
  TestServer server(*std::move(base), o, so);

  std::mt19937 rng(3);
  const std::vector<int32_t> ids = RandomPrompt(rng, 50);
  v1::EmbedRequest req;
  v1::TokenIds* t = req.add_inputs()->mutable_token_ids();
  for (int32_t id : ids) t->add_ids(id);
  grpc::ClientContext ctx;
  v1::EmbedResponse resp;
  const grpc::Status st = server.stub().Embed(&ctx, req, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(resp.pooling(), v1::POOLING_MEAN);
  std::vector<double> want = Finished(Pool(ref_->FinalHidden(ids), Pooling::kMean));
  ExpectNear(Values(resp.embeddings(0)), want, "base checkpoint, mean, normalized");
  // The same weights in the causal-LM layout give the same vector, bit for bit.
  EngineOptions lo = o;
  absl::StatusOr<std::unique_ptr<Engine>> lm = Engine::Create(model_, lo);
  ASSERT_TRUE(lm.ok()) << lm.status();
  (*lm)->Start();
  std::vector<float> same = Read(*Submit(**lm, ids, Pooling::kMean)).embedding;
  FinishEmbedding(0, true, &same);
  EXPECT_EQ(Values(resp.embeddings(0)), same);

  const StreamResult g = RunGenerate(server.stub(), TextRequest("Hello", 4));
  EXPECT_EQ(g.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(g.status.error_message().find("no LM head"), std::string::npos)
      << g.status.error_message();
}

TEST_F(EmbeddingTest, WithPromptLogprobsIsRefused) {
  EngineOptions o;
  o.slots = 1;
  o.threads = 2;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(model_, o);
  ASSERT_TRUE(engine.ok()) << engine.status();
  auto r = std::make_unique<GenerationRequest>();
  r->prompt = {1, 2, 3};
  r->pooling = Pooling::kMean;
  r->prompt_logprobs = 0;
  r->sink = std::make_shared<CollectingSink>();
  const absl::Status st = (*engine)->Submit(std::move(r)).status();
  EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
  EXPECT_NE(st.message().find("prompt_logprobs"), std::string::npos) << st;
}

// Through the service: text inputs tokenized as Tokenize does (special tokens included), token
// inputs as given, each vector the reference's pooled state, normalized unless asked otherwise,
// cut to `dimensions` first; the reply in input order with its token counts.
TEST_F(EmbeddingTest, EmbedRpcGivesTheReferencesVectorsInOrder) {
  EngineOptions o;
  o.slots = 2;
  o.threads = 2;
  o.prefill_chunk = 32;
  TestServer server(o);
  std::mt19937 rng(77);
  const std::vector<int32_t> ids = RandomPrompt(rng, 70);
  v1::EmbedRequest req;
  req.add_inputs()->set_text("The quick brown fox jumps over the lazy dog");
  v1::TokenIds* token_input = req.add_inputs()->mutable_token_ids();
  for (int32_t t : ids) token_input->add_ids(t);
  req.add_inputs()->set_text("Hello");

  std::vector<std::vector<int32_t>> prompts;
  for (const char* text : {"The quick brown fox jumps over the lazy dog", "Hello"}) {
    v1::TokenizeRequest t;
    t.set_text(text);
    t.set_add_bos(true);
    grpc::ClientContext ctx;
    v1::TokenizeResponse tok;
    ASSERT_TRUE(server.stub().Tokenize(&ctx, t, &tok).ok());
    prompts.emplace_back(tok.token_ids().begin(), tok.token_ids().end());
  }
  prompts.insert(prompts.begin() + 1, ids);

  grpc::ClientContext ctx;
  v1::EmbedResponse resp;
  const grpc::Status st = server.stub().Embed(&ctx, req, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(resp.pooling(), v1::POOLING_LAST);
  ASSERT_EQ(resp.embeddings_size(), 3);
  int32_t tokens = 0;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(resp.embeddings(i).prompt_tokens(), static_cast<int32_t>(prompts[i].size()));
    tokens += resp.embeddings(i).prompt_tokens();
    ExpectNear(Values(resp.embeddings(i)), Finished(ref_->FinalHidden(prompts[i]).back()),
               "Embed, last, normalized");
  }
  EXPECT_EQ(resp.prompt_tokens(), tokens);

  // Mean pooling, not normalized; and Matryoshka dimensions (cut, then normalized).
  v1::EmbedRequest mean;
  *mean.add_inputs() = req.inputs(1);
  mean.set_pooling(v1::POOLING_MEAN);
  mean.set_normalize(false);
  grpc::ClientContext ctx2;
  ASSERT_TRUE(server.stub().Embed(&ctx2, mean, &resp).ok());
  ExpectNear(Values(resp.embeddings(0)), Pool(ref_->FinalHidden(ids), Pooling::kMean),
             "Embed, mean, raw");
  v1::EmbedRequest cut;
  *cut.add_inputs() = req.inputs(1);
  cut.set_dimensions(8);
  grpc::ClientContext ctx3;
  ASSERT_TRUE(server.stub().Embed(&ctx3, cut, &resp).ok());
  ASSERT_EQ(resp.embeddings(0).values_size(), 8);
  ExpectNear(Values(resp.embeddings(0)), Finished(ref_->FinalHidden(ids).back(), 8),
             "Embed, 8 dimensions");
  // truncate_prompt_tokens keeps the last k tokens.
  v1::EmbedRequest trunc;
  *trunc.add_inputs() = req.inputs(1);
  trunc.set_truncate_prompt_tokens(20);
  grpc::ClientContext ctx4;
  ASSERT_TRUE(server.stub().Embed(&ctx4, trunc, &resp).ok());
  EXPECT_EQ(resp.embeddings(0).prompt_tokens(), 20);
  ExpectNear(Values(resp.embeddings(0)),
             Finished(ref_->FinalHidden(std::vector<int32_t>(ids.end() - 20, ids.end())).back()),
             "Embed, last 20 tokens");

  grpc::ClientContext ictx;
  v1::ModelInfo info;
  ASSERT_TRUE(server.stub().GetModelInfo(&ictx, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.pooling(), "last");
  EXPECT_TRUE(info.embedding_normalize());
  ASSERT_TRUE(server.engine().WaitIdle(absl::Seconds(30)));
  EXPECT_EQ(server.engine().Stats().kv.blocks_used, 0);
}

TEST_F(EmbeddingTest, EmbedRpcRefusesBadRequestsNamingTheField) {
  EngineOptions o;
  o.slots = 1;
  o.threads = 2;
  TestServer server(o);
  const int32_t hidden = model_->config.hidden_size;
  const int32_t ctx_len = server.engine().options().max_context;
  struct Case {
    std::function<void(v1::EmbedRequest*)> make;
    const char* field;
  };
  const std::vector<Case> cases = {
      {[](v1::EmbedRequest*) {}, "inputs"},
      {[](v1::EmbedRequest* r) { r->add_inputs()->set_text(""); }, "inputs[0].text"},
      {[](v1::EmbedRequest* r) { r->add_inputs(); }, "inputs[0]"},
      {[&](v1::EmbedRequest* r) {
         r->add_inputs()->set_text("fine");
         r->add_inputs()->mutable_token_ids()->add_ids(model_->config.vocab_size);
       },
       "inputs[1].token_ids"},
      {[&](v1::EmbedRequest* r) {
         r->add_inputs()->set_text("fine");
         r->set_dimensions(hidden + 1);
       },
       "dimensions"},
      {[&](v1::EmbedRequest* r) {  // a whole context: no room (truncate_prompt_tokens is)
         v1::TokenIds* ids = r->add_inputs()->mutable_token_ids();
         for (int32_t i = 0; i < ctx_len; ++i) ids->add_ids(1 + i % 50);
       },
       "inputs[0].token_ids"},
      {[](v1::EmbedRequest* r) {
         for (int i = 0; i < 2049; ++i) r->add_inputs()->set_text("x");
       },
       "inputs"},
      {[](v1::EmbedRequest* r) {
         r->add_inputs()->set_text("fine");
         r->set_priority(101);
       },
       "priority"},
      {[](v1::EmbedRequest* r) {
         r->add_inputs()->set_text("fine");
         r->set_truncate_prompt_tokens(-2);
       },
       "truncate_prompt_tokens"},
      {[](v1::EmbedRequest* r) {
         r->add_inputs()->set_text("fine");
         r->set_lora_adapter("nope");
       },
       "lora_adapter"},
  };
  for (const Case& c : cases) {
    v1::EmbedRequest req;
    c.make(&req);
    grpc::ClientContext ctx;
    v1::EmbedResponse resp;
    const grpc::Status st = server.stub().Embed(&ctx, req, &resp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << c.field;
    EXPECT_EQ(st.error_message().rfind(std::string(c.field) + ":", 0), 0u)
        << c.field << ": " << st.error_message();
  }
  // More inputs than the server ever queues: refused by name, whatever the queue holds now.
  {
    EngineOptions small = o;
    small.max_queue = 4;
    TestServer bounded(small);
    v1::EmbedRequest five;
    for (int i = 0; i < 5; ++i) five.add_inputs()->set_text("x");
    grpc::ClientContext ctx5;
    v1::EmbedResponse resp5;
    const grpc::Status st5 = bounded.stub().Embed(&ctx5, five, &resp5);
    EXPECT_EQ(st5.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st5.error_message();
    EXPECT_EQ(st5.error_message().rfind("inputs:", 0), 0u) << st5.error_message();
    five.mutable_inputs()->RemoveLast();
    grpc::ClientContext ctx4;
    EXPECT_TRUE(bounded.stub().Embed(&ctx4, five, &resp5).ok());
    EXPECT_EQ(resp5.embeddings_size(), 4);
  }
  // A model whose sentence-transformers files kvrm cannot follow: Embed refused, saying why.
  {
    ServerOptions so;
    so.info.embed_refusal = "modules.json: [2].type: sentence_transformers.models.Dense ...";
    TestServer refusing(std::unique_ptr<ModelBundle>(LoadTinyModel()), o, so);
    v1::EmbedRequest one;
    one.add_inputs()->set_text("x");
    grpc::ClientContext ctx1;
    v1::EmbedResponse resp1;
    const grpc::Status st1 = refusing.stub().Embed(&ctx1, one, &resp1);
    EXPECT_EQ(st1.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st1.error_message();
    EXPECT_NE(st1.error_message().find("Dense"), std::string::npos) << st1.error_message();
    // GetModelInfo says so too (kvrm_cli info's "embeddings" row), and Score has no similarity.
    grpc::ClientContext ictx;
    v1::ModelInfo info;
    ASSERT_TRUE(refusing.stub().GetModelInfo(&ictx, v1::GetModelInfoRequest(), &info).ok());
    EXPECT_NE(info.embed_refusal().find("Dense"), std::string::npos) << info.embed_refusal();
    EXPECT_EQ(info.score_method(), v1::SCORE_METHOD_UNSPECIFIED);
    EXPECT_TRUE(RunGenerate(refusing.stub(), TextRequest("Hello", 2)).status.ok());
  }
  // A truncated input that fits is served.
  v1::EmbedRequest fits;
  auto* ids = fits.add_inputs()->mutable_token_ids();
  for (int32_t i = 0; i < ctx_len + 10; ++i) ids->add_ids(1 + i % 50);
  fits.set_truncate_prompt_tokens(-1);
  grpc::ClientContext ctx;
  v1::EmbedResponse resp;
  const grpc::Status st = server.stub().Embed(&ctx, fits, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(resp.embeddings(0).prompt_tokens(), ctx_len - 1);
  ASSERT_TRUE(server.engine().WaitIdle(absl::Seconds(30)));
  EXPECT_EQ(server.engine().Stats().kv.blocks_used, 0);
}

}  // namespace
}  // namespace kvrm
