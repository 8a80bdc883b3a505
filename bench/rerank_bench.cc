// Reranking through the service (Score, a cross-encoder: the LM head's rows of two tokens as the
// head, as kvrmd --classifier_from_tokens serves Qwen3-Reranker) against an Embed call of exactly
// the same token sequences (each (query, document) pair as the tokenizer joins it), side by side
// in one process on the CPU backend: what tokenizing the pairs, the head and the reply cost on
// top of the pairs' prefill.
//
//   bazel build //bench:rerank_bench
//   bazel-bin/bench/rerank_bench --json=/tmp/rerank.json
//
// For each document length (--document_tokens) one call scores --documents random documents
// against one query of --query_tokens (texts: random ids of the vocabulary decoded), and one
// Embed call (last-token pooling) embeds the same pairs given as token ids. The two alternate
// their order across --repeats (the machine is shared and noisy); the table shows medians of each
// call's documents per second and pair tokens per second, and of the pairs' ratios. Prefix
// caching is off unless --prefix_caching, so each call computes every token (with it, the pairs
// share their query's whole KV blocks: a long instruction and query are prefilled once).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "bench/engine_run.h"
#include "bench/generated_model.h"
#include "common/logging.h"
#include "kvrm/v1/kvrm.grpc.pb.h"
#include "model/classifier_head.h"
#include "nlohmann/json.hpp"
#include "runtime/engine.h"
#include "runtime/model_bundle.h"
#include "server/kvrm_server.h"

ABSL_FLAG(std::string, size, "small", "generated model shape (tools/modelgen): tiny or small");
ABSL_FLAG(std::string, model_dir, "", "where to generate the model (default: a temp dir)");
ABSL_FLAG(std::string, document_tokens, "32,128,384", "document lengths, comma-separated");
ABSL_FLAG(int32_t, query_tokens, 16, "the query's length");
ABSL_FLAG(int32_t, documents, 32, "documents a call");
ABSL_FLAG(int32_t, slots, 4, "engine slots");
ABSL_FLAG(int32_t, repeats, 3, "pairs of calls per row (their order alternates); medians shown");
ABSL_FLAG(int32_t, threads, 2, "CPU backend threads");
ABSL_FLAG(bool, prefix_caching, false,
          "keep the engine's prefix cache on (kvrmd's default): pairs share their query's blocks");
ABSL_FLAG(std::string, json, "", "also write the figures as JSON");

namespace kvrm {
namespace {

// `n` random ids decoded to text (special tokens left out).
std::string RandomText(const ModelBundle& model, bench::IdSource& ids, int32_t n) {
  std::vector<int32_t> t(n);
  for (int32_t& id : t) id = ids.Next();
  return model.tokenizer->Decode(t, /*skip_special_tokens=*/true);
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

int Main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  std::vector<int32_t> lengths;
  if (!bench::ParseCounts("--document_tokens", absl::GetFlag(FLAGS_document_tokens), &lengths)) {
    return 2;
  }
  const std::string size = absl::GetFlag(FLAGS_size);
  absl::StatusOr<std::unique_ptr<ModelBundle>> model =
      bench::LoadGeneratedModel(absl::GetFlag(FLAGS_model_dir), size, "kvrm-rerank-bench");
  if (!model.ok()) {
    std::fprintf(stderr, "rerank_bench: %s\n", model.status().ToString().c_str());
    return 1;
  }
  ModelBundle& m = **model;
  // Two tokens of the vocabulary as "no" and "yes".
  std::vector<std::string> head_tokens;
  for (int32_t id = 10; head_tokens.size() < 2 && id < m.tokenizer->vocab_size(); ++id) {
    const std::string token(m.tokenizer->IdToToken(id));
    if (!token.empty() && m.tokenizer->TokenToId(token) == id) head_tokens.push_back(token);
  }
  absl::StatusOr<ClassifierHead> head =
      ClassifierFromTokens(m.weights.lm_head, *m.tokenizer, head_tokens);
  if (!head.ok()) {
    std::fprintf(stderr, "rerank_bench: %s\n", head.status().ToString().c_str());
    return 1;
  }
  m.classifier = *std::move(head);
  const int32_t threads = absl::GetFlag(FLAGS_threads);
  const int32_t documents = absl::GetFlag(FLAGS_documents);
  const int32_t repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  EngineOptions o;
  o.slots = absl::GetFlag(FLAGS_slots);
  o.threads = threads;
  o.prefix_caching = absl::GetFlag(FLAGS_prefix_caching);  // off: every call computes every token
  o.max_queue = std::max(256, documents);
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(&m, o);
  if (!engine.ok()) {
    std::fprintf(stderr, "rerank_bench: %s\n", engine.status().ToString().c_str());
    return 1;
  }
  (*engine)->Start();
  ServerOptions so;
  so.listen = "127.0.0.1:0";
  so.max_message_bytes = 64 << 20;
  absl::StatusOr<std::unique_ptr<KvrmServer>> server = KvrmServer::Start(engine->get(), so);
  if (!server.ok()) {
    std::fprintf(stderr, "rerank_bench: %s\n", server.status().ToString().c_str());
    return 1;
  }
  std::unique_ptr<v1::Kvrm::Stub> stub = v1::Kvrm::NewStub((*server)->InProcessChannel());

  const LlamaConfig& config = m.config;
  std::printf("rerank (Score, cross-encoder) against Embed of the same pairs: model %s (hidden %d, "
              "%d layers), %d documents a call, %d-token query, %d slots, %d threads, prefix cache %s, "
              "%s\n",
              size.c_str(), config.hidden_size, config.num_hidden_layers, documents,
              absl::GetFlag(FLAGS_query_tokens), o.slots, threads,
              o.prefix_caching ? "on" : "off", bench::CpuModelName().c_str());
  std::printf("%9s %9s | %12s %12s %7s | %14s %7s\n", "document", "pair tok", "score doc/s",
              "embed doc/s", "ratio", "score pair tok/s", "cached");
  nlohmann::json out = bench::MachineJson(m, size, threads);
  out["documents"] = documents;
  out["query_tokens"] = absl::GetFlag(FLAGS_query_tokens);
  out["slots"] = o.slots;
  out["repeats"] = repeats;
  out["head"] = m.classifier->source;
  out["prefix_caching"] = o.prefix_caching;
  out["rows"] = nlohmann::json::array();
  for (int32_t length : lengths) {
    bench::IdSource ids(m, 29 + length);
    v1::ScoreRequest score;
    score.add_queries(RandomText(m, ids, absl::GetFlag(FLAGS_query_tokens)));
    for (int32_t d = 0; d < documents; ++d) score.add_documents(RandomText(m, ids, length));
    // The same pairs as token ids, joined as Score joins them.
    v1::EmbedRequest embed;
    embed.set_pooling(v1::POOLING_LAST);
    embed.set_normalize(false);
    absl::StatusOr<std::vector<int32_t>> q = m.tokenizer->Encode(score.queries(0), false);
    CHECK_OK(q.status());
    for (const std::string& doc : score.documents()) {
      absl::StatusOr<std::vector<int32_t>> d = m.tokenizer->Encode(doc, false);
      CHECK_OK(d.status());
      const std::vector<int32_t> pair = m.tokenizer->JoinPair(*q, *d, true);
      embed.add_inputs()->mutable_token_ids()->mutable_ids()->Add(pair.begin(), pair.end());
    }
    std::vector<double> score_s, embed_s, ratios;
    std::vector<double> cached[2];  // tokens from the prefix cache: Score's, Embed's
    int32_t pair_tokens = 0;
    for (int32_t rep = 0; rep < repeats; ++rep) {
      double wall[2] = {0, 0};
      for (int32_t k = 0; k < 2; ++k) {
        const bool is_score = (k + rep) % 2 == 0;  // the order alternates
        grpc::ClientContext ctx;
        const auto start = std::chrono::steady_clock::now();
        grpc::Status st;
        int32_t tokens = 0;
        // Each call its own cache salt: with the prefix cache on, a call shares blocks between
        // its own pairs only, never with the other call of the same pairs.
        const std::string salt = absl::StrCat(is_score ? "score-" : "embed-", length, "-", rep);
        if (is_score) {
          v1::ScoreResponse r;
          score.set_cache_salt(salt);
          st = stub->Score(&ctx, score, &r);
          tokens = r.prompt_tokens();
          cached[0].push_back(r.cached_prompt_tokens());
        } else {
          v1::EmbedResponse r;
          embed.set_cache_salt(salt);
          st = stub->Embed(&ctx, embed, &r);
          tokens = r.prompt_tokens();
          int32_t c = 0;
          for (const v1::Embedding& e : r.embeddings()) c += e.cached_prompt_tokens();
          cached[1].push_back(c);
        }
        const double s = Seconds(start);
        if (!st.ok()) {
          std::fprintf(stderr, "rerank_bench: %s: %s\n", is_score ? "Score" : "Embed",
                       st.error_message().c_str());
          return 1;
        }
        if (pair_tokens != 0 && tokens != pair_tokens) {
          std::fprintf(stderr, "rerank_bench: Score and Embed prefilled %d and %d tokens\n",
                       pair_tokens, tokens);
          return 1;
        }
        pair_tokens = tokens;
        wall[is_score ? 0 : 1] = s;
        (is_score ? score_s : embed_s).push_back(s);
      }
      ratios.push_back(wall[1] / wall[0]);  // score's throughput over embed's
    }
    const double score_wall = bench::Median(score_s), embed_wall = bench::Median(embed_s);
    nlohmann::json row;
    row["document_tokens"] = length;
    row["pair_tokens"] = pair_tokens;
    row["score_wall_s"] = score_s;
    row["embed_wall_s"] = embed_s;
    row["score_documents_per_s"] = documents / score_wall;
    row["embed_documents_per_s"] = documents / embed_wall;
    row["score_pair_tokens_per_s"] = pair_tokens / score_wall;
    row["ratio_documents_per_s"] = bench::Median(ratios);
    row["ratio_runs"] = ratios;
    row["score_cached_tokens"] = bench::Median(cached[0]);
    row["embed_cached_tokens"] = bench::Median(cached[1]);
    std::printf("%9d %9d | %12.1f %12.1f %6.3fx | %14.0f %7.0f\n", length, pair_tokens,
                documents / score_wall, documents / embed_wall, bench::Median(ratios),
                pair_tokens / score_wall, bench::Median(cached[0]));
    out["rows"].push_back(std::move(row));
  }
  std::printf("ratio: Score's documents per second over Embed's of the same pairs, median of the "
              "pairs of calls; pair tok: the tokens a call prefilled; cached: of those, Score's from the "
              "prefix cache\n");
  stub.reset();
  server->reset();  // before the engine it serves
  engine->reset();
  if (const std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
    std::ofstream(path) << out.dump(2) << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace kvrm

int main(int argc, char** argv) { return kvrm::Main(argc, argv); }
