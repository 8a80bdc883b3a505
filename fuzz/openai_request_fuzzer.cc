// Fuzzes the OpenAI-compatible HTTP API's request parser and reply builder (server/openai_api.h)
// with what an HTTP client controls: byte 0 picks the endpoint (completions, chat completions),
// the rest is the request body. Invariants: a body either parses into a GenerateRequest with the
// endpoint's prompt kind, or fails with INVALID_ARGUMENT whose OpenAI error is a 400 with a JSON
// body; a service error about any recorded field is written with that field's OpenAI name; the
// replies built for a parsed request (whole and streamed, with logprobs and a tool call) are JSON
// that parses, and the stream ends with [DONE]. The same body as a /v1/responses request
// (server/responses_api.h): parsed into a chat request, or refused with INVALID_ARGUMENT naming
// a parameter; a parsed one's reply (whole and streamed, with text, reasoning and a call) is JSON.
// And as a /v1/messages (server/messages_api.h) or count_tokens body: parsed or refused naming a
// parameter; a parsed one's reply is JSON, its stream typed events whose data names its type.
#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "fuzz/fuzz_util.h"
#include "kvrm/v1/kvrm.pb.h"
#include "server/openai_api.h"
#include "server/messages_api.h"
#include "server/responses_api.h"

namespace {
kvrm::Tokenizer* tokenizer = nullptr;

bool IsJson(std::string_view text) {
  return kvrm::ParseJson(text, "reply").ok();
}
}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  tokenizer = kvrm::fuzz::LoadTokenizer("gpt2").release();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const kvrm::OpenAiEndpoint endpoint = data[0] % 2 == 0
                                            ? kvrm::OpenAiEndpoint::kCompletions
                                            : kvrm::OpenAiEndpoint::kChatCompletions;
  const std::string_view body(reinterpret_cast<const char*>(data) + 1, size - 1);
  // vLLM's /tokenize and /detokenize bodies: parsed or refused naming a parameter, never thrown.
  for (const absl::Status& st :
       {kvrm::ParseTokenizeRequest(absl::string_view(body.data(), body.size())).status(),
        kvrm::ParseDetokenizeRequest(absl::string_view(body.data(), body.size())).status()}) {
    FUZZ_CHECK(st.ok() || (st.code() == absl::StatusCode::kInvalidArgument &&
                           absl::StrContains(st.message(), ": ")));
  }
  {
    // /v1/embeddings: parsed or refused naming a parameter; a reply of what was asked is JSON.
    absl::StatusOr<kvrm::OpenAiEmbeddings> e =
        kvrm::ParseEmbeddingsRequest(absl::string_view(body.data(), body.size()));
    if (!e.ok()) {
      FUZZ_CHECK(e.status().code() == absl::StatusCode::kInvalidArgument &&
                 absl::StrContains(e.status().message(), ": "));
    } else {
      FUZZ_CHECK(e->embed.inputs_size() > 0);
      kvrm::v1::EmbedResponse r;
      r.set_request_id(e->embed.request_id());
      for (int i = 0; i < e->embed.inputs_size() && i < 4; ++i) {
        kvrm::v1::Embedding* v = r.add_embeddings();
        for (int j = 0; j < 3; ++j) v->add_values(0.25f * static_cast<float>(i - j));
      }
      FUZZ_CHECK(IsJson(kvrm::EmbeddingsReplyJson(r, "m", 0, e->base64)));
    }
  }
  {
    // /classify, /score and /rerank: parsed or refused naming a parameter; replies are JSON.
    const absl::string_view b(body.data(), body.size());
    absl::StatusOr<kvrm::OpenAiClassify> c = kvrm::ParseClassifyRequest(b);
    if (!c.ok()) {
      FUZZ_CHECK(c.status().code() == absl::StatusCode::kInvalidArgument &&
                 absl::StrContains(c.status().message(), ": "));
    } else {
      FUZZ_CHECK(c->classify.inputs_size() > 0);
      kvrm::v1::ClassifyResponse r;
      kvrm::v1::Classification* k = r.add_classifications();
      k->set_label_name("label \"0\"");
      k->add_probs(0.75f);
      FUZZ_CHECK(IsJson(kvrm::ClassifyReplyJson(r, "m", 0)));
    }
    for (bool rerank : {false, true}) {
      absl::StatusOr<kvrm::OpenAiScore> s = kvrm::ParseScoreRequest(b, rerank);
      if (!s.ok()) {
        FUZZ_CHECK(s.status().code() == absl::StatusCode::kInvalidArgument &&
                   absl::StrContains(s.status().message(), ": "));
        continue;
      }
      FUZZ_CHECK(s->score.queries_size() > 0 && s->score.documents_size() > 0);
      FUZZ_CHECK(s->top_n >= 0);
      kvrm::v1::ScoreResponse r;
      for (int i = 0; i < s->score.documents_size(); ++i) r.add_scores(0.5f - 0.125f * (i % 5));
      FUZZ_CHECK(IsJson(kvrm::ScoreReplyJson(r, *s, "m", 0)));
    }
  }
  kvrm::OpenAiDefaults defaults;
  {
    absl::StatusOr<kvrm::ResponsesRequest> responses =
        kvrm::ParseResponsesRequest(absl::string_view(body.data(), body.size()), defaults);
    if (!responses.ok()) {
      FUZZ_CHECK(responses.status().code() == absl::StatusCode::kInvalidArgument &&
                 absl::StrContains(responses.status().message(), ": "));
    } else {
      FUZZ_CHECK(responses->chat.generate.has_chat());
      for (bool stream : {false, true}) {
        kvrm::ResponsesReply reply(*responses, "resp_f", 0, "m");
        kvrm::v1::GenerateResponse m;
        m.set_reasoning_text("r");
        m.set_text("t\xff");  // not UTF-8: the JSON writer must not throw
        kvrm::v1::GenerateResponse end;
        end.mutable_finished()->set_reason(kvrm::v1::FINISH_REASON_TOOL_CALLS);
        kvrm::v1::ToolCall* call = end.mutable_finished()->add_tool_calls();
        call->set_id("call_1");
        call->set_name("f");
        call->set_arguments("{}");
        if (stream) {
          std::string sse = reply.StreamStart() + reply.StreamMessage(m, 0) +
                            reply.StreamMessage(end, 0) + reply.StreamEnd();
          for (absl::string_view block : absl::StrSplit(sse, "\n\n", absl::SkipEmpty())) {
            const size_t at = block.find("\ndata: ");
            FUZZ_CHECK(absl::StartsWith(block, "event: ") && at != absl::string_view::npos);
            FUZZ_CHECK(IsJson(std::string_view(block.data() + at + 7, block.size() - at - 7)));
          }
        } else {
          reply.Add(m, 0);
          reply.Add(end, 0);
          FUZZ_CHECK(IsJson(reply.Body()));
        }
      }
    }
  }
  {
    const absl::string_view b(body.data(), body.size());
    const absl::Status counted = kvrm::ParseCountTokensRequest(b).status();
    FUZZ_CHECK(counted.ok() || (counted.code() == absl::StatusCode::kInvalidArgument &&
                                absl::StrContains(counted.message(), ": ")));
    absl::StatusOr<kvrm::MessagesRequest> messages = kvrm::ParseMessagesRequest(b, defaults);
    if (!messages.ok()) {
      FUZZ_CHECK(messages.status().code() == absl::StatusCode::kInvalidArgument &&
                 absl::StrContains(messages.status().message(), ": "));
      kvrm::OpenAiError e = kvrm::ToOpenAiError(messages.status(), nullptr);
      e.shape = kvrm::OpenAiError::Shape::kAnthropic;
      FUZZ_CHECK(IsJson(e.Json()));
    } else {
      FUZZ_CHECK(messages->chat.generate.has_chat());
      FUZZ_CHECK(messages->chat.generate.stopping().max_new_tokens() > 0);
      for (bool stream : {false, true}) {
        kvrm::MessagesReply reply(*messages, "msg_f", "m");
        kvrm::v1::GenerateResponse m;
        m.mutable_prompt_usage()->set_prompt_tokens(5);
        m.set_reasoning_text("r");
        m.set_text("t\xff");  // not UTF-8: the JSON writer must not throw
        kvrm::v1::GenerateResponse end;
        end.mutable_finished()->set_reason(kvrm::v1::FINISH_REASON_TOOL_CALLS);
        kvrm::v1::ToolCall* call = end.mutable_finished()->add_tool_calls();
        call->set_id("call_1");
        call->set_name("f");
        call->set_arguments(std::string(body.substr(0, 12)));  // any text: input stays an object
        if (stream) {
          std::string sse = reply.StreamStart();
          sse += reply.StreamMessage(m, 0);
          sse += reply.StreamMessage(end, 0);
          sse += reply.StreamEnd();
          for (absl::string_view block : absl::StrSplit(sse, "\n\n", absl::SkipEmpty())) {
            const size_t at = block.find("\ndata: ");
            FUZZ_CHECK(absl::StartsWith(block, "event: ") && at != absl::string_view::npos);
            const std::string_view data(block.data() + at + 7, block.size() - at - 7);
            absl::StatusOr<kvrm::Json> j = kvrm::ParseJson(data, "event");
            FUZZ_CHECK(j.ok() && (*j)["type"] == std::string(block.substr(7, at - 7)));
          }
        } else {
          reply.Add(m, 0);
          reply.Add(end, 0);
          absl::StatusOr<kvrm::Json> j = kvrm::ParseJson(reply.Body(), "body");
          FUZZ_CHECK(j.ok() && (*j)["content"].back()["input"].is_object());
        }
      }
    }
  }
  absl::StatusOr<kvrm::OpenAiRequest> r =
      kvrm::ParseOpenAiRequest(endpoint, absl::string_view(body.data(), body.size()), defaults);
  if (!r.ok()) {
    FUZZ_CHECK(r.status().code() == absl::StatusCode::kInvalidArgument);
    const kvrm::OpenAiError e = kvrm::ToOpenAiError(r.status(), nullptr);
    FUZZ_CHECK(e.http_status == 400 && !e.message.empty());
    FUZZ_CHECK(IsJson(e.Json()));
    return 0;
  }
  const kvrm::v1::GenerateRequest& g = r->generate;
  if (endpoint == kvrm::OpenAiEndpoint::kChatCompletions) {
    FUZZ_CHECK(g.has_chat());
  } else {
    FUZZ_CHECK(g.has_text() || g.has_token_ids());
  }
  FUZZ_CHECK(r->logprobs < 0 || g.response().logprobs());
  // Every recorded field's error is reported under the parameter's OpenAI name.
  for (const auto& [field, param] : r->params) {
    const kvrm::OpenAiError e = kvrm::ToOpenAiError(
        absl::InvalidArgumentError(absl::StrCat(field, ": bad")), &*r);
    FUZZ_CHECK(e.http_status == 400);
    FUZZ_CHECK(absl::StartsWith(e.message, e.param) && !e.param.empty());
    FUZZ_CHECK(IsJson(e.Json()));
  }
  // Replies for it: one token with logprobs, then the finish (with a tool call for chat).
  kvrm::v1::GenerateResponse token;
  token.add_token_ids(1);
  token.set_text(std::string(body.substr(0, 8)));  // any bytes: the JSON writer must cope
  kvrm::v1::TokenLogprob* lp = token.add_logprobs();
  lp->set_token_id(static_cast<int32_t>(size % 50000));
  lp->set_logprob(-0.5f);
  kvrm::v1::TopLogprob* top = lp->add_top();
  top->set_token_id(static_cast<int32_t>((size * 7) % 50000));
  top->set_logprob(-1.0f);
  kvrm::v1::GenerateResponse last;
  last.mutable_finished()->set_reason(endpoint == kvrm::OpenAiEndpoint::kChatCompletions
                                          ? kvrm::v1::FINISH_REASON_TOOL_CALLS
                                          : kvrm::v1::FINISH_REASON_LENGTH);
  last.mutable_finished()->mutable_usage()->set_prompt_tokens(3);
  last.mutable_finished()->mutable_usage()->set_completion_tokens(1);
  if (endpoint == kvrm::OpenAiEndpoint::kChatCompletions) {
    kvrm::v1::ToolCall* call = last.mutable_finished()->add_tool_calls();
    call->set_id("call_0");
    call->set_name("f");
    call->set_arguments("{}");
  }
  const int n = std::max(1, std::min(g.n(), 4));
  // A list of prompts: one call each (the calls keep every parameter), P*n choices.
  const std::vector<kvrm::v1::GenerateRequest> calls = kvrm::OpenAiCalls(*r);
  FUZZ_CHECK(calls.size() == 1 + r->more_prompts.size());
  const int prompts = std::min<int>(static_cast<int>(calls.size()), 4);
  std::vector<std::string> texts(calls.size(), std::string(body.substr(0, 4)));
  kvrm::OpenAiReply whole(*r, tokenizer, "id", 0, "m", texts);
  kvrm::OpenAiReply streamed(*r, tokenizer, "id", 0, "m", texts);
  std::string events = streamed.StreamStart();
  for (int p = 0; p < prompts; ++p) {
    FUZZ_CHECK(calls[p].n() == g.n());
    for (int i = 0; i < n; ++i) {
      token.set_index(i);
      last.set_index(i);
      whole.Add(token, p);
      whole.Add(last, p);
      events += streamed.StreamMessage(token, p);
      events += streamed.StreamMessage(last, p);
    }
  }
  FUZZ_CHECK(IsJson(whole.Body()));
  events += streamed.StreamEnd();
  FUZZ_CHECK(absl::EndsWith(events, "data: [DONE]\n\n"));
  for (absl::string_view e : absl::StrSplit(events, "\n\n", absl::SkipEmpty())) {
    FUZZ_CHECK(absl::ConsumePrefix(&e, "data: "));
    FUZZ_CHECK(e == "[DONE]" || IsJson(std::string_view(e.data(), e.size())));
  }
  return 0;
}
