#include "metrics/registry.h"

#include <algorithm>
#include <cmath>

#include "common/logging.h"
#include "metrics/exposition.h"

namespace kvrm {

namespace {

// atomic<double>::fetch_add is a compare-exchange loop; relaxed is enough because each cell is
// an independent statistic and scrapes tolerate reading a value one update old.
void AtomicAdd(std::atomic<double>& cell, double amount) {
  double old = cell.load(std::memory_order_relaxed);
  while (!cell.compare_exchange_weak(old, old + amount, std::memory_order_relaxed)) {
  }
}

}  // namespace

void Counter::Add(double amount) {
  if (!(amount > 0)) return;  // also drops NaN
  AtomicAdd(value_, amount);
}

void Gauge::Add(double amount) { AtomicAdd(value_, amount); }

Histogram::Histogram(const std::vector<double>* bounds)
    : bounds_(bounds), counts_(new std::atomic<uint64_t>[bounds->size() + 1]) {
  for (size_t i = 0; i <= bounds->size(); ++i) counts_[i].store(0, std::memory_order_relaxed);
}

void Histogram::Observe(double value) {
  // Prometheus buckets are upper-inclusive: the first bound >= value. NaN lands in +Inf.
  const std::vector<double>& b = *bounds_;
  const size_t i = std::lower_bound(b.begin(), b.end(), value) - b.begin();
  counts_[i].fetch_add(1, std::memory_order_relaxed);
  AtomicAdd(sum_, value);
}

std::vector<uint64_t> Histogram::CumulativeCounts() const {
  std::vector<uint64_t> out(bounds_->size() + 1);
  uint64_t running = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    running += counts_[i].load(std::memory_order_relaxed);
    out[i] = running;
  }
  return out;
}

uint64_t Histogram::Count() const { return CumulativeCounts().back(); }

template <>
std::unique_ptr<Counter> Family<Counter>::Make() const {
  return std::make_unique<Counter>();
}
template <>
std::unique_ptr<Gauge> Family<Gauge>::Make() const {
  return std::make_unique<Gauge>();
}
template <>
std::unique_ptr<Histogram> Family<Histogram>::Make() const {
  return std::make_unique<Histogram>(&bounds_);
}

template <typename T>
T& Family<T>::WithLabels(absl::Span<const std::string> values) {
  CHECK(values.size() == label_names_.size())
      << name_ << ": " << values.size() << " label values for " << label_names_.size() << " labels";
  std::lock_guard<std::mutex> lock(*mu_);
  for (Child& c : children_) {
    if (std::equal(c.label_values.begin(), c.label_values.end(), values.begin())) {
      return *c.metric;
    }
  }
  children_.push_back(Child{std::vector<std::string>(values.begin(), values.end()), Make()});
  return *children_.back().metric;
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

void MetricRegistry::CheckNew(const std::string& name,
                              const std::vector<std::string>& label_names) {
  CHECK(IsValidMetricName(name)) << "invalid metric name '" << name << "'";
  for (const std::string& l : label_names) {
    CHECK(IsValidLabelName(l)) << name << ": invalid label name '" << l << "'";
  }
  for (const Entry& e : families_) {
    const std::string& other = e.counter ? e.counter->name()
                               : e.gauge ? e.gauge->name()
                                         : e.histogram->name();
    CHECK(other != name) << "metric '" << name << "' registered twice";
  }
}

Family<Counter>& MetricRegistry::AddCounter(const std::string& name, const std::string& help,
                                            std::vector<std::string> label_names) {
  std::lock_guard<std::mutex> lock(mu_);
  CheckNew(name, label_names);
  Entry e;
  e.counter.reset(new Family<Counter>(&mu_, name, help, std::move(label_names), {}));
  families_.push_back(std::move(e));
  return *families_.back().counter;
}

Family<Gauge>& MetricRegistry::AddGauge(const std::string& name, const std::string& help,
                                        std::vector<std::string> label_names) {
  std::lock_guard<std::mutex> lock(mu_);
  CheckNew(name, label_names);
  Entry e;
  e.gauge.reset(new Family<Gauge>(&mu_, name, help, std::move(label_names), {}));
  families_.push_back(std::move(e));
  return *families_.back().gauge;
}

Family<Histogram>& MetricRegistry::AddHistogram(const std::string& name, const std::string& help,
                                                std::vector<std::string> label_names,
                                                std::vector<double> bounds) {
  std::lock_guard<std::mutex> lock(mu_);
  CheckNew(name, label_names);
  for (const std::string& l : label_names) CHECK(l != "le") << name << ": 'le' is reserved";
  CHECK(!bounds.empty()) << name << ": no buckets";
  for (size_t i = 0; i < bounds.size(); ++i) {
    CHECK(std::isfinite(bounds[i])) << name << ": bucket bounds must be finite (+Inf is implied)";
    CHECK(i == 0 || bounds[i] > bounds[i - 1]) << name << ": bucket bounds must increase";
  }
  Entry e;
  e.histogram.reset(
      new Family<Histogram>(&mu_, name, help, std::move(label_names), std::move(bounds)));
  families_.push_back(std::move(e));
  return *families_.back().histogram;
}

std::string MetricRegistry::Render() const {
  std::string out;
  std::lock_guard<std::mutex> lock(mu_);
  for (const Entry& e : families_) {
    if (e.counter) {
      const Family<Counter>& f = *e.counter;
      AppendHeader(&out, f.name_, f.help_, "counter");
      for (const auto& c : f.children_) {
        AppendSample(&out, f.name_, f.label_names_, c.label_values, "", c.metric->Value());
      }
    } else if (e.gauge) {
      const Family<Gauge>& f = *e.gauge;
      AppendHeader(&out, f.name_, f.help_, "gauge");
      for (const auto& c : f.children_) {
        AppendSample(&out, f.name_, f.label_names_, c.label_values, "", c.metric->Value());
      }
    } else {
      const Family<Histogram>& f = *e.histogram;
      AppendHeader(&out, f.name_, f.help_, "histogram");
      const std::string bucket = f.name_ + "_bucket";
      for (const auto& c : f.children_) {
        // One snapshot of the counts, so the buckets, +Inf and _count agree with each other.
        const std::vector<uint64_t> cum = c.metric->CumulativeCounts();
        for (size_t i = 0; i < f.bounds_.size(); ++i) {
          AppendSample(&out, bucket, f.label_names_, c.label_values, FormatValue(f.bounds_[i]),
                       static_cast<double>(cum[i]));
        }
        AppendSample(&out, bucket, f.label_names_, c.label_values, "+Inf",
                     static_cast<double>(cum.back()));
        AppendSample(&out, f.name_ + "_sum", f.label_names_, c.label_values, "", c.metric->Sum());
        AppendSample(&out, f.name_ + "_count", f.label_names_, c.label_values, "",
                     static_cast<double>(cum.back()));
      }
    }
  }
  return out;
}

}  // namespace kvrm
