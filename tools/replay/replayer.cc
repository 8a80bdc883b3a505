#include "tools/replay/replayer.h"

#include <algorithm>
#include <chrono>
#include <memory>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"

namespace kvrm::replay {
namespace {

using Clock = std::chrono::steady_clock;

// One in-flight Generate stream. Its operations are strictly sequential (start, reads, finish),
// so the call itself is the completion-queue tag and `op` says which operation completed.
struct Call {
  enum class Op { kStart, kRead, kFinish };
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientAsyncReader<v1::GenerateResponse>> reader;
  v1::GenerateResponse response;
  grpc::Status status;
  RequestRecord* record = nullptr;
  Op op = Op::kStart;
};

std::string FinishReasonName(v1::FinishReason reason) {
  std::string name = v1::FinishReason_Name(reason);
  constexpr absl::string_view kPrefix = "FINISH_REASON_";
  if (absl::StartsWith(name, kPrefix)) name.erase(0, kPrefix.size());
  return name;
}

// The replay loop's state; lives on the replay thread only.
class Driver {
 public:
  Driver(v1::Kvrm::Stub& stub, absl::Span<const PlannedRequest> plan,
         const PromptSynthesizer& prompts, const ReplayOptions& options)
      : stub_(stub), plan_(plan), prompts_(prompts), options_(options), records_(plan.size()) {}

  std::vector<RequestRecord> Run() {
    // Requests are built ahead of their time (prompt synthesis of a 100k-token prompt takes
    // milliseconds), so that a burst's later requests do not go out late by the work of the
    // earlier ones: the initial burst before the clock starts, the rest in idle moments.
    built_.resize(plan_.size());
    while (built_next_ < plan_.size() && built_next_ < kMaxBuiltAhead &&
           plan_[built_next_].send_at_s <= kBuildHorizonS) {
      BuildNext();
    }
    start_ = Clock::now();
    size_t next = 0;
    while (next < plan_.size() || in_flight_ > 0) {
      // Open loop: everything due is sent now, late or not.
      while (next < plan_.size() && plan_[next].send_at_s <= Elapsed()) Send(next++);
      double wait_s = 0.1;  // bounds the progress refresh
      if (next < plan_.size()) wait_s = std::min(wait_s, plan_[next].send_at_s - Elapsed());
      // One request built per turn while the next send is not due, so that building never
      // holds up a send or the reading of streams for long.
      if (built_next_ < plan_.size() && built_next_ < next + kMaxBuiltAhead &&
          plan_[built_next_].send_at_s <= Elapsed() + kBuildHorizonS && wait_s > 1e-3) {
        BuildNext();
        wait_s = 0;
      }
      void* tag = nullptr;
      bool ok = false;
      const auto deadline =
          std::chrono::system_clock::now() +
          std::chrono::microseconds(static_cast<int64_t>(std::max(0.0, wait_s) * 1e6));
      if (cq_.AsyncNext(&tag, &ok, deadline) == grpc::CompletionQueue::GOT_EVENT) {
        Handle(static_cast<Call*>(tag), ok);
      }
      if (options_.progress != nullptr) options_.progress->Update(Progress());
    }
    cq_.Shutdown();
    void* tag;
    bool ok;
    while (cq_.Next(&tag, &ok)) {
    }
    if (options_.progress != nullptr) options_.progress->Finish(Progress());
    return std::move(records_);
  }

 private:
  double Elapsed() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

  ProgressState Progress() const {
    return {static_cast<int>(plan_.size()), sent_, done_, in_flight_, errors_, tokens_, Elapsed()};
  }

  void Send(size_t i) {
    const PlannedRequest& p = plan_[i];
    RequestRecord& r = records_[i];
    r.index = p.index;
    r.trace_s = p.trace_s;
    r.scheduled_s = p.send_at_s;
    r.input_tokens = p.input_tokens;
    r.output_tokens_requested = p.output_tokens;
    r.clamped = p.clamped;
    r.token_times_s.reserve(p.output_tokens);
    while (built_next_ <= i) BuildNext();  // not built ahead: now
    const std::unique_ptr<v1::GenerateRequest> request = std::move(built_[i]);
    auto* call = new Call;  // deleted when its Finish completes
    call->record = &r;
    if (options_.request_timeout_s > 0) {
      call->context.set_deadline(
          std::chrono::system_clock::now() +
          std::chrono::microseconds(static_cast<int64_t>(options_.request_timeout_s * 1e6)));
    }
    call->reader = stub_.PrepareAsyncGenerate(&call->context, *request, &cq_);
    r.send_s = Elapsed();
    call->op = Call::Op::kStart;
    call->reader->StartCall(call);
    ++sent_;
    ++in_flight_;
  }

  void BuildNext() {
    built_[built_next_] =
        std::make_unique<v1::GenerateRequest>(BuildRequest(plan_[built_next_], prompts_));
    const std::vector<std::string>& adapters = options_.lora_adapters;
    if (!adapters.empty()) {
      built_[built_next_]->set_lora_adapter(adapters[plan_[built_next_].index % adapters.size()]);
    }
    ++built_next_;
  }

  void Handle(Call* call, bool ok) {
    RequestRecord& r = *call->record;
    switch (call->op) {
      case Call::Op::kStart:
      case Call::Op::kRead:
        if (call->op == Call::Op::kRead && ok) OnMessage(call->response, &r);
        if (ok) {
          call->op = Call::Op::kRead;
          call->reader->Read(&call->response, call);
        } else {
          call->op = Call::Op::kFinish;
          call->reader->Finish(&call->status, call);
        }
        return;
      case Call::Op::kFinish:
        r.finish_s = Elapsed();
        r.grpc_code = static_cast<int>(call->status.error_code());
        if (!call->status.ok()) {
          r.error = call->status.error_message();
          ++errors_;
        } else if (r.finish_reason.empty()) {
          // E.g. a response the client could not parse (protobuf rejects invalid UTF-8 in
          // `text`): gRPC ends the stream OK, but output was lost.
          r.error = "the stream ended without a finished message";
          ++errors_;
        }
        ++done_;
        --in_flight_;
        delete call;
        return;
    }
  }

  void OnMessage(const v1::GenerateResponse& m, RequestRecord* r) {
    const double now = Elapsed();
    if (m.token_ids_size() > 0 && r->first_token_s < 0) r->first_token_s = now;
    for (int i = 0; i < m.token_ids_size(); ++i) r->token_times_s.push_back(now);
    tokens_ += m.token_ids_size();
    if (m.has_finished()) {
      r->finish_reason = FinishReasonName(m.finished().reason());
      r->server_completion_tokens = m.finished().usage().completion_tokens();
      r->server_cached_prompt_tokens = m.finished().usage().cached_prompt_tokens();
      if (!m.finished().error().empty()) r->error = m.finished().error();
    }
  }

  v1::Kvrm::Stub& stub_;
  absl::Span<const PlannedRequest> plan_;
  const PromptSynthesizer& prompts_;
  const ReplayOptions& options_;
  // How far ahead requests are built: those due within the horizon, at most this many unsent.
  static constexpr double kBuildHorizonS = 2.0;
  static constexpr size_t kMaxBuiltAhead = 1024;

  std::vector<RequestRecord> records_;  // [plan.size()], filled as requests are sent
  std::vector<std::unique_ptr<v1::GenerateRequest>> built_;  // [plan.size()]; null once sent
  size_t built_next_ = 0;                                    // built_[0, built_next_) were built
  grpc::CompletionQueue cq_;
  Clock::time_point start_;
  int sent_ = 0, done_ = 0, in_flight_ = 0, errors_ = 0;
  int64_t tokens_ = 0;
};

}  // namespace

absl::StatusOr<v1::ModelInfo> FetchModelInfo(v1::Kvrm::Stub& stub, double timeout_s) {
  grpc::ClientContext context;
  context.set_wait_for_ready(true);
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1e3)));
  v1::ModelInfo info;
  const grpc::Status status = stub.GetModelInfo(&context, v1::GetModelInfoRequest(), &info);
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                        absl::StrCat("GetModelInfo: ", status.error_message()));
  }
  if (info.max_context() < 2 || info.vocab_size() < 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("GetModelInfo: unusable model limits (max_context ", info.max_context(),
                     ", vocab_size ", info.vocab_size(), ")"));
  }
  return info;
}

v1::GenerateRequest BuildRequest(const PlannedRequest& planned, const PromptSynthesizer& prompts) {
  v1::GenerateRequest request;
  request.set_request_id(absl::StrCat("replay-", planned.index));
  const std::vector<int32_t> ids = prompts.Synthesize(planned);
  request.mutable_token_ids()->mutable_ids()->Assign(ids.begin(), ids.end());
  request.mutable_stopping()->set_max_new_tokens(planned.output_tokens);
  request.mutable_stopping()->set_ignore_eos(true);
  return request;
}

std::vector<RequestRecord> Replay(v1::Kvrm::Stub& stub, absl::Span<const PlannedRequest> plan,
                                  const PromptSynthesizer& prompts, const ReplayOptions& options) {
  return Driver(stub, plan, prompts, options).Run();
}

}  // namespace kvrm::replay
