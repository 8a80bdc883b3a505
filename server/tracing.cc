#include "server/tracing.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/logging.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/security/credentials.h"

namespace kvrm {
namespace {

constexpr size_t kMaxTraceStateBytes = 512;  // W3C: vendors may drop longer ones

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;  // upper case is not valid in traceparent
}

// `hex` (2 * N lower-case hex digits) into `out`; false if it is not that.
template <size_t N>
bool FromHex(absl::string_view hex, std::array<uint8_t, N>* out) {
  if (hex.size() != 2 * N) return false;
  bool zero = true;
  for (size_t i = 0; i < N; ++i) {
    const int hi = HexDigit(hex[2 * i]), lo = HexDigit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    (*out)[i] = static_cast<uint8_t>(hi * 16 + lo);
    zero = zero && (*out)[i] == 0;
  }
  return !zero;  // an all-zero id is invalid
}

template <size_t N>
std::array<uint8_t, N> RandomId() {
  thread_local absl::BitGen gen;
  std::array<uint8_t, N> id{};
  do {
    for (uint8_t& b : id) b = absl::Uniform<uint8_t>(gen);
  } while (std::all_of(id.begin(), id.end(), [](uint8_t b) { return b == 0; }));
  return id;
}

otlp::KeyValue* NewAttribute(otlp::Span* span, absl::string_view key) {
  otlp::KeyValue* kv = span->add_attributes();
  kv->set_key(std::string(key));
  return kv;
}

// Percent-decoding of OTEL_RESOURCE_ATTRIBUTES' values (the W3C Baggage octet rules).
std::string PercentDecoded(absl::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size()) {
      const int hi = HexDigit(absl::ascii_tolower(s[i + 1]));
      const int lo = HexDigit(absl::ascii_tolower(s[i + 2]));
      if (hi >= 0 && lo >= 0) {
        out.push_back(static_cast<char>(hi * 16 + lo));
        i += 2;
        continue;
      }
    }
    out.push_back(s[i]);
  }
  return out;
}

bool Retryable(grpc::StatusCode code) {
  // OTLP/gRPC: the codes a client retries on.
  switch (code) {
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::ABORTED:
    case grpc::StatusCode::OUT_OF_RANGE:
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DATA_LOSS:
      return true;  // (RESOURCE_EXHAUSTED only with a RetryInfo delay, which is not read here)
    default:
      return false;
  }
}

}  // namespace

std::optional<TraceParent> ParseTraceParent(absl::string_view traceparent,
                                            absl::string_view tracestate) {
  traceparent = absl::StripAsciiWhitespace(traceparent);
  // version "-" trace-id "-" parent-id "-" flags: 2 + 1 + 32 + 1 + 16 + 1 + 2 = 55 characters.
  if (traceparent.size() < 55) return std::nullopt;
  std::array<uint8_t, 1> version{};
  const absl::string_view v = traceparent.substr(0, 2);
  if (HexDigit(v[0]) < 0 || HexDigit(v[1]) < 0 || v == "ff") return std::nullopt;
  version[0] = static_cast<uint8_t>(HexDigit(v[0]) * 16 + HexDigit(v[1]));
  // Version 00 is exactly 55 characters; a later one may carry more after a dash.
  if (version[0] == 0 && traceparent.size() != 55) return std::nullopt;
  if (traceparent.size() > 55 && traceparent[55] != '-') return std::nullopt;
  if (traceparent[2] != '-' || traceparent[35] != '-' || traceparent[52] != '-') {
    return std::nullopt;
  }
  TraceParent p;
  if (!FromHex(traceparent.substr(3, 32), &p.trace_id) ||
      !FromHex(traceparent.substr(36, 16), &p.span_id)) {
    return std::nullopt;
  }
  const absl::string_view f = traceparent.substr(53, 2);
  if (HexDigit(f[0]) < 0 || HexDigit(f[1]) < 0) return std::nullopt;
  p.flags = static_cast<uint8_t>(HexDigit(f[0]) * 16 + HexDigit(f[1]));
  tracestate = absl::StripAsciiWhitespace(tracestate);
  if (tracestate.size() <= kMaxTraceStateBytes) p.trace_state = std::string(tracestate);
  return p;
}

std::string HexId(absl::Span<const uint8_t> id) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  out.reserve(2 * id.size());
  for (uint8_t b : id) {
    out.push_back(kDigits[b >> 4]);
    out.push_back(kDigits[b & 15]);
  }
  return out;
}

absl::StatusOr<std::vector<std::pair<std::string, std::string>>> ParseResourceAttributes(
    absl::string_view text) {
  std::vector<std::pair<std::string, std::string>> out;
  for (absl::string_view pair : absl::StrSplit(text, ',', absl::SkipWhitespace())) {
    const size_t eq = pair.find('=');
    if (eq == absl::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("OTEL_RESOURCE_ATTRIBUTES: `", pair, "` is not key=value"));
    }
    const absl::string_view key = absl::StripAsciiWhitespace(pair.substr(0, eq));
    if (key.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("OTEL_RESOURCE_ATTRIBUTES: `", pair, "` has an empty key"));
    }
    out.emplace_back(std::string(key),
                     PercentDecoded(absl::StripAsciiWhitespace(pair.substr(eq + 1))));
  }
  return out;
}

void AddString(otlp::Span* span, absl::string_view key, absl::string_view value) {
  NewAttribute(span, key)->mutable_value()->set_string_value(std::string(value));
}

void AddInt(otlp::Span* span, absl::string_view key, int64_t value) {
  NewAttribute(span, key)->mutable_value()->set_int_value(value);
}

void AddDouble(otlp::Span* span, absl::string_view key, double value) {
  NewAttribute(span, key)->mutable_value()->set_double_value(value);
}

void AddBool(otlp::Span* span, absl::string_view key, bool value) {
  NewAttribute(span, key)->mutable_value()->set_bool_value(value);
}

void AddStrings(otlp::Span* span, absl::string_view key, const std::vector<std::string>& values) {
  otlp::ArrayValue* array = NewAttribute(span, key)->mutable_value()->mutable_array_value();
  for (const std::string& v : values) array->add_values()->set_string_value(v);
}

void SetTimes(otlp::Span* span, absl::Time start, absl::Time end) {
  span->set_start_time_unix_nano(static_cast<uint64_t>(absl::ToUnixNanos(start)));
  span->set_end_time_unix_nano(static_cast<uint64_t>(absl::ToUnixNanos(std::max(start, end))));
}

void SetCallOutcome(otlp::Span* span, const grpc::Status& status, absl::string_view engine_error) {
  AddInt(span, "rpc.grpc.status_code", static_cast<int64_t>(status.error_code()));
  if (!status.ok()) {
    span->mutable_status()->set_code(otlp::Status::STATUS_CODE_ERROR);
    span->mutable_status()->set_message(status.error_message());
  } else if (!engine_error.empty()) {
    span->mutable_status()->set_code(otlp::Status::STATUS_CODE_ERROR);
    span->mutable_status()->set_message(std::string(engine_error));
  }
}

const otlp::AnyValue* FindAttribute(const otlp::Span& span, absl::string_view key) {
  for (const otlp::KeyValue& kv : span.attributes()) {
    if (kv.key() == key) return &kv.value();
  }
  return nullptr;
}

TraceId Tracer::NewTraceId() { return RandomId<16>(); }
SpanId Tracer::NewSpanId() { return RandomId<8>(); }

absl::StatusOr<std::unique_ptr<Tracer>> Tracer::Start(TracerOptions options) {
  if (options.endpoint.empty()) {
    return absl::InvalidArgumentError("--otlp_traces_endpoint: empty");
  }
  if (!(options.sample_ratio >= 0.0 && options.sample_ratio <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--otlp_traces_sample_ratio=", options.sample_ratio, " is outside [0, 1]"));
  }
  if (options.max_queue_spans < 1 || options.max_batch_spans < 1) {
    return absl::InvalidArgumentError("tracing: queue and batch sizes must be at least 1");
  }
  return std::unique_ptr<Tracer>(new Tracer(std::move(options)));
}

Tracer::Tracer(TracerOptions options) : options_(std::move(options)) {
  auto add = [this](const std::string& key, const std::string& value) {
    otlp::KeyValue* kv = resource_.add_attributes();
    kv->set_key(key);
    kv->mutable_value()->set_string_value(value);
  };
  add("service.name", options_.service_name);
  if (!options_.service_version.empty()) add("service.version", options_.service_version);
  add("telemetry.sdk.name", "kvrm");
  add("telemetry.sdk.language", "cpp");
  for (const auto& [key, value] : options_.resource_attributes) {
    if (key != "service.name") add(key, value);
  }
  absl::string_view target = options_.endpoint;
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (absl::ConsumePrefix(&target, "https://")) {
    credentials = grpc::SslCredentials(grpc::SslCredentialsOptions());
  } else {
    absl::ConsumePrefix(&target, "http://");
  }
  // A URL's path (an OTLP/HTTP endpoint's /v1/traces) means nothing to gRPC: host:port only.
  if (const size_t slash = target.find('/');
      slash != absl::string_view::npos && !absl::StartsWith(target, "unix:")) {
    LOG(WARNING) << "tracing: " << options_.endpoint << " has a path; kvrmd speaks OTLP/gRPC, to "
                 << target.substr(0, slash);
    target = target.substr(0, slash);
  }
  stub_ = otlp::TraceService::NewStub(grpc::CreateChannel(std::string(target), credentials));
  thread_ = std::thread([this] { Run(); });
}

Tracer::~Tracer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
    // What is queued goes out within one export_timeout in all, not one per batch: a receiver
    // that hangs must not hold the process past its termination grace period.
    stop_deadline_ = absl::Now() + options_.export_timeout;
  }
  wake_.notify_all();
  thread_.join();
}

bool Tracer::ShouldTrace(const std::optional<TraceParent>& parent) {
  if (parent) return parent->sampled();
  if (options_.sample_ratio >= 1.0) return true;
  if (options_.sample_ratio <= 0.0) return false;
  thread_local absl::BitGen gen;
  return absl::Bernoulli(gen, options_.sample_ratio);
}

void Tracer::Record(std::vector<otlp::Span> spans) {
  int64_t dropped = 0;
  bool wake = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (otlp::Span& span : spans) {
      ++recorded_;
      if (static_cast<int32_t>(queue_.size()) >= options_.max_queue_spans || stopping_) {
        ++dropped;
        ++done_;
        continue;
      }
      queue_.push_back(std::move(span));
    }
    dropped_ += dropped;
    wake = static_cast<int32_t>(queue_.size()) >= options_.max_batch_spans;
  }
  if (dropped > 0 && options_.dropped != nullptr)
    options_.dropped->Add(static_cast<double>(dropped));
  if (dropped > 0) progress_.notify_all();
  if (wake) wake_.notify_all();
}

bool Tracer::Flush(absl::Duration timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  const int64_t target = recorded_;
  flush_ = true;
  wake_.notify_all();
  return progress_.wait_for(lock, absl::ToChronoNanoseconds(timeout),
                            [&] { return done_ >= target; });
}

int64_t Tracer::exported() const {
  std::lock_guard<std::mutex> lock(mu_);
  return exported_;
}

int64_t Tracer::dropped() const {
  std::lock_guard<std::mutex> lock(mu_);
  return dropped_;
}

void Tracer::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    const auto ready = [&] {
      return stopping_ || flush_ || static_cast<int32_t>(queue_.size()) >= options_.max_batch_spans;
    };
    wake_.wait_for(lock, absl::ToChronoNanoseconds(options_.flush_interval), ready);
    if (stopping_ && (give_up_ || absl::Now() >= stop_deadline_) && !queue_.empty()) {
      const int64_t left = static_cast<int64_t>(queue_.size());
      queue_.clear();
      done_ += left;
      dropped_ += left;
      if (options_.dropped != nullptr) options_.dropped->Add(static_cast<double>(left));
    }
    if (queue_.empty()) {
      flush_ = false;
      progress_.notify_all();
      if (stopping_) return;
      continue;
    }
    const size_t n = std::min(queue_.size(), static_cast<size_t>(options_.max_batch_spans));
    std::vector<otlp::Span> batch;
    batch.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      batch.push_back(std::move(queue_.front()));
      queue_.pop_front();
    }
    if (queue_.empty()) flush_ = false;
    lock.unlock();
    const bool sent = Export(batch);
    lock.lock();
    done_ += static_cast<int64_t>(batch.size());
    if (!sent) {
      dropped_ += static_cast<int64_t>(batch.size());
      if (stopping_) give_up_ = true;  // the receiver failed while stopping: drop the rest
    }
    progress_.notify_all();
  }
}

bool Tracer::Export(const std::vector<otlp::Span>& batch) {
  otlp::ExportTraceServiceRequest request;
  otlp::ResourceSpans* rs = request.add_resource_spans();
  *rs->mutable_resource() = resource_;
  otlp::ScopeSpans* ss = rs->add_scope_spans();
  ss->mutable_scope()->set_name("kvrm");
  ss->mutable_scope()->set_version(options_.service_version);
  for (const otlp::Span& span : batch) *ss->add_spans() = span;
  absl::Duration backoff = absl::Milliseconds(100);
  for (int attempt = 0;; ++attempt) {
    grpc::ClientContext context;
    absl::Time deadline = absl::Now() + options_.export_timeout;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (stopping_) deadline = std::min(deadline, stop_deadline_);
    }
    context.set_deadline(absl::ToChronoTime(deadline));
    otlp::ExportTraceServiceResponse response;
    const grpc::Status status = stub_->Export(&context, request, &response);
    if (status.ok()) {
      const int64_t rejected = std::clamp<int64_t>(response.partial_success().rejected_spans(), 0,
                                                   static_cast<int64_t>(batch.size()));
      const int64_t accepted = static_cast<int64_t>(batch.size()) - rejected;
      {
        std::lock_guard<std::mutex> lock(mu_);
        exported_ += accepted;
        dropped_ += rejected;
      }
      if (options_.exported != nullptr) options_.exported->Add(static_cast<double>(accepted));
      if (rejected > 0 && options_.dropped != nullptr) {
        options_.dropped->Add(static_cast<double>(rejected));
      }
      return true;  // (rejected spans are not sent again: the receiver said they are bad)
    }
    if (options_.export_failures != nullptr) options_.export_failures->Add();
    bool stopping;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping = stopping_;
    }
    if (!Retryable(status.error_code()) || attempt >= 3 || stopping) {
      // Once a minute at most: a receiver that stays down is one line, not one a batch.
      const absl::Time now = absl::Now();
      if (now - last_warning_ >= absl::Minutes(1)) {
        LOG(WARNING) << "tracing: " << batch.size() << " spans not exported to "
                     << options_.endpoint << ": " << status.error_message()
                     << " (kvrm:otlp_spans_dropped_total counts them; said at most once a minute)";
        last_warning_ = now;
      }
      if (options_.dropped != nullptr) options_.dropped->Add(static_cast<double>(batch.size()));
      return false;
    }
    absl::SleepFor(backoff);
    backoff *= 2;
  }
}

}  // namespace kvrm
