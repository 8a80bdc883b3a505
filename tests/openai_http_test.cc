// The OpenAI-compatible HTTP API end to end: an in-process kvrmd (tiny model) with the HTTP server
// on a free loopback port, driven by plain HTTP/1.1 requests. Checks that the HTTP API gives what
// the gRPC API gives for the same request, the shapes OpenAI clients parse, the HTTP statuses of
// refusals, and that a client hanging up frees its slot.
#include "server/openai_http.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/json.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "metrics/kvrm_metrics.h"
#include "metrics/registry.h"
#include "tests/http_client.h"
#include "tests/test_server.h"

namespace kvrm {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

EngineOptions Options(int slots, int max_queue = 64) {
  EngineOptions o;
  o.slots = slots;
  o.max_queue = max_queue;
  o.max_new_tokens = 256;
  o.prefill_chunk = 32;
  o.threads = 2;
  o.kv_mode = KvMode::kKvrm;
  return o;
}

// kvrmd's wiring: the HTTP server over the gRPC server's in-process channel.
class Daemon {
 public:
  explicit Daemon(EngineOptions options, ServerOptions so = {}, size_t max_body = 8 << 20,
                  const HttpApiMetrics* metrics = nullptr,
                  const MetricRegistry* registry = nullptr,
                  const std::function<void(OpenAiHttpOptions&)>& more = nullptr)
      : server_(options, so) {
    OpenAiHttpOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.served_model_name = "tiny";
    o.max_context = server_.engine().options().max_context;
    o.defaults.chat_max_tokens = options.max_new_tokens;
    o.tokenizer = server_.model().tokenizer.get();
    o.max_body_bytes = max_body;
    o.metrics = metrics;
    o.registry = registry;
    o.version = "test-version";
    if (more) more(o);
    absl::StatusOr<std::unique_ptr<OpenAiHttpServer>> http =
        OpenAiHttpServer::Start(server_.server().InProcessChannel(), o);
    EXPECT_TRUE(http.ok()) << http.status();
    http_ = std::move(*http);
  }

  HttpReply Post(const std::string& path, const std::string& body,
                 const HttpHeaders& headers = {}) {
    return HttpCall(http_->port(), "POST", path, body, headers);
  }
  int http_port() const { return http_->port(); }
  TestServer& grpc() { return server_; }
  OpenAiHttpServer& http() { return *http_; }

  // Waits until no slot is in use and nothing waits (the engine is idle again).
  bool WaitIdle() {
    const absl::Time deadline = absl::Now() + absl::Seconds(30);
    while (absl::Now() < deadline) {
      grpc::ClientContext context;
      v1::ServerInfo info;
      if (server_.stub().GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok() &&
          info.slots_in_use() == 0 && info.queue_depth() == 0) {
        return true;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    return false;
  }

 private:
  TestServer server_;
  std::unique_ptr<OpenAiHttpServer> http_;
};

Json Body(const HttpReply& r) {
  absl::StatusOr<Json> j = ParseJson(r.body, "reply");
  EXPECT_TRUE(j.ok()) << r.status << " " << r.body;
  return j.ok() ? *j : Json();
}

// The stream's JSON events (without the final [DONE], which is checked to be last).
std::vector<Json> Events(const HttpReply& r) {
  std::vector<std::string> data = SseData(r.body);
  EXPECT_FALSE(data.empty());
  EXPECT_EQ(data.empty() ? "" : data.back(), "[DONE]");
  std::vector<Json> events;
  for (size_t i = 0; i + 1 < data.size(); ++i) {
    absl::StatusOr<Json> j = ParseJson(data[i], "event");
    EXPECT_TRUE(j.ok()) << data[i];
    if (j.ok()) events.push_back(*j);
  }
  return events;
}

// Start refuses connection limits and idle timeouts that would serve nothing, naming the flag.
TEST(OpenAiHttpTest, StartRefusesBadConnectionOptions) {
  EngineOptions eo;
  eo.slots = 1;
  eo.threads = 1;
  TestServer server(eo);
  for (const auto& [edit, flag] :
       std::vector<std::pair<std::function<void(OpenAiHttpOptions&)>, std::string>>{
           {[](OpenAiHttpOptions& o) { o.connection_limit = 0; }, "--http_max_connections=0"},
           {[](OpenAiHttpOptions& o) { o.connection_limit = 70000; },
            "--http_max_connections=70000"},
           {[](OpenAiHttpOptions& o) { o.idle_timeout_s = 0; }, "--http_idle_timeout_s=0"},
       }) {
    OpenAiHttpOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.tokenizer = server.model().tokenizer.get();
    edit(o);
    absl::StatusOr<std::unique_ptr<OpenAiHttpServer>> http =
        OpenAiHttpServer::Start(server.server().InProcessChannel(), o);
    ASSERT_FALSE(http.ok()) << flag;
    EXPECT_EQ(http.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(absl::StartsWith(http.status().message(), flag)) << http.status();
  }
}

TEST(OpenAiHttpTest, ModelsListsTheServedModel) {
  Daemon d(Options(2));
  HttpReply r = HttpCall(d.http_port(), "GET", "/v1/models");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.headers["content-type"], "application/json");
  Json list = Body(r);
  EXPECT_EQ(list["object"], "list");
  ASSERT_EQ(list["data"].size(), 1u);
  EXPECT_EQ(list["data"][0]["id"], "tiny");
  EXPECT_EQ(list["data"][0]["object"], "model");
  EXPECT_EQ(list["data"][0]["max_model_len"], d.grpc().engine().options().max_context);
  EXPECT_EQ(HttpCall(d.http_port(), "GET", "/v1/models/tiny").status, 200);
  EXPECT_EQ(HttpCall(d.http_port(), "GET", "/v1/models/gpt-4").status, 404);
  EXPECT_EQ(HttpCall(d.http_port(), "GET", "/health").status, 200);
}

// vLLM's use_beam_search: n beams as n choices, best first, each a whole completion.
TEST(OpenAiHttpTest, BeamSearchReturnsTheBeamsAsChoices) {
  Daemon d(Options(2));
  HttpReply r = d.Post("/v1/completions", R"({"prompt": "Once upon a time", "max_tokens": 5,
      "n": 3, "use_beam_search": true, "length_penalty": 1.0, "ignore_eos": true,
      "temperature": 0})");
  ASSERT_EQ(r.status, 200) << r.body;
  const Json j = Body(r);
  ASSERT_EQ(j["choices"].size(), 3u) << r.body;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["finish_reason"], "length");
  }
  EXPECT_NE(j["choices"][0]["text"], j["choices"][1]["text"]);
  EXPECT_EQ(j["usage"]["completion_tokens"], 15);
  HttpReply bad = d.Post("/v1/completions", R"({"prompt": "x", "max_tokens": 5, "n": 2,
      "use_beam_search": true, "top_p": 0.5})");
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(Body(bad)["error"]["param"], "top_p") << bad.body;
  EXPECT_TRUE(d.WaitIdle());
}

// More names (kvrmd --served_model_name=a,b,...): each is accepted as the model, and listed.
TEST(OpenAiHttpTest, AliasesOfTheServedModelAreAcceptedAndListed) {
  Daemon d(Options(2), ServerOptions(), 8 << 20, nullptr, nullptr, [](OpenAiHttpOptions& o) {
    o.served_model_aliases = {"claude-sonnet-4-5", "gpt-4o"};
  });
  const std::string message =
      R"({"model": "claude-sonnet-4-5", "max_tokens": 2, "messages": [{"role": "user", "content": "x"}]})";
  HttpReply r = d.Post("/v1/messages", message);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Body(r)["model"], "claude-sonnet-4-5");
  EXPECT_EQ(d.Post("/v1/chat/completions", R"({"model": "gpt-4o", "max_tokens": 2,
                   "messages": [{"role": "user", "content": "x"}]})")
                .status,
            200);
  EXPECT_EQ(
      d.Post("/v1/completions", R"({"model": "gpt-5", "prompt": "x", "max_tokens": 2})").status,
      404);
  HttpReply models = HttpCall(d.http_port(), "GET", "/v1/models");
  ASSERT_EQ(models.status, 200) << models.body;
  std::vector<std::string> ids;
  const Json listed = Body(models);
  for (const Json& m : listed["data"]) ids.push_back(m["id"].get<std::string>());
  EXPECT_THAT(ids, ElementsAre("tiny", "claude-sonnet-4-5", "gpt-4o"));
  EXPECT_EQ(HttpCall(d.http_port(), "GET", "/v1/models/gpt-4o").status, 200);
}

TEST(OpenAiHttpTest, CompletionIsWhatGrpcGivesForTheSameRequest) {
  Daemon d(Options(2));
  v1::GenerateRequest g = TextRequest("The capital of", 12);
  g.mutable_stopping()->set_ignore_eos(true);
  StreamResult want = RunGenerate(d.grpc().stub(), g);
  ASSERT_TRUE(want.status.ok()) << want.status.error_message();

  HttpReply r = d.Post("/v1/completions", R"({"model": "tiny", "prompt": "The capital of",
      "max_tokens": 12, "temperature": 0, "ignore_eos": true})");
  ASSERT_EQ(r.status, 200) << r.body;
  Json j = Body(r);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_TRUE(absl::StartsWith(j["id"].get<std::string>(), "cmpl-"));
  EXPECT_EQ(r.headers["x-request-id"], j["id"].get<std::string>());
  EXPECT_EQ(j["model"], "tiny");
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["text"], want.text);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], want.finished.usage().prompt_tokens());
  EXPECT_EQ(j["usage"]["completion_tokens"], 12);
  EXPECT_EQ(j["usage"]["total_tokens"], want.finished.usage().prompt_tokens() + 12);

  // echo: the prompt, then the same completion.
  r = d.Post("/v1/completions", R"({"prompt": "The capital of", "max_tokens": 12,
      "temperature": 0, "ignore_eos": true, "echo": true})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Body(r)["choices"][0]["text"], "The capital of" + want.text);
}

// lm-evaluation-harness's log-likelihood request (echo + logprobs, one token): the logprobs
// object leads with every prompt token (the first null) scored as gRPC's prompt_logprobs scores
// them; vLLM's prompt_logprobs list says the same.
TEST(OpenAiHttpTest, EchoWithLogprobsScoresThePromptAsGrpcDoes) {
  Daemon d(Options(2));
  v1::GenerateRequest g = TextRequest("The capital of France is Paris", 1);
  g.mutable_response()->set_prompt_top_logprobs(1);
  const StreamResult want = RunGenerate(d.grpc().stub(), g);
  ASSERT_TRUE(want.status.ok()) << want.status.error_message();
  ASSERT_FALSE(want.messages.empty());
  const auto& scored = want.messages[0].prompt_logprobs();
  ASSERT_GT(scored.size(), 3);

  HttpReply r = d.Post("/v1/completions", R"({"prompt": "The capital of France is Paris",
      "max_tokens": 1, "temperature": 0, "echo": true, "logprobs": 1, "prompt_logprobs": 1})");
  ASSERT_EQ(r.status, 200) << r.body;
  const Json c = Body(r)["choices"][0];
  const Json& lp = c["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), static_cast<size_t>(scored.size()) + 1) << lp.dump();
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  const Json& plp = c["prompt_logprobs"];
  ASSERT_EQ(plp.size(), static_cast<size_t>(scored.size()));
  EXPECT_TRUE(plp[0].is_null());
  for (int i = 1; i < scored.size(); ++i) {
    EXPECT_FLOAT_EQ(lp["token_logprobs"][i].get<float>(), scored[i].logprob()) << i;
    EXPECT_EQ(lp["top_logprobs"][i].size(), 1u) << i;
    const Json& own = plp[i][std::to_string(scored[i].token_id())];
    EXPECT_FLOAT_EQ(own["logprob"].get<float>(), scored[i].logprob()) << i;
    EXPECT_EQ(own["rank"].get<int>(), scored[i].rank()) << i;
  }
  // The completion's token last, as without echo.
  EXPECT_EQ(lp["tokens"].back(), c["text"].get<std::string>().substr(
                                     std::string("The capital of France is Paris").size()));
}

// vLLM's return_token_ids: the prompt's ids as gRPC's Tokenize gives them and each choice's
// generated ids as gRPC's stream gives them, whole or streamed (chat: the prompt's on the
// response or a chunk; completions: on each choice); return_tokens_as_token_ids spells logprob
// tokens "token_id:N"; continuous_usage_stats puts the usage so far in every chunk.
TEST(OpenAiHttpTest, ReturnTokenIdsAreThePromptAndTheCompletionsIds) {
  Daemon d(Options(2));
  const std::string prompt = "The capital of";
  v1::GenerateRequest g = TextRequest(prompt, 8);
  g.mutable_stopping()->set_ignore_eos(true);
  const StreamResult want = RunGenerate(d.grpc().stub(), g);
  ASSERT_TRUE(want.status.ok()) << want.status.error_message();
  grpc::ClientContext ctx;
  v1::TokenizeRequest tr;
  tr.set_text(prompt);
  tr.set_add_bos(true);
  v1::TokenizeResponse tokenized;
  ASSERT_TRUE(d.grpc().stub().Tokenize(&ctx, tr, &tokenized).ok());
  const Json prompt_ids =
      std::vector<int32_t>(tokenized.token_ids().begin(), tokenized.token_ids().end());
  const Json ids = want.tokens;
  ASSERT_EQ(want.tokens.size(), 8u);

  // Completions, whole and streamed.
  const std::string body = absl::StrCat(R"({"prompt": ")", prompt, R"(", "max_tokens": 8,
      "temperature": 0, "ignore_eos": true, "return_token_ids": true, "n": 2)");
  HttpReply r = d.Post("/v1/completions", body + "}");
  ASSERT_EQ(r.status, 200) << r.body;
  for (const Json& c : Body(r)["choices"]) {
    EXPECT_EQ(c["prompt_token_ids"], prompt_ids) << r.body;
    EXPECT_EQ(c["token_ids"], ids) << r.body;
  }
  r = d.Post("/v1/completions", body + R"(, "stream": true,
      "stream_options": {"include_usage": true, "continuous_usage_stats": true}})");
  ASSERT_EQ(r.status, 200) << r.body;
  std::map<int, Json> streamed_ids, streamed_prompt;
  const std::vector<Json> events = Events(r);
  ASSERT_FALSE(events.empty());
  for (size_t k = 0; k + 1 < events.size(); ++k) {  // (the last: include_usage's total)
    const Json& e = events[k];
    ASSERT_EQ(e["choices"].size(), 1u) << e.dump();
    const Json& c = e["choices"][0];
    const int index = c["index"].get<int>();
    if (!streamed_ids.contains(index)) streamed_ids[index] = Json::array();
    for (const Json& id : c["token_ids"]) streamed_ids[index].push_back(id);
    if (c.contains("prompt_token_ids")) {
      EXPECT_FALSE(streamed_prompt.contains(index)) << "prompt ids sent twice: " << e.dump();
      streamed_prompt[index] = c["prompt_token_ids"];
    }
    // The usage so far: its prompt's and its choice's tokens up to this chunk (vLLM's).
    ASSERT_TRUE(e.contains("usage")) << e.dump();
    EXPECT_EQ(e["usage"]["completion_tokens"], streamed_ids[index].size()) << e.dump();
    EXPECT_EQ(e["usage"]["prompt_tokens"], prompt_ids.size());
  }
  EXPECT_EQ(events.back()["usage"]["completion_tokens"], 16);
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(streamed_ids[i], ids) << i;
    EXPECT_EQ(streamed_prompt[i], prompt_ids) << i;
  }

  // Chat: the prompt's ids on the response (streamed: on one chunk), the choice's ids on it.
  const std::string chat = R"({"messages": [{"role": "user", "content": "Hi"}],
      "max_tokens": 6, "temperature": 0, "return_token_ids": true, "logprobs": true,
      "top_logprobs": 1, "return_tokens_as_token_ids": true)";
  r = d.Post("/v1/chat/completions", chat + "}");
  ASSERT_EQ(r.status, 200) << r.body;
  const Json whole = Body(r);
  ASSERT_TRUE(whole["prompt_token_ids"].is_array()) << r.body;
  EXPECT_EQ(whole["prompt_token_ids"].size(), whole["usage"]["prompt_tokens"].get<size_t>());
  const Json& choice = whole["choices"][0];
  ASSERT_EQ(choice["token_ids"].size(), whole["usage"]["completion_tokens"].get<size_t>());
  const Json& content = choice["logprobs"]["content"];
  ASSERT_EQ(content.size(), choice["token_ids"].size());
  for (size_t i = 0; i < content.size(); ++i) {
    EXPECT_EQ(content[i]["token"], absl::StrCat("token_id:", choice["token_ids"][i].get<int>()));
    EXPECT_EQ(content[i]["top_logprobs"][0]["token"].get<std::string>().rfind("token_id:", 0), 0u);
  }
  r = d.Post("/v1/chat/completions", chat + R"(, "stream": true,
      "stream_options": {"continuous_usage_stats": true}})");
  ASSERT_EQ(r.status, 200) << r.body;
  Json chat_ids = Json::array(), chat_prompt;
  int with_prompt = 0;
  for (const Json& e : Events(r)) {
    EXPECT_FALSE(e.contains("usage")) << "continuous_usage_stats needs include_usage";
  }
  for (const Json& e : Events(r)) {
    if (e.contains("prompt_token_ids")) {
      ++with_prompt;
      chat_prompt = e["prompt_token_ids"];
    }
    for (const Json& c : e["choices"]) {
      if (c.contains("token_ids")) {
        for (const Json& id : c["token_ids"]) chat_ids.push_back(id);
      }
    }
  }
  EXPECT_EQ(with_prompt, 1);
  EXPECT_EQ(chat_prompt, whole["prompt_token_ids"]);
  EXPECT_EQ(chat_ids, choice["token_ids"]);

  // Not asked for: no ids, tokens spelled as text.
  r = d.Post("/v1/chat/completions", R"({"messages": [{"role": "user", "content": "Hi"}],
      "max_tokens": 4, "logprobs": true})");
  ASSERT_EQ(r.status, 200) << r.body;
  const Json plain = Body(r);
  EXPECT_FALSE(plain.contains("prompt_token_ids"));
  EXPECT_FALSE(plain["choices"][0].contains("token_ids"));
  for (const Json& t : plain["choices"][0]["logprobs"]["content"]) {
    EXPECT_EQ(t["token"].get<std::string>().rfind("token_id:", 0), std::string::npos);
  }
  // prompt_logprobs' decoded_token stays text with return_tokens_as_token_ids (as vLLM's).
  r = d.Post("/v1/completions", R"({"prompt": "The capital of", "max_tokens": 1,
      "prompt_logprobs": 1, "logprobs": 0, "return_tokens_as_token_ids": true})");
  ASSERT_EQ(r.status, 200) << r.body;
  const Json scored = Body(r);
  const Json& c0 = scored["choices"][0];
  EXPECT_EQ(c0["logprobs"]["tokens"][0].get<std::string>().rfind("token_id:", 0), 0u) << r.body;
  for (size_t i = 1; i < c0["prompt_logprobs"].size(); ++i) {
    for (const auto& [id, entry] : c0["prompt_logprobs"][i].items()) {
      EXPECT_EQ(entry["decoded_token"].get<std::string>().find("token_id:"), std::string::npos)
          << r.body;
    }
  }
  // A beam search's chunks (each choice whole at its end) count its prompt too.
  r = d.Post("/v1/completions", R"({"prompt": "The capital of", "max_tokens": 3, "n": 2,
      "use_beam_search": true, "stream": true,
      "stream_options": {"include_usage": true, "continuous_usage_stats": true}})");
  ASSERT_EQ(r.status, 200) << r.body;
  for (const Json& e : Events(r)) {
    ASSERT_TRUE(e.contains("usage")) << e.dump();
    EXPECT_EQ(e["usage"]["prompt_tokens"], prompt_ids.size()) << e.dump();
  }
}

// vLLM's POST /reset_prefix_cache (gRPC ResetPrefixCache), with --allow_prefix_cache_reset: a
// prompt cached by one call is prefilled cold by the next after it; the reply says what was
// freed. Without the flag, or without a prefix cache, it is refused.
TEST(OpenAiHttpTest, ResetPrefixCacheMakesTheNextPromptCold) {
  {
    Daemon off(Options(2));
    HttpReply r = off.Post("/reset_prefix_cache", "");
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_THAT(r.body, HasSubstr("--allow_prefix_cache_reset"));
  }
  ServerOptions so;
  so.prefix_cache_reset = true;
  {
    EngineOptions static_kv = Options(2);
    static_kv.kv_mode = KvMode::kStatic;
    Daemon no_cache(static_kv, so);
    HttpReply r = no_cache.Post("/reset_prefix_cache", "");
    EXPECT_EQ(r.status, 400) << r.body;
    EXPECT_THAT(r.body, HasSubstr("no prefix cache"));
  }
  Daemon d(Options(2), so);
  v1::GenerateRequest g;
  std::mt19937 rng(7);
  for (int i = 0; i < 70; ++i)
    g.mutable_token_ids()->add_ids(20 + static_cast<int32_t>(rng() % 900));
  g.mutable_stopping()->set_max_new_tokens(2);
  const auto cached = [&] {
    const StreamResult r = RunGenerate(d.grpc().stub(), g);
    EXPECT_TRUE(r.status.ok()) << r.status.error_message();
    return r.finished.usage().cached_prompt_tokens();
  };
  EXPECT_EQ(cached(), 0);
  // All of it but its last token: 4 blocks shared, 5 tokens of the fifth copied.
  EXPECT_EQ(cached(), 69) << "the second is served from the cache";
  ASSERT_TRUE(d.WaitIdle());
  HttpReply r = d.Post("/reset_prefix_cache", "");
  ASSERT_EQ(r.status, 200) << r.body;
  // 71 tokens with K/V (the prompt and the first token): 4 full blocks of 16 and a tail of 7.
  EXPECT_EQ(Body(r)["device_blocks_freed"], 5) << r.body;
  EXPECT_EQ(Body(r)["host_blocks_freed"], 0) << r.body;
  EXPECT_EQ(cached(), 0) << "cold after the reset";
  EXPECT_EQ(cached(), 69) << "and cached again";
  ASSERT_TRUE(d.WaitIdle());
  grpc::ClientContext ctx;
  v1::ResetPrefixCacheResponse freed;
  ASSERT_TRUE(d.grpc().stub().ResetPrefixCache(&ctx, v1::ResetPrefixCacheRequest(), &freed).ok());
  EXPECT_EQ(freed.device_blocks_freed(), 5);
  EXPECT_EQ(cached(), 0);
  EXPECT_EQ(d.grpc().engine().Stats().prefix_cache_resets_total, 2u);
  EXPECT_EQ(HttpCall(d.http_port(), "GET", "/reset_prefix_cache", "", {}).status, 405);
}

TEST(OpenAiHttpTest, StreamedChatIsTheNonStreamedChatInPieces) {
  Daemon d(Options(2));
  const std::string request = R"("messages": [{"role": "system", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "Hello "},
                                   {"type": "text", "text": "there"}]}],
      "max_tokens": 24, "temperature": 1, "seed": 7, "n": 2, "logprobs": true,
      "top_logprobs": 2)";
  HttpReply whole = d.Post("/v1/chat/completions", absl::StrCat("{", request, "}"));
  ASSERT_EQ(whole.status, 200) << whole.body;
  Json w = Body(whole);
  EXPECT_EQ(w["object"], "chat.completion");
  ASSERT_EQ(w["choices"].size(), 2u);

  HttpReply streamed = d.Post(
      "/v1/chat/completions",
      absl::StrCat("{", request, R"(, "stream": true, "stream_options": {"include_usage": true}})"));
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  EXPECT_EQ(streamed.headers["content-type"], "text/event-stream");
  EXPECT_EQ(streamed.headers["transfer-encoding"], "chunked");
  std::vector<Json> events = Events(streamed);
  ASSERT_GE(events.size(), 4u);
  std::string text[2];
  std::string finish[2];
  int logprob_tokens[2] = {0, 0};
  bool role[2] = {false, false};
  for (size_t i = 0; i + 1 < events.size(); ++i) {
    const Json& e = events[i];
    EXPECT_EQ(e["object"], "chat.completion.chunk");
    EXPECT_EQ(e["id"], events[0]["id"]);
    ASSERT_EQ(e["choices"].size(), 1u) << e.dump();
    const Json& c = e["choices"][0];
    const int index = c["index"].get<int>();
    ASSERT_TRUE(index == 0 || index == 1);
    EXPECT_TRUE(finish[index].empty()) << "a chunk after the finish: " << e.dump();
    if (c["delta"].contains("role")) {
      EXPECT_EQ(c["delta"]["role"], "assistant");
      EXPECT_TRUE(text[index].empty()) << "the role comes first";
      role[index] = true;
    }
    if (c["delta"].contains("content")) text[index] += c["delta"]["content"].get<std::string>();
    if (!c["logprobs"].is_null()) logprob_tokens[index] += c["logprobs"]["content"].size();
    if (!c["finish_reason"].is_null()) finish[index] = c["finish_reason"].get<std::string>();
  }
  // The last event before [DONE] is the usage, with no choices.
  const Json& usage = events.back();
  EXPECT_TRUE(usage["choices"].empty());
  // The same usage, but that the streamed call, the same prompt sent again, finds all of it but
  // its last token cached (28 of 29) where the first found the block its other completion
  // shared (16).
  Json streamed_usage = usage["usage"], whole_usage = w["usage"];
  EXPECT_EQ(whole_usage["prompt_tokens_details"]["cached_tokens"], 16);
  EXPECT_EQ(streamed_usage["prompt_tokens_details"]["cached_tokens"], 28);
  streamed_usage.erase("prompt_tokens_details");
  whole_usage.erase("prompt_tokens_details");
  EXPECT_EQ(streamed_usage, whole_usage);
  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE(i);
    const Json& c = w["choices"][i];
    EXPECT_TRUE(role[i]);
    EXPECT_EQ(text[i], c["message"]["content"].get<std::string>());
    EXPECT_EQ(finish[i], c["finish_reason"].get<std::string>());
    // One logprob entry per token, each with two alternatives and the token's bytes.
    const Json& lp = c["logprobs"]["content"];
    EXPECT_EQ(logprob_tokens[i], static_cast<int>(lp.size()));
    ASSERT_FALSE(lp.empty());
    for (const Json& t : lp) {
      EXPECT_LE(t["logprob"].get<double>(), 0.0);
      EXPECT_EQ(t["top_logprobs"].size(), 2u);
      EXPECT_FALSE(t["bytes"].empty());
    }
  }
  const int completion = w["usage"]["completion_tokens"].get<int>();
  EXPECT_EQ(completion, static_cast<int>(w["choices"][0]["logprobs"]["content"].size() +
                                         w["choices"][1]["logprobs"]["content"].size()));
}

TEST(OpenAiHttpTest, ToolCallsComeBackInOpenAisShape) {
  Daemon d(Options(2));
  HttpReply r = d.Post("/v1/chat/completions", R"({
      "messages": [{"role": "user", "content": "Weather in Lima?"}],
      "tools": [{"type": "function", "function": {"name": "get_weather",
          "description": "Forecast.",
          "parameters": {"type": "object", "properties": {"city": {"enum": ["Lima", "Oslo"]}},
                         "required": ["city"], "additionalProperties": false}}}],
      "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
      "max_tokens": 64, "temperature": 1, "seed": 3})");
  ASSERT_EQ(r.status, 200) << r.body;
  Json j = Body(r);
  const Json& c = j["choices"][0];
  EXPECT_EQ(c["finish_reason"], "tool_calls") << r.body;
  EXPECT_TRUE(c["message"]["content"].is_null());
  ASSERT_EQ(c["message"]["tool_calls"].size(), 1u);
  const Json& call = c["message"]["tool_calls"][0];
  EXPECT_TRUE(absl::StartsWith(call["id"].get<std::string>(), "call_"));
  EXPECT_EQ(call["type"], "function");
  EXPECT_EQ(call["function"]["name"], "get_weather");
  absl::StatusOr<Json> args = ParseJson(call["function"]["arguments"].get<std::string>(), "args");
  ASSERT_TRUE(args.ok());
  ASSERT_TRUE((*args)["city"] == "Lima" || (*args)["city"] == "Oslo") << args->dump();

  // The call goes back as an assistant turn with its result; the reply is text.
  const std::string turn2 = absl::StrCat(R"({"messages": [
      {"role": "user", "content": "Weather in Lima?"},
      {"role": "assistant", "content": null, "tool_calls": [)", call.dump(), R"(]},
      {"role": "tool", "tool_call_id": )", call["id"].dump(), R"(, "content": "sunny"}],
      "max_tokens": 4, "temperature": 0})");
  r = d.Post("/v1/chat/completions", turn2);
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_GT(Body(r)["usage"]["prompt_tokens"].get<int>(), 0);
}

// Streamed, the call arrives as OpenAI's deltas while it is generated: its id, type and name
// first, then pieces of its arguments that join into the call's JSON; the final chunk has the
// finish reason and does not send the call again.
TEST(OpenAiHttpTest, StreamedToolCallsArriveAsDeltas) {
  Daemon d(Options(2));
  HttpReply r = d.Post("/v1/chat/completions", R"({
      "messages": [{"role": "user", "content": "Weather in Lima?"}], "stream": true,
      "tools": [{"type": "function", "function": {"name": "get_weather",
          "parameters": {"type": "object", "properties": {"city": {"enum": ["Lima", "Oslo"]},
                         "days": {"enum": [1, 2, 3]}},
                         "required": ["city", "days"], "additionalProperties": false}}}],
      "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
      "max_tokens": 200, "temperature": 1, "seed": 5})");
  ASSERT_EQ(r.status, 200) << r.body;
  std::string id, name, arguments, finish;
  int pieces = 0, named = 0;
  for (const Json& e : Events(r)) {
    if (!e.contains("choices") || e["choices"].empty()) continue;
    const Json& choice = e["choices"][0];
    if (!choice["finish_reason"].is_null()) finish = choice["finish_reason"].get<std::string>();
    if (!choice["delta"].contains("tool_calls")) continue;
    for (const Json& call : choice["delta"]["tool_calls"]) {
      EXPECT_EQ(call["index"], 0);
      if (call.contains("id")) {
        ++named;
        id = call["id"].get<std::string>();
        EXPECT_EQ(call["type"], "function");
        name = call["function"]["name"].get<std::string>();
      }
      arguments += call["function"]["arguments"].get<std::string>();
      ++pieces;
    }
  }
  EXPECT_EQ(finish, "tool_calls") << r.body;
  EXPECT_EQ(named, 1) << "the call is introduced once, never repeated at the end";
  EXPECT_GT(pieces, 1) << "streamed in pieces: " << r.body;
  EXPECT_TRUE(absl::StartsWith(id, "call_"));
  EXPECT_EQ(name, "get_weather");
  absl::StatusOr<Json> args = ParseJson(arguments, "joined arguments");
  ASSERT_TRUE(args.ok()) << arguments;
  EXPECT_TRUE((*args)["city"] == "Lima" || (*args)["city"] == "Oslo") << arguments;
  EXPECT_TRUE((*args)["days"].is_number_integer()) << arguments;
}

TEST(OpenAiHttpTest, GuidedChoiceHoldsTheReplyToTheChoices) {
  Daemon d(Options(2));
  for (uint64_t seed = 0; seed < 4; ++seed) {
    HttpReply r = d.Post("/v1/completions",
                         absl::StrCat(R"({"prompt": "Sentiment:", "max_tokens": 8, "seed": )",
                                      seed, R"(, "guided_choice": ["positive", "negative"]})"));
    ASSERT_EQ(r.status, 200) << r.body;
    const std::string text = Body(r)["choices"][0]["text"].get<std::string>();
    EXPECT_TRUE(text == "positive" || text == "negative") << text;
  }
}

// A GBNF grammar through each spelling a client may use (vLLM's guided_grammar and
// structured_outputs.grammar, llama.cpp's grammar); a broken one is a 400 naming the parameter.
TEST(OpenAiHttpTest, GrammarHoldsTheReplyAndABadOneIsA400) {
  Daemon d(Options(2));
  const std::string grammar = R"g(root ::= answer " (" [0-9] ")"
answer ::= "yes" | "no")g";
  const std::string quoted = Json(grammar).dump();
  for (const std::string& param :
       {absl::StrCat(R"("guided_grammar": )", quoted), absl::StrCat(R"("grammar": )", quoted),
        absl::StrCat(R"("structured_outputs": {"grammar": )", quoted, "}")}) {
    HttpReply r =
        d.Post("/v1/completions",
               absl::StrCat(R"({"prompt": "Is it?", "max_tokens": 12, "seed": 3, )", param, "}"));
    ASSERT_EQ(r.status, 200) << r.body;
    const std::string text = Body(r)["choices"][0]["text"].get<std::string>();
    EXPECT_TRUE(text.size() == 7 || text.size() == 6) << text;
    EXPECT_TRUE(absl::StartsWith(text, "yes (") || absl::StartsWith(text, "no (")) << text;
    EXPECT_TRUE(absl::EndsWith(text, ")")) << text;
  }
  HttpReply bad = d.Post("/v1/chat/completions",
                         R"({"messages": [{"role": "user", "content": "x"}],
                             "guided_grammar": "root ::= \"a\" missing"})");
  EXPECT_EQ(bad.status, 400) << bad.body;
  const Json err = Body(bad)["error"];
  EXPECT_EQ(err["param"], "guided_grammar") << bad.body;
  EXPECT_EQ(err["message"], "guided_grammar: grammar: line 1 column 14: undefined rule missing")
      << bad.body;
}

// The Responses API: the same greedy turn as a chat completion, as one `response` object and as
// typed events whose text deltas join to it; a forced function call comes back as a
// function_call item; a stored-conversation id is a 400 naming it.
TEST(OpenAiHttpTest, ResponsesApiIsTheChatTurnInResponsesShape) {
  Daemon d(Options(2));
  HttpReply chat = d.Post("/v1/chat/completions", R"({"messages": [
      {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}],
      "max_tokens": 12, "temperature": 0})");
  ASSERT_EQ(chat.status, 200) << chat.body;
  const std::string want = Body(chat)["choices"][0]["message"]["content"].get<std::string>();
  const std::string body = R"({"model": "tiny", "instructions": "Be brief.", "input": "Hello",
                               "max_output_tokens": 12, "temperature": 0)";
  HttpReply r = d.Post("/v1/responses", body + "}");
  ASSERT_EQ(r.status, 200) << r.body;
  const Json j = Body(r);
  EXPECT_TRUE(absl::StartsWith(j["id"].get<std::string>(), "resp_")) << r.body;
  EXPECT_EQ(j["object"], "response");
  EXPECT_EQ(j["model"], "tiny");
  EXPECT_EQ(j["instructions"], "Be brief.");
  ASSERT_EQ(j["output"].size(), 1u) << r.body;
  EXPECT_EQ(j["output"][0]["type"], "message");
  EXPECT_EQ(j["output"][0]["content"][0]["text"], want);
  EXPECT_EQ(j["usage"]["input_tokens"], Body(chat)["usage"]["prompt_tokens"]);
  EXPECT_EQ(j["status"],
            Body(chat)["choices"][0]["finish_reason"] == "length" ? "incomplete" : "completed");

  HttpReply s = d.Post("/v1/responses", body + R"(, "stream": true})");
  ASSERT_EQ(s.status, 200) << s.body;
  std::string joined;
  std::vector<std::string> types;
  for (const std::string& data : SseData(s.body)) {
    absl::StatusOr<Json> e = ParseJson(data, "event");
    ASSERT_TRUE(e.ok()) << data;
    types.push_back((*e)["type"].get<std::string>());
    if ((*e)["type"] == "response.output_text.delta") joined += (*e)["delta"].get<std::string>();
  }
  ASSERT_GE(types.size(), 4u);
  EXPECT_EQ(types.front(), "response.created");
  EXPECT_TRUE(types.back() == "response.completed" || types.back() == "response.incomplete")
      << types.back();
  EXPECT_EQ(joined, want);

  HttpReply call = d.Post("/v1/responses", R"({"input": "Weather in Lima?",
      "tools": [{"type": "function", "name": "get_weather",
                 "parameters": {"type": "object", "properties": {"city": {"enum": ["Lima", "Oslo"]}},
                                "required": ["city"], "additionalProperties": false}}],
      "tool_choice": {"type": "function", "name": "get_weather"},
      "max_output_tokens": 64, "temperature": 1, "seed": 3})");
  ASSERT_EQ(call.status, 200) << call.body;
  const Json c = Body(call);
  ASSERT_EQ(c["output"].size(), 1u) << call.body;
  const Json& item = c["output"][0];
  EXPECT_EQ(item["type"], "function_call");
  EXPECT_EQ(item["name"], "get_weather");
  EXPECT_TRUE(absl::StartsWith(item["call_id"].get<std::string>(), "call_"));
  absl::StatusOr<Json> args = ParseJson(item["arguments"].get<std::string>(), "arguments");
  ASSERT_TRUE(args.ok()) << call.body;
  EXPECT_TRUE((*args)["city"] == "Lima" || (*args)["city"] == "Oslo") << args->dump();

  // The call and its result go back as input items; the reply is text.
  HttpReply turn2 = d.Post("/v1/responses", absl::StrCat(R"({"input": [
      {"role": "user", "content": "Weather in Lima?"}, )",
                                                         item.dump(), R"(,
      {"type": "function_call_output", "call_id": )",
                                                         item["call_id"].dump(), R"(,
       "output": "sunny"}], "max_output_tokens": 4, "temperature": 0})"));
  ASSERT_EQ(turn2.status, 200) << turn2.body;
  EXPECT_EQ(Body(turn2)["output"][0]["type"], "message") << turn2.body;

  // top_logprobs: each output token's logprob and its alternatives, spelled by the tokenizer.
  HttpReply scored = d.Post("/v1/responses", body + R"(, "top_logprobs": 2})");
  ASSERT_EQ(scored.status, 200) << scored.body;
  const Json sj = Body(scored);
  const Json& lps = sj["output"][0]["content"][0]["logprobs"];
  EXPECT_EQ(static_cast<int>(lps.size()), sj["usage"]["output_tokens"].get<int>()) << scored.body;
  std::string spelled;
  for (const Json& lp : lps) {
    EXPECT_LE(lp["logprob"].get<double>(), 0.0);
    EXPECT_EQ(lp["top_logprobs"].size(), 2u);
    spelled += lp["token"].get<std::string>();
  }
  EXPECT_EQ(spelled, want);

  HttpReply bad = d.Post("/v1/responses", R"({"input": "x", "previous_response_id": "resp_1"})");
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(Body(bad)["error"]["param"], "previous_response_id") << bad.body;
  // Without --responses_store nothing is kept to fetch.
  EXPECT_EQ(
      HttpCall(d.http_port(), "GET", "/v1/responses/" + j["id"].get<std::string>(), "", {}).status,
      404);
  EXPECT_EQ(HttpCall(d.http_port(), "PUT", "/v1/responses/x", "{}", {}).status, 405);
  HttpReply big = d.Post("/v1/responses", R"({"input": "x", "max_output_tokens": 0})");
  EXPECT_EQ(big.status, 400);
  EXPECT_EQ(Body(big)["error"]["param"], "max_output_tokens") << big.body;
}

// Anthropic's Messages API: the same greedy turn as a chat completion, as one `message` and as
// typed events whose text deltas join to it (message_start carrying the prompt's usage); a
// forced tool comes back as a tool_use block whose result goes back as a tool_result;
// count_tokens counts the prompt a message is given; errors are in Anthropic's shape.
TEST(OpenAiHttpTest, MessagesApiIsTheChatTurnInAnthropicsShape) {
  Daemon d(Options(2));
  HttpReply chat = d.Post("/v1/chat/completions", R"({"messages": [
      {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}],
      "max_tokens": 12, "temperature": 0})");
  ASSERT_EQ(chat.status, 200) << chat.body;
  const Json cj = Body(chat);
  const std::string want = cj["choices"][0]["message"]["content"].get<std::string>();
  ASSERT_FALSE(want.empty());
  const int prompt_tokens = cj["usage"]["prompt_tokens"].get<int>();
  const std::string body = R"({"model": "tiny", "system": "Be brief.",
      "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 12, "temperature": 0)";
  HttpReply r = d.Post("/v1/messages", body + "}", {{"anthropic-version", "2023-06-01"}});
  ASSERT_EQ(r.status, 200) << r.body;
  const Json j = Body(r);
  EXPECT_TRUE(absl::StartsWith(j["id"].get<std::string>(), "msg_")) << r.body;
  EXPECT_EQ(j["type"], "message");
  EXPECT_EQ(j["role"], "assistant");
  EXPECT_EQ(j["model"], "tiny");
  ASSERT_EQ(j["content"].size(), 1u) << r.body;
  EXPECT_EQ(j["content"][0]["type"], "text");
  EXPECT_EQ(j["content"][0]["text"], want);
  EXPECT_EQ(j["stop_reason"],
            cj["choices"][0]["finish_reason"] == "length" ? "max_tokens" : "end_turn");
  // input_tokens leave out the prefix cache's (the chat's turn put this prompt there).
  EXPECT_EQ(j["usage"]["input_tokens"].get<int>() + j["usage"]["cache_read_input_tokens"].get<int>(),
            prompt_tokens);
  EXPECT_EQ(j["usage"]["output_tokens"], cj["usage"]["completion_tokens"]);

  HttpReply s = d.Post("/v1/messages", body + R"(, "stream": true})");
  ASSERT_EQ(s.status, 200) << s.body;
  EXPECT_EQ(s.headers.at("content-type"), "text/event-stream");
  std::string joined;
  std::vector<std::string> types;
  Json start, end;
  for (const std::string& data : SseData(s.body)) {
    absl::StatusOr<Json> e = ParseJson(data, "event");
    ASSERT_TRUE(e.ok()) << data;
    types.push_back((*e)["type"].get<std::string>());
    if (types.back() == "message_start") start = (*e)["message"];
    if (types.back() == "message_delta") end = *e;
    if (types.back() == "content_block_delta") joined += (*e)["delta"]["text"].get<std::string>();
  }
  ASSERT_GE(types.size(), 6u);
  EXPECT_EQ(types.front(), "message_start");
  EXPECT_EQ(types[1], "content_block_start");
  EXPECT_EQ(types[types.size() - 2], "message_delta");
  EXPECT_EQ(types.back(), "message_stop");
  EXPECT_EQ(joined, want);
  // The prompt's usage is known at the start (the first message's prompt_usage).
  EXPECT_EQ(start["usage"]["input_tokens"].get<int>() +
                start["usage"]["cache_read_input_tokens"].get<int>(),
            prompt_tokens)
      << s.body;
  EXPECT_EQ(end["delta"]["stop_reason"], j["stop_reason"]);
  EXPECT_EQ(end["usage"]["output_tokens"], j["usage"]["output_tokens"]);

  HttpReply counted = d.Post("/v1/messages/count_tokens", body + "}");
  ASSERT_EQ(counted.status, 200) << counted.body;
  EXPECT_EQ(Body(counted)["input_tokens"], prompt_tokens);

  const std::string tools = R"("tools": [{"name": "get_weather", "description": "Weather.",
      "input_schema": {"type": "object", "properties": {"city": {"enum": ["Lima", "Oslo"]}},
                       "required": ["city"], "additionalProperties": false}}])";
  HttpReply call = d.Post("/v1/messages", absl::StrCat(R"({"messages": [
      {"role": "user", "content": "Weather in Lima?"}], )", tools, R"(,
      "tool_choice": {"type": "tool", "name": "get_weather"},
      "max_tokens": 64, "temperature": 1, "seed": 3})"));
  ASSERT_EQ(call.status, 200) << call.body;
  const Json c = Body(call);
  EXPECT_EQ(c["stop_reason"], "tool_use") << call.body;
  ASSERT_EQ(c["content"].size(), 1u) << call.body;
  const Json& use = c["content"][0];
  EXPECT_EQ(use["type"], "tool_use");
  EXPECT_EQ(use["name"], "get_weather");
  EXPECT_TRUE(use["input"]["city"] == "Lima" || use["input"]["city"] == "Oslo") << call.body;
  HttpReply counted_tools = d.Post("/v1/messages/count_tokens", absl::StrCat(R"({"messages": [
      {"role": "user", "content": "Weather in Lima?"}], )", tools, "}"));
  ASSERT_EQ(counted_tools.status, 200) << counted_tools.body;
  EXPECT_EQ(Body(counted_tools)["input_tokens"].get<int>(),
            c["usage"]["input_tokens"].get<int>() + c["usage"]["cache_read_input_tokens"].get<int>())
      << "the tools are in the counted prompt";

  // The call and its result go back as blocks; the reply is text.
  HttpReply turn2 = d.Post("/v1/messages", absl::StrCat(R"({"messages": [
      {"role": "user", "content": "Weather in Lima?"},
      {"role": "assistant", "content": [)", use.dump(), R"(]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": )", use["id"].dump(),
                                                         R"(, "content": "sunny"}]}], )",
                                                         tools, R"(, "max_tokens": 4, "temperature": 0})"));
  ASSERT_EQ(turn2.status, 200) << turn2.body;
  EXPECT_EQ(Body(turn2)["type"], "message") << turn2.body;

  // Errors: Anthropic's shape, the parameter named in the message.
  HttpReply bad = d.Post("/v1/messages", R"({"messages": [{"role": "user", "content": "x"}]})");
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(Body(bad)["type"], "error") << bad.body;
  EXPECT_EQ(Body(bad)["error"]["type"], "invalid_request_error") << bad.body;
  EXPECT_TRUE(absl::StartsWith(Body(bad)["error"]["message"].get<std::string>(), "max_tokens: "))
      << bad.body;
  HttpReply zero = d.Post("/v1/messages", R"({"messages": [{"role": "user", "content": "x"}],
                                              "max_tokens": 0})");
  EXPECT_EQ(zero.status, 400);
  EXPECT_TRUE(absl::StartsWith(Body(zero)["error"]["message"].get<std::string>(), "max_tokens"))
      << zero.body;
  // A service refusal names the Messages API's parameter too.
  HttpReply budget = d.Post("/v1/messages", R"({"messages": [{"role": "user", "content": "x"}],
      "max_tokens": 5, "thinking": {"type": "enabled", "budget_tokens": -3}})");
  EXPECT_EQ(budget.status, 400);
  EXPECT_TRUE(absl::StartsWith(Body(budget)["error"]["message"].get<std::string>(),
                               "thinking.budget_tokens: -3 is negative"))
      << budget.body;
  HttpReply other = d.Post("/v1/messages", R"({"model": "claude-sonnet-4", "max_tokens": 5,
                                               "messages": [{"role": "user", "content": "x"}]})");
  EXPECT_EQ(other.status, 404);
  EXPECT_EQ(Body(other)["error"]["type"], "not_found_error") << other.body;
  EXPECT_THAT(Body(other)["error"]["message"].get<std::string>(), HasSubstr("`tiny`"));
  HttpReply get = HttpCall(d.http_port(), "GET", "/v1/messages", "", {});
  EXPECT_EQ(get.status, 405);
  EXPECT_EQ(Body(get)["error"]["type"], "invalid_request_error") << get.body;
  EXPECT_TRUE(d.WaitIdle());
}

// With a store (kvrmd --responses_store): a second turn by previous_response_id is the turn
// sent with the whole conversation as input, streamed or not; the stored response comes back by
// GET and goes by DELETE; store: false keeps nothing.
TEST(OpenAiHttpTest, StoredResponsesContinueByPreviousResponseId) {
  Daemon d(Options(2), {}, 8 << 20, nullptr, nullptr,
           [](OpenAiHttpOptions& o) { o.responses_store_entries = 16; });
  HttpReply first = d.Post("/v1/responses", R"({"input": "Hello", "max_output_tokens": 6,
                                                "temperature": 0})");
  ASSERT_EQ(first.status, 200) << first.body;
  const Json f = Body(first);
  EXPECT_EQ(f["store"], true);
  const std::string id = f["id"].get<std::string>();
  const std::string said = f["output"][0]["content"][0]["text"].get<std::string>();

  // The same second turn, sent whole ...
  HttpReply whole = d.Post(
      "/v1/responses", absl::StrCat(R"({"input": [
      {"role": "user", "content": "Hello"}, {"role": "assistant", "content": )",
                                    Json(said).dump(), R"(}, {"role": "user", "content": "More"}],
      "max_output_tokens": 6, "temperature": 0, "store": false})"));
  ASSERT_EQ(whole.status, 200) << whole.body;
  const std::string want = Body(whole)["output"][0]["content"][0]["text"].get<std::string>();
  EXPECT_EQ(Body(whole)["store"], false);
  // ... and by reference, whole and streamed.
  const std::string next = absl::StrCat(R"({"previous_response_id": ")", id,
                                        R"(", "input": "More", "max_output_tokens": 6,
                                        "temperature": 0)");
  HttpReply by_id = d.Post("/v1/responses", next + "}");
  ASSERT_EQ(by_id.status, 200) << by_id.body;
  EXPECT_EQ(Body(by_id)["output"][0]["content"][0]["text"], want);
  EXPECT_EQ(Body(by_id)["previous_response_id"], id);
  EXPECT_EQ(Body(by_id)["usage"]["input_tokens"], Body(whole)["usage"]["input_tokens"]);
  HttpReply streamed = d.Post("/v1/responses", next + R"(, "stream": true})");
  ASSERT_EQ(streamed.status, 200) << streamed.body;
  std::string joined, streamed_id;
  for (const std::string& data : SseData(streamed.body)) {
    absl::StatusOr<Json> e = ParseJson(data, "event");
    ASSERT_TRUE(e.ok()) << data;
    if ((*e)["type"] == "response.output_text.delta") joined += (*e)["delta"].get<std::string>();
    if ((*e)["type"] == "response.created") streamed_id = (*e)["response"]["id"].get<std::string>();
  }
  EXPECT_EQ(joined, want);

  // GET returns what was sent; a streamed response is stored too; DELETE removes it.
  HttpReply got = HttpCall(d.http_port(), "GET", "/v1/responses/" + id, "", {});
  ASSERT_EQ(got.status, 200) << got.body;
  EXPECT_EQ(Body(got), f);
  HttpReply got_streamed = HttpCall(d.http_port(), "GET", "/v1/responses/" + streamed_id, "", {});
  EXPECT_EQ(got_streamed.status, 200) << got_streamed.body;
  HttpReply del = HttpCall(d.http_port(), "DELETE", "/v1/responses/" + id, "", {});
  ASSERT_EQ(del.status, 200) << del.body;
  EXPECT_EQ(Body(del)["deleted"], true);
  EXPECT_EQ(HttpCall(d.http_port(), "GET", "/v1/responses/" + id, "", {}).status, 404);
  HttpReply gone = d.Post("/v1/responses", next + "}");
  EXPECT_EQ(gone.status, 400);
  EXPECT_EQ(Body(gone)["error"]["param"], "previous_response_id") << gone.body;
  // store: false kept nothing.
  const std::string unstored = Body(whole)["id"].get<std::string>();
  EXPECT_EQ(HttpCall(d.http_port(), "GET", "/v1/responses/" + unstored, "", {}).status, 404);
}

TEST(OpenAiHttpTest, AListOfPromptsIsOneCallPerPromptInOneReply) {
  Daemon d(Options(4));
  const std::vector<std::string> prompts = {"The capital of", "Once upon a", "Rivers run"};
  std::vector<StreamResult> want;
  for (const std::string& p : prompts) {
    v1::GenerateRequest g = TextRequest(p, 10);
    g.mutable_stopping()->set_ignore_eos(true);
    want.push_back(RunGenerate(d.grpc().stub(), g));
    ASSERT_TRUE(want.back().status.ok()) << want.back().status.error_message();
  }
  const std::string list = R"(["The capital of", "Once upon a", "Rivers run"])";
  // Greedy, n=2: prompt p's two completions are choices 2p and 2p+1, each gRPC's text.
  HttpReply r = d.Post("/v1/completions",
                       absl::StrCat(R"({"prompt": )", list, R"(, "n": 2, "max_tokens": 10,
                           "temperature": 0, "ignore_eos": true, "request_id": "b7"})"));
  ASSERT_EQ(r.status, 200) << r.body;
  Json j = Body(r);
  EXPECT_EQ(j["id"], "b7");
  ASSERT_EQ(j["choices"].size(), 6u);
  int64_t prompt_tokens = 0;
  for (size_t p = 0; p < prompts.size(); ++p) {
    prompt_tokens += want[p].finished.usage().prompt_tokens();
    for (int k = 0; k < 2; ++k) {
      const Json& c = j["choices"][2 * p + k];
      EXPECT_EQ(c["index"], 2 * p + k);
      EXPECT_EQ(c["text"], want[p].text) << "prompt " << p;
      EXPECT_EQ(c["finish_reason"], "length");
    }
  }
  EXPECT_EQ(j["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(j["usage"]["completion_tokens"], 6 * 10);

  // Streamed, with echo and usage: the same texts, rebuilt per index from interleaved chunks.
  r = d.Post("/v1/completions",
             absl::StrCat(R"({"prompt": )", list, R"(, "max_tokens": 10, "temperature": 0,
                 "ignore_eos": true, "echo": true, "stream": true,
                 "stream_options": {"include_usage": true}})"));
  ASSERT_EQ(r.status, 200) << r.body;
  std::map<int, std::string> texts;
  Json usage;
  for (const Json& e : Events(r)) {
    if (e.contains("usage") && !e["usage"].is_null()) usage = e["usage"];
    for (const Json& c : e["choices"]) texts[c["index"].get<int>()] += c["text"].get<std::string>();
  }
  ASSERT_EQ(texts.size(), prompts.size());
  for (size_t p = 0; p < prompts.size(); ++p) EXPECT_EQ(texts[p], prompts[p] + want[p].text);
  ASSERT_TRUE(usage.is_object());
  EXPECT_EQ(usage["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(usage["completion_tokens"], 3 * 10);

  // One prompt the service refuses (a token id outside the vocabulary) refuses the request and
  // leaves nothing running.
  r = d.Post("/v1/completions", R"({"prompt": [[1, 2, 3], [1, 2000000000]], "max_tokens": 200,
                                     "ignore_eos": true})");
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(Body(r)["error"]["param"], "prompt") << r.body;
  EXPECT_TRUE(d.WaitIdle());
}

// The value of one series in a registry's exposition ("" when it is not there).
std::string SeriesValue(const MetricRegistry& registry, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(registry.Render(), '\n')) {
    if (absl::StartsWith(line, series + " ")) return std::string(line.substr(series.size() + 1));
  }
  return "";
}

std::string HttpRequests(const std::string& endpoint, int code) {
  return absl::StrCat(R"(kvrm:http_requests_total{model_name="tiny",kv_mode="kvrm",handler=")",
                      endpoint, R"(",code=")", code, R"("})");
}

constexpr char kDisconnects[] =
    R"(kvrm:http_client_disconnects_total{model_name="tiny",kv_mode="kvrm"})";
constexpr char kConnections[] = R"(kvrm:http_connections{model_name="tiny",kv_mode="kvrm"})";

// Polls until the series reads `want` (the server records after the reply's last byte).
bool WaitForSeries(const MetricRegistry& registry, const std::string& series,
                   const std::string& want) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    if (SeriesValue(registry, series) == want) return true;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return false;
}

TEST(OpenAiHttpTest, MetricsCountRequestsByEndpointAndStatus) {
  MetricRegistry registry;
  KvrmMetrics metrics(&registry, {"tiny", "kvrm"});
  Daemon d(Options(2), {}, 8 << 20, &metrics.http_api());
  EXPECT_EQ(SeriesValue(registry, HttpRequests("completions", 200)), "0");
  EXPECT_EQ(SeriesValue(registry, kConnections), "0");
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(d.Post("/v1/completions", R"({"prompt": "x", "max_tokens": 2})").status, 200);
  }
  EXPECT_EQ(d.Post("/v1/completions", R"({"prompt": "x", "top_p": 7})").status, 400);
  EXPECT_EQ(d.Post("/v1/chat/completions",
                   R"({"messages": [{"role": "user", "content": "x"}], "max_tokens": 2,
                       "stream": true})").status,
            200);
  EXPECT_EQ(HttpCall(d.http_port(), "GET", "/v1/models").status, 200);
  EXPECT_EQ(HttpCall(d.http_port(), "GET", "/nope").status, 404);
  EXPECT_EQ(HttpCall(d.http_port(), "GET", "/health").status, 200);
  EXPECT_TRUE(WaitForSeries(registry, HttpRequests("completions", 200), "3"));
  EXPECT_TRUE(WaitForSeries(registry, HttpRequests("completions", 400), "1"));
  EXPECT_TRUE(WaitForSeries(registry, HttpRequests("chat_completions", 200), "1"));
  EXPECT_TRUE(WaitForSeries(registry, HttpRequests("models", 200), "1"));
  EXPECT_TRUE(WaitForSeries(registry, HttpRequests("other", 404), "1"));
  EXPECT_TRUE(WaitForSeries(registry, HttpRequests("health", 200), "1"));
  EXPECT_EQ(SeriesValue(registry, HttpRequests("completions", 429)), "0");
  const std::string duration_count = absl::StrCat(
      R"(kvrm:http_request_duration_seconds_count{model_name="tiny",kv_mode="kvrm",)",
      R"(handler="completions"})");
  EXPECT_EQ(SeriesValue(registry, duration_count), "4");
  // Every connection was closed by its client (one request each): none left open.
  EXPECT_TRUE(WaitForSeries(registry, kConnections, "0"));
  EXPECT_EQ(SeriesValue(registry, kDisconnects), "0");
}

// Waits (at most 30 s) until the server has generated a token: a request is decoding.
bool WaitUntilDecoding(Daemon& d) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    grpc::ClientContext context;
    v1::ServerInfo info;
    if (d.grpc().stub().GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok() &&
        info.tokens_generated_total() > 0) {
      return true;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  return false;
}

// Waits until a slot is in use.
bool WaitUntilBusy(Daemon& d) {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    grpc::ClientContext context;
    v1::ServerInfo info;
    if (d.grpc().stub().GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok() &&
        info.slots_in_use() > 0) {
      return true;
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
  return false;
}

// Makes every decode step last at least 2 ms, so that a 250-token request takes half a second
// on any machine: long enough to hang up in the middle of it.
class SlowSteps : public EngineObserver {
 public:
  explicit SlowSteps(absl::Duration step = absl::Milliseconds(2)) : step_(step) {}
  void OnDecodeStep(int32_t, absl::Duration) override { absl::SleepFor(step_); }

 private:
  const absl::Duration step_;
};

TEST(OpenAiHttpTest, AClientThatHangsUpBeforeAWholeReplyFreesItsSlot) {
  MetricRegistry registry;
  KvrmMetrics metrics(&registry, {"tiny", "kvrm"});
  SlowSteps slow;
  EngineOptions options = Options(2);
  options.observer = &slow;
  Daemon d(options, {}, 8 << 20, &metrics.http_api());
  {
    HttpConnection c(d.http_port(), "POST", "/v1/completions",
                     R"({"prompt": "Go on", "max_tokens": 250, "ignore_eos": true})");
    ASSERT_TRUE(c.connected());
    // Hang up once the request is decoding.
    ASSERT_TRUE(WaitUntilDecoding(d));
  }
  EXPECT_TRUE(d.WaitIdle()) << "the call was not cancelled";
  grpc::ClientContext context;
  v1::ServerInfo info;
  ASSERT_TRUE(d.grpc().stub().GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok());
  EXPECT_EQ(info.kv().blocks_reserved(), 0) << info.DebugString();
  EXPECT_LT(info.tokens_generated_total(), 250u) << "it ran to the end for nobody";
  EXPECT_EQ(SeriesValue(registry, kDisconnects), "1");
  EXPECT_TRUE(WaitForSeries(registry, HttpRequests("completions", 499), "1"));
  EXPECT_EQ(d.Post("/v1/completions", R"({"prompt": "x", "max_tokens": 3})").status, 200);
}

// Makes every prefill chunk last at least 10 ms and counts the embeddings that ended with a
// vector.
class SlowPrefill : public EngineObserver {
 public:
  void OnPrefillChunk(int32_t, absl::Duration) override { absl::SleepFor(absl::Milliseconds(10)); }
  void OnMixedStep(int32_t, int32_t, absl::Duration) override {
    absl::SleepFor(absl::Milliseconds(10));
  }
  void OnFinished(const GenerationRequest& r, const FinishInfo& info) override {
    if (r.pooling != Pooling::kNone && info.reason == FinishReason::kStop) embedded.fetch_add(1);
  }
  std::atomic<int> embedded{0};
};

// A client that hangs up on /v1/embeddings cancels the inputs not yet embedded.
TEST(OpenAiHttpTest, AClientThatHangsUpOnEmbeddingsCancelsTheRest) {
  MetricRegistry registry;
  KvrmMetrics metrics(&registry, {"tiny", "kvrm"});
  SlowPrefill slow;
  EngineOptions options = Options(2);
  options.observer = &slow;
  Daemon d(options, {}, 8 << 20, &metrics.http_api());
  std::string inputs;
  for (int i = 0; i < 64; ++i) {
    absl::StrAppend(&inputs, i ? ", " : "", "[");
    for (int t = 0; t < 150; ++t) absl::StrAppend(&inputs, t ? ", " : "", 1 + (i * 7 + t) % 200);
    absl::StrAppend(&inputs, "]");
  }
  {
    // 64 inputs of 5 chunks at 10 ms or more a chunk: over three seconds of work.
    HttpConnection c(d.http_port(), "POST", "/v1/embeddings",
                     absl::StrCat(R"({"input": [)", inputs, "]}"));
    ASSERT_TRUE(c.connected());
    ASSERT_TRUE(WaitUntilBusy(d));
  }
  EXPECT_TRUE(d.WaitIdle()) << "the call was not cancelled";
  EXPECT_LT(slow.embedded.load(), 32) << "it ran to the end for nobody";
  EXPECT_EQ(SeriesValue(registry, kDisconnects), "1");
  grpc::ClientContext context;
  v1::ServerInfo info;
  ASSERT_TRUE(d.grpc().stub().GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok());
  EXPECT_EQ(info.kv().blocks_reserved(), 0) << info.DebugString();
  EXPECT_EQ(d.Post("/v1/embeddings", R"({"input": "x"})").status, 200);
}

TEST(OpenAiHttpTest, HeadersGrpcCannotCarryAreRefusedAndTheServerGoesOn) {
  Daemon d(Options(2));
  const std::string body = R"({"prompt": "x", "max_tokens": 2})";
  // gRPC metadata is printable ASCII; passing these on would abort the process.
  for (const std::string& auth : {std::string("Bearer\tabc"), std::string("Bearer \xc3\xa9"),
                                  std::string("Bearer a\x7f")}) {
    HttpReply r = d.Post("/v1/completions", body, {{"Authorization", auth}});
    EXPECT_EQ(r.status, 401) << r.body;
    EXPECT_EQ(Body(r)["error"]["type"], "authentication_error") << r.body;
    EXPECT_EQ(HttpCall(d.http_port(), "GET", "/v1/models", "", {{"Authorization", auth}}).status,
              401);
    EXPECT_EQ(d.Post("/tokenize", R"({"prompt": "x"})", {{"Authorization", auth}}).status, 401);
  }
  HttpReply r = d.Post("/v1/completions", body, {{"X-Request-Id", "id\xc3\xa9"}});
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(Body(r)["error"]["param"], "request_id") << r.body;
  // A health probe does not pass headers on: unaffected.
  EXPECT_EQ(HttpCall(d.http_port(), "GET", "/health", "", {{"Authorization", "a\tb"}}).status,
            200);
  r = d.Post("/v1/completions", body, {{"X-Request-Id", "plain-id-1"}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Body(r)["id"], "plain-id-1");
}

TEST(OpenAiHttpTest, CompletionCountsAreBoundedBeforeTheReplyIsSized) {
  Daemon d(Options(2));
  // Sized from n before the service saw it, this reply would have been hundreds of GB.
  HttpReply r = d.Post("/v1/completions", R"({"prompt": "x", "n": 2147483647})");
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(Body(r)["error"]["param"], "n") << r.body;
  EXPECT_EQ(d.Post("/v1/completions", R"({"prompt": "x", "n": -1})").status, 400);
  // 64 prompts of n = 5: 320 completions, over the 256 of one request.
  std::vector<std::string> prompts(64, "p");
  r = d.Post("/v1/completions",
             absl::StrCat(R"({"prompt": )", Json(prompts).dump(), R"(, "n": 5, "max_tokens": 1})"));
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(Body(r)["error"]["param"], "n");
  EXPECT_TRUE(absl::StrContains(Body(r)["error"]["message"].get<std::string>(), "320"));
  r = d.Post("/v1/completions",
             absl::StrCat(R"({"prompt": )", Json(std::vector<std::string>(8, "p")).dump(),
                          R"(, "n": 2, "max_tokens": 1})"));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Body(r)["choices"].size(), 16u);
}

TEST(OpenAiHttpTest, AListOfPromptsWhoseCallsAreTooLargeTogetherIs413) {
  Daemon d(Options(2), {}, 8 << 20, nullptr, nullptr,
           [](OpenAiHttpOptions& o) { o.max_fanout_bytes = 64 << 10; });
  // A 15 KB guided_choice list, repeated by each of 8 prompts' calls: over 64 KB together.
  std::vector<std::string> choices;
  for (int i = 0; i < 800; ++i) choices.push_back(absl::StrCat("choice-number-", i));
  const std::string shared = absl::StrCat(R"("guided_choice": )", Json(choices).dump());
  HttpReply r = d.Post("/v1/completions",
                       absl::StrCat(R"({"prompt": )", Json(std::vector<std::string>(8, "p")).dump(),
                                    ", ", shared, R"(, "max_tokens": 2})"));
  EXPECT_EQ(r.status, 413) << r.body;
  EXPECT_TRUE(absl::StrContains(r.body, "8 prompts")) << r.body;
  // One prompt with the same parameters is one call: served.
  r = d.Post("/v1/completions", absl::StrCat(R"({"prompt": "p", )", shared, R"(, "max_tokens": 2})"));
  EXPECT_EQ(r.status, 200) << r.body;
}

// (With the Messages API, Anthropic's ping events.)
TEST(OpenAiHttpTest, AStreamWithNothingToSendGetsKeepAliveComments) {
  {
    SlowSteps slow(absl::Milliseconds(60));  // every token 60 ms after the last: 60 ms silences
    EngineOptions options = Options(2);
    options.observer = &slow;
    Daemon d(options, {}, 8 << 20, nullptr, nullptr,
             [](OpenAiHttpOptions& o) { o.sse_keepalive = absl::Milliseconds(20); });
    HttpReply r = d.Post("/v1/completions", R"({"prompt": "Go on", "max_tokens": 6,
                                                "ignore_eos": true, "stream": true})");
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_TRUE(absl::StrContains(r.body, ": keep-alive\n\n")) << r.body;
    // The comments are between events, and the stream is whole.
    const std::vector<Json> events = Events(r);
    ASSERT_FALSE(events.empty());
    EXPECT_FALSE(events.back()["choices"][0]["finish_reason"].is_null()) << r.body;

    // The Messages API's stream gets Anthropic's ping events once message_start is out (a
    // comment before it), each an event like the others.
    HttpReply m = d.Post("/v1/messages", R"({"messages": [{"role": "user", "content": "Go on"}],
                                            "max_tokens": 6, "ignore_eos": true,
                                            "stream": true})");
    ASSERT_EQ(m.status, 200) << m.body;
    const size_t start = m.body.find("event: message_start\n");
    const size_t ping = m.body.find("event: ping\ndata: {\"type\":\"ping\"}\n\n");
    ASSERT_NE(start, std::string::npos) << m.body;
    ASSERT_NE(ping, std::string::npos) << m.body;
    EXPECT_LT(start, ping) << m.body;
    EXPECT_EQ(m.body.find(": keep-alive", start), std::string::npos) << "pings after the start";
    std::vector<std::string> types;
    for (const std::string& data : SseData(m.body)) {
      absl::StatusOr<Json> e = ParseJson(data, "event");
      ASSERT_TRUE(e.ok()) << data;
      types.push_back((*e)["type"].get<std::string>());
    }
    ASSERT_FALSE(types.empty());
    EXPECT_EQ(types.front(), "message_start");
    EXPECT_EQ(types.back(), "message_stop");
  }
  // Tokens arriving more often than that: none. (One server at a time: a second one started
  // while the first runs shares gRPC's callback threads with it, and ThreadSanitizer cannot see
  // the hand-off to them inside the uninstrumented libgrpc.)
  Daemon fast(Options(2), {}, 8 << 20, nullptr, nullptr,
              [](OpenAiHttpOptions& o) { o.sse_keepalive = absl::Seconds(30); });
  HttpReply r =
      fast.Post("/v1/completions", R"({"prompt": "Go on", "max_tokens": 6, "stream": true})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_FALSE(absl::StrContains(r.body, ": keep-alive")) << r.body;
}

TEST(OpenAiHttpTest, DrainingAnswersHealthWith503AndWaitsForReplies) {
  SlowSteps slow;
  EngineOptions options = Options(2);
  options.observer = &slow;
  Daemon d(options);
  std::atomic<bool> done{false};
  HttpReply streamed;
  std::thread client([&] {
    streamed = d.Post("/v1/completions", R"({"prompt": "Go on", "max_tokens": 100,
                                             "ignore_eos": true, "stream": true})");
    done = true;
  });
  // Once it is streaming, drain: health is 503 at once, WaitIdle returns when the reply is whole.
  ASSERT_TRUE(WaitUntilDecoding(d));
  d.http().BeginDrain();
  EXPECT_EQ(HttpCall(d.http_port(), "GET", "/health").status, 503);
  EXPECT_EQ(HttpCall(d.http_port(), "GET", "/ping").status, 503);
  EXPECT_FALSE(d.http().WaitIdle(absl::Milliseconds(1))) << "the stream is in flight";
  EXPECT_TRUE(d.http().WaitIdle(absl::Seconds(60)));
  client.join();
  EXPECT_TRUE(done);
  ASSERT_EQ(streamed.status, 200);
  EXPECT_EQ(SseData(streamed.body).back(), "[DONE]");
  EXPECT_TRUE(d.http().WaitIdle(absl::Milliseconds(1)));
}

// POST /v1/embeddings: what Embed gives for the same inputs, as floats or as OpenAI's base64
// float32; dimensions cut; usage; refusals naming OpenAI's parameter.
TEST(OpenAiHttpTest, EmbeddingsAreWhatEmbedGives) {
  Daemon d(Options(2));
  v1::EmbedRequest req;
  req.add_inputs()->set_text("The capital of France");
  v1::TokenIds* ids = req.add_inputs()->mutable_token_ids();
  for (int32_t t : {5, 17, 3, 99, 42}) ids->add_ids(t);
  grpc::ClientContext ctx;
  v1::EmbedResponse want;
  ASSERT_TRUE(d.grpc().stub().Embed(&ctx, req, &want).ok());
  ASSERT_EQ(want.embeddings_size(), 2);

  HttpReply r =
      d.Post("/v1/embeddings",
             R"({"model": "tiny", "input": ["The capital of France", [5, 17, 3, 99, 42]]})");
  ASSERT_EQ(r.status, 200) << r.body;
  Json body = Body(r);
  EXPECT_EQ(body["object"], "list");
  EXPECT_EQ(body["model"], "tiny");
  ASSERT_EQ(body["data"].size(), 2u);
  for (int i = 0; i < 2; ++i) {
    const Json& e = body["data"][i];
    EXPECT_EQ(e["object"], "embedding");
    EXPECT_EQ(e["index"], i);
    ASSERT_EQ(e["embedding"].size(), static_cast<size_t>(want.embeddings(i).values_size()));
    double norm = 0;
    for (int j = 0; j < want.embeddings(i).values_size(); ++j) {
      // (JSON numbers of 17 digits: the float itself comes back.)
      EXPECT_EQ(e["embedding"][j].get<float>(), want.embeddings(i).values(j)) << i << " " << j;
      norm += e["embedding"][j].get<double>() * e["embedding"][j].get<double>();
    }
    EXPECT_NEAR(norm, 1.0, 1e-5);
  }
  EXPECT_EQ(body["usage"]["prompt_tokens"], want.prompt_tokens());
  EXPECT_EQ(body["usage"]["total_tokens"], want.prompt_tokens());

  // base64: little-endian float32 bytes, what the OpenAI SDKs ask for and decode.
  r = d.Post("/v1/embeddings",
             R"({"input": [5, 17, 3, 99, 42], "encoding_format": "base64", "dimensions": 4})");
  ASSERT_EQ(r.status, 200) << r.body;
  body = Body(r);
  ASSERT_EQ(body["data"].size(), 1u);
  std::string bytes;
  ASSERT_TRUE(absl::Base64Unescape(body["data"][0]["embedding"].get<std::string>(), &bytes));
  ASSERT_EQ(bytes.size(), 16u);
  double norm = 0, dot = 0, first4 = 0;
  for (int j = 0; j < 4; ++j) {
    uint32_t u = 0;
    for (int b = 0; b < 4; ++b)
      u |= static_cast<uint32_t>(static_cast<uint8_t>(bytes[4 * j + b])) << (8 * b);
    float v;
    std::memcpy(&v, &u, 4);
    norm += double{v} * v;
    dot += double{v} * want.embeddings(1).values(j);
    first4 += double{want.embeddings(1).values(j)} * want.embeddings(1).values(j);
  }
  EXPECT_NEAR(norm, 1.0, 1e-5);
  // The cut vector points where the full one's first four components do.
  EXPECT_NEAR(dot / std::sqrt(first4), 1.0, 1e-5);

  struct Bad {
    const char* body;
    int status;
    const char* param;
  };
  for (const Bad& b : {Bad{R"({"input": []})", 400, "input"}, Bad{R"({})", 400, "input"},
                       Bad{R"({"input": [[1, 2], [1, 100000000]]})", 400, "input[1]"},
                       Bad{R"({"input": [1, 100000000]})", 400, "input"},
                       Bad{R"({"input": [true]})", 400, "input[0]"},
                       Bad{R"({"input": "x", "dimensions": 100000})", 400, "dimensions"},
                       Bad{R"({"input": "x", "encoding_format": "int8"})", 400, "encoding_format"},
                       Bad{R"({"input": "x", "model": "gpt-4"})", 404, "model"}}) {
    r = d.Post("/v1/embeddings", b.body);
    EXPECT_EQ(r.status, b.status) << b.body << " " << r.body;
    EXPECT_EQ(Body(r)["error"]["param"], b.param) << b.body << " " << r.body;
  }
  EXPECT_EQ(HttpCall(d.http_port(), "GET", "/v1/embeddings").status, 405);
  EXPECT_TRUE(d.WaitIdle());
}

TEST(OpenAiHttpTest, TokenizeAndDetokenizeAreTheModelsTokenizer) {
  Daemon d(Options(2));
  const std::string text = "The capital of France is";
  HttpReply r = d.Post("/tokenize", absl::StrCat(R"({"model": "tiny", "prompt": ")", text,
                                                 R"(", "return_token_strs": true})"));
  ASSERT_EQ(r.status, 200) << r.body;
  Json j = Body(r);
  // What gRPC's Tokenize gives (with BOS, add_special_tokens' default).
  grpc::ClientContext context;
  v1::TokenizeRequest want_request;
  want_request.set_text(text);
  want_request.set_add_bos(true);
  want_request.set_return_pieces(true);
  v1::TokenizeResponse want;
  ASSERT_TRUE(d.grpc().stub().Tokenize(&context, want_request, &want).ok());
  const std::vector<int32_t> ids(want.token_ids().begin(), want.token_ids().end());
  ASSERT_GT(ids.size(), 2u);
  EXPECT_EQ(j["tokens"].get<std::vector<int32_t>>(), ids);
  EXPECT_EQ(j["count"], ids.size());
  EXPECT_EQ(j["max_model_len"], d.grpc().engine().options().max_context);
  EXPECT_EQ(j["token_strs"].size(), ids.size());
  // Without BOS: one token fewer.
  r = d.Post("/tokenize", absl::StrCat(R"({"prompt": ")", text, R"(", "add_special_tokens": false})"));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Body(r)["count"], ids.size() - 1);
  EXPECT_TRUE(Body(r)["token_strs"].is_null());

  // Detokenize is the inverse; special tokens are written, as vLLM's (HF decode's default).
  r = d.Post("/detokenize", absl::StrCat(R"({"tokens": )", j["tokens"].dump(), "}"));
  ASSERT_EQ(r.status, 200) << r.body;
  const std::string with_bos = Body(r)["prompt"].get<std::string>();
  EXPECT_TRUE(absl::EndsWith(with_bos, text)) << with_bos;
  EXPECT_GT(with_bos.size(), text.size()) << "no BOS spelt";
  r = d.Post("/detokenize", absl::StrCat(R"({"tokens": )", j["tokens"].dump(),
                                         R"(, "skip_special_tokens": true})"));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Body(r)["prompt"], text) << "BOS spelt though skipped";
  r = d.Post("/detokenize", R"({"tokens": [1], "skip_special_tokens": "yes"})");
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(Body(r)["error"]["param"], "skip_special_tokens") << r.body;
  std::vector<int32_t> no_bos(ids.begin() + 1, ids.end());
  r = d.Post("/detokenize", absl::StrCat(R"({"tokens": )", Json(no_bos).dump(), "}"));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Body(r)["prompt"], text);

  // A chat's count is the prompt_tokens its completion reports.
  const std::string messages = R"("messages": [{"role": "system", "content": "Be brief."},
                                               {"role": "user", "content": "Hello there"}])";
  r = d.Post("/tokenize", absl::StrCat("{", messages, "}"));
  ASSERT_EQ(r.status, 200) << r.body;
  const int64_t chat_count = Body(r)["count"].get<int64_t>();
  r = d.Post("/v1/chat/completions", absl::StrCat("{", messages, R"(, "max_tokens": 2})"));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Body(r)["usage"]["prompt_tokens"], chat_count);

  // Refusals name the parameter.
  r = d.Post("/detokenize", R"({"tokens": [1, 2000000]})");
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(Body(r)["error"]["param"], "tokens[1]") << r.body;
  r = d.Post("/tokenize", R"({"prompt": 5})");
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(Body(r)["error"]["param"], "prompt");
  EXPECT_EQ(d.Post("/tokenize", R"({"model": "gpt-4", "prompt": "x"})").status, 404);
  EXPECT_EQ(HttpCall(d.http_port(), "GET", "/tokenize").status, 405);
}

TEST(OpenAiHttpTest, PingVersionAndMetricsBesideTheApi) {
  MetricRegistry registry;
  KvrmMetrics metrics(&registry, {"tiny", "kvrm"});
  Daemon d(Options(2), {}, 8 << 20, &metrics.http_api(), &registry);
  EXPECT_EQ(HttpCall(d.http_port(), "GET", "/ping").status, 200);
  EXPECT_EQ(HttpCall(d.http_port(), "POST", "/ping").status, 200);
  HttpReply v = HttpCall(d.http_port(), "GET", "/version");
  ASSERT_EQ(v.status, 200);
  EXPECT_EQ(Body(v)["version"], "test-version");
  HttpReply m = HttpCall(d.http_port(), "GET", "/metrics");
  ASSERT_EQ(m.status, 200);
  EXPECT_TRUE(absl::StartsWith(m.headers["content-type"], "text/plain; version=0.0.4"));
  EXPECT_TRUE(absl::StrContains(m.body, "# TYPE kvrm:http_requests_total counter")) << m.body;
  EXPECT_TRUE(absl::StrContains(m.body, R"(handler="health",code="200"} 2)")) << m.body;
  EXPECT_TRUE(absl::StrContains(m.body, R"(handler="version",code="200"} 1)")) << m.body;
  EXPECT_EQ(HttpCall(d.http_port(), "POST", "/version").status, 405);
  EXPECT_EQ(HttpCall(d.http_port(), "DELETE", "/v1/completions").status, 405);
  EXPECT_EQ(HttpCall(d.http_port(), "POST", "/health").status, 405);
  EXPECT_TRUE(WaitForSeries(registry, HttpRequests("version", 405), "1"));
  EXPECT_TRUE(WaitForSeries(registry, HttpRequests("completions", 405), "1"));
}

TEST(OpenAiHttpTest, MetricsIsNoRouteWhereTheServerDoesNotServeIt) {
  MetricRegistry registry;
  KvrmMetrics metrics(&registry, {"tiny", "kvrm"});
  Daemon d(Options(2), {}, 8 << 20, &metrics.http_api());  // no registry: no /metrics
  EXPECT_EQ(HttpCall(d.http_port(), "GET", "/metrics").status, 404);
  EXPECT_TRUE(WaitForSeries(registry, HttpRequests("other", 404), "1"));
  EXPECT_EQ(SeriesValue(registry, HttpRequests("metrics", 404)), "0");
}

TEST(OpenAiHttpTest, RefusalsHaveHttpStatusesAndNameTheParameter) {
  Daemon d(Options(2), {}, /*max_body=*/4096);
  struct Case {
    std::string path, body;
    int status;
    std::string param;
  };
  const std::vector<Case> cases = {
      {"/v1/completions", R"({"prompt": "x", "top_p": 1.5})", 400, "top_p"},
      {"/v1/completions", R"({"prompt": "x", "max_tokens": 100000})", 400, "max_tokens"},
      {"/v1/completions", R"({"prompt": "x", "temperature": "hot"})", 400, "temperature"},
      {"/v1/completions", R"({"prompt": ["a", 3]})", 400, "prompt[1]"},
      {"/v1/completions", R"({"prompt": "x")", 400, ""},
      {"/v1/chat/completions", R"({"messages": [{"content": "x"}]})", 400, "messages[0].role"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}],
          "max_completion_tokens": 0})", 400, "max_completion_tokens"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": "x"}],
          "response_format": {"type": "json_schema",
                              "json_schema": {"schema": {"type": "object", "not": {}}}}})",
       400, "response_format.json_schema.schema"},
      {"/v1/chat/completions", R"({"model": "gpt-4", "messages": []})", 404, "model"},
      {"/v1/chat/completions", absl::StrCat(R"({"messages": [{"role": "user", "content": ")",
                                            std::string(5000, 'a'), R"("}]})"),
       413, ""},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.body.substr(0, 120));
    HttpReply r = d.Post(c.path, c.body);
    EXPECT_EQ(r.status, c.status) << r.body;
    Json j = Body(r);
    ASSERT_TRUE(j.contains("error")) << r.body;
    EXPECT_EQ(j["error"]["code"], c.status);
    EXPECT_FALSE(j["error"]["message"].get<std::string>().empty());
    if (!c.param.empty()) {
      EXPECT_EQ(j["error"]["param"], c.param);
    }
    if (!c.param.empty() && c.status == 400) {
      EXPECT_TRUE(absl::StartsWith(j["error"]["message"].get<std::string>(), c.param))
          << j["error"]["message"];
    }
  }
  EXPECT_EQ(HttpCall(d.http_port(), "GET", "/v1/completions").status, 405);
  EXPECT_EQ(HttpCall(d.http_port(), "POST", "/v1/audio/transcriptions", "{}").status, 404);
  // Nothing refused left anything behind.
  EXPECT_TRUE(d.WaitIdle());
}

TEST(OpenAiHttpTest, BearerTokensGuardTheHttpApiToo) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string tokens = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/http_tokens");
  std::ofstream(tokens) << "sesame\n";
  ServerOptions so;
  so.auth_tokens_file = tokens;
  Daemon d(Options(2), so);
  const std::string body = R"({"prompt": "x", "max_tokens": 2})";
  HttpReply r = d.Post("/v1/completions", body);
  EXPECT_EQ(r.status, 401) << r.body;
  EXPECT_EQ(Body(r)["error"]["type"], "authentication_error");
  EXPECT_EQ(d.Post("/v1/completions", body, {{"Authorization", "Bearer wrong"}}).status, 401);
  EXPECT_EQ(d.Post("/v1/completions", body, {{"Authorization", "Bearer sesame"}}).status, 200);
  // Anthropic's clients send the key as x-api-key: on every route, as a bearer token.
  const std::string message =
      R"({"max_tokens": 2, "messages": [{"role": "user", "content": "x"}]})";
  HttpReply anon = d.Post("/v1/messages", message);
  EXPECT_EQ(anon.status, 401) << anon.body;
  EXPECT_EQ(Body(anon)["error"]["type"], "authentication_error") << anon.body;
  EXPECT_EQ(d.Post("/v1/messages", message, {{"x-api-key", "wrong"}}).status, 401);
  EXPECT_EQ(d.Post("/v1/messages", message, {{"x-api-key", "sesame"}}).status, 200);
  EXPECT_EQ(d.Post("/v1/completions", body, {{"x-api-key", "sesame"}}).status, 200);
  EXPECT_EQ(d.Post("/v1/messages/count_tokens", message, {{"x-api-key", "sesame"}}).status, 200);
  EXPECT_EQ(d.Post("/v1/messages/count_tokens", message).status, 401);
  EXPECT_EQ(HttpCall(d.http_port(), "GET", "/v1/models").status, 401);
  EXPECT_EQ(
      HttpCall(d.http_port(), "GET", "/v1/models", "", {{"Authorization", "Bearer sesame"}}).status,
      200);
}

TEST(OpenAiHttpTest, AFullQueueIs429WithRetryAfter) {
  Daemon d(Options(/*slots=*/1, /*max_queue=*/1));
  constexpr int kClients = 6;
  std::vector<HttpReply> replies(kClients);
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&d, &replies, i] {
      replies[i] = d.Post("/v1/completions",
                          R"({"prompt": "x", "max_tokens": 200, "ignore_eos": true})");
    });
  }
  for (std::thread& t : clients) t.join();
  int ok = 0;
  int refused = 0;
  for (const HttpReply& r : replies) {
    if (r.status == 200) {
      ++ok;
      EXPECT_EQ(Body(r)["usage"]["completion_tokens"], 200);
    } else {
      ASSERT_EQ(r.status, 429) << r.body;
      ++refused;
      EXPECT_EQ(Body(r)["error"]["type"], "rate_limit_error");
      EXPECT_FALSE(r.headers.at("retry-after").empty());
    }
  }
  EXPECT_GE(ok, 1);
  EXPECT_GE(refused, 1) << "one slot and a queue of one took " << kClients << " at once";
  EXPECT_TRUE(d.WaitIdle());
}

TEST(OpenAiHttpTest, AClientThatHangsUpMidStreamFreesItsSlot) {
  Daemon d(Options(2));
  {
    HttpConnection c(d.http_port(), "POST", "/v1/chat/completions",
                     R"({"messages": [{"role": "user", "content": "Go on"}], "stream": true,
                         "max_tokens": 250, "ignore_eos": true})");
    ASSERT_TRUE(c.connected());
    std::string got;
    while (!absl::StrContains(got, "\"content\":\"") && got.size() < (1 << 20)) {
      const std::string more = c.Read(30000);
      ASSERT_FALSE(more.empty()) << "no token came: " << got;
      got += more;
    }
    EXPECT_TRUE(absl::StartsWith(got, "HTTP/1.1 200")) << got.substr(0, 80);
  }  // hangs up after the first tokens
  EXPECT_TRUE(d.WaitIdle()) << "the call was not cancelled";
  grpc::ClientContext context;
  v1::ServerInfo info;
  ASSERT_TRUE(d.grpc().stub().GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok());
  // Every block is free again (the prefix cache's idle blocks count as free).
  EXPECT_EQ(info.kv().blocks_reserved(), 0) << info.DebugString();
  EXPECT_EQ(info.kv().blocks_free(), info.kv().blocks_total()) << info.DebugString();
  EXPECT_LT(info.tokens_generated_total(), 250u) << "it ran to the end";
  // The server goes on serving.
  HttpReply r = d.Post("/v1/completions", R"({"prompt": "x", "max_tokens": 3})");
  EXPECT_EQ(r.status, 200) << r.body;
}

TEST(OpenAiHttpTest, StoppingWithAStreamInFlightEndsIt) {
  auto d = std::make_unique<Daemon>(Options(2));
  std::atomic<bool> done{false};
  HttpReply reply;
  const int port = d->http_port();  // the client never touches `d`, which goes away under it
  std::thread client([&] {
    reply = HttpCall(port, "POST", "/v1/completions",
                     R"({"prompt": "x", "max_tokens": 256, "stream": true, "ignore_eos": true})");
    done = true;
  });
  absl::SleepFor(absl::Milliseconds(100));
  d.reset();  // the HTTP server cancels its calls and joins its threads, then the engine stops
  client.join();
  EXPECT_TRUE(done);
}

}  // namespace
}  // namespace kvrm
