#include "server/kvrm_service.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <functional>
#include <mutex>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status_macros.h"
#include "common/thread_priority.h"
#include "model/harmony.h"
#include "model/reasoning.h"
#include "runtime/text_stream.h"
#include "server/beam_search.h"
#include "server/response_queue.h"

// gRPC passes a reactor between threads (the handler, whoever calls StartWrite or Finish, the
// threads that run its callbacks) with synchronisation inside libgrpc, which ThreadSanitizer
// cannot see: Debian's gRPC is not built with it. Under TSan these state that hand-off, so the
// reactor's own state stays checked: a release before each call that hands gRPC work, an acquire
// where each callback starts. Nothing in other builds.
#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#define KVRM_GRPC_HANDOFF(p) __tsan_release(p)
#define KVRM_GRPC_CALLBACK(p) __tsan_acquire(p)
#else
#define KVRM_GRPC_HANDOFF(p) static_cast<void>(p)
#define KVRM_GRPC_CALLBACK(p) static_cast<void>(p)
#endif

namespace kvrm {
namespace {

v1::FinishReason ToProto(FinishReason r) {
  switch (r) {
    case FinishReason::kLength: return v1::FINISH_REASON_LENGTH;
    case FinishReason::kEos: return v1::FINISH_REASON_EOS;
    case FinishReason::kStop: return v1::FINISH_REASON_STOP;
    case FinishReason::kCancelled: return v1::FINISH_REASON_CANCELLED;
    case FinishReason::kTimeLimit: return v1::FINISH_REASON_TIME_LIMIT;
    case FinishReason::kError: return v1::FINISH_REASON_ERROR;
  }
  return v1::FINISH_REASON_UNSPECIFIED;
}

// Replies that ended by themselves or at their length limit are read for calls; cancelled,
// timed-out and failed ones give back what they held as text.
bool ParsesToolCalls(FinishReason r) {
  return r == FinishReason::kEos || r == FinishReason::kStop || r == FinishReason::kLength;
}

// Cancels the engine requests of `handles` submitted so far (0: not yet), read under `mu`; the
// engine's Cancel is called outside it.
void CancelSubmitted(Engine* engine, std::mutex* mu, const std::vector<uint64_t>& handles) {
  std::vector<uint64_t> copy;
  {
    std::lock_guard<std::mutex> lock(*mu);
    copy = handles;
  }
  for (uint64_t h : copy) {
    if (h != 0) engine->Cancel(h);
  }
}

}  // namespace

// One Generate call: n completions (GenerateRequest.n), each an engine request whose messages
// carry its index. Completion 0 (the leader) is submitted at once; the others when the leader
// has its first token, so that its prompt's KV is in the prefix cache and they attach it instead
// of prefilling it again (vLLM forks n samples after the prompt likewise). Lifetime: one
// reference held by gRPC until OnDone and one per engine sink until the engine drops that
// request; the last one deletes the reactor.
class GenerateReactor final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  GenerateReactor(Engine* engine, const Tokenizer* tokenizer, std::string request_id,
                  bool omit_token_ids, int32_t top_logprobs, int32_t n,
                  Counter* merged_chunks_counter, size_t max_merged_bytes)
      : engine_(engine),
        tokenizer_(tokenizer),
        request_id_(std::move(request_id)),
        omit_token_ids_(omit_token_ids),
        top_logprobs_(top_logprobs),
        n_(n),
        merged_chunks_counter_(merged_chunks_counter),
        handles_(n, 0),
        queue_(max_merged_bytes) {}

  // The sink the engine calls on its own thread, for completion `index`.
  class Sink final : public RequestSink {
   public:
    Sink(GenerateReactor* reactor, int32_t index) : reactor_(reactor), index_(index) {}
    ~Sink() override { reactor_->Unref(); }
    void OnChunk(StreamChunk chunk) override {
      reactor_->Enqueue(index_, std::move(chunk), nullptr);
    }
    void OnFinished(StreamChunk last, const FinishInfo& info) override {
      reactor_->Enqueue(index_, std::move(last), &info);
    }

   private:
    GenerateReactor* reactor_;
    const int32_t index_;
  };

  std::shared_ptr<RequestSink> MakeSink(int32_t index) {
    refs_.fetch_add(1);
    return std::make_shared<Sink>(this, index);
  }

  // The validated request the other n - 1 completions are copied from (before the leader is
  // submitted; its sink is not copied).
  void set_follower_template(const GenerationRequest& leader) {
    follower_ = std::make_unique<GenerationRequest>(leader);
    follower_->sink.reset();
    follower_->prompt_logprobs = -1;  // completion 0 carries the prompt's scores
  }

  // Before the leader is submitted: every completion's text is read for function calls.
  void set_tool_calling(const ToolCalling& calling, const ToolCallSyntax* syntax,
                        const ToolCallMetrics* metrics) {
    tool_streams_.clear();
    for (int32_t i = 0; i < n_; ++i) {
      tool_streams_.push_back(std::make_unique<ToolCallStream>(
          calling.mode, syntax, calling.function, calling.single_call, calling.tools));
    }
    tool_metrics_ = metrics;
  }

  // Before the leader is submitted: each completion's first message carries the prompt's token
  // ids (response.prompt_token_ids).
  void set_prompt_token_ids(const std::vector<int32_t>& prompt) {
    prompt_ids_ = prompt;
    prompt_ids_pending_.assign(n_, 1);
  }

  // Before the leader is submitted: every completion's text is split into reasoning and answer
  // (a chat request to a model that thinks; `starts_inside`: the prompt opened the block).
  void set_reasoning(bool starts_inside) {
    reasoning_streams_.clear();
    for (int32_t i = 0; i < n_; ++i) {
      reasoning_streams_.push_back(std::make_unique<ReasoningStream>(starts_inside));
    }
    reasoning_tokens_.assign(n_, ReasoningTokens{});
  }

  // Before the leader is submitted: every completion's text is read as harmony messages (a chat
  // request to gpt-oss): analysis to reasoning_text, the answer to text, function calls (with
  // `tool_calls`) as Hermes markup to the tool-call stream.
  void set_harmony(bool tool_calls) {
    harmony_streams_.clear();
    for (int32_t i = 0; i < n_; ++i) {
      harmony_streams_.push_back(std::make_unique<HarmonyStream>(tool_calls));
    }
    reasoning_tokens_.assign(n_, ReasoningTokens{});
  }

  // A traced call (server/tracing.h): its span's ids and the request's attributes, filled before
  // anything is submitted; each completion's end and the call's status are added as they come,
  // and the spans are recorded when the reactor goes (every completion ended, the call done).
  struct Trace {
    Tracer* tracer = nullptr;
    absl::Time start;
    otlp::Span root;                     // ids, name, kind, flags and the request's attributes
    std::vector<v1::Finished> finished;  // per completion; reason unset until it ends
    grpc::Status status;
  };
  void set_trace(std::unique_ptr<Trace> trace) {
    trace->finished.resize(n_);
    trace_ = std::move(trace);
  }

  // Before anything is submitted: the completions come from a beam search (BeamSearchRun), not
  // as a leader and its followers; `cancel` ends its running step when the client leaves (at once
  // when it already has).
  void set_beam_search(std::function<void()> cancel) {
    followers_submitted_ = true;
    bool left;
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancel_hook_ = cancel;
      left = cancelled_;
    }
    if (left) cancel();
  }

  // The client cancelled (before anything was submitted, for a call that waited to compile).
  bool cancelled() {
    std::lock_guard<std::mutex> lock(mu_);
    return cancelled_;
  }

  // Records completion `index`'s engine handle; true when the call was cancelled before it
  // could be (OnCancel's CancelAll saw no handle): the caller cancels it then.
  bool set_handle(int32_t index, uint64_t handle) {
    std::lock_guard<std::mutex> lock(mu_);
    handles_[index] = handle;
    return cancelled_;
  }

  // A reference for code that touches the reactor after handing it a sink (the compile thread
  // between Submit and set_handle): the engine may finish the request and gRPC end the call
  // meanwhile, which would otherwise delete it.
  class Hold {
   public:
    explicit Hold(GenerateReactor* reactor) : reactor_(reactor) { reactor_->refs_.fetch_add(1); }
    ~Hold() { reactor_->Unref(); }
    Hold(const Hold&) = delete;
    Hold& operator=(const Hold&) = delete;

   private:
    GenerateReactor* reactor_;
  };

  // Ends the call before it reached the engine.
  void Reject(const grpc::Status& status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      finished_ = true;
      if (trace_) trace_->status = status;
    }
    Finish(status);
    // gRPC binds the reactor (and may run its callbacks) once Generate returns it.
    KVRM_GRPC_HANDOFF(this);
  }

  void OnWriteDone(bool ok) override {
    KVRM_GRPC_CALLBACK(this);
    const v1::GenerateResponse* next = nullptr;
    bool finish = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!ok) {
        // The client is gone: stop writing, end the engine's work, close the call.
        finished_ = true;
        cancelled_ = true;
        queue_.DropQueued();
        queue_.WriteDone();
        if (trace_) {
          trace_->status = grpc::Status(grpc::StatusCode::CANCELLED, "client stopped reading");
        }
      } else {
        next = queue_.WriteDone();
        if (!next && finals_queued_ == n_ && !finished_) finish = finished_ = true;
      }
    }
    KVRM_GRPC_HANDOFF(this);
    if (!ok) {
      CancelAll();
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "client stopped reading"));
    } else if (next) {
      StartWrite(next);
    } else if (finish) {
      Finish(grpc::Status::OK);
    }
  }

  void OnCancel() override {
    KVRM_GRPC_CALLBACK(this);
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancelled_ = true;
      if (trace_ && trace_->status.ok()) {
        trace_->status = grpc::Status(grpc::StatusCode::CANCELLED, "cancelled by the client");
      }
    }
    CancelAll();
  }

  void OnDone() override {
    KVRM_GRPC_CALLBACK(this);
    Unref();
  }

 private:
  ~GenerateReactor() override {
    if (trace_) RecordTrace();
  }

  void Unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  void CancelAll() {
    CancelSubmitted(engine_, &mu_, handles_);
    std::function<void()> hook;
    {
      std::lock_guard<std::mutex> lock(mu_);
      hook = cancel_hook_;
    }
    if (hook) hook();
  }

  // The call's spans (the last reference is going: nothing else touches the reactor): the
  // request's, with the outcome's attributes, and per completion its queue, prefill and decode.
  void RecordTrace() {
    Trace& t = *trace_;
    const absl::Time end = absl::Now();
    otlp::Span root = std::move(t.root);
    SetTimes(&root, t.start, end);
    std::vector<std::string> reasons;
    int64_t output_tokens = 0;
    std::string engine_error;
    const v1::Finished* first = nullptr;
    for (const v1::Finished& f : t.finished) {
      if (f.reason() == v1::FINISH_REASON_UNSPECIFIED) continue;
      if (first == nullptr) first = &f;
      reasons.push_back(TraceFinishReason(f.reason()));
      output_tokens += f.usage().completion_tokens();
      if (f.reason() == v1::FINISH_REASON_ERROR && engine_error.empty()) engine_error = f.error();
    }
    if (first != nullptr) {
      AddStrings(&root, "gen_ai.response.finish_reasons", reasons);
      AddInt(&root, "gen_ai.usage.input_tokens", first->usage().prompt_tokens());
      AddInt(&root, "gen_ai.usage.output_tokens", output_tokens);
      AddInt(&root, "kvrm.usage.cached_input_tokens", first->usage().cached_prompt_tokens());
      // vLLM's latency attributes, in seconds (the first completion's).
      AddDouble(&root, "gen_ai.latency.time_in_queue", first->queue_time_ms() / 1e3);
      AddDouble(&root, "gen_ai.latency.time_to_first_token", first->time_to_first_token_ms() / 1e3);
      AddDouble(&root, "gen_ai.latency.e2e", first->total_time_ms() / 1e3);
    }
    SetCallOutcome(&root, t.status, engine_error);
    std::vector<otlp::Span> spans;
    spans.reserve(1 + 3 * t.finished.size());
    spans.emplace_back();  // the root's place: first
    for (size_t i = 0; i < t.finished.size(); ++i) {
      const v1::Finished& f = t.finished[i];
      if (f.reason() == v1::FINISH_REASON_UNSPECIFIED) continue;
      auto phase = [&](const char* name, double from_ms, double to_ms) {
        otlp::Span& s = spans.emplace_back();
        s.set_trace_id(root.trace_id());
        const SpanId id = Tracer::NewSpanId();
        s.set_span_id(id.data(), id.size());
        s.set_parent_span_id(root.span_id());
        s.set_flags((root.flags() & 0xff) | 0x100);  // its parent (the call's span) is local
        s.set_name(name);
        s.set_kind(otlp::Span::SPAN_KIND_INTERNAL);
        SetTimes(&s, t.start + absl::Milliseconds(from_ms), t.start + absl::Milliseconds(to_ms));
        if (n_ > 1) AddInt(&s, "kvrm.completion.index", static_cast<int64_t>(i));
      };
      // A request cancelled or refused while it waited has only its wait (its queue time is its
      // whole time); one admitted has its prefill, and from its first token its decode.
      const bool admitted = f.time_to_first_token_ms() > 0 || f.queue_time_ms() < f.total_time_ms();
      phase("kvrm.queue", 0, admitted ? f.queue_time_ms() : f.total_time_ms());
      if (f.time_to_first_token_ms() > 0) {
        phase("kvrm.prefill", f.queue_time_ms(), f.time_to_first_token_ms());
        phase("kvrm.decode", f.time_to_first_token_ms(), f.total_time_ms());
      } else if (admitted) {
        phase("kvrm.prefill", f.queue_time_ms(), f.total_time_ms());
      }
    }
    spans[0] = std::move(root);
    t.tracer->Record(std::move(spans));
  }

  static const char* TraceFinishReason(v1::FinishReason reason) {
    switch (reason) {
      case v1::FINISH_REASON_LENGTH:
        return "length";
      case v1::FINISH_REASON_EOS:
      case v1::FINISH_REASON_STOP:
        return "stop";
      case v1::FINISH_REASON_TOOL_CALLS:
        return "tool_calls";
      case v1::FINISH_REASON_CANCELLED:
        return "cancelled";
      case v1::FINISH_REASON_TIME_LIMIT:
        return "time_limit";
      case v1::FINISH_REASON_ERROR:
        return "error";
      default:
        return "unknown";
    }
  }

  // Called on the engine thread (inside the leader's sink) at the leader's first message:
  // submits completions 1 .. n-1. One the engine refuses ends at once with that error. A
  // leader that ended cancelled before its first token (the engine's CancelAll at a drain, or a
  // Cancel of the request) ends them cancelled, unsubmitted: submitted after the CancelAll,
  // they would run to their length through the drain.
  void SubmitFollowers(bool leader_cancelled) {
    for (int32_t i = 1; i < n_; ++i) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (cancelled_) {
          // Never submitted: no final message will come for these.
          finals_queued_ += n_ - i;
          return;
        }
      }
      if (leader_cancelled) {
        FinishInfo info;
        info.reason = FinishReason::kCancelled;
        Enqueue(i, StreamChunk{}, &info);
        continue;
      }
      auto r = std::make_unique<GenerationRequest>(*follower_);
      if (r->sampling.seed != 0) r->sampling.seed += static_cast<uint64_t>(i);
      r->request_id = absl::StrCat(request_id_, "/", i);
      r->sink = MakeSink(i);
      // Part of a call the server accepted: not refused for a full queue or a drain.
      absl::StatusOr<uint64_t> handle = engine_->Submit(std::move(r), /*admitted_call=*/true);
      if (handle.ok()) {
        // The client left while it was submitted.
        if (set_handle(i, *handle)) engine_->Cancel(*handle);
        continue;
      }
      FinishInfo info;
      info.reason = FinishReason::kError;
      info.error = std::string(handle.status().message());
      Enqueue(i, StreamChunk{}, &info);
    }
  }

  // Completion `index`'s chunk through its reasoning splitter (ReasoningStream or HarmonyStream,
  // fed only by the engine thread): the reasoning to msg->reasoning_text, the answer left in
  // chunk->text, the chunk's tokens counted as reasoning when the splitter was or is in it; else
  // held while `held(split)`, counted with the next that is. `last`: the completion ended.
  template <typename Stream, typename Held>
  void SplitReasoning(Stream& stream, int32_t index, bool last, Held held, StreamChunk* chunk,
                      v1::GenerateResponse* msg) {
    const bool thinking_before = stream.reasoning();
    typename Stream::Split split = stream.Feed(chunk->text);
    ReasoningTokens& counted = reasoning_tokens_[index];
    const int32_t tokens = static_cast<int32_t>(chunk->token_ids.size());
    if (thinking_before || stream.reasoning()) {
      counted.total += counted.held + tokens;
      counted.held = 0;
    } else {
      counted.held = held(split) ? counted.held + tokens : 0;
    }
    if (last) {
      typename Stream::Split rest = stream.Finish();
      split.reasoning += rest.reasoning;
      split.content += rest.content;
    }
    msg->set_reasoning_text(std::move(split.reasoning));
    chunk->text = std::move(split.content);
  }

  void Enqueue(int32_t index, StreamChunk chunk, const FinishInfo* info) {
    if (index == 0 && n_ > 1 && !followers_submitted_.exchange(true)) {
      SubmitFollowers(info != nullptr && info->reason == FinishReason::kCancelled);
    }
    v1::GenerateResponse msg;
    msg.set_request_id(request_id_);
    msg.set_index(index);
    if (!omit_token_ids_) {
      for (int32_t id : chunk.token_ids) msg.add_token_ids(id);
    }
    if (!prompt_ids_pending_.empty() && prompt_ids_pending_[index]) {
      prompt_ids_pending_[index] = 0;
      msg.mutable_prompt_token_ids()->Add(prompt_ids_.begin(), prompt_ids_.end());
    }
    std::vector<ToolCall> calls;
    if (!harmony_streams_.empty()) {
      // Harmony: a token counts as reasoning when it is not the answer's (headers, markers,
      // analysis, calls); tokens while the reply's first text leaves undecided whether it is
      // harmony are held, and count once a header shows it is.
      HarmonyStream& harmony = *harmony_streams_[index];
      SplitReasoning(
          harmony, index, info != nullptr,
          [&](const HarmonyStream::Split&) { return harmony.undecided(); }, &chunk, &msg);
    } else if (!reasoning_streams_.empty()) {
      // The thinking goes out as reasoning_text; the answer goes on as the text (and to the
      // tool-call stream). A token is thinking when the block was open before it or is after it
      // (the markers' tokens count as thinking), and so are the tokens before the block opened
      // that the stream held (a marker spelled by several tokens, whitespace before it).
      SplitReasoning(
          *reasoning_streams_[index], index, info != nullptr,
          [](const ReasoningStream::Split& split) { return split.content.empty(); }, &chunk,
          &msg);
    }
    if (tool_streams_.empty()) {
      msg.set_text(std::move(chunk.text));
    } else {
      // Only the engine thread feeds a completion's stream (its sink, or SubmitFollowers there).
      ToolCallStream& stream = *tool_streams_[index];
      std::string text = stream.Feed(chunk.text);
      const auto add_deltas = [&] {
        for (ToolCallDelta& d : stream.TakeDeltas()) {
          v1::ToolCallDelta* out = msg.add_tool_call_deltas();
          out->set_index(d.index);
          out->set_id(std::move(d.id));
          out->set_name(std::move(d.name));
          out->set_arguments(std::move(d.arguments));
        }
      };
      add_deltas();
      if (info) {
        ToolCallStream::Result r = stream.Finish(ParsesToolCalls(info->reason));
        add_deltas();  // a streamed call the reply's end closed: its last piece
        text += r.text;
        calls = std::move(r.calls);
        if (tool_metrics_ != nullptr) {
          if (!calls.empty()) tool_metrics_->calls->Add(static_cast<double>(calls.size()));
          if (r.malformed) tool_metrics_->parse_failures->Add();
        }
      }
      msg.set_text(std::move(text));
    }
    const auto add = [&](const TokenLogprobs& lp, int32_t max_top, v1::TokenLogprob* out) {
      out->set_token_id(lp.token);
      out->set_logprob(lp.logprob);
      out->set_rank(lp.rank);
      for (int32_t i = 0; i < std::min(lp.num_top, max_top); ++i) {
        v1::TopLogprob* t = out->add_top();
        t->set_token_id(lp.top_ids[i]);
        t->set_logprob(lp.top_logprobs[i]);
        t->set_text(tokenizer_->Decode({lp.top_ids[i]}, false));
      }
    };
    if (chunk.prompt_tokens >= 0) {
      msg.mutable_prompt_usage()->set_prompt_tokens(chunk.prompt_tokens);
      msg.mutable_prompt_usage()->set_cached_prompt_tokens(chunk.cached_prompt_tokens);
    }
    for (const TokenLogprobs& lp : chunk.logprobs) add(lp, top_logprobs_, msg.add_logprobs());
    // (The engine kept as many alternatives as the request asked for.)
    for (const TokenLogprobs& lp : chunk.prompt_logprobs) {
      add(lp, kMaxTopLogprobs, msg.add_prompt_logprobs());
    }
    if (info) {
      v1::Finished* f = msg.mutable_finished();
      f->set_reason(ToProto(info->reason));
      f->set_matched_stop(info->matched_stop);
      f->set_error(info->error);
      f->mutable_usage()->set_prompt_tokens(info->prompt_tokens);
      f->mutable_usage()->set_completion_tokens(info->completion_tokens);
      f->mutable_usage()->set_cached_prompt_tokens(info->cached_prompt_tokens);
      if (!reasoning_tokens_.empty()) {
        f->mutable_usage()->set_reasoning_tokens(reasoning_tokens_[index].total);
      }
      f->set_queue_time_ms(info->queue_time_ms);
      f->set_time_to_first_token_ms(info->time_to_first_token_ms);
      f->set_total_time_ms(info->total_time_ms);
      f->set_cumulative_logprob(info->cumulative_logprob);
      if (!calls.empty()) {
        f->set_reason(v1::FINISH_REASON_TOOL_CALLS);
        for (ToolCall& c : calls) {
          v1::ToolCall* out = f->add_tool_calls();
          out->set_id(std::move(c.id));
          out->set_name(std::move(c.name));
          out->set_arguments(std::move(c.arguments));
        }
      }
    }
    const v1::GenerateResponse* start = nullptr;
    bool merged = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (finished_) return;
      if (info) ++finals_queued_;
      if (info && trace_ && index >= 0 && index < n_) trace_->finished[index] = msg.finished();
      const uint64_t before = queue_.merged_chunks();
      start = queue_.Push(std::move(msg));
      merged = queue_.merged_chunks() != before;
    }
    if (merged && merged_chunks_counter_ != nullptr) merged_chunks_counter_->Add();
    if (start) {
      KVRM_GRPC_HANDOFF(this);
      StartWrite(start);
    }
  }

  Engine* engine_;
  const Tokenizer* tokenizer_;
  const std::string request_id_;
  const bool omit_token_ids_;
  const int32_t top_logprobs_;
  const int32_t n_;
  Counter* const merged_chunks_counter_;  // null: not counted
  std::unique_ptr<GenerationRequest> follower_;  // set before the leader is submitted
  // One per completion when the request offered tools (set before the leader is submitted;
  // then only the engine thread touches them).
  std::vector<std::unique_ptr<ToolCallStream>> tool_streams_;
  // Likewise, one per completion of a chat request to a model that thinks.
  std::vector<std::unique_ptr<ReasoningStream>> reasoning_streams_;
  std::vector<std::unique_ptr<HarmonyStream>> harmony_streams_;  // or one that speaks harmony
  struct ReasoningTokens {
    int32_t total = 0;  // counted as thinking
    int32_t held = 0;   // before the reply began: thinking if the block opens next
  };
  std::vector<ReasoningTokens> reasoning_tokens_;  // per completion, with reasoning_streams_
  // response.prompt_token_ids (set before the leader is submitted): the prompt, and per
  // completion whether its first message is still to come (then only its feeder touches it).
  std::vector<int32_t> prompt_ids_;
  std::vector<uint8_t> prompt_ids_pending_;
  const ToolCallMetrics* tool_metrics_ = nullptr;
  std::atomic<bool> followers_submitted_{false};
  std::atomic<int> refs_{1};  // gRPC's reference; MakeSink adds the engine's
  std::mutex mu_;
  std::vector<uint64_t> handles_;             // guarded by mu_; 0: not submitted
  std::unique_ptr<Trace> trace_;  // set before anything is submitted; its fields under mu_
  std::function<void()> cancel_hook_;         // guarded by mu_: a beam search's Cancel
  ResponseQueue queue_;                       // guarded by mu_
  int32_t finals_queued_ = 0;                 // guarded by mu_: completions whose end is queued
  bool cancelled_ = false;                    // guarded by mu_: the client cancelled or left
  bool finished_ = false;                     // guarded by mu_: Finish called or about to be
};

// A beam search (GenerateRequest.beam_search): each step scores every live beam by one engine
// request (the call's prompt and the beam's tokens; one token; the top 2n logprobs), as vLLM's
// beam search does, and server/beam_search.h picks the n that go on. The prefix cache holds what
// the beams share, so a step prefills only each beam's last block. Steps after the first are
// submitted from the engine thread as the previous one's last request ends; the call's n
// completions (its reactor's sinks, held until then) get the best beams at the end.
class BeamSearchRun : public std::enable_shared_from_this<BeamSearchRun> {
 public:
  BeamSearchRun(Engine* engine, const Tokenizer* tokenizer, std::unique_ptr<GenerationRequest> base,
                BeamSearchConfig config, std::vector<std::shared_ptr<RequestSink>> outputs)
      : engine_(engine),
        tokenizer_(tokenizer),
        base_(std::move(base)),
        config_(std::move(config)),
        max_tokens_(base_->max_new_tokens),
        outputs_(std::move(outputs)),
        beams_(1) {}

  ~BeamSearchRun() {
    if (lora_pin_ >= 0) engine_->UnpinLoraAdapter(lora_pin_);
  }

  // Submits the first step (the prompt alone); its refusal (a full queue, an adapter not
  // served) is the call's. The call's LoRA adapter is held in its slot until the search ends,
  // as a running request holds it: no on-demand load evicts it between two steps, and every
  // step runs with this load of it.
  absl::Status Start() {
    std::lock_guard<std::mutex> lock(mu_);
    ASSIGN_OR_RETURN(lora_pin_, engine_->PinLoraAdapter(base_.get()));
    const absl::Status submitted = SubmitStep(/*admitted=*/false);
    // Refused: let go of the adapter before the client hears of it, as a request's end does.
    if (!submitted.ok() && lora_pin_ >= 0) engine_->UnpinLoraAdapter(std::exchange(lora_pin_, -1));
    return submitted;
  }

  // The client left (the reactor's cancel hook): the step's requests are cancelled now (their
  // slots and KV freed at the engine's next step), and the search ends with them.
  void Cancel() {
    std::vector<uint64_t> handles;
    {
      std::lock_guard<std::mutex> lock(mu_);
      client_cancelled_ = true;
      handles = handles_;
    }
    for (uint64_t h : handles) engine_->Cancel(h);
  }

 private:
  class StepSink final : public RequestSink {
   public:
    StepSink(std::shared_ptr<BeamSearchRun> run, size_t beam) : run_(std::move(run)), beam_(beam) {}
    void OnChunk(StreamChunk) override {}  // one token: the end carries it
    void OnFinished(StreamChunk last, const FinishInfo& info) override {
      run_->Scored(beam_, last, info);
    }

   private:
    std::shared_ptr<BeamSearchRun> run_;
    const size_t beam_;
  };

  // One request per live beam. On a refusal nothing of the step is running.
  absl::Status SubmitStep(bool admitted) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    scored_.assign(beams_.size(), {});
    pending_ = beams_.size();
    handles_.clear();
    for (size_t b = 0; b < beams_.size(); ++b) {
      auto r = std::make_unique<GenerationRequest>(*base_);
      r->prompt.insert(r->prompt.end(), beams_[b].tokens.begin(), beams_[b].tokens.end());
      r->request_id = absl::StrCat(base_->request_id, "/beam", step_, ".", b);
      r->max_new_tokens = 1;
      r->ignore_eos = true;  // the EOS is a candidate like any other here; the search decides
      r->sampling.logprobs = true;
      r->sampling.top_logprobs = std::min(2 * config_.width, kMaxTopLogprobs);
      r->arrival = absl::Now();  // the engine's latency metrics time this request, not the call
      r->sink = std::make_shared<StepSink>(shared_from_this(), b);
      absl::StatusOr<uint64_t> handle = engine_->Submit(std::move(r), admitted);
      if (handle.ok()) {
        handles_.push_back(*handle);
        if (client_cancelled_) engine_->Cancel(*handle);
      }
      if (!handle.ok()) {
        if (b == 0) return handle.status();
        // The rest of the step is submitted: it ends, then the search ends with this error.
        pending_ -= beams_.size() - b;
        error_ = std::string(handle.status().message());
        return absl::OkStatus();
      }
    }
    return absl::OkStatus();
  }

  // Beam `beam`'s scoring request ended (the engine thread).
  void Scored(size_t beam, const StreamChunk& last, const FinishInfo& info) {
    std::unique_lock<std::mutex> lock(mu_);
    if (step_ == 0) {
      queue_time_ms_ = info.queue_time_ms;
      cached_prompt_tokens_ = info.cached_prompt_tokens;
    }
    if (info.reason == FinishReason::kCancelled) {
      cancelled_by_engine_ = true;
    } else if (info.reason == FinishReason::kError || last.logprobs.empty()) {
      if (error_.empty()) error_ = info.error.empty() ? "a beam was not scored" : info.error;
    } else if (beam < scored_.size()) {
      const TokenLogprobs& lp = last.logprobs.front();
      for (int32_t i = 0; i < lp.num_top; ++i) {
        scored_[beam].emplace_back(lp.top_ids[i], lp.top_logprobs[i]);
      }
    }
    if (--pending_ > 0) return;
    if (!error_.empty()) return End(FinishReason::kError);
    if (cancelled_by_engine_ || client_cancelled_) return End(FinishReason::kCancelled);
    beams_ = BeamStep(beams_, scored_, config_, &completed_);
    ++step_;
    // Done at the limit, with no beam left, or with the context full (a step's prompt is the
    // call's and every beam token so far: the engine needs room for one more).
    const int64_t context = engine_->options().max_context;
    if (step_ >= max_tokens_ || beams_.empty() ||
        static_cast<int64_t>(base_->prompt.size()) + step_ >= context) {
      return End(FinishReason::kLength);
    }
    if (absl::Status s = SubmitStep(/*admitted=*/true); !s.ok()) {
      error_ = std::string(s.message());
      End(FinishReason::kError);
    }
  }

  // The call's completions: the best beams, or every one ended with `reason` (cancelled, an
  // error); kLength: the search is done.
  void End(FinishReason reason) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<std::shared_ptr<RequestSink>> outputs = std::move(outputs_);
    outputs_.clear();
    if (lora_pin_ >= 0) engine_->UnpinLoraAdapter(std::exchange(lora_pin_, -1));
    const double total_ms = absl::ToDoubleMilliseconds(absl::Now() - base_->arrival);
    std::vector<Beam> best;
    if (reason == FinishReason::kLength) best = BestBeams(completed_, beams_, config_);
    for (size_t i = 0; i < outputs.size(); ++i) {
      FinishInfo info;
      info.prompt_tokens = static_cast<int32_t>(base_->prompt.size());
      info.cached_prompt_tokens = cached_prompt_tokens_;
      info.queue_time_ms = std::max(0.0, queue_time_ms_);
      info.total_time_ms = total_ms;
      StreamChunk chunk;
      if (reason != FinishReason::kLength) {
        info.reason = reason;
        info.error = reason == FinishReason::kError ? error_ : "";
      } else if (i >= best.size()) {
        info.reason = FinishReason::kError;
        info.error = absl::StrCat("beam search kept ", best.size(), " beams of ", outputs.size(),
                                  " (too few tokens could be scored)");
      } else {
        const Beam& beam = best[i];
        info.reason = beam.ended ? FinishReason::kEos : FinishReason::kLength;
        info.completion_tokens = static_cast<int32_t>(beam.tokens.size());
        info.cumulative_logprob = beam.cum_logprob;
        info.time_to_first_token_ms = total_ms;  // the whole beam comes at once
        chunk.token_ids = beam.tokens;
        chunk.text = BeamText(beam);
      }
      outputs[i]->OnFinished(std::move(chunk), info);
    }
  }

  // A beam's text as the engine writes a sampled completion's (TextStream): the request's kept
  // special tokens (a thinking model's markers, gpt-oss's harmony) and the last prompt tokens as
  // context for the first token's leading space; an ended beam's end token not written.
  std::string BeamText(const Beam& beam) const {
    const std::vector<int32_t>& prompt = base_->prompt;
    const size_t context = std::min<size_t>(5, prompt.size());
    const Tokenizer* tok = tokenizer_;
    TextStream stream([tok, kept = base_->kept_special_tokens](
                          absl::Span<const int32_t> ids) { return tok->DecodeKeeping(ids, kept); },
                      {}, std::vector<int32_t>(prompt.end() - context, prompt.end()));
    std::string text;
    const size_t n = beam.tokens.size() - (beam.ended ? 1 : 0);
    for (size_t i = 0; i < n; ++i) text += stream.Push(beam.tokens[i]).text;
    return text + stream.Finish();
  }

  Engine* const engine_;
  const Tokenizer* const tokenizer_;
  const std::unique_ptr<GenerationRequest> base_;  // the validated request each step copies
  const BeamSearchConfig config_;
  const int32_t max_tokens_;
  std::mutex mu_;  // Start (the caller's thread) against the first step's end (the engine's)
  std::vector<std::shared_ptr<RequestSink>> outputs_ ABSL_GUARDED_BY(mu_);
  std::vector<Beam> beams_ ABSL_GUARDED_BY(mu_);  // live; one empty beam: the prompt alone
  std::vector<Beam> completed_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<std::pair<int32_t, float>>> scored_ ABSL_GUARDED_BY(mu_);
  size_t pending_ ABSL_GUARDED_BY(mu_) = 0;
  int32_t step_ ABSL_GUARDED_BY(mu_) = 0;
  std::string error_ ABSL_GUARDED_BY(mu_);
  bool cancelled_by_engine_ ABSL_GUARDED_BY(mu_) = false;
  bool client_cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<uint64_t> handles_ ABSL_GUARDED_BY(mu_);  // the step's requests
  double queue_time_ms_ ABSL_GUARDED_BY(mu_) = 0;
  int32_t cached_prompt_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  int32_t lora_pin_ ABSL_GUARDED_BY(mu_) = -1;  // the adapter slot held (-1: none)
};

// A pooling call's (Embed, Classify, Score): one engine request per input, the reply built
// from their pooled vectors when the last has ended. It holds a reference for gRPC until OnDone,
// one per input until the engine ends that input's request, and one for the thread that submits
// them while it does; the last one deletes it.
class PoolingReactor final : public grpc::ServerUnaryReactor {
 public:
  struct Pooled {
    std::vector<float> vector;  // the pooled final hidden state, as the engine gives it
    int32_t prompt_tokens = 0;
    int32_t cached_prompt_tokens = 0;
  };
  // Turns one input's pooled vector into what the reply needs of it (normalized, the head's
  // logits), on the engine thread as that input ends: the work is spread over the call's inputs
  // and what is held until the last is small.
  using Each = std::function<void(std::vector<float>*)>;
  // Fills the response from every input's vector, in input order; called once, when all ended
  // well (then the call ends with the status it returns).
  using Reply = std::function<grpc::Status(std::vector<Pooled>)>;
  // Names input i in errors ("inputs[2]", "documents[2]").
  using Name = std::function<std::string(int32_t)>;

  PoolingReactor(Engine* engine, int32_t inputs, Each each, Reply reply, Name name)
      : engine_(engine),
        each_(std::move(each)),
        reply_(std::move(reply)),
        name_(std::move(name)),
        pooled_(inputs),
        handles_(inputs, 0),
        pending_(inputs + 1) {}

  class Sink final : public RequestSink {
   public:
    Sink(PoolingReactor* reactor, int32_t index) : reactor_(reactor), index_(index) {}
    void OnChunk(StreamChunk) override {}
    void OnFinished(StreamChunk last, const FinishInfo& info) override {
      reactor_->Ended(index_, std::move(last), info);
    }

   private:
    PoolingReactor* const reactor_;
    const int32_t index_;
  };

  // Submits every input (on the gRPC thread). When the engine refuses one (a full queue, a
  // drain, an adapter not served), those submitted are cancelled and the call ends with the
  // refusal once they have.
  void Start(grpc::CallbackServerContext* context,
             std::vector<std::unique_ptr<GenerationRequest>> inputs, const std::string& id,
             absl::Time arrival) {
    refs_.fetch_add(1);  // the submitter's, until it has counted itself out
    const int32_t n = static_cast<int32_t>(inputs.size());
    int32_t submitted = 0;
    for (; submitted < n; ++submitted) {
      std::unique_ptr<GenerationRequest>& r = inputs[submitted];
      r->request_id = submitted == 0 ? id : absl::StrCat(id, "/", submitted);
      r->arrival = arrival;
      r->sink = std::make_shared<Sink>(this, submitted);
      refs_.fetch_add(1);
      // The call is admitted (or refused) as a whole: only its first input meets the queue
      // bound and a drain, as Generate's n completions do.
      absl::StatusOr<uint64_t> handle =
          engine_->Submit(std::move(r), /*admitted_call=*/submitted > 0);
      if (!handle.ok()) {
        refs_.fetch_sub(1);  // (never submitted: no sink will end)
        if (absl::IsResourceExhausted(handle.status())) {
          context->AddTrailingMetadata("retry-after-ms", "1000");
        }
        std::lock_guard<std::mutex> lock(mu_);
        status_ = ToGrpcStatus(handle.status());
        cancelled_ = true;
        break;
      }
      bool cancel;
      {
        std::lock_guard<std::mutex> lock(mu_);
        handles_[submitted] = *handle;
        cancel = cancelled_;
      }
      if (cancel) engine_->Cancel(*handle);
    }
    if (submitted < n) CancelAll();
    // The submitter's count, and the inputs never submitted.
    KVRM_GRPC_HANDOFF(this);
    Count(1 + n - submitted);
    Unref();
  }

  // A traced call (server/tracing.h): its span, recorded with the inputs' usage and the call's
  // status when the reactor goes. Set before Start or Fail.
  void set_trace(Tracer* tracer, otlp::Span root, absl::Time start) {
    tracer_ = tracer;
    trace_root_ = std::move(root);
    trace_start_ = start;
  }

  // Ends the call with `status` instead of starting it (an on-demand adapter that did not load):
  // nothing was submitted.
  void Fail(const grpc::Status& status) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (status_.ok()) status_ = status;
    }
    KVRM_GRPC_HANDOFF(this);
    Count(static_cast<int32_t>(handles_.size()) + 1);
  }

  void OnCancel() override {
    KVRM_GRPC_CALLBACK(this);
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancelled_ = true;
      // (After the call ended, what it ended with stands.)
      if (status_.ok() && !ended_) {
        status_ = grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
      }
    }
    CancelAll();
  }

  void OnDone() override {
    KVRM_GRPC_CALLBACK(this);
    Unref();
  }

 private:
  // On the engine thread: input `index` ended.
  void Ended(int32_t index, StreamChunk last, const FinishInfo& info) {
    bool cancel_rest = false;
    const bool pooled = info.reason == FinishReason::kStop && !last.embedding.empty();
    if (pooled && each_) each_(&last.embedding);  // this input's alone: no lock needed
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (pooled) {
        Pooled& p = pooled_[index];
        p.vector = std::move(last.embedding);
        p.prompt_tokens = info.prompt_tokens;
        p.cached_prompt_tokens = info.cached_prompt_tokens;
        traced_input_tokens_ += info.prompt_tokens;
        traced_cached_tokens_ += info.cached_prompt_tokens;
      } else if (status_.ok()) {
        // The first input that failed decides the call's status; the rest are not needed.
        const std::string which = name_(index) + ": ";
        switch (info.reason) {
          case FinishReason::kCancelled:
            status_ = grpc::Status(grpc::StatusCode::CANCELLED, which + "cancelled");
            break;
          case FinishReason::kTimeLimit:
            status_ = grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED, which + "time limit");
            break;
          default:
            status_ = grpc::Status(grpc::StatusCode::INTERNAL,
                                   which + (info.error.empty() ? "no hidden state" : info.error));
        }
        cancel_rest = !cancelled_;
        cancelled_ = true;
      }
    }
    if (cancel_rest) CancelAll();
    Count(1);
    Unref();
  }

  // `n` of the pending inputs (or the submitter) are done; the last one sends the reply.
  void Count(int32_t n) {
    grpc::Status status;
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_ -= n;
      if (pending_ > 0) return;
      status = status_;
    }
    // Every input has ended: nothing writes pooled_ any more.
    if (status.ok()) status = reply_(std::move(pooled_));
    {
      std::lock_guard<std::mutex> lock(mu_);
      status_ = status;  // the reply's own failure included
      ended_ = true;
    }
    // The response was written on this thread (the engine's, or the submitter's): gRPC reads
    // and frees it on its own after Finish (OnDone acquires this).
    KVRM_GRPC_HANDOFF(this);
    Finish(status);
  }

  void CancelAll() { CancelSubmitted(engine_, &mu_, handles_); }

  ~PoolingReactor() override {
    if (tracer_ == nullptr) return;
    // The last reference is going: nothing else touches the reactor.
    otlp::Span root = std::move(trace_root_);
    SetTimes(&root, trace_start_, absl::Now());
    AddInt(&root, "gen_ai.usage.input_tokens", traced_input_tokens_);
    AddInt(&root, "kvrm.usage.cached_input_tokens", traced_cached_tokens_);
    AddInt(&root, "kvrm.inputs", static_cast<int64_t>(handles_.size()));
    SetCallOutcome(&root, status_);
    std::vector<otlp::Span> spans;
    spans.push_back(std::move(root));
    tracer_->Record(std::move(spans));
  }

  void Unref() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  Engine* const engine_;
  const Each each_;
  const Reply reply_;
  const Name name_;
  std::mutex mu_;
  std::vector<Pooled> pooled_;     // guarded by mu_: [inputs]
  std::vector<uint64_t> handles_;  // guarded by mu_: [inputs], 0 until submitted
  int32_t pending_;                // guarded by mu_: inputs not ended, + 1 while submitting
  grpc::Status status_;  // guarded by mu_: the call's, OK until something failed; final once ended_
  bool cancelled_ = false;         // guarded by mu_
  std::atomic<int32_t> refs_{1};   // gRPC's (OnDone), the submitter's, one per submitted input
  bool ended_ = false;             // guarded by mu_: Count ended the call (status_ is final)
  // Tracing (null tracer: none); set before anything is submitted, the counts under mu_.
  Tracer* tracer_ = nullptr;
  otlp::Span trace_root_;
  absl::Time trace_start_;
  int64_t traced_input_tokens_ = 0;
  int64_t traced_cached_tokens_ = 0;
};

namespace {

grpc::ServerUnaryReactor* FinishUnary(grpc::CallbackServerContext* context,
                                      const grpc::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(status);
  return reactor;
}

}  // namespace

grpc::Status ToGrpcStatus(const absl::Status& status) {
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

grpc::Status KvrmService::CheckAuth(const grpc::CallbackServerContext* context) const {
  if (auth_ == nullptr) return grpc::Status::OK;
  const auto& md = context->client_metadata();
  auto it = md.find("authorization");
  if (it == md.end()) return ToGrpcStatus(auth_->Check(absl::string_view()));
  return ToGrpcStatus(auth_->Check(absl::string_view(it->second.data(), it->second.size())));
}

KvrmService::KvrmService(Engine* engine, ServiceInfo info)
    : engine_(engine), info_(std::move(info)), started_(absl::Now()) {
  limits_.vocab_size = engine->model().config.vocab_size;
  limits_.max_context = engine->options().max_context;
  limits_.max_new_tokens = engine->options().max_new_tokens;
  limits_.default_thinking_budget = info_.default_thinking_budget;
  structured::CompilerOptions compile;
  // A quarter of the cores walk one constraint's states (results do not depend on it); the
  // rest stay with the engine, which on the CPU backend uses them all.
  compile.limits.threads =
      std::clamp(static_cast<int32_t>(std::thread::hardware_concurrency()) / 4, 1, 8);
  structured_ = std::make_unique<structured::ConstraintCompiler>(
      StructuredTokenBytes(engine->model()), compile);
  compile_queue_ = std::make_unique<WorkQueue>(kCompileThreads, kCompileQueue);
  lora_queue_ = std::make_unique<WorkQueue>(1, kLoraLoadQueue);
  // Loads read and cut adapters on the cores the engine uses: they take what it leaves (on 2
  // cores, a load every 500 ms cost decoding requests 25 % of their tok/s at normal priority and
  // 6-9 % at this; docs/benchmarks.md, "loads while serving").
  lora_queue_->TryPost([] { LowerThisThreadsPriority(); });
  // Markers that are special tokens would be skipped in decoded text: requests keep them.
  tool_syntax_ = MakeToolCallSyntax(engine->model().chat.tool_call_format);
  const Tokenizer& tok = *engine->model().tokenizer;
  for (std::string_view marker : ToolCallMarkers(tool_syntax_.format)) {
    if (std::optional<int32_t> id = tok.TokenToId(marker); id && tok.IsSpecial(*id)) {
      tool_syntax_.marker_tokens.push_back(*id);
    }
  }
  for (std::string_view marker : {kThinkStart, kThinkEnd}) {
    if (std::optional<int32_t> id = tok.TokenToId(marker); id && tok.IsSpecial(*id)) {
      reasoning_marker_tokens_.push_back(*id);
    }
  }
  if (engine->model().chat.reasoning_format == ReasoningFormat::kHarmony) {
    for (std::string_view marker : kHarmonyMarkers) {
      if (std::optional<int32_t> id = tok.TokenToId(marker); id && tok.IsSpecial(*id)) {
        reasoning_marker_tokens_.push_back(*id);
      }
    }
  }
}

void KvrmService::SetStructuredOutputMetrics(const StructuredOutputMetrics* metrics) {
  structured_metrics_ = metrics;
  if (metrics == nullptr) return;
  structured_->SetObserver([metrics](const structured::ConstraintCompiler::Event& e) {
    if (e.cache_hit) {
      metrics->cache_hits->Add();
      return;
    }
    metrics->compiles->Add();
    if (e.refused) metrics->refusals->Add();
    metrics->compile_seconds->Observe(e.seconds);
  });
}

grpc::ServerWriteReactor<v1::GenerateResponse>* KvrmService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  const absl::Time arrival = absl::Now();
  std::string id = request->request_id().empty()
                       ? absl::StrCat("req-", next_id_.fetch_add(1))
                       : request->request_id();
  auto* reactor = new GenerateReactor(engine_, engine_->model().tokenizer.get(), id,
                                      request->response().omit_token_ids(),
                                      request->response().top_logprobs(),
                                      // Validated below; clamped here, before anything is
                                      // sized from it.
                                      std::clamp(request->n(), 1, limits_.max_n),
                                      merged_chunks_counter_, max_merged_bytes_);
  if (tracer_ != nullptr) StartTrace(*context, *request, id, arrival, reactor);
  if (grpc::Status s = CheckAuth(context); !s.ok()) { reactor->Reject(s); return reactor; }
  if (!lora_dir_.empty() && !request->lora_adapter().empty() &&
      !engine_->ServesLoraAdapter(request->lora_adapter())) {
    // An adapter not served, to be loaded from --lora_dir first, on the adapter thread (which
    // then compiles a new constraint too, as a compile thread would).
    SubmitOffThread(
        lora_queue_.get(), "lora_adapter: too many adapter loads waiting",
        [this, request] { return LoadOnDemand(request->lora_adapter()); }, context, request,
        reactor, std::move(id), arrival);
    return reactor;
  }
  if (request->has_structured() || request->has_chat()) {
    const bool harmony = IsHarmonyChat(*request, &engine_->model().chat);
    absl::StatusOr<std::optional<StructuredField>> f =
        RequestConstraint(*request, limits_, harmony);
    // A constraint behind a thinking block is compiled for the way the prompt leaves it, known
    // once the prompt is rendered: either must be compiled already.
    using Thinking = structured::ConstraintSpec::Thinking;
    bool cached = true;
    if (f.ok() && f->has_value()) {
      structured::ConstraintSpec spec = (*f)->spec;
      const bool thinking = ConstraintFollowsThinking(*request, &engine_->model().chat);
      for (Thinking t : !thinking ? std::vector<Thinking>{Thinking::kNone}
                        : harmony ? std::vector<Thinking>{Thinking::kHarmony}
                                  : std::vector<Thinking>{Thinking::kInside, Thinking::kMayOpen}) {
        spec.thinking = t;
        cached = cached && structured_->Contains(spec);
      }
    }
    if (!cached) {
      // A constraint not compiled yet can take up to a second: on a compile thread.
      SubmitOffThread(compile_queue_.get(),
                      "structured: too many new constraints waiting to compile", nullptr, context,
                      request, reactor, std::move(id), arrival);
      return reactor;
    }
  }
  ValidateAndSubmit(context, *request, reactor, std::move(id), arrival);
  return reactor;
}

std::optional<otlp::Span> KvrmService::TraceRoot(const grpc::CallbackServerContext& context,
                                                 const char* operation,
                                                 const std::string& lora_adapter) {
  // The caller's trace context (W3C traceparent / tracestate metadata; the HTTP API passes its
  // headers of those names on).
  std::optional<TraceParent> parent;
  const auto& metadata = context.client_metadata();
  // More than one traceparent is invalid (W3C): the call then starts a trace of its own.
  if (auto it = metadata.find("traceparent");
      it != metadata.end() && metadata.count("traceparent") == 1) {
    absl::string_view state;
    if (auto st = metadata.find("tracestate"); st != metadata.end()) {
      state = absl::string_view(st->second.data(), st->second.size());
    }
    parent = ParseTraceParent(absl::string_view(it->second.data(), it->second.size()), state);
  }
  if (!tracer_->ShouldTrace(parent)) return std::nullopt;
  otlp::Span root;
  const TraceId trace_id = parent ? parent->trace_id : Tracer::NewTraceId();
  const SpanId span_id = Tracer::NewSpanId();
  root.set_trace_id(trace_id.data(), trace_id.size());
  root.set_span_id(span_id.data(), span_id.size());
  if (parent) {
    root.set_parent_span_id(parent->span_id.data(), parent->span_id.size());
    root.set_trace_state(parent->trace_state);
  }
  // W3C trace flags (sampled); with a caller's context, OTLP's "the parent is remote" bits.
  constexpr uint32_t kHasIsRemote = 0x100, kIsRemote = 0x200;
  root.set_flags(parent ? (parent->flags | kHasIsRemote | kIsRemote) : 1u);
  root.set_kind(otlp::Span::SPAN_KIND_SERVER);
  // The GenAI semantic conventions' name and attributes: "{operation} {model}".
  const std::string& model = lora_adapter.empty() ? info_.served_model_name : lora_adapter;
  root.set_name(absl::StrCat(operation, " ", model));
  AddString(&root, "gen_ai.operation.name", operation);
  AddString(&root, "gen_ai.system", "kvrm");
  AddString(&root, "gen_ai.request.model", model);
  if (!lora_adapter.empty()) AddString(&root, "kvrm.lora_adapter", lora_adapter);
  AddString(&root, "kvrm.kv_mode", info_.kv_mode);
  return root;
}

void KvrmService::StartTrace(const grpc::CallbackServerContext& context,
                             const v1::GenerateRequest& request, const std::string& id,
                             absl::Time arrival, GenerateReactor* reactor) {
  std::optional<otlp::Span> traced =
      TraceRoot(context, request.has_chat() ? "chat" : "text_completion", request.lora_adapter());
  if (!traced) return;
  auto trace = std::make_unique<GenerateReactor::Trace>();
  trace->tracer = tracer_;
  trace->start = arrival;
  trace->root = *std::move(traced);
  otlp::Span& root = trace->root;
  AddString(&root, "gen_ai.response.id", id);
  AddInt(&root, "gen_ai.request.max_tokens", request.stopping().max_new_tokens());
  const v1::SamplingParams& s = request.sampling();
  AddDouble(&root, "gen_ai.request.temperature", s.temperature());
  if (s.top_p() > 0) AddDouble(&root, "gen_ai.request.top_p", s.top_p());
  if (s.top_k() > 0) AddInt(&root, "gen_ai.request.top_k", s.top_k());
  if (request.n() > 1) AddInt(&root, "gen_ai.request.choice.count", request.n());
  if (request.priority() != 0) AddInt(&root, "kvrm.priority", request.priority());
  reactor->set_trace(std::move(trace));
}

void KvrmService::SubmitOffThread(WorkQueue* queue, const char* when_full,
                                  std::function<absl::Status()> first,
                                  grpc::CallbackServerContext* context,
                                  const v1::GenerateRequest* request, GenerateReactor* reactor,
                                  std::string id, absl::Time arrival) {
  // The gRPC thread must never block; the request proto and context live until the call is
  // finished.
  const bool posted = queue->TryPost([this, first = std::move(first), context, request, reactor,
                                      id = std::move(id), arrival]() mutable {
    if (reactor->cancelled()) {
      reactor->Reject(grpc::Status(grpc::StatusCode::CANCELLED, "cancelled"));
      return;
    }
    if (first) {
      if (const absl::Status st = first(); !st.ok()) {
        // Busy (every adapter slot with requests running): worth a retry once they end.
        if (absl::IsResourceExhausted(st)) context->AddTrailingMetadata("retry-after-ms", "1000");
        reactor->Reject(ToGrpcStatus(st));
        return;
      }
    }
    ValidateAndSubmit(context, *request, reactor, std::move(id), arrival);
  });
  if (!posted) {
    context->AddTrailingMetadata("retry-after-ms", "1000");
    reactor->Reject(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, when_full));
    return;
  }
  KVRM_GRPC_HANDOFF(reactor);
}

void KvrmService::ValidateAndSubmit(grpc::CallbackServerContext* context,
                                    const v1::GenerateRequest& request, GenerateReactor* reactor,
                                    std::string id, absl::Time arrival) {
  structured::ConstraintSpec::Thinking thinking = structured::ConstraintSpec::Thinking::kNone;
  absl::StatusOr<std::unique_ptr<GenerationRequest>> r =
      ValidateGenerateRequest(request, *engine_->model().tokenizer, limits_,
                              &engine_->model().chat, structured_.get(), &thinking);
  if (!r.ok()) {
    reactor->Reject(ToGrpcStatus(r.status()));
    return;
  }
  absl::StatusOr<std::optional<ToolCalling>> tools = ToolCallingFromProto(
      request, tool_syntax_.format, limits_, IsHarmonyChat(request, &engine_->model().chat));
  if (!tools.ok()) {
    reactor->Reject(ToGrpcStatus(tools.status()));
    return;
  }
  if (thinking == structured::ConstraintSpec::Thinking::kInside ||
      thinking == structured::ConstraintSpec::Thinking::kMayOpen) {
    // A chat request to a model that thinks: kInside when the prompt opened the block.
    reactor->set_reasoning(thinking == structured::ConstraintSpec::Thinking::kInside);
    (*r)->kept_special_tokens = reasoning_marker_tokens_;
  }
  if (IsHarmonyChat(request, &engine_->model().chat)) {
    // gpt-oss: its messages' markers stay in the text for HarmonyStream, which hands function
    // calls (auto mode) to the tool-call stream as Hermes markup.
    reactor->set_harmony(tools->has_value() && (*tools)->parse &&
                         (*tools)->mode == ToolCallStream::Mode::kAuto);
    (*r)->kept_special_tokens = reasoning_marker_tokens_;
  }
  if (tools->has_value()) {
    if ((*tools)->parse) {
      if ((*tools)->mode == ToolCallStream::Mode::kAuto) {
        (*r)->kept_special_tokens.insert((*r)->kept_special_tokens.end(),
                                         tool_syntax_.marker_tokens.begin(),
                                         tool_syntax_.marker_tokens.end());
      }
      reactor->set_tool_calling(**tools, &tool_syntax_, tool_metrics_);
    }
    if (tool_metrics_ != nullptr) tool_metrics_->requests[(*tools)->choice]->Add();
  }
  if (structured_metrics_ != nullptr && request.has_structured()) {
    // The constraint case numbers are regex = 1 ... choice = 4, the metric's kinds in order;
    // grammar (7) is its fifth.
    const v1::StructuredOutput::ConstraintCase c = request.structured().constraint_case();
    const int kind = c == v1::StructuredOutput::kGrammar ? 4 : static_cast<int>(c) - 1;
    if (kind >= 0 && kind < 5) structured_metrics_->requests[kind]->Add();
  }
  (*r)->request_id = std::move(id);
  (*r)->arrival = arrival;
  if (request.response().prompt_token_ids()) reactor->set_prompt_token_ids((*r)->prompt);
  if (request.n() > 1) reactor->set_follower_template(**r);
  (*r)->sink = reactor->MakeSink(0);
  // From Submit on, the engine may finish the request and, off the gRPC thread (a compile
  // thread), gRPC end the call before set_handle: held until this function returns.
  GenerateReactor::Hold hold(reactor);
  if (request.has_beam_search()) {
    StartBeamSearch(context, request, std::move(*r), reactor);
    return;
  }
  absl::StatusOr<uint64_t> handle = engine_->Submit(std::move(*r));
  if (!handle.ok()) {
    if (absl::IsResourceExhausted(handle.status())) {
      context->AddTrailingMetadata("retry-after-ms", "1000");
    }
    reactor->Reject(ToGrpcStatus(handle.status()));
    return;
  }
  // Cancelled before its handle was known: OnCancel could not cancel it.
  if (reactor->set_handle(0, *handle)) engine_->Cancel(*handle);
  KVRM_GRPC_HANDOFF(reactor);
}

void KvrmService::StartBeamSearch(grpc::CallbackServerContext* context,
                                  const v1::GenerateRequest& request,
                                  std::unique_ptr<GenerationRequest> r, GenerateReactor* reactor) {
  BeamSearchConfig config;
  config.width = std::max(1, request.n());
  config.length_penalty =
      request.beam_search().has_length_penalty() ? request.beam_search().length_penalty() : 1.0;
  config.prompt_tokens = static_cast<int32_t>(r->prompt.size());
  config.eos_ids = engine_->model().config.eos_token_ids;  // the engine's end tokens
  config.ignore_eos = r->ignore_eos;
  std::vector<std::shared_ptr<RequestSink>> outputs;
  for (int32_t i = 0; i < config.width; ++i) outputs.push_back(reactor->MakeSink(i));
  r->sink.reset();
  auto run = std::make_shared<BeamSearchRun>(engine_, engine_->model().tokenizer.get(),
                                             std::move(r), std::move(config), std::move(outputs));
  reactor->set_beam_search([weak = std::weak_ptr<BeamSearchRun>(run)] {
    if (std::shared_ptr<BeamSearchRun> live = weak.lock()) live->Cancel();
  });
  if (absl::Status s = run->Start(); !s.ok()) {
    if (absl::IsResourceExhausted(s)) context->AddTrailingMetadata("retry-after-ms", "1000");
    reactor->Reject(ToGrpcStatus(s));
    return;
  }
  KVRM_GRPC_HANDOFF(reactor);
}

grpc::Status KvrmService::CheckQueueRoom(grpc::CallbackServerContext* context, int32_t inputs,
                                         const char* field) const {
  // A pooling call's inputs count against the queue bound together (its inputs after the first
  // are submitted past the bound, as one call's): one that could never fit is refused, one that
  // does not fit now is told to come back.
  const int32_t max_queue = engine_->options().max_queue;
  if (inputs > max_queue) {
    return grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat(field, ": ", inputs, " prompts to prefill; this server queues at most ",
                     max_queue, " (kvrmd --max_queue)"));
  }
  if (const int32_t queued = engine_->QueuedRequests(); queued + inputs > max_queue) {
    context->AddTrailingMetadata("retry-after-ms", "1000");
    return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                        absl::StrCat("queue full (", queued, " waiting requests; this call has ",
                                     inputs, " prompts)"));
  }
  return grpc::Status::OK;
}

grpc::Status KvrmService::PoolingRefusal(const char* rpc) const {
  if (!engine_->returns_hidden()) {
    return grpc::Status(grpc::StatusCode::UNIMPLEMENTED,
                        absl::StrCat(rpc,
                                     ": this device does not return hidden states "
                                     "(--device=cpu does)"));
  }
  return grpc::Status::OK;
}

grpc::ServerUnaryReactor* KvrmService::RefusePooling(grpc::CallbackServerContext* context,
                                                     const grpc::Status& status,
                                                     const char* operation,
                                                     const std::string& lora_adapter,
                                                     absl::Time arrival) {
  if (tracer_ != nullptr) {
    if (std::optional<otlp::Span> root = TraceRoot(*context, operation, lora_adapter)) {
      SetTimes(&*root, arrival, absl::Now());
      SetCallOutcome(&*root, status);
      std::vector<otlp::Span> spans;
      spans.push_back(*std::move(root));
      tracer_->Record(std::move(spans));
    }
  }
  return FinishUnary(context, status);
}

void KvrmService::StartPooling(grpc::CallbackServerContext* context, PoolingReactor* reactor,
                               std::vector<std::unique_ptr<GenerationRequest>> inputs,
                               const std::string& id, absl::Time arrival,
                               const std::string& lora_adapter, const char* operation) {
  if (tracer_ != nullptr) {
    if (std::optional<otlp::Span> root = TraceRoot(*context, operation, lora_adapter)) {
      AddString(&*root, "gen_ai.response.id", id);
      reactor->set_trace(tracer_, *std::move(root), arrival);
    }
  }
  if (lora_dir_.empty() || lora_adapter.empty() || engine_->ServesLoraAdapter(lora_adapter)) {
    reactor->Start(context, std::move(inputs), id, arrival);
    return;
  }
  // An adapter not served, loaded from --lora_dir first on the adapter thread, as Generate's.
  auto held = std::make_shared<std::vector<std::unique_ptr<GenerationRequest>>>(std::move(inputs));
  const bool posted =
      lora_queue_->TryPost([this, context, reactor, held, id, arrival, lora_adapter] {
        if (const absl::Status st = LoadOnDemand(lora_adapter); !st.ok()) {
          if (absl::IsResourceExhausted(st)) {
            context->AddTrailingMetadata("retry-after-ms", "1000");
          }
          reactor->Fail(ToGrpcStatus(st));
          return;
        }
        reactor->Start(context, std::move(*held), id, arrival);
      });
  if (!posted) {
    context->AddTrailingMetadata("retry-after-ms", "1000");
    reactor->Fail(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                               "lora_adapter: too many adapter loads waiting"));
  }
}

grpc::ServerUnaryReactor* KvrmService::Embed(grpc::CallbackServerContext* context,
                                             const v1::EmbedRequest* request,
                                             v1::EmbedResponse* response) {
  const absl::Time arrival = absl::Now();
  // A refusal before the inputs are submitted: traced as the call's end (RefusePooling).
  const auto refuse = [&](const grpc::Status& status) {
    return RefusePooling(context, status, "embeddings", request->lora_adapter(), arrival);
  };
  if (grpc::Status s = CheckAuth(context); !s.ok()) return refuse(s);
  if (grpc::Status s = PoolingRefusal("Embed"); !s.ok()) return refuse(s);
  if (!info_.embed_refusal.empty()) {
    return refuse(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                               absl::StrCat("Embed: ", info_.embed_refusal)));
  }
  absl::StatusOr<EmbedPlan> plan =
      ValidateEmbedRequest(*request, *engine_->model().tokenizer, limits_, info_.pooling,
                           info_.embedding_normalize, engine_->model().config.hidden_size);
  if (!plan.ok()) return refuse(ToGrpcStatus(plan.status()));
  const int32_t inputs = static_cast<int32_t>(plan->inputs.size());
  if (grpc::Status s = CheckQueueRoom(context, inputs, "inputs"); !s.ok()) {
    return refuse(s);
  }
  const std::string id = request->request_id().empty() ? absl::StrCat("emb-", next_id_.fetch_add(1))
                                                       : request->request_id();
  response->set_request_id(id);
  response->set_pooling(plan->pooling == Pooling::kMean  ? v1::POOLING_MEAN
                        : plan->pooling == Pooling::kCls ? v1::POOLING_CLS
                                                         : v1::POOLING_LAST);
  auto each = [dimensions = plan->dimensions, normalize = plan->normalize](std::vector<float>* v) {
    FinishEmbedding(dimensions, normalize, v);
  };
  auto reply = [response](std::vector<PoolingReactor::Pooled> pooled) {
    for (PoolingReactor::Pooled& p : pooled) {
      v1::Embedding* e = response->add_embeddings();
      e->mutable_values()->Assign(p.vector.begin(), p.vector.end());
      e->set_prompt_tokens(p.prompt_tokens);
      e->set_cached_prompt_tokens(p.cached_prompt_tokens);
      response->set_prompt_tokens(response->prompt_tokens() + p.prompt_tokens);
    }
    return grpc::Status::OK;
  };
  auto* reactor = new PoolingReactor(engine_, inputs, std::move(each), std::move(reply),
                                     [](int32_t i) { return absl::StrCat("inputs[", i, "]"); });
  StartPooling(context, reactor, std::move(plan->inputs), id, arrival, request->lora_adapter(),
               "embeddings");
  return reactor;
}

grpc::ServerUnaryReactor* KvrmService::Classify(grpc::CallbackServerContext* context,
                                                const v1::ClassifyRequest* request,
                                                v1::ClassifyResponse* response) {
  const absl::Time arrival = absl::Now();
  // A refusal before the inputs are submitted: traced as the call's end (RefusePooling).
  const auto refuse = [&](const grpc::Status& status) {
    return RefusePooling(context, status, "classify", request->lora_adapter(), arrival);
  };
  if (grpc::Status s = CheckAuth(context); !s.ok()) return refuse(s);
  if (grpc::Status s = PoolingRefusal("Classify"); !s.ok()) return refuse(s);
  const std::optional<ClassifierHead>& head = engine_->model().classifier;
  if (const std::string& error = engine_->model().classifier_error; !error.empty()) {
    return refuse(
        grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, absl::StrCat("Classify: ", error)));
  }
  if (!head) {
    return refuse(grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                               "Classify: the served model has no classification head (a "
                               "*ForSequenceClassification checkpoint's score.weight, or "
                               "kvrmd --classifier_from_tokens)"));
  }
  absl::StatusOr<std::vector<std::unique_ptr<GenerationRequest>>> inputs =
      ValidateClassifyRequest(*request, *engine_->model().tokenizer, limits_);
  if (!inputs.ok()) return refuse(ToGrpcStatus(inputs.status()));
  const int32_t n = static_cast<int32_t>(inputs->size());
  if (grpc::Status s = CheckQueueRoom(context, n, "inputs"); !s.ok()) {
    return refuse(s);
  }
  const std::string id = request->request_id().empty() ? absl::StrCat("cls-", next_id_.fetch_add(1))
                                                       : request->request_id();
  response->set_request_id(id);
  // Each input's vector becomes the head's logits as it ends.
  auto each = [&head = *head](std::vector<float>* v) {
    const std::vector<double> logits = head.Logits(*v);
    v->assign(logits.begin(), logits.end());
  };
  auto reply = [response, &head = *head](std::vector<PoolingReactor::Pooled> pooled) {
    for (const PoolingReactor::Pooled& p : pooled) {
      const std::vector<double> logits(p.vector.begin(), p.vector.end());
      const std::vector<double> probs = head.Probabilities(logits);
      v1::Classification* c = response->add_classifications();
      for (double v : logits) c->add_logits(static_cast<float>(v));
      for (double v : probs) c->add_probs(static_cast<float>(v));
      const int32_t label =
          static_cast<int32_t>(std::max_element(probs.begin(), probs.end()) - probs.begin());
      c->set_label(label);
      c->set_label_name(head.labels[label]);
      c->set_prompt_tokens(p.prompt_tokens);
      c->set_cached_prompt_tokens(p.cached_prompt_tokens);
      response->set_prompt_tokens(response->prompt_tokens() + p.prompt_tokens);
    }
    return grpc::Status::OK;
  };
  auto* reactor = new PoolingReactor(engine_, n, std::move(each), std::move(reply),
                                     [](int32_t i) { return absl::StrCat("inputs[", i, "]"); });
  StartPooling(context, reactor, *std::move(inputs), id, arrival, request->lora_adapter(),
               "classify");
  return reactor;
}

v1::ScoreMethod KvrmService::score_method() const {
  const std::optional<ClassifierHead>& head = engine_->model().classifier;
  if (!engine_->returns_hidden() || !engine_->model().classifier_error.empty()) {
    return v1::SCORE_METHOD_UNSPECIFIED;
  }
  if (head)
    return head->num_labels == 1 ? v1::SCORE_METHOD_CROSS_ENCODER : v1::SCORE_METHOD_UNSPECIFIED;
  return info_.embed_refusal.empty() ? v1::SCORE_METHOD_EMBEDDING_SIMILARITY
                                     : v1::SCORE_METHOD_UNSPECIFIED;
}

grpc::ServerUnaryReactor* KvrmService::Score(grpc::CallbackServerContext* context,
                                             const v1::ScoreRequest* request,
                                             v1::ScoreResponse* response) {
  const absl::Time arrival = absl::Now();
  // A refusal before the inputs are submitted: traced as the call's end (RefusePooling).
  const auto refuse = [&](const grpc::Status& status) {
    return RefusePooling(context, status, "score", request->lora_adapter(), arrival);
  };
  if (grpc::Status s = CheckAuth(context); !s.ok()) return refuse(s);
  if (grpc::Status s = PoolingRefusal("Score"); !s.ok()) return refuse(s);
  const std::optional<ClassifierHead>& head = engine_->model().classifier;
  const v1::ScoreMethod method = score_method();
  if (method == v1::SCORE_METHOD_UNSPECIFIED) {
    return refuse(
        grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                     !engine_->model().classifier_error.empty()
                         ? absl::StrCat("Score: ", engine_->model().classifier_error)
                     : head ? absl::StrCat("Score: the classification head has ", head->num_labels,
                                           " labels; a cross-encoder's has one (Classify "
                                           "gives each label's probability)")
                            : absl::StrCat("Score: ", info_.embed_refusal)));
  }
  const bool cross = method == v1::SCORE_METHOD_CROSS_ENCODER;
  absl::StatusOr<ScorePlan> plan =
      ValidateScoreRequest(*request, *engine_->model().tokenizer, limits_, cross, info_.pooling);
  if (!plan.ok()) return refuse(ToGrpcStatus(plan.status()));
  const int32_t n = static_cast<int32_t>(plan->inputs.size());
  if (grpc::Status s = CheckQueueRoom(context, n, "documents"); !s.ok()) {
    return refuse(s);
  }
  const std::string id = request->request_id().empty()
                             ? absl::StrCat("score-", next_id_.fetch_add(1))
                             : request->request_id();
  response->set_request_id(id);
  response->set_method(method);
  const int32_t queries = plan->queries, documents = plan->documents;
  auto reply = [response, cross, queries, documents](std::vector<PoolingReactor::Pooled> pooled) {
    for (const PoolingReactor::Pooled& p : pooled) {
      response->set_prompt_tokens(response->prompt_tokens() + p.prompt_tokens);
      response->set_cached_prompt_tokens(response->cached_prompt_tokens() +
                                         p.cached_prompt_tokens);
    }
    for (int32_t d = 0; d < documents; ++d) {
      double score = 0;
      if (cross) {
        score = pooled[d].vector[0];  // (each made it the score)
      } else {
        // The cosine similarity: the dot product of the unit vectors, in double (0 where either
        // vector was zero).
        const std::vector<float>& a = pooled[queries == 1 ? 0 : d].vector;
        const std::vector<float>& b = pooled[queries + d].vector;
        for (size_t c = 0; c < a.size() && c < b.size(); ++c) {
          score += static_cast<double>(a[c]) * b[c];
        }
        score = std::clamp(score, -1.0, 1.0);  // (rounding in the unit vectors)
      }
      response->add_scores(static_cast<float>(score));
    }
    return grpc::Status::OK;
  };
  auto name = [cross, queries](int32_t i) {
    if (cross) return absl::StrCat("documents[", i, "]");
    return i < queries ? absl::StrCat("queries[", i, "]")
                       : absl::StrCat("documents[", i - queries, "]");
  };
  // As each input ends: a pair's vector becomes its score, a text's its unit vector.
  auto each = [cross, head = cross ? &*head : nullptr](std::vector<float>* v) {
    if (cross) {
      *v = {static_cast<float>(head->Score(head->Logits(*v)[0]))};
    } else {
      FinishEmbedding(0, /*normalize=*/true, v);
    }
  };
  auto* reactor =
      new PoolingReactor(engine_, n, std::move(each), std::move(reply), std::move(name));
  StartPooling(context, reactor, std::move(plan->inputs), id, arrival, request->lora_adapter(),
               "score");
  return reactor;
}

grpc::ServerUnaryReactor* KvrmService::Tokenize(grpc::CallbackServerContext* context,
                                                const v1::TokenizeRequest* request,
                                                v1::TokenizeResponse* response) {
  if (grpc::Status s = CheckAuth(context); !s.ok()) return FinishUnary(context, s);
  if (static_cast<int64_t>(request->text().size()) > limits_.max_prompt_bytes) {
    return FinishUnary(context, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                             "text: longer than the prompt limit"));
  }
  const Tokenizer& tok = *engine_->model().tokenizer;
  absl::StatusOr<std::vector<int32_t>> ids;
  if (request->has_chat()) {
    if (!request->text().empty()) {
      return FinishUnary(context, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                               "chat: set text or chat, not both"));
    }
    absl::StatusOr<std::string> prompt =
        RenderChatPrompt(request->chat(), &engine_->model().chat, limits_);
    if (!prompt.ok()) return FinishUnary(context, ToGrpcStatus(prompt.status()));
    ids = tok.Encode(*prompt, /*add_bos=*/false);
    response->set_prompt(*std::move(prompt));
  } else {
    ids = tok.Encode(request->text(), request->add_bos());
  }
  if (!ids.ok()) {
    return FinishUnary(context, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                             absl::StrCat("text: ", ids.status().message())));
  }
  for (int32_t id : *ids) {
    response->add_token_ids(id);
    if (request->return_pieces()) response->add_pieces(tok.Decode({id}, false));
  }
  return FinishUnary(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* KvrmService::Detokenize(grpc::CallbackServerContext* context,
                                                  const v1::DetokenizeRequest* request,
                                                  v1::DetokenizeResponse* response) {
  if (grpc::Status s = CheckAuth(context); !s.ok()) return FinishUnary(context, s);
  const int32_t vocab = engine_->model().config.vocab_size;
  for (int i = 0; i < request->token_ids_size(); ++i) {
    const int32_t id = request->token_ids(i);
    if (id < 0 || id >= vocab) {
      return FinishUnary(
          context, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                absl::StrCat("token_ids[", i, "]: ", id,
                                             " is outside the vocabulary [0, ", vocab, ")")));
    }
  }
  const std::vector<int32_t> ids(request->token_ids().begin(), request->token_ids().end());
  response->set_text(engine_->model().tokenizer->Decode(ids, request->skip_special_tokens()));
  return FinishUnary(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* KvrmService::GetModelInfo(grpc::CallbackServerContext* context,
                                                    const v1::GetModelInfoRequest*,
                                                    v1::ModelInfo* response) {
  if (grpc::Status s = CheckAuth(context); !s.ok()) return FinishUnary(context, s);
  const ModelBundle& m = engine_->model();
  const LlamaConfig& c = m.config;
  response->set_name(m.name);
  response->set_architecture(std::string(ArchitectureClassName(c.model_type)));
  response->set_vocab_size(c.vocab_size);
  response->set_max_context(engine_->options().max_context);
  response->set_num_layers(c.num_hidden_layers);
  response->set_hidden_size(c.hidden_size);
  response->set_num_attention_heads(c.num_attention_heads);
  response->set_num_key_value_heads(c.num_key_value_heads);
  response->set_intermediate_size(c.intermediate_size);
  response->set_dtype(std::string(DTypeName(m.weights.dtype)));
  response->set_weights_format(m.weights_format);
  response->set_weight_quantization(engine_->weight_quantization());
  response->set_num_parameters(m.weights.num_parameters);
  response->set_num_active_parameters(m.weights.num_active_parameters);
  if (engine_->returns_hidden()) response->set_pooling(PoolingName(info_.pooling));
  response->set_embedding_normalize(info_.embedding_normalize);
  if (const std::optional<ClassifierHead>& head = engine_->model().classifier) {
    response->set_num_labels(head->num_labels);
    for (const std::string& label : head->labels) response->add_labels(label);
  }
  response->set_score_method(score_method());
  response->set_embed_refusal(info_.embed_refusal);
  response->set_classifier_refusal(engine_->model().classifier_error);
  response->set_num_experts(c.num_experts);
  response->set_num_experts_per_tok(c.num_experts_per_tok);
  response->set_moe_intermediate_size(c.moe_intermediate_size);
  if (m.config.bos_token_id) response->set_bos_token_id(*m.config.bos_token_id);
  for (int32_t e : c.eos_token_ids) response->add_eos_token_ids(e);
  response->set_max_new_tokens_limit(engine_->options().max_new_tokens);
  response->set_chat_template(m.chat.chat_template != nullptr);
  response->set_tool_call_parser(std::string(ToolCallFormatName(tool_syntax_.format)));
  response->set_reasoning_parser(std::string(ReasoningFormatName(m.chat.reasoning_format)));
  for (const ServedLoraAdapter& a : engine_->LoraAdapters()) {
    LoraAdapterInfoOf(a, response->add_lora_adapters());
  }
  response->set_max_loras(engine_->max_loras());
  response->set_max_lora_rank(engine_->max_lora_rank());
  response->set_runtime_lora_updating(runtime_lora_updating_);
  if (engine_->max_loras() > 0) {
    response->set_lora_dtype(
        std::string(DTypeName(engine_->options().lora_dtype.value_or(DType::kF32))));
  }
  return FinishUnary(context, grpc::Status::OK);
}

namespace {

// FAILED_PRECONDITION naming the flag unless runtime LoRA updates are allowed; then the name's
// checks (INVALID_ARGUMENT naming lora_name).
grpc::Status CheckLoraUpdate(bool allowed, const std::string& name) {
  if (!allowed) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "LoRA adapters are loaded and unloaded while serving only when kvrmd runs "
                        "with --allow_runtime_lora_updating");
  }
  if (name.empty() || name.size() > 256) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        absl::StrCat("lora_name: ", name.size(), " bytes; 1 to 256"));
  }
  for (unsigned char c : name) {
    if (c <= 0x20 || c == 0x7f) {
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "lora_name: spaces and control characters are not allowed");
    }
  }
  return grpc::Status::OK;
}

}  // namespace

absl::Status KvrmService::LoadOnDemand(const std::string& name) {
  if (engine_->ServesLoraAdapter(name)) return absl::OkStatus();  // loaded while this waited
  const std::string dir = OnDemandLoraPath(lora_dir_, name);
  if (dir.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "lora_adapter: `", name, "` is not served, and --lora_dir has no adapter of that name"));
  }
  absl::StatusOr<LoraAdapter> adapter = kvrm::LoadLoraAdapter(engine_->model().config, name, dir);
  if (!adapter.ok()) {
    LOG(WARNING) << "LoRA adapter '" << name << "' from " << dir << ": " << adapter.status();
    return absl::Status(adapter.status().code(), absl::StrCat("lora_adapter: `", name, "` (", dir,
                                                              "): ", adapter.status().message()));
  }
  absl::StatusOr<ServedLoraAdapter> served =
      engine_->LoadLoraAdapter(*std::move(adapter), /*evictable=*/true);
  if (absl::IsAlreadyExists(served.status())) return absl::OkStatus();
  if (!served.ok()) {
    return absl::Status(served.status().code(),
                        absl::StrCat("lora_adapter: ", served.status().message()));
  }
  LOG(INFO) << "LoRA adapter '" << name << "' loaded on demand from " << dir << " into slot "
            << served->slot;
  return absl::OkStatus();
}

std::string OnDemandLoraPath(const std::string& root, const std::string& name) {
  if (root.empty() || name.empty() || name.size() > 256 || name[0] == '.') return "";
  for (unsigned char c : name) {
    if (!(std::isalnum(c) || c == '-' || c == '_' || c == '.')) return "";
  }
  const std::string dir = absl::StrCat(root, "/", name);
  std::error_code ec;
  return std::filesystem::is_regular_file(dir + "/adapter_config.json", ec) ? dir : "";
}

void LoraAdapterInfoOf(const ServedLoraAdapter& served, v1::LoraAdapterInfo* info) {
  const LoraAdapter& a = served.adapter;
  info->set_name(a.name);
  info->set_path(a.path);
  info->set_rank(a.rank);
  info->set_alpha(a.alpha);
  info->set_scale(a.scale);
  for (const std::string& t : a.target_modules) info->add_target_modules(t);
  info->set_num_parameters(a.num_parameters);
  info->set_base_model(a.base_model);
  info->set_running_requests(served.requests);
  info->set_on_demand(served.evictable);
}

grpc::ServerUnaryReactor* KvrmService::ResetPrefixCache(grpc::CallbackServerContext* context,
                                                        const v1::ResetPrefixCacheRequest*,
                                                        v1::ResetPrefixCacheResponse* response) {
  if (grpc::Status s = CheckAuth(context); !s.ok()) return FinishUnary(context, s);
  if (!prefix_cache_reset_) {
    return FinishUnary(context, grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                                             "ResetPrefixCache: kvrmd serves it only with "
                                             "--allow_prefix_cache_reset"));
  }
  // Done between two engine steps: waited for on the adapter thread, not a gRPC one.
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const bool posted = lora_queue_->TryPost([this, reactor, response] {
    absl::StatusOr<KvPager::CacheReset> freed = engine_->ResetPrefixCache(absl::Seconds(30));
    if (!freed.ok()) {
      reactor->Finish(ToGrpcStatus(freed.status()));
      return;
    }
    LOG(INFO) << "prefix cache reset: " << freed->device_blocks << " device and "
              << freed->host_blocks << " host blocks freed";
    response->set_device_blocks_freed(freed->device_blocks);
    response->set_host_blocks_freed(freed->host_blocks);
    reactor->Finish(grpc::Status::OK);
  });
  if (!posted) {
    reactor->Finish(grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                                 "ResetPrefixCache: the adapter thread's queue is full; retry"));
  }
  return reactor;
}

grpc::ServerUnaryReactor* KvrmService::LoadLoraAdapter(grpc::CallbackServerContext* context,
                                                       const v1::LoadLoraAdapterRequest* request,
                                                       v1::LoraAdapterInfo* response) {
  if (grpc::Status s = CheckAuth(context); !s.ok()) return FinishUnary(context, s);
  if (grpc::Status s = CheckLoraUpdate(runtime_lora_updating_, request->lora_name()); !s.ok()) {
    return FinishUnary(context, s);
  }
  if (request->lora_path().empty()) {
    return FinishUnary(context,
                       grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "lora_path: empty"));
  }
  if (request->lora_name() == info_.served_model_name ||
      std::find(info_.served_model_aliases.begin(), info_.served_model_aliases.end(),
                request->lora_name()) != info_.served_model_aliases.end()) {
    return FinishUnary(
        context, grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                              absl::StrCat("lora_name: `", request->lora_name(),
                                           "` is the served model's name (--served_model_name)")));
  }
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const bool posted = lora_queue_->TryPost([this, reactor, request, response] {
    absl::StatusOr<LoraAdapter> adapter =
        kvrm::LoadLoraAdapter(engine_->model().config, request->lora_name(), request->lora_path());
    absl::StatusOr<ServedLoraAdapter> served =
        adapter.ok() ? engine_->LoadLoraAdapter(*std::move(adapter))
                     : absl::StatusOr<ServedLoraAdapter>(adapter.status());
    if (!served.ok()) {
      LOG(WARNING) << "LoRA adapter '" << request->lora_name() << "' from " << request->lora_path()
                   << ": " << served.status();
      reactor->Finish(ToGrpcStatus(served.status()));
      return;
    }
    LOG(INFO) << "LoRA adapter '" << served->adapter.name << "' loaded from "
              << served->adapter.path << " into slot " << served->slot << " (rank "
              << served->adapter.rank << ")";
    LoraAdapterInfoOf(*served, response);
    reactor->Finish(grpc::Status::OK);
  });
  if (!posted) {
    reactor->Finish(grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("LoRA adapter loads: ", kLoraLoadQueue, " already waiting; retry later")));
  }
  return reactor;
}

grpc::ServerUnaryReactor* KvrmService::UnloadLoraAdapter(
    grpc::CallbackServerContext* context, const v1::UnloadLoraAdapterRequest* request,
    v1::UnloadLoraAdapterResponse* response) {
  if (grpc::Status s = CheckAuth(context); !s.ok()) return FinishUnary(context, s);
  if (grpc::Status s = CheckLoraUpdate(runtime_lora_updating_, request->lora_name()); !s.ok()) {
    return FinishUnary(context, s);
  }
  absl::StatusOr<int64_t> running = engine_->UnloadLoraAdapter(request->lora_name());
  if (!running.ok()) return FinishUnary(context, ToGrpcStatus(running.status()));
  LOG(INFO) << "LoRA adapter '" << request->lora_name() << "' unloaded (" << *running
            << " requests still running with it)";
  response->set_running_requests(*running);
  return FinishUnary(context, grpc::Status::OK);
}

grpc::ServerUnaryReactor* KvrmService::GetServerInfo(grpc::CallbackServerContext* context,
                                                     const v1::GetServerInfoRequest*,
                                                     v1::ServerInfo* response) {
  if (grpc::Status s = CheckAuth(context); !s.ok()) return FinishUnary(context, s);
  const EngineStats s = engine_->Stats();
  response->set_version(info_.version);
  response->set_device(info_.device);
  response->set_kv_mode(info_.kv_mode);
  response->set_kv_dtype(std::string(DTypeName(engine_->options().kv_dtype)));
  response->set_mixed_steps(engine_->fuses_prefill());
  response->set_device_sampling(engine_->samples_on_device());
  response->set_tensor_parallel(info_.tensor_parallel);
  response->set_slots_total(s.slots_total);
  response->set_slots_in_use(s.slots_in_use);
  response->set_queue_depth(s.queue_depth);
  response->set_queue_limit(engine_->options().max_queue);
  v1::KvUsage* kv = response->mutable_kv();
  kv->set_block_tokens(s.kv.block_tokens);
  kv->set_blocks_total(s.kv.blocks_total);
  kv->set_blocks_used(s.kv.blocks_used);
  kv->set_blocks_reserved(s.kv.blocks_reserved);
  kv->set_blocks_free(s.kv.blocks_free);
  kv->set_bytes_per_block(s.kv.bytes_per_block);
  kv->set_host_blocks_used(s.kv.host_blocks_used);
  kv->set_window_release_tokens(
      engine_->options().window_release ? engine_->model().config.sliding_window : 0);
  kv->set_window_released_blocks_total(s.window_blocks_released_total);
  response->set_state(draining_.load() ? "DRAINING" : "SERVING");
  response->set_requests_total(s.requests_total);
  response->set_tokens_generated_total(s.tokens_generated_total);
  response->set_uptime_s(absl::ToDoubleSeconds(absl::Now() - started_));
  const FarHistoryShape& far = engine_->far_history();
  v1::FarHistoryInfo* fh = response->mutable_far_history();
  fh->set_enabled(far.enabled());
  fh->set_sink_tokens(far.sink_blocks * engine_->options().block_tokens);
  fh->set_window_tokens(far.window_blocks * engine_->options().block_tokens);
  fh->set_blocks_summarized_total(s.far_blocks_summarized_total);
  v1::PrefixCacheInfo* pc = response->mutable_prefix_cache();
  pc->set_enabled(engine_->options().prefix_caching);
  pc->set_queried_tokens_total(s.prefix_cache_queries_total);
  pc->set_hit_tokens_total(s.prefix_cache_hits_total);
  pc->set_cached_blocks(s.kv.blocks_cached);
  pc->set_evicted_blocks_total(s.prefix_cache_evictions_total);
  pc->set_offload_enabled(engine_->options().prefix_cache_offload);
  pc->set_host_hit_tokens_total(s.prefix_cache_host_hits_total);
  pc->set_host_cached_blocks(s.kv.host_blocks_cached);
  pc->set_offloaded_blocks_total(s.prefix_cache_offloaded_blocks_total);
  pc->set_partial_blocks_enabled(engine_->options().prefix_cache_partial_blocks);
  pc->set_copied_tokens_total(s.prefix_cache_copied_tokens_total);
  v1::SpeculativeDecodingInfo* sd = response->mutable_speculative_decoding();
  sd->set_num_speculative_tokens(engine_->options().speculative_tokens);
  sd->set_prompt_lookup_min(engine_->options().speculative_ngram.min_ngram);
  sd->set_prompt_lookup_max(engine_->options().speculative_ngram.max_ngram);
  sd->set_drafts_total(s.spec_decode_drafts_total);
  sd->set_draft_tokens_total(s.spec_decode_draft_tokens_total);
  sd->set_accepted_tokens_total(s.spec_decode_accepted_tokens_total);
  const structured::ConstraintCompiler::Stats so = structured_->stats();
  v1::StructuredOutputInfo* si = response->mutable_structured_output();
  si->set_cached_constraints(so.entries);
  si->set_cached_bytes(so.bytes);
  si->set_compiles_total(static_cast<uint64_t>(so.misses));
  si->set_refusals_total(static_cast<uint64_t>(so.refusals));
  si->set_cache_hits_total(static_cast<uint64_t>(so.hits));
  si->set_compile_seconds_total(so.compile_seconds);
  return FinishUnary(context, grpc::Status::OK);
}

}  // namespace kvrm
