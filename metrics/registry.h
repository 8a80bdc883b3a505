// A small Prometheus metrics registry: counters, gauges and fixed-bucket histograms in labelled
// families, rendered in the text exposition format (version 0.0.4).
//
// Recording is lock-free and allocation-free: every labelled child is a cell of atomics created
// up front (WithLabels, at start-up) and the caller keeps the returned reference; Add / Set /
// Observe touch only that cell's atomics with relaxed ordering. Creation and Render take the
// registry's mutex; they are for start-up and scrapes, never the step path.
#ifndef KVRM_METRICS_REGISTRY_H_
#define KVRM_METRICS_REGISTRY_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/types/span.h"

namespace kvrm {

// A monotonically increasing value. Add() with a negative amount is ignored (counters never go
// down; a reset is a process restart).
class Counter {
 public:
  void Add(double amount = 1.0);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Add(double amount);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Fixed upper bounds (sorted, finite; +Inf is implicit). Counts are kept per bucket and made
// cumulative only when rendered, so an observation increments exactly one counter.
class Histogram {
 public:
  explicit Histogram(const std::vector<double>* bounds);
  void Observe(double value);

  // Snapshot for rendering and tests: cumulative counts per bound, then +Inf (== count).
  std::vector<uint64_t> CumulativeCounts() const;
  double Sum() const { return sum_.load(std::memory_order_relaxed); }
  uint64_t Count() const;
  const std::vector<double>& bounds() const { return *bounds_; }

 private:
  const std::vector<double>* bounds_;                // owned by the family
  std::unique_ptr<std::atomic<uint64_t>[]> counts_;  // [bounds + 1]; the last is (max, +Inf]
  std::atomic<double> sum_{0.0};
};

// One metric name with its HELP, TYPE, label names and labelled children.
template <typename T>
class Family {
 public:
  // Returns the child for these label values (one per label name, in order), creating it on
  // first use. Children live as long as the registry; keep the reference.
  T& WithLabels(absl::Span<const std::string> values);
  T& WithLabels(std::initializer_list<std::string> values) {
    return WithLabels(absl::MakeConstSpan(values.begin(), values.size()));
  }

  const std::string& name() const { return name_; }

 private:
  friend class MetricRegistry;
  struct Child {
    std::vector<std::string> label_values;
    std::unique_ptr<T> metric;
  };
  Family(std::mutex* mu, std::string name, std::string help, std::vector<std::string> labels,
         std::vector<double> bounds)
      : mu_(mu),
        name_(std::move(name)),
        help_(std::move(help)),
        label_names_(std::move(labels)),
        bounds_(std::move(bounds)) {}
  std::unique_ptr<T> Make() const;

  std::mutex* mu_;  // the registry's
  const std::string name_;
  const std::string help_;
  const std::vector<std::string> label_names_;
  const std::vector<double> bounds_;  // histograms only
  std::deque<Child> children_;        // guarded by *mu_; a deque keeps children in place
};

class MetricRegistry {
 public:
  MetricRegistry() = default;
  MetricRegistry(const MetricRegistry&) = delete;
  MetricRegistry& operator=(const MetricRegistry&) = delete;

  // Names and label names must be valid Prometheus names and unique in the registry (CHECKed:
  // they are compile-time constants). Label names may not be "le" for histograms.
  Family<Counter>& AddCounter(const std::string& name, const std::string& help,
                              std::vector<std::string> label_names = {});
  Family<Gauge>& AddGauge(const std::string& name, const std::string& help,
                          std::vector<std::string> label_names = {});
  // `bounds`: strictly increasing finite upper bounds.
  Family<Histogram>& AddHistogram(const std::string& name, const std::string& help,
                                  std::vector<std::string> label_names, std::vector<double> bounds);

  // The text exposition of every family, in registration order, children in creation order.
  std::string Render() const;

 private:
  void CheckNew(const std::string& name, const std::vector<std::string>& label_names);

  mutable std::mutex mu_;
  // One entry per family, in registration order (the exposition's order); exactly one pointer
  // is set.
  struct Entry {
    std::unique_ptr<Family<Counter>> counter;
    std::unique_ptr<Family<Gauge>> gauge;
    std::unique_ptr<Family<Histogram>> histogram;
  };
  std::vector<Entry> families_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvrm

#endif  // KVRM_METRICS_REGISTRY_H_
