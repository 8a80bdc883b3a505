// Classification and scoring (Classify, Score; /classify, /score, /rerank): a sequence
// classifier's head (score.weight of a *ForSequenceClassification checkpoint, or LM-head rows of
// named tokens) on the last token's final hidden state, against the float64 reference Llama;
// cross-encoder pairs joined as the tokenizer joins them, truncated at the document's end;
// embedding similarity for a model without a head; and what is refused, naming the field.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/json.h"
#include "common/logging.h"
#include "common/subprocess.h"
#include "gtest/gtest.h"
#include "model/classifier_head.h"
#include "model/safetensors_writer.h"
#include "runtime/model_bundle.h"
#include "server/openai_http.h"
#include "tests/http_client.h"
#include "tests/reference_llama.h"
#include "tests/test_server.h"

namespace kvrm {
namespace {

namespace fs = std::filesystem;

// The tiny model's weights as a *ForSequenceClassification checkpoint: every tensor of the
// causal LM but the (tied) LM head, a random score.weight [labels][hidden] and config.json's
// id2label; `more` edits config.json further.
std::string WriteClassifier(const ModelBundle& base, const std::string& name,
                            const std::vector<std::string>& labels, std::vector<float>* weight,
                            const std::function<void(Json&)>& more = nullptr,
                            std::vector<float>* bias = nullptr) {
  const fs::path src = base.files->dir();
  const fs::path dir = fs::path(TestTmpDir()) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const fs::directory_entry& e : fs::directory_iterator(src)) {
    const std::string file = e.path().filename().string();
    if (file == "config.json" || absl::EndsWith(file, ".safetensors") ||
        absl::EndsWith(file, ".index.json")) {
      continue;
    }
    fs::copy(e.path(), dir / file, fs::copy_options::recursive);
  }
  absl::StatusOr<Json> config = ReadJsonFile((src / "config.json").string());
  CHECK_OK(config.status());
  (*config)["architectures"] = {"LlamaForSequenceClassification"};
  (*config)["tie_word_embeddings"] = false;  // and no lm_head.weight: score.weight instead
  Json id2label = Json::object();
  for (size_t i = 0; i < labels.size(); ++i) id2label[std::to_string(i)] = labels[i];
  (*config)["id2label"] = id2label;
  if (more) more(*config);
  CHECK_OK(WriteFileAtomically((dir / "config.json").string(), config->dump()));

  const int64_t hidden = base.config.hidden_size;
  std::mt19937 rng(static_cast<uint32_t>(labels.size() * 7919 + name.size()));
  std::normal_distribution<float> normal(0.0f, 2.0f / std::sqrt(static_cast<float>(hidden)));
  weight->resize(labels.size() * hidden);
  for (float& w : *weight) w = normal(rng);
  std::vector<TensorToWrite> tensors;
  for (const std::string& t : base.files->TensorNames()) {
    absl::StatusOr<TensorView> v = base.files->Get(t);
    CHECK_OK(v.status());
    tensors.push_back(
        TensorToWrite{t, v->dtype, v->shape, absl::MakeConstSpan(v->data, v->nbytes)});
  }
  tensors.push_back(TensorToWrite{
      "score.weight",
      DType::kF32,
      {static_cast<int64_t>(labels.size()), hidden},
      absl::MakeConstSpan(reinterpret_cast<const std::byte*>(weight->data()), weight->size() * 4)});
  if (bias != nullptr) {  // score.bias, as a head written with one has
    bias->resize(labels.size());
    for (float& b : *bias) b = normal(rng) * 8;
    tensors.push_back(TensorToWrite{
        "score.bias",
        DType::kF32,
        {static_cast<int64_t>(labels.size())},
        absl::MakeConstSpan(reinterpret_cast<const std::byte*>(bias->data()), bias->size() * 4)});
  }
  CHECK_OK(WriteSafetensors((dir / "model.safetensors").string(), tensors));
  return dir.string();
}

class ClassifyTest : public ::testing::Test {
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
  static EngineOptions Options() {
    EngineOptions o;
    o.slots = 2;
    o.threads = 2;
    o.prefill_chunk = 32;
    return o;
  }
  static std::vector<int32_t> RandomPrompt(std::mt19937& rng, size_t n) {
    std::vector<int32_t> p(n);
    for (int32_t& t : p) t = static_cast<int32_t>(rng() % model_->config.vocab_size);
    return p;
  }
  static std::vector<int32_t> Encode(const std::string& text, bool special) {
    absl::StatusOr<std::vector<int32_t>> ids = model_->tokenizer->Encode(text, special);
    CHECK_OK(ids.status());
    return *ids;
  }
  // The reference logits of `weight` ([labels][hidden]) on `prompt`'s last final hidden state,
  // and the bound on |got - want| each may have: 1e-5 of max |h| times sum |w| (the hidden states
  // agree to ~1e-6 of their scale, embedding_test).
  static std::vector<double> RefLogits(const std::vector<int32_t>& prompt,
                                       const std::vector<float>& weight, double* tolerance) {
    const std::vector<double> h = ref_->FinalHidden(prompt).back();
    const size_t d = h.size(), labels = weight.size() / d;
    double hmax = 0, wsum = 0;
    for (double v : h) hmax = std::max(hmax, std::abs(v));
    std::vector<double> out(labels, 0.0);
    for (size_t l = 0; l < labels; ++l) {
      double rowsum = 0;
      for (size_t c = 0; c < d; ++c) {
        out[l] += double{weight[l * d + c]} * h[c];
        rowsum += std::abs(weight[l * d + c]);
      }
      wsum = std::max(wsum, rowsum);
    }
    *tolerance = 1e-5 * hmax * wsum;
    return out;
  }
  static ModelBundle* model_;
  static ReferenceLlama* ref_;
};
ModelBundle* ClassifyTest::model_ = nullptr;
ReferenceLlama* ClassifyTest::ref_ = nullptr;

double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

v1::ScoreRequest ScoreRequestOf(const std::string& query, const std::vector<std::string>& docs) {
  v1::ScoreRequest req;
  req.add_queries(query);
  for (const std::string& d : docs) req.add_documents(d);
  return req;
}

// A three-label classifier: loaded with its labels and no LM head; Classify's logits are the
// reference's, its probabilities their softmax, its label the most probable, for text and token
// inputs in order; Generate is refused; Score is refused (a cross-encoder has one label).
TEST_F(ClassifyTest, ClassifyIsTheHeadOnTheReferencesLastHiddenState) {
  std::vector<float> weight;
  const std::string dir = WriteClassifier(*model_, "classifier3", {"neg", "neu", "pos"}, &weight);
  absl::StatusOr<std::unique_ptr<ModelBundle>> m = ModelBundle::Load(dir);
  ASSERT_TRUE(m.ok()) << m.status();
  ASSERT_TRUE((*m)->classifier.has_value());
  EXPECT_EQ((*m)->classifier->num_labels, 3);
  EXPECT_EQ((*m)->classifier->labels, (std::vector<std::string>{"neg", "neu", "pos"}));
  EXPECT_FALSE((*m)->weights.has_lm_head);
  EXPECT_FALSE(model_->classifier.has_value());
  TestServer server(*std::move(m), Options());

  std::mt19937 rng(5);
  const std::vector<int32_t> ids = RandomPrompt(rng, 75);  // three chunks
  const std::string text = "The movie was long but the ending made up for it";
  v1::ClassifyRequest req;
  req.add_inputs()->set_text(text);
  v1::TokenIds* t = req.add_inputs()->mutable_token_ids();
  for (int32_t id : ids) t->add_ids(id);
  const std::vector<std::vector<int32_t>> prompts = {Encode(text, true), ids};
  grpc::ClientContext ctx;
  v1::ClassifyResponse resp;
  const grpc::Status st = server.stub().Classify(&ctx, req, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(resp.request_id().rfind("cls-", 0), 0u) << resp.request_id();
  ASSERT_EQ(resp.classifications_size(), 2);
  int32_t tokens = 0;
  for (int i = 0; i < 2; ++i) {
    const v1::Classification& c = resp.classifications(i);
    double tol;
    const std::vector<double> want = RefLogits(prompts[i], weight, &tol);
    ASSERT_EQ(c.logits_size(), 3);
    ASSERT_EQ(c.probs_size(), 3);
    double top = *std::max_element(want.begin(), want.end()), sum = 0;
    for (double v : want) sum += std::exp(v - top);
    double psum = 0, worst = 0;
    for (int l = 0; l < 3; ++l) {
      worst = std::max(worst, std::abs(c.logits(l) - want[l]));
      EXPECT_NEAR(c.logits(l), want[l], tol) << i << " " << l;
      EXPECT_NEAR(c.probs(l), std::exp(want[l] - top) / sum, 1e-4) << i << " " << l;
      psum += c.probs(l);
    }
    std::printf(
        "input %d: logits %.4f %.4f %.4f, max |logit - float64 reference| %.2e "
        "(tolerance %.1e)\n",
        i, c.logits(0), c.logits(1), c.logits(2), worst, tol);
    EXPECT_NEAR(psum, 1.0, 1e-5);
    const int32_t best = static_cast<int32_t>(std::max_element(c.probs().begin(), c.probs().end()) -
                                              c.probs().begin());
    EXPECT_EQ(c.label(), best);
    EXPECT_EQ(c.label_name(), (std::vector<std::string>{"neg", "neu", "pos"})[best]);
    EXPECT_EQ(c.prompt_tokens(), static_cast<int32_t>(prompts[i].size()));
    tokens += c.prompt_tokens();
  }
  EXPECT_EQ(resp.prompt_tokens(), tokens);

  grpc::ClientContext ictx;
  v1::ModelInfo info;
  ASSERT_TRUE(server.stub().GetModelInfo(&ictx, v1::GetModelInfoRequest(), &info).ok());
  EXPECT_EQ(info.num_labels(), 3);
  EXPECT_EQ(info.labels_size(), 3);
  EXPECT_EQ(info.labels(2), "pos");
  EXPECT_EQ(info.score_method(), v1::SCORE_METHOD_UNSPECIFIED);
  EXPECT_EQ(info.classifier_refusal(), "");

  v1::ScoreRequest score;
  score.add_queries("q");
  score.add_documents("d");
  grpc::ClientContext sctx;
  v1::ScoreResponse sresp;
  const grpc::Status ss = server.stub().Score(&sctx, score, &sresp);
  EXPECT_EQ(ss.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << ss.error_message();
  EXPECT_NE(ss.error_message().find("3 labels"), std::string::npos) << ss.error_message();
  const StreamResult g = RunGenerate(server.stub(), TextRequest("Hello", 4));
  EXPECT_EQ(g.status.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  ASSERT_TRUE(server.engine().WaitIdle(absl::Seconds(30)));
  EXPECT_EQ(server.engine().Stats().kv.blocks_used, 0);
}

// config.json's problem_type picks Classify's probabilities as Transformers' loss trained them
// (vLLM's rule): multi_label_classification a sigmoid per label, regression the logits
// themselves (a reward model's score); a score.bias is added to the logits.
TEST_F(ClassifyTest, ProblemTypeAndBiasShapeTheProbabilities) {
  std::mt19937 rng(8);
  const std::vector<int32_t> ids = RandomPrompt(rng, 40);
  struct Case {
    const char* problem_type;
    std::vector<std::string> labels;
    ClassifierHead::Activation want;
  };
  for (const Case& c : {Case{"multi_label_classification",
                             {"toxic", "spam", "off-topic"},
                             ClassifierHead::Activation::kSigmoid},
                        Case{"regression", {"reward"}, ClassifierHead::Activation::kIdentity}}) {
    std::vector<float> weight, bias;
    const std::string dir = WriteClassifier(
        *model_, absl::StrCat("classifier-", c.problem_type), c.labels, &weight,
        [&](Json& j) { j["problem_type"] = c.problem_type; }, &bias);
    absl::StatusOr<std::unique_ptr<ModelBundle>> m = ModelBundle::Load(dir);
    ASSERT_TRUE(m.ok()) << m.status();
    ASSERT_TRUE((*m)->classifier.has_value()) << (*m)->classifier_error;
    EXPECT_EQ((*m)->classifier->classify_activation, c.want) << c.problem_type;
    EXPECT_EQ((*m)->classifier->bias.size(), c.labels.size());
    TestServer server(*std::move(m), Options());
    v1::ClassifyRequest req;
    v1::TokenIds* t = req.add_inputs()->mutable_token_ids();
    for (int32_t id : ids) t->add_ids(id);
    grpc::ClientContext ctx;
    v1::ClassifyResponse resp;
    const grpc::Status st = server.stub().Classify(&ctx, req, &resp);
    ASSERT_TRUE(st.ok()) << st.error_message();
    double tol;
    std::vector<double> want = RefLogits(ids, weight, &tol);
    const v1::Classification& got = resp.classifications(0);
    ASSERT_EQ(got.logits_size(), static_cast<int>(c.labels.size()));
    for (size_t l = 0; l < c.labels.size(); ++l) {
      want[l] += bias[l];
      EXPECT_NEAR(got.logits(l), want[l], tol + 1e-6) << c.problem_type << " " << l;
      const double p = c.want == ClassifierHead::Activation::kIdentity ? want[l] : Sigmoid(want[l]);
      EXPECT_NEAR(got.probs(l), p, tol + 1e-6) << c.problem_type << " " << l;
    }
  }
}

// A head kvrm cannot follow (an activation it does not apply, labels that do not match the
// rows) leaves the model served: it loads, embeds, and Classify and Score are refused naming
// the file and key (Score does not fall back to embedding similarity for a classifier).
TEST_F(ClassifyTest, AHeadKvrmCannotFollowLeavesTheRestServed) {
  std::vector<float> weight;
  for (const auto& [name, edit, key] :
       std::vector<std::tuple<std::string, std::function<void(Json&)>, std::string>>{
           {"classifier-odd-activation",
            [](Json& j) {
              j["sentence_transformers"] = {{"activation_fn", "torch.nn.modules.activation.Tanh"}};
            },
            "activation_fn"},
           {"classifier-odd-labels",
            [](Json& j) {
              j["id2label"] = {{"0", "a"}};
            },
            "id2label"}}) {
    const std::string dir = WriteClassifier(*model_, name, {"x", "y"}, &weight, edit);
    absl::StatusOr<std::unique_ptr<ModelBundle>> m = ModelBundle::Load(dir);
    ASSERT_TRUE(m.ok()) << m.status();
    EXPECT_FALSE((*m)->classifier.has_value());
    EXPECT_NE((*m)->classifier_error.find(key), std::string::npos) << (*m)->classifier_error;
    TestServer server(*std::move(m), Options());
    v1::ClassifyRequest c;
    c.add_inputs()->set_text("x");
    grpc::ClientContext cctx;
    v1::ClassifyResponse cresp;
    grpc::Status st = server.stub().Classify(&cctx, c, &cresp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
    EXPECT_NE(st.error_message().find(key), std::string::npos) << st.error_message();
    v1::ScoreRequest sr;
    sr.add_queries("q");
    sr.add_documents("d");
    grpc::ClientContext sctx;
    v1::ScoreResponse sresp;
    st = server.stub().Score(&sctx, sr, &sresp);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
    grpc::ClientContext ictx;
    v1::ModelInfo info;
    ASSERT_TRUE(server.stub().GetModelInfo(&ictx, v1::GetModelInfoRequest(), &info).ok());
    EXPECT_NE(info.classifier_refusal().find(key), std::string::npos) << info.classifier_refusal();
    EXPECT_EQ(info.num_labels(), 0);
    EXPECT_EQ(info.score_method(), v1::SCORE_METHOD_UNSPECIFIED);
    v1::EmbedRequest e;
    e.add_inputs()->set_text("still served");
    grpc::ClientContext ectx;
    v1::EmbedResponse eresp;
    st = server.stub().Embed(&ectx, e, &eresp);
    EXPECT_TRUE(st.ok()) << st.error_message();
  }
}

// A one-label cross-encoder: each (query, document) pair is the tokenizer's JoinPair of the two
// (special tokens as its pair template puts them), scored sigmoid(logit) against the reference;
// one query for every document or one per document; truncation cuts the document's end, or the
// pair is refused naming the document; an Identity activation gives the raw logit.
TEST_F(ClassifyTest, CrossEncoderScoresEachPairThroughTheHead) {
  std::vector<float> weight;
  const std::string dir = WriteClassifier(*model_, "reranker", {"LABEL_0"}, &weight);
  absl::StatusOr<std::unique_ptr<ModelBundle>> m = ModelBundle::Load(dir);
  ASSERT_TRUE(m.ok()) << m.status();
  EngineOptions o = Options();
  TestServer server(*std::move(m), o);
  const int32_t ctx_len = server.engine().options().max_context;

  const std::string query = "what is the capital of france";
  const std::vector<std::string> docs = {"Paris is the capital of France.",
                                         "The quick brown fox jumps over the lazy dog.",
                                         "Berlin is in Germany", "capital"};
  const v1::ScoreRequest req = ScoreRequestOf(query, docs);
  grpc::ClientContext ctx;
  v1::ScoreResponse resp;
  grpc::Status st = server.stub().Score(&ctx, req, &resp);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(resp.method(), v1::SCORE_METHOD_CROSS_ENCODER);
  ASSERT_EQ(resp.scores_size(), 4);
  int32_t tokens = 0;
  for (int d = 0; d < 4; ++d) {
    const std::vector<int32_t> pair =
        model_->tokenizer->JoinPair(Encode(query, false), Encode(docs[d], false), true);
    tokens += static_cast<int32_t>(pair.size());
    double tol;
    const double logit = RefLogits(pair, weight, &tol)[0];
    // sigmoid' <= 1/4: the logit's bound carries over.
    EXPECT_NEAR(resp.scores(d), Sigmoid(logit), tol / 4 + 1e-7) << d;
    std::printf("document %d: score %.6f, |score - sigmoid(float64 reference logit %.5f)| %.2e\n",
                d, resp.scores(d), logit, std::abs(resp.scores(d) - Sigmoid(logit)));
  }
  EXPECT_EQ(resp.prompt_tokens(), tokens);

  // One query per document: the same pairs, the same scores.
  v1::ScoreRequest pairs;
  for (int d = 0; d < 4; ++d) pairs.add_queries(query);
  *pairs.mutable_documents() = req.documents();
  grpc::ClientContext ctx2;
  v1::ScoreResponse resp2;
  ASSERT_TRUE(server.stub().Score(&ctx2, pairs, &resp2).ok());
  for (int d = 0; d < 4; ++d) EXPECT_EQ(resp2.scores(d), resp.scores(d)) << d;

  // A long document cut at its end to truncate_prompt_tokens.
  std::string long_doc;
  for (int i = 0; i < 40; ++i) long_doc += "the capital city of a country is its seat of power ";
  const std::vector<int32_t> q_ids = Encode(query, false), d_ids = Encode(long_doc, false);
  const std::vector<int32_t> whole = model_->tokenizer->JoinPair(q_ids, d_ids, true);
  ASSERT_GT(static_cast<int32_t>(whole.size()), 60);
  const int32_t k = 60;
  const std::vector<int32_t> cut = model_->tokenizer->JoinPair(
      q_ids, std::vector<int32_t>(d_ids.begin(), d_ids.end() - (whole.size() - k)), true);
  ASSERT_EQ(static_cast<int32_t>(cut.size()), k);
  v1::ScoreRequest trunc;
  trunc.add_queries(query);
  trunc.add_documents(long_doc);
  trunc.set_truncate_prompt_tokens(k);
  grpc::ClientContext ctx3;
  ASSERT_TRUE(server.stub().Score(&ctx3, trunc, &resp).ok());
  EXPECT_EQ(resp.prompt_tokens(), k);
  double tol;
  const double cut_logit = RefLogits(cut, weight, &tol)[0];
  EXPECT_NEAR(resp.scores(0), Sigmoid(cut_logit), tol / 4 + 1e-7);

  // Refusals, each naming its field.
  std::string too_long;
  for (int i = 0; i < ctx_len; ++i) too_long += "word ";
  struct Case {
    std::function<void(v1::ScoreRequest*)> make;
    const char* field;
  };
  const std::vector<Case> cases = {
      {[](v1::ScoreRequest* r) { r->add_queries("q"); }, "documents"},
      {[](v1::ScoreRequest* r) { r->add_documents("d"); }, "queries"},
      {[](v1::ScoreRequest* r) {
         r->add_queries("a");
         r->add_queries("b");
         for (int i = 0; i < 3; ++i) r->add_documents("d");
       },
       "queries"},
      {[](v1::ScoreRequest* r) {
         r->add_queries("q");
         r->add_documents("d");
         r->add_documents("");
       },
       "documents[1]"},
      {[](v1::ScoreRequest* r) {
         r->add_queries("");
         r->add_documents("d");
       },
       "queries[0]"},
      {[&](v1::ScoreRequest* r) {  // too long, no truncation asked for
         r->add_queries("q");
         r->add_documents("fine");
         r->add_documents(too_long);
       },
       "documents[1]"},
      {[&](v1::ScoreRequest* r) {  // the query alone fills the cap
         r->add_queries(too_long);
         r->add_documents("d");
         r->set_truncate_prompt_tokens(-1);
       },
       "queries[0]"},
      {[](v1::ScoreRequest* r) {
         r->add_queries("q");
         r->add_documents("d");
         r->set_truncate_prompt_tokens(-3);
       },
       "truncate_prompt_tokens"},
  };
  for (const Case& c : cases) {
    v1::ScoreRequest r;
    c.make(&r);
    grpc::ClientContext cctx;
    v1::ScoreResponse out;
    const grpc::Status s = server.stub().Score(&cctx, r, &out);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << c.field << " " << s.error_message();
    EXPECT_EQ(s.error_message().rfind(std::string(c.field) + ":", 0), 0u)
        << c.field << ": " << s.error_message();
  }
  ASSERT_TRUE(server.engine().WaitIdle(absl::Seconds(30)));
  EXPECT_EQ(server.engine().Stats().kv.blocks_used, 0);

  // sentence-transformers' Identity activation: the score is the logit itself.
  std::vector<float> w2;
  const std::string raw_dir =
      WriteClassifier(*model_, "reranker-identity", {"LABEL_0"}, &w2, [](Json& c) {
        c["sentence_transformers"] = {{"activation_fn", "torch.nn.modules.linear.Identity"}};
      });
  absl::StatusOr<std::unique_ptr<ModelBundle>> raw = ModelBundle::Load(raw_dir);
  ASSERT_TRUE(raw.ok()) << raw.status();
  EXPECT_EQ((*raw)->classifier->score_activation, ClassifierHead::Activation::kIdentity);
  TestServer raw_server(*std::move(raw), o);
  v1::ScoreRequest one;
  one.add_queries(query);
  one.add_documents(docs[0]);
  grpc::ClientContext ctx4;
  ASSERT_TRUE(raw_server.stub().Score(&ctx4, one, &resp).ok());
  const std::vector<int32_t> pair0 =
      model_->tokenizer->JoinPair(Encode(query, false), Encode(docs[0], false), true);
  const double raw_logit = RefLogits(pair0, w2, &tol)[0];
  EXPECT_NEAR(resp.scores(0), raw_logit, tol + 1e-6);
}

// kvrmd --classifier_from_tokens: a causal LM served as a reranker by two of its LM head's rows
// (Qwen3-Reranker's "no", "yes"): the score is b's probability against a, from the reference's
// own logits of those tokens.
TEST_F(ClassifyTest, ClassifierFromTokensIsTheLmHeadsTwoWayProbability) {
  std::unique_ptr<ModelBundle> m(LoadTinyModel());
  std::mt19937 rng(11);
  std::vector<std::string> tokens;
  std::vector<int32_t> ids;
  while (tokens.size() < 2) {
    const int32_t id = static_cast<int32_t>(rng() % 500 + 10);
    const std::string token(m->tokenizer->IdToToken(id));
    if (token.empty() || m->tokenizer->TokenToId(token) != id) continue;
    tokens.push_back(token);
    ids.push_back(id);
  }
  absl::StatusOr<ClassifierHead> head =
      ClassifierFromTokens(m->weights.lm_head, *m->tokenizer, tokens);
  ASSERT_TRUE(head.ok()) << head.status();
  EXPECT_EQ(head->num_labels, 1);
  EXPECT_FALSE(
      ClassifierFromTokens(m->weights.lm_head, *m->tokenizer, {tokens[0], "no-such-token\x01"})
          .ok());
  EXPECT_FALSE(
      ClassifierFromTokens(m->weights.lm_head, *m->tokenizer, {tokens[0], tokens[0]}).ok());
  m->classifier = *std::move(head);
  TestServer server(std::move(m), Options());
  const std::string query = "is the sky blue";
  const std::vector<std::string> docs = {"yes the sky is blue", "grass is green"};
  const v1::ScoreRequest req = ScoreRequestOf(query, docs);
  grpc::ClientContext ctx;
  v1::ScoreResponse resp;
  ASSERT_TRUE(server.stub().Score(&ctx, req, &resp).ok());
  for (int d = 0; d < 2; ++d) {
    const std::vector<int32_t> pair =
        model_->tokenizer->JoinPair(Encode(query, false), Encode(docs[d], false), true);
    const std::vector<double> logits = ref_->Forward(pair).back();
    const double want = Sigmoid(logits[ids[1]] - logits[ids[0]]);
    // Logits agree to ~1e-4 absolute here (forward_test's bound), their difference to twice.
    EXPECT_NEAR(resp.scores(d), want, 1e-4) << d;
  }
}

// A model without a head scores by embedding similarity: the cosine of the two texts' pooled
// states (the server's pooling), each text tokenized as Embed's are.
TEST_F(ClassifyTest, WithoutAHeadScoreIsTheEmbeddingsCosine) {
  TestServer server(Options());
  const std::string query = "a small dog";
  const std::vector<std::string> docs = {"a little puppy", "tax returns are due in April", "dogs"};
  const v1::ScoreRequest req = ScoreRequestOf(query, docs);
  grpc::ClientContext ctx;
  v1::ScoreResponse resp;
  ASSERT_TRUE(server.stub().Score(&ctx, req, &resp).ok());
  EXPECT_EQ(resp.method(), v1::SCORE_METHOD_EMBEDDING_SIMILARITY);
  const std::vector<double> q = ref_->FinalHidden(Encode(query, true)).back();
  int32_t tokens = static_cast<int32_t>(Encode(query, true).size());
  for (int d = 0; d < 3; ++d) {
    const std::vector<double> e = ref_->FinalHidden(Encode(docs[d], true)).back();
    tokens += static_cast<int32_t>(Encode(docs[d], true).size());
    double qe = 0, qq = 0, ee = 0;
    for (size_t c = 0; c < q.size(); ++c) {
      qe += q[c] * e[c];
      qq += q[c] * q[c];
      ee += e[c] * e[c];
    }
    EXPECT_NEAR(resp.scores(d), qe / std::sqrt(qq * ee), 1e-4) << d;
  }
  EXPECT_EQ(resp.prompt_tokens(), tokens);
  // Classify needs a head.
  v1::ClassifyRequest c;
  c.add_inputs()->set_text("x");
  grpc::ClientContext cctx;
  v1::ClassifyResponse cresp;
  const grpc::Status st = server.stub().Classify(&cctx, c, &cresp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
}

// The HTTP API: vLLM's /classify, /score and the rerank shape (vLLM's, Jina's, Cohere's), the
// same figures as the RPCs, most relevant first, top_n, documents as strings or {"text"}.
TEST_F(ClassifyTest, HttpClassifyScoreAndRerankAreTheRpcs) {
  std::vector<float> weight;
  const std::string dir = WriteClassifier(*model_, "reranker-http", {"relevant"}, &weight);
  absl::StatusOr<std::unique_ptr<ModelBundle>> m = ModelBundle::Load(dir);
  ASSERT_TRUE(m.ok()) << m.status();
  TestServer server(*std::move(m), Options());
  OpenAiHttpOptions ho;
  ho.host = "127.0.0.1";
  ho.port = 0;
  ho.served_model_name = "reranker";
  ho.max_context = server.engine().options().max_context;
  ho.tokenizer = server.model().tokenizer.get();
  absl::StatusOr<std::unique_ptr<OpenAiHttpServer>> http =
      OpenAiHttpServer::Start(server.server().InProcessChannel(), ho);
  ASSERT_TRUE(http.ok()) << http.status();
  const int port = (*http)->port();
  auto body = [](const HttpReply& r) {
    absl::StatusOr<Json> j = ParseJson(r.body, "reply");
    return j.ok() ? *j : Json();
  };

  const std::vector<std::string> docs = {"green grass", "the capital of France is Paris", "Paris",
                                         "bananas"};
  const v1::ScoreRequest req = ScoreRequestOf("capital of France", docs);
  grpc::ClientContext ctx;
  v1::ScoreResponse want;
  ASSERT_TRUE(server.stub().Score(&ctx, req, &want).ok());

  HttpReply r =
      HttpCall(port, "POST", "/score",
               R"({"model": "reranker", "text_1": "capital of France", "text_2": )"
               R"(["green grass", "the capital of France is Paris", "Paris", "bananas"]})");
  ASSERT_EQ(r.status, 200) << r.body;
  Json j = body(r);
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(j["data"][i]["index"], i);
    EXPECT_EQ(j["data"][i]["object"], "score");
    EXPECT_EQ(j["data"][i]["score"].get<float>(), want.scores(i)) << i;
  }
  EXPECT_EQ(j["usage"]["prompt_tokens"], want.prompt_tokens());

  std::vector<int> order = {0, 1, 2, 3};
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return want.scores(a) > want.scores(b); });
  for (const char* path : {"/rerank", "/v1/rerank", "/v2/rerank"}) {
    r = HttpCall(port, "POST", path,
                 R"({"query": "capital of France", "top_n": 3, "documents": ["green grass", )"
                 R"({"text": "the capital of France is Paris"}, "Paris", "bananas"]})");
    ASSERT_EQ(r.status, 200) << path << " " << r.body;
    j = body(r);
    ASSERT_EQ(j["results"].size(), 3u) << r.body;
    for (int i = 0; i < 3; ++i) {
      const int d = order[i];
      EXPECT_EQ(j["results"][i]["index"], d) << path;
      EXPECT_EQ(j["results"][i]["relevance_score"].get<float>(), want.scores(d)) << path;
      EXPECT_EQ(j["results"][i]["document"]["text"], docs[d]) << path;
    }
    EXPECT_EQ(j["usage"]["total_tokens"], want.prompt_tokens());
  }
  r = HttpCall(port, "POST", "/rerank",
               R"({"query": "q", "documents": ["a", "b"], "return_documents": false})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_FALSE(body(r)["results"][0].contains("document")) << r.body;

  v1::ClassifyRequest c;
  c.add_inputs()->set_text("Paris");
  grpc::ClientContext cctx;
  v1::ClassifyResponse cwant;
  ASSERT_TRUE(server.stub().Classify(&cctx, c, &cwant).ok());
  r = HttpCall(port, "POST", "/classify", R"({"model": "reranker", "input": ["Paris"]})");
  ASSERT_EQ(r.status, 200) << r.body;
  j = body(r);
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["label"], "relevant");
  EXPECT_EQ(j["data"][0]["num_classes"], 1);
  EXPECT_EQ(j["data"][0]["probs"][0].get<float>(), cwant.classifications(0).probs(0));

  struct Bad {
    const char* path;
    const char* body;
    const char* param;
  };
  for (const Bad& b :
       {Bad{"/score", R"({"text_1": "q"})", "text_2"},
        Bad{"/score", R"({"text_1": ["a", "b"], "text_2": ["x", "y", "z"]})", "text_1"},
        Bad{"/score", R"({"text_1": "q", "text_2": ["x", ""]})", "text_2[1]"},
        Bad{"/rerank", R"({"query": "q", "documents": ["x", 3]})", "documents[1]"},
        Bad{"/rerank", R"({"query": ["q"], "documents": ["x"]})", "query"},
        Bad{"/rerank", R"({"query": "q", "documents": ["x"], "top_n": -1})", "top_n"},
        Bad{"/classify", R"({"input": []})", "input"}}) {
    r = HttpCall(port, "POST", b.path, b.body);
    EXPECT_EQ(r.status, 400) << b.body << " " << r.body;
    EXPECT_EQ(body(r)["error"]["param"], b.param) << b.body << " " << r.body;
  }
  EXPECT_EQ(HttpCall(port, "GET", "/rerank").status, 405);
}

}  // namespace
}  // namespace kvrm
