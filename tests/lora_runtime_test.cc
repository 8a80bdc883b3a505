// LoRA adapters loaded and unloaded while serving (Engine::LoadLoraAdapter / UnloadLoraAdapter,
// the LoadLoraAdapter / UnloadLoraAdapter RPCs, POST /v1/load_lora_adapter and
// /v1/unload_lora_adapter): an adapter loaded at run time gives the tokens it gives when served
// from the start; slots run out and come back; an unloaded adapter's running requests finish
// with it; an adapter loaded again under a name shares no KV with its former self; loads and
// unloads racing requests crash nothing, leak no block and hand no request another's adapter;
// adapters loaded on demand from --lora_dir take the least recently used idle slot.
#include <atomic>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/json.h"
#include "common/logging.h"
#include "gtest/gtest.h"
#include "model/lora.h"
#include "runtime/engine.h"
#include "runtime/model_bundle.h"
#include "server/kvrm_service.h"
#include "server/openai_http.h"
#include "tests/http_client.h"
#include "tests/test_server.h"
#include "tools/modelgen/lora_writer.h"

namespace kvrm {
namespace {

std::string TmpDir() {
  const char* tmp = std::getenv("TEST_TMPDIR");
  return tmp != nullptr ? tmp : "/tmp";
}

// Adapter directories for the tiny model: "a", "b", "c" (rank 8, every projection, seeds 1-3)
// and "wide" (rank 32, over the engine's default max_lora_rank of 16).
const std::map<std::string, std::string>& AdapterDirs() {
  static const auto* dirs = [] {
    auto* d = new std::map<std::string, std::string>;
    std::unique_ptr<ModelBundle> model(LoadTinyModel());
    int seed = 1;
    for (const std::string name : {"a", "b", "c", "wide"}) {
      modelgen::MakeLoraOptions o;
      o.out_dir = absl::StrCat(TmpDir(), "/runtime_lora_", name);
      o.seed = seed++;
      if (name == "wide") o.rank = 32;
      CHECK_OK(modelgen::MakeLoraAdapter(model->config, o));
      (*d)[name] = o.out_dir;
    }
    return d;
  }();
  return *dirs;
}

LoraAdapter Load(const ModelBundle& model, const std::string& name, const std::string& dir) {
  absl::StatusOr<LoraAdapter> a = LoadLoraAdapter(model.config, name, dir);
  CHECK_OK(a.status());
  return *std::move(a);
}

EngineOptions Options(int32_t max_loras) {
  EngineOptions o;
  o.slots = 4;
  o.max_context = 256;
  o.prefill_chunk = 32;
  o.threads = 2;
  o.max_loras = max_loras;
  return o;
}

ServerOptions Updating() {
  ServerOptions s;
  s.runtime_lora_updating = true;
  return s;
}

const char kPrompt[] = "the quick brown fox jumps over the lazy dog and keeps on running far";

v1::GenerateRequest Greedy(const std::string& adapter, int tokens,
                           const std::string& prompt = kPrompt) {
  v1::GenerateRequest r = TextRequest(prompt, tokens);
  r.mutable_sampling()->set_temperature(0);
  r.mutable_stopping()->set_ignore_eos(true);
  r.set_lora_adapter(adapter);
  return r;
}

// What each adapter gives when served from the start (kvrmd --lora_modules), and the base model.
const std::map<std::string, std::vector<int32_t>>& Want() {
  static const auto* want = [] {
    std::unique_ptr<ModelBundle> model(LoadTinyModel());
    for (const std::string name : {"a", "b", "c"}) {
      model->lora_adapters.push_back(Load(*model, name, AdapterDirs().at(name)));
    }
    TestServer server(std::move(model), Options(0));
    auto* w = new std::map<std::string, std::vector<int32_t>>;
    for (const std::string name : {"", "a", "b", "c"}) {
      StreamResult r = RunGenerate(server.stub(), Greedy(name, 16));
      CHECK(r.status.ok()) << r.status.error_message();
      (*w)[name] = r.tokens;
    }
    return w;
  }();
  return *want;
}

grpc::Status LoadRpc(TestServer& server, const std::string& name, const std::string& path,
                     v1::LoraAdapterInfo* info = nullptr) {
  grpc::ClientContext context;
  v1::LoadLoraAdapterRequest request;
  request.set_lora_name(name);
  request.set_lora_path(path);
  v1::LoraAdapterInfo reply;
  return server.stub().LoadLoraAdapter(&context, request, info != nullptr ? info : &reply);
}

grpc::Status UnloadRpc(TestServer& server, const std::string& name, int64_t* running = nullptr) {
  grpc::ClientContext context;
  v1::UnloadLoraAdapterRequest request;
  request.set_lora_name(name);
  v1::UnloadLoraAdapterResponse reply;
  grpc::Status st = server.stub().UnloadLoraAdapter(&context, request, &reply);
  if (running != nullptr) *running = reply.running_requests();
  return st;
}

v1::ModelInfo Info(TestServer& server) {
  grpc::ClientContext context;
  v1::ModelInfo info;
  CHECK(server.stub().GetModelInfo(&context, v1::GetModelInfoRequest(), &info).ok());
  return info;
}

// Until the first adapter served has a request submitted and not finished (at most 4 s).
void WaitForARequestWithTheFirstAdapter(TestServer& server) {
  for (int i = 0; i < 4000; ++i) {
    std::vector<ServedLoraAdapter> served = server.engine().LoraAdapters();
    if (!served.empty() && served[0].requests == 1) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

TEST(LoraRuntimeTest, LoadServeAndUnloadThroughTheService) {
  const auto& dirs = AdapterDirs();
  TestServer server(Options(2), Updating());
  v1::ModelInfo info = Info(server);
  EXPECT_EQ(info.lora_adapters_size(), 0);
  EXPECT_EQ(info.max_loras(), 2);
  EXPECT_EQ(info.max_lora_rank(), 16);
  EXPECT_TRUE(info.runtime_lora_updating());
  StreamResult before = RunGenerate(server.stub(), Greedy("a", 4));
  EXPECT_EQ(before.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);

  v1::LoraAdapterInfo loaded;
  grpc::Status st = LoadRpc(server, "a", dirs.at("a"), &loaded);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(loaded.name(), "a");
  EXPECT_EQ(loaded.path(), dirs.at("a"));
  EXPECT_EQ(loaded.rank(), 8);
  EXPECT_EQ(loaded.target_modules_size(), 7);
  StreamResult r = RunGenerate(server.stub(), Greedy("a", 16));
  ASSERT_TRUE(r.status.ok()) << r.status.error_message();
  EXPECT_EQ(r.tokens, Want().at("a"));
  EXPECT_NE(r.tokens, Want().at(""));

  // Refusals: the same name, a rank over --max_lora_rank, a directory that is not an adapter,
  // the served model's name, a malformed name; then the slots run out.
  st = LoadRpc(server, "a", dirs.at("b"));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::ALREADY_EXISTS) << st.error_message();
  st = LoadRpc(server, "wide", dirs.at("wide"));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  EXPECT_NE(st.error_message().find("--max_lora_rank"), std::string::npos) << st.error_message();
  st = LoadRpc(server, "nowhere", TmpDir() + "/no_such_adapter");
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND) << st.error_message();
  st = LoadRpc(server, "bad name", dirs.at("b"));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  EXPECT_NE(st.error_message().find("lora_name"), std::string::npos) << st.error_message();
  ASSERT_TRUE(LoadRpc(server, "b", dirs.at("b")).ok());
  st = LoadRpc(server, "c", dirs.at("c"));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  EXPECT_NE(st.error_message().find("--max_loras"), std::string::npos) << st.error_message();
  info = Info(server);
  ASSERT_EQ(info.lora_adapters_size(), 2);
  EXPECT_EQ(info.lora_adapters(0).name(), "a");
  EXPECT_EQ(info.lora_adapters(1).name(), "b");

  // Unloaded: refused by name, its slot taken by the next load.
  int64_t running = -1;
  ASSERT_TRUE(UnloadRpc(server, "a", &running).ok());
  EXPECT_EQ(running, 0);
  EXPECT_EQ(UnloadRpc(server, "a").error_code(), grpc::StatusCode::NOT_FOUND);
  r = RunGenerate(server.stub(), Greedy("a", 4));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(r.status.error_message().find("`b`"), std::string::npos) << r.status.error_message();
  st = LoadRpc(server, "c", dirs.at("c"));
  ASSERT_TRUE(st.ok()) << st.error_message();
  for (const std::string name : {"b", "c"}) {
    r = RunGenerate(server.stub(), Greedy(name, 16));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.tokens, Want().at(name)) << name;
  }
  EXPECT_EQ(RunGenerate(server.stub(), Greedy("", 16)).tokens, Want().at(""));
}

TEST(LoraRuntimeTest, OffUnlessAllowed) {
  TestServer server(Options(2));
  grpc::Status st = LoadRpc(server, "a", AdapterDirs().at("a"));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("--allow_runtime_lora_updating"), std::string::npos)
      << st.error_message();
  EXPECT_EQ(UnloadRpc(server, "a").error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_FALSE(Info(server).runtime_lora_updating());
  // Allowed, but no slots: the engine says so.
  TestServer none(Options(0), Updating());
  st = LoadRpc(none, "a", AdapterDirs().at("a"));
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << st.error_message();
  EXPECT_NE(st.error_message().find("--max_loras"), std::string::npos) << st.error_message();
}

// An adapter unloaded while a request runs with it: the request finishes with it (the tokens it
// gives alone), new requests naming it are refused at once, and its slot is free after.
TEST(LoraRuntimeTest, UnloadWhileRunningLetsTheRequestFinish) {
  const auto& dirs = AdapterDirs();
  TestServer server(Options(1), Updating());
  ASSERT_TRUE(LoadRpc(server, "a", dirs.at("a")).ok());
  // The tokens of a long request with "a", from a server that keeps it.
  std::vector<int32_t> want;
  {
    TestServer keep(Options(1), Updating());
    ASSERT_TRUE(LoadRpc(keep, "a", dirs.at("a")).ok());
    StreamResult r = RunGenerate(keep.stub(), Greedy("a", 120));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    want = r.tokens;
  }
  StreamResult long_run;
  std::thread t([&] { long_run = RunGenerate(server.stub(), Greedy("a", 120)); });
  // Once the engine holds the request (submitted, not finished), unload.
  WaitForARequestWithTheFirstAdapter(server);
  int64_t running = -1;
  ASSERT_TRUE(UnloadRpc(server, "a", &running).ok());
  StreamResult refused = RunGenerate(server.stub(), Greedy("a", 4));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  t.join();
  ASSERT_TRUE(long_run.status.ok()) << long_run.status.error_message();
  if (running == 1) {
    EXPECT_EQ(long_run.tokens, want);
  }
  EXPECT_EQ(running, 1) << "the request ended before the unload (a slow machine?)";
  // The one slot was the request's until it ended: free now.
  grpc::Status st = LoadRpc(server, "b", dirs.at("b"));
  ASSERT_TRUE(st.ok()) << st.error_message();
  StreamResult b = RunGenerate(server.stub(), Greedy("b", 16));
  EXPECT_EQ(b.tokens, Want().at("b"));
}

// An adapter loaded again under the same name (other weights) shares no KV with its former
// self: the prompt is prefilled again and its tokens are the new adapter's.
TEST(LoraRuntimeTest, ReloadUnderTheSameNameSharesNoCachedKv) {
  const auto& dirs = AdapterDirs();
  TestServer server(Options(1), Updating());
  ASSERT_TRUE(LoadRpc(server, "x", dirs.at("a")).ok());
  StreamResult first = RunGenerate(server.stub(), Greedy("x", 16));
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  EXPECT_EQ(first.tokens, Want().at("a"));
  StreamResult again = RunGenerate(server.stub(), Greedy("x", 16));
  EXPECT_GE(again.finished.usage().cached_prompt_tokens(), 16);  // the same load: cached
  ASSERT_TRUE(UnloadRpc(server, "x").ok());
  ASSERT_TRUE(LoadRpc(server, "x", dirs.at("b")).ok());
  StreamResult reloaded = RunGenerate(server.stub(), Greedy("x", 16));
  ASSERT_TRUE(reloaded.status.ok()) << reloaded.status.error_message();
  EXPECT_EQ(reloaded.finished.usage().cached_prompt_tokens(), 0);
  EXPECT_EQ(reloaded.tokens, Want().at("b"));
}

// Loads and unloads racing requests: every request either is refused by name (its adapter was
// not served when it came) or gives exactly its adapter's tokens; nothing crashes, and at the
// end no slot, block or request is held.
TEST(LoraRuntimeTest, LoadsAndUnloadsRacingRequests) {
  const auto& dirs = AdapterDirs();
  TestServer server(Options(2), Updating());
  const std::vector<std::string> names = {"a", "b", "c"};
  std::atomic<bool> done{false};
  std::atomic<int> loads{0}, served{0}, refused{0};
  std::thread updater([&] {
    std::mt19937 rng(5);
    for (int op = 0; op < 60; ++op) {
      const std::string& name = names[rng() % names.size()];
      if (rng() % 3 != 0) {
        grpc::Status st = LoadRpc(server, name, dirs.at(name));
        loads += st.ok();
        EXPECT_TRUE(st.ok() || st.error_code() == grpc::StatusCode::ALREADY_EXISTS ||
                    st.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED)
            << st.error_message();
      } else {
        grpc::Status st = UnloadRpc(server, name);
        EXPECT_TRUE(st.ok() || st.error_code() == grpc::StatusCode::NOT_FOUND)
            << st.error_message();
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 10));
    }
  });
  std::vector<std::thread> clients;
  for (int c = 0; c < 3; ++c) {
    clients.emplace_back([&, c] {
      std::mt19937 rng(100 + c);
      // Until the updater is done (refusals come back at once: a bound keeps it finite).
      for (int i = 0; i < 2000 && !done.load(); ++i) {
        const std::string name = names[rng() % names.size()];
        StreamResult r = RunGenerate(server.stub(), Greedy(name, 16));
        if (r.status.error_code() == grpc::StatusCode::INVALID_ARGUMENT) {
          ++refused;
          continue;
        }
        ASSERT_TRUE(r.status.ok()) << r.status.error_message();
        EXPECT_EQ(r.tokens, Want().at(name)) << name;
        ++served;
      }
    });
  }
  updater.join();
  done = true;
  for (std::thread& t : clients) t.join();
  std::printf("loads %d, requests served %d, refused %d\n", loads.load(), served.load(),
              refused.load());
  EXPECT_GT(loads.load(), 0);
  EXPECT_GT(served.load(), 0);
  for (const std::string& name : names) UnloadRpc(server, name);
  // Everything let go of: the slots are free again (two loads fit), no request is held.
  ASSERT_TRUE(LoadRpc(server, "a", dirs.at("a")).ok());
  ASSERT_TRUE(LoadRpc(server, "b", dirs.at("b")).ok());
  for (const ServedLoraAdapter& a : server.engine().LoraAdapters()) EXPECT_EQ(a.requests, 0);
  const EngineStats s = server.engine().Stats();
  EXPECT_EQ(s.slots_in_use, 0);
  EXPECT_EQ(s.kv.blocks_used, 0);
  EXPECT_EQ(s.kv.blocks_reserved, 0);
  EXPECT_EQ(s.kv.host_blocks_used, 0);
}

// --lora_dir: adapters "a", "b", "c" (the seeds of AdapterDirs') as directories of one root.
const std::string& OnDemandRoot() {
  static const auto* root = [] {
    auto* r = new std::string(TmpDir() + "/ondemand_lora");
    std::unique_ptr<ModelBundle> model(LoadTinyModel());
    int seed = 1;
    for (const std::string name : {"a", "b", "c"}) {
      modelgen::MakeLoraOptions o;
      o.out_dir = absl::StrCat(*r, "/", name);
      o.seed = seed++;
      CHECK_OK(modelgen::MakeLoraAdapter(model->config, o));
    }
    return r;
  }();
  return *root;
}

ServerOptions OnDemand() {
  ServerOptions s;
  s.lora_dir = OnDemandRoot();
  return s;
}

std::vector<std::string> Served(TestServer& server) {
  const v1::ModelInfo info = Info(server);
  std::vector<std::string> names;
  for (const v1::LoraAdapterInfo& a : info.lora_adapters()) names.push_back(a.name());
  return names;
}

// A request naming an adapter of --lora_dir loads it first; with both slots taken, the least
// recently used one gives its slot; every reply is the adapter's own.
TEST(LoraRuntimeTest, OnDemandAdaptersTakeTheLeastRecentlyUsedSlot) {
  TestServer server(Options(2), OnDemand());
  for (const std::string name : {"a", "b"}) {
    StreamResult r = RunGenerate(server.stub(), Greedy(name, 16));
    ASSERT_TRUE(r.status.ok()) << r.status.error_message();
    EXPECT_EQ(r.tokens, Want().at(name)) << name;
  }
  v1::ModelInfo info = Info(server);
  ASSERT_EQ(info.lora_adapters_size(), 2);
  EXPECT_TRUE(info.lora_adapters(0).on_demand());
  // "a" is used again, so "b" is the least recently used when "c" comes.
  ASSERT_TRUE(RunGenerate(server.stub(), Greedy("a", 4)).status.ok());
  StreamResult c = RunGenerate(server.stub(), Greedy("c", 16));
  ASSERT_TRUE(c.status.ok()) << c.status.error_message();
  EXPECT_EQ(c.tokens, Want().at("c"));
  EXPECT_EQ(Served(server), (std::vector<std::string>{"a", "c"}));
  StreamResult b = RunGenerate(server.stub(), Greedy("b", 16));  // evicts "a" now
  EXPECT_EQ(b.tokens, Want().at("b"));
  EXPECT_EQ(Served(server), (std::vector<std::string>{"b", "c"}));
  // Names that are no adapter of the directory, or would leave it: refused naming the field.
  for (const std::string bad : {"zzz", "../ondemand_lora/a", ".hidden"}) {
    StreamResult r = RunGenerate(server.stub(), Greedy(bad, 4));
    EXPECT_EQ(r.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << bad;
    EXPECT_NE(r.status.error_message().find("lora_adapter"), std::string::npos)
        << r.status.error_message();
  }
  EXPECT_EQ(RunGenerate(server.stub(), Greedy("", 16)).tokens, Want().at(""));
}

// Embed (as Classify and Score) with --lora_dir: an adapter not served is loaded first, on the
// adapter thread, as for Generate; the vector is the adapter's (what the same call gives once it
// is served, and not the base model's), and a name the directory lacks is refused naming
// lora_adapter.
TEST(LoraRuntimeTest, EmbedLoadsItsAdapterOnDemand) {
  TestServer server(Options(2), OnDemand());
  auto embed = [&](const std::string& adapter, grpc::Status* status) {
    v1::EmbedRequest req;
    req.add_inputs()->set_text("The quick brown fox jumps over the lazy dog");
    req.add_inputs()->set_text("Hello");
    req.set_lora_adapter(adapter);
    grpc::ClientContext ctx;
    v1::EmbedResponse resp;
    *status = server.stub().Embed(&ctx, req, &resp);
    std::vector<std::vector<float>> out;
    for (const v1::Embedding& e : resp.embeddings())
      out.emplace_back(e.values().begin(), e.values().end());
    return out;
  };
  grpc::Status st;
  const std::vector<std::vector<float>> base = embed("", &st);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_TRUE(Served(server).empty());
  const std::vector<std::vector<float>> loaded = embed("b", &st);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(Served(server), (std::vector<std::string>{"b"}));
  const std::vector<std::vector<float>> again = embed("b", &st);
  ASSERT_TRUE(st.ok()) << st.error_message();
  ASSERT_EQ(loaded.size(), 2u);
  EXPECT_EQ(loaded, again);
  EXPECT_NE(loaded, base);
  embed("zzz", &st);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("lora_adapter"), std::string::npos) << st.error_message();
  ASSERT_TRUE(server.engine().WaitIdle(absl::Seconds(30)));
  EXPECT_EQ(server.engine().Stats().kv.blocks_used, 0);
}

// An on-demand adapter that a request runs with keeps its slot: with one slot, a request for
// another adapter meanwhile is RESOURCE_EXHAUSTED (retry later), and loads once the slot is idle.
// Adapters served from the start (or loaded by LoadLoraAdapter) are never evicted.
TEST(LoraRuntimeTest, OnDemandNeverEvictsARunningOrPinnedAdapter) {
  {
    TestServer server(Options(1), OnDemand());
    StreamResult long_run;
    std::thread t([&] { long_run = RunGenerate(server.stub(), Greedy("a", 200)); });
    WaitForARequestWithTheFirstAdapter(server);
    StreamResult b = RunGenerate(server.stub(), Greedy("b", 4));
    t.join();
    ASSERT_TRUE(long_run.status.ok()) << long_run.status.error_message();
    EXPECT_EQ(b.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
        << b.status.error_message();
    EXPECT_EQ(b.trailers.count("retry-after-ms"), 1u);
    b = RunGenerate(server.stub(), Greedy("b", 16));
    ASSERT_TRUE(b.status.ok()) << b.status.error_message();
    EXPECT_EQ(b.tokens, Want().at("b"));
  }
  std::unique_ptr<ModelBundle> model(LoadTinyModel());
  model->lora_adapters.push_back(Load(*model, "pinned", AdapterDirs().at("c")));
  TestServer pinned(std::move(model), Options(1), OnDemand());
  StreamResult r = RunGenerate(pinned.stub(), Greedy("a", 4));
  EXPECT_EQ(r.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << r.status.error_message();
  EXPECT_EQ(RunGenerate(pinned.stub(), Greedy("pinned", 16)).tokens, Want().at("c"));
}

// A beam search runs as one-token requests a step, so between two steps no request holds its
// adapter: the search pins it (Engine::PinLoraAdapter) until it ends. A pinned on-demand adapter
// is not evicted (with one slot, a request for another is RESOURCE_EXHAUSTED until the unpin),
// an unload waits for the unpin to empty the slot, and a beam search with an adapter decodes as
// greedy decoding with it does (width 1), through an unload and another adapter's requests
// knocking at the one slot meanwhile, and lets go of it at the end. After an unload, requests
// naming the adapter are refused, but those copied from the pinned one (the search's next
// steps) run, until the pin is let go of: then they are refused, whatever holds the slot.
TEST(LoraRuntimeTest, ABeamSearchHoldsItsAdapterBetweenSteps) {
  TestServer server(Options(1), OnDemand());
  ASSERT_TRUE(RunGenerate(server.stub(), Greedy("a", 4)).status.ok());
  Engine& engine = server.engine();
  GenerationRequest none;
  EXPECT_EQ(*engine.PinLoraAdapter(&none), -1) << "no adapter named: nothing held";
  GenerationRequest bad;
  bad.lora_name = "zzz";
  const absl::StatusOr<int32_t> refused = engine.PinLoraAdapter(&bad);
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
  EXPECT_NE(refused.status().message().find("lora_adapter"), std::string::npos);

  GenerationRequest pin;
  pin.lora_name = "a";
  const absl::StatusOr<int32_t> slot = engine.PinLoraAdapter(&pin);
  ASSERT_TRUE(slot.ok()) << slot.status();
  EXPECT_EQ(pin.lora_adapter, *slot);
  EXPECT_TRUE(pin.lora_name.empty()) << "copies name the slot, not a later load of the name";
  ASSERT_EQ(engine.LoraAdapters().size(), 1u);
  EXPECT_EQ(engine.LoraAdapters()[0].requests, 1);
  StreamResult b = RunGenerate(server.stub(), Greedy("b", 4));
  EXPECT_EQ(b.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << b.status.error_message();
  EXPECT_EQ(Served(server), (std::vector<std::string>{"a"}));
  engine.UnpinLoraAdapter(*slot);
  EXPECT_EQ(engine.LoraAdapters()[0].requests, 0);
  b = RunGenerate(server.stub(), Greedy("b", 16));
  ASSERT_TRUE(b.status.ok()) << b.status.error_message();
  EXPECT_EQ(b.tokens, Want().at("b"));
  EXPECT_EQ(Served(server), (std::vector<std::string>{"b"}));

  // An unload while pinned: refused by name from then on, its slot emptied at the unpin.
  pin = GenerationRequest();
  pin.lora_name = "b";
  ASSERT_TRUE(engine.PinLoraAdapter(&pin).ok());
  EXPECT_EQ(engine.UnloadLoraAdapter("b").value_or(-1), 1) << "the pin counts as running";
  EXPECT_FALSE(engine.ServesLoraAdapter("b"));
  {
    auto named = std::make_unique<GenerationRequest>();
    named->lora_name = "b";
    named->prompt = {17, 250};
    named->sink = std::make_shared<CollectingSink>();
    EXPECT_TRUE(absl::IsInvalidArgument(engine.Submit(std::move(named)).status()))
        << "refused by name";
  }
  {
    // A copy of the pinned request (a beam search's next step) still runs with it.
    auto step = std::make_unique<GenerationRequest>(pin);
    step->request_id = "step";
    for (int32_t t : {17, 250, 31, 402}) step->prompt.push_back(t);
    step->max_new_tokens = 3;
    step->ignore_eos = true;
    auto sink = std::make_shared<CollectingSink>();
    step->sink = sink;
    const absl::StatusOr<uint64_t> handle = engine.Submit(std::move(step));
    ASSERT_TRUE(handle.ok()) << handle.status();
    FinishInfo info;
    EXPECT_EQ(sink->Wait(&info).size(), 3u) << info.error;
    EXPECT_EQ(info.reason, FinishReason::kLength);
  }
  StreamResult c = RunGenerate(server.stub(), Greedy("c", 4));
  EXPECT_EQ(c.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
      << "the slot is kept while pinned: " << c.status.error_message();
  engine.UnpinLoraAdapter(pin.lora_adapter);
  c = RunGenerate(server.stub(), Greedy("c", 16));
  ASSERT_TRUE(c.status.ok()) << "the slot emptied once unpinned: " << c.status.error_message();
  EXPECT_EQ(c.tokens, Want().at("c"));
  {
    // A copy of the request pinned to "b", once "b" is gone and "c" holds the slot: refused,
    // not run with "c".
    auto stale = std::make_unique<GenerationRequest>(pin);
    stale->prompt = {17, 250};
    stale->sink = std::make_shared<CollectingSink>();
    const absl::Status st = engine.Submit(std::move(stale)).status();
    EXPECT_TRUE(absl::IsInvalidArgument(st)) << st;
    EXPECT_NE(st.message().find("no longer serves"), std::string::npos) << st;
  }

  // A beam search with adapter "b" (loaded on demand first), unloaded once the search began,
  // with requests for "c" knocking at
  // the one slot from its first step to its end.
  ASSERT_TRUE(RunGenerate(server.stub(), Greedy("b", 1)).status.ok());
  v1::GenerateRequest beam = Greedy("b", 16);
  beam.set_n(1);
  beam.mutable_beam_search();
  StreamResult searched;
  std::atomic<bool> done{false};
  std::thread t([&] {
    searched = RunGenerate(server.stub(), beam);
    done = true;
  });
  for (int i = 0; i < 4000 && !done && engine.LoraAdapters()[0].requests == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  // Its remaining steps run with "b" all the same (without the pin they would be refused by
  // name), and its slot is emptied after the search ends.
  EXPECT_EQ(engine.UnloadLoraAdapter("b").status(), absl::OkStatus());
  EXPECT_FALSE(done) << "the search ended before the unload: make it longer";
  int refused_c = 0, served_c = 0;
  while (!done) {
    c = RunGenerate(server.stub(), Greedy("c", 1));
    if (c.status.ok()) {
      ++served_c;  // (after the search ended)
    } else {
      EXPECT_EQ(c.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED)
          << c.status.error_message();
      ++refused_c;
    }
  }
  t.join();
  ASSERT_TRUE(searched.status.ok()) << searched.status.error_message();
  EXPECT_EQ(searched.finished.reason(), v1::FINISH_REASON_LENGTH) << searched.finished.error();
  EXPECT_EQ(searched.tokens, Want().at("b")) << "every step ran with adapter b";
  std::printf("requests for c while the search ran: %d refused, %d served\n", refused_c, served_c);
  ASSERT_TRUE(engine.WaitIdle(absl::Seconds(30)));
  for (const ServedLoraAdapter& a : engine.LoraAdapters()) {
    EXPECT_EQ(a.requests, 0) << a.adapter.name << " still held";
  }
}

// The HTTP API with --lora_dir: `model` naming an adapter of the directory goes through and
// loads it; a name that is none is 404.
TEST(LoraRuntimeTest, HttpModelLoadsOnDemand) {
  TestServer server(Options(2), OnDemand());
  OpenAiHttpOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.served_model_name = "tiny";
  o.lora_adapter_loadable = [](const std::string& name) {
    return !OnDemandLoraPath(OnDemandRoot(), name).empty();
  };
  o.max_context = server.engine().options().max_context;
  o.tokenizer = server.model().tokenizer.get();
  auto http = OpenAiHttpServer::Start(server.server().InProcessChannel(), o);
  ASSERT_TRUE(http.ok()) << http.status();
  const int port = (*http)->port();
  auto completion = [&](const std::string& model) {
    return HttpCall(port, "POST", "/v1/completions",
                    absl::StrCat(R"({"model": ")", model, R"(", "prompt": ")", kPrompt,
                                 R"(", "max_tokens": 16, "temperature": 0, "ignore_eos": true})"));
  };
  HttpReply r = completion("b");
  ASSERT_EQ(r.status, 200) << r.body;
  StreamResult want = RunGenerate(server.stub(), Greedy("b", 16));
  EXPECT_EQ(want.tokens, Want().at("b"));
  EXPECT_EQ(Json::parse(r.body)["choices"][0]["text"], want.text);
  EXPECT_EQ(completion("nope").status, 404);
}

// The HTTP API: vLLM's two endpoints, with `model` naming a loaded adapter and /v1/models
// listing it; errors as OpenAI errors naming the field.
TEST(LoraRuntimeTest, HttpLoadAndUnloadEndpoints) {
  const auto& dirs = AdapterDirs();
  TestServer server(Options(2), Updating());
  OpenAiHttpOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.served_model_name = "tiny";
  Engine* engine = &server.engine();
  o.lora_adapters = [engine] {
    std::vector<std::string> names;
    for (const ServedLoraAdapter& a : engine->LoraAdapters()) names.push_back(a.adapter.name);
    return names;
  };
  o.max_context = server.engine().options().max_context;
  o.tokenizer = server.model().tokenizer.get();
  auto http = OpenAiHttpServer::Start(server.server().InProcessChannel(), o);
  ASSERT_TRUE(http.ok()) << http.status();
  const int port = (*http)->port();
  const std::string completion =
      absl::StrCat(R"({"model": "sql", "prompt": ")", kPrompt,
                   R"(", "max_tokens": 16, "temperature": 0, "ignore_eos": true})");
  EXPECT_EQ(HttpCall(port, "POST", "/v1/completions", completion).status, 404);
  HttpReply r =
      HttpCall(port, "POST", "/v1/load_lora_adapter",
               absl::StrCat(R"({"lora_name": "sql", "lora_path": ")", dirs.at("a"), R"("})"));
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.body, "Success: LoRA adapter 'sql' added successfully.");
  HttpReply list = HttpCall(port, "GET", "/v1/models");
  ASSERT_EQ(list.status, 200);
  const Json models = Json::parse(list.body);
  ASSERT_EQ(models["data"].size(), 2u);
  EXPECT_EQ(models["data"][1]["id"], "sql");
  EXPECT_EQ(models["data"][1]["parent"], "tiny");
  r = HttpCall(port, "POST", "/v1/completions", completion);
  ASSERT_EQ(r.status, 200) << r.body;
  StreamResult want = RunGenerate(server.stub(), Greedy("sql", 16));
  EXPECT_EQ(Json::parse(r.body)["choices"][0]["text"], want.text);
  EXPECT_EQ(want.tokens, Want().at("a"));

  // Errors.
  r = HttpCall(port, "POST", "/v1/load_lora_adapter",
               absl::StrCat(R"({"lora_name": "sql", "lora_path": ")", dirs.at("b"), R"("})"));
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(Json::parse(r.body)["error"]["param"], "lora_name") << r.body;
  r = HttpCall(port, "POST", "/v1/load_lora_adapter", R"({"lora_name": "other"})");
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(Json::parse(r.body)["error"]["param"], "lora_path") << r.body;
  r = HttpCall(port, "POST", "/v1/load_lora_adapter",
               R"({"lora_name": "other", "lora_path": "/nonexistent"})");
  EXPECT_EQ(r.status, 404) << r.body;
  r = HttpCall(port, "POST", "/v1/unload_lora_adapter", R"({"lora_name": "nope"})");
  EXPECT_EQ(r.status, 404) << r.body;
  r = HttpCall(port, "POST", "/v1/unload_lora_adapter", R"({"lora_name": 3})");
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(HttpCall(port, "GET", "/v1/load_lora_adapter").status, 405);

  r = HttpCall(port, "POST", "/v1/unload_lora_adapter", R"({"lora_name": "sql"})");
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.body, "Success: LoRA adapter 'sql' removed successfully.");
  EXPECT_EQ(HttpCall(port, "POST", "/v1/completions", completion).status, 404);
  EXPECT_EQ(Json::parse(HttpCall(port, "GET", "/v1/models").body)["data"].size(), 1u);
}

}  // namespace
}  // namespace kvrm
