// A small metrics registry that renders the Prometheus text exposition format
// (version 0.0.4): counters, gauges and histograms, each a family of series
// keyed by label values.
//
// longhauld fills most series at scrape time: a collector registered with
// AddCollector() copies figures from the components' snapshot accessors
// (TransferManager::List, Receiver::stats, Journal::stats...) just before the
// text is rendered, so the data path carries no metrics code.
#ifndef LONGHAUL_DAEMON_METRICS_REGISTRY_H_
#define LONGHAUL_DAEMON_METRICS_REGISTRY_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"

namespace longhaul::metrics {

// A monotonically increasing value. Thread-safe.
class Counter {
 public:
  void Increment(double by = 1.0);
  // Mirrors a count that a component keeps itself. The caller keeps it
  // monotonic; a smaller value reads as a counter reset, as after a restart.
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// A value that goes up and down. Thread-safe.
class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Add(double by);
  double value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0.0};
};

// Counts observations into buckets with fixed upper bounds (le="..."), plus
// the implicit +Inf bucket. Thread-safe.
class Histogram {
 public:
  // `upper_bounds` must be strictly increasing and finite.
  explicit Histogram(std::vector<double> upper_bounds);

  void Observe(double value);
  // Replaces the contents with counts kept by a component: `bucket_counts`
  // holds one count per upper bound plus a last one for the overflow
  // (not cumulative); `sum` is the sum of all observations.
  void SetCounts(absl::Span<const uint64_t> bucket_counts, double sum);

  struct Snapshot {
    std::vector<double> upper_bounds;
    std::vector<uint64_t> counts;  // per bucket (not cumulative); last: overflow
    double sum = 0;
    uint64_t count = 0;
  };
  Snapshot Get() const;

 private:
  const std::vector<double> upper_bounds_;
  mutable absl::Mutex mu_;
  std::vector<uint64_t> counts_ ABSL_GUARDED_BY(mu_);
  double sum_ ABSL_GUARDED_BY(mu_) = 0;
};

enum class MetricType { kCounter, kGauge, kHistogram };

// The series of one metric name, one per combination of label values.
// Thread-safe. Series live as long as the family unless Clear() drops them;
// references returned by WithLabels stay valid until then.
template <typename M>
class Family {
 public:
  // The series for `label_values`, in the order of the family's label names
  // (their number must match), created on first use.
  M& WithLabels(const std::vector<std::string>& label_values);
  // Drops every series: for snapshots whose label sets change between
  // scrapes (a peer removed, a state no transfer is in).
  void Clear();

 private:
  friend class Registry;
  Family(std::string name, std::string help, MetricType type, std::vector<std::string> label_names,
         std::function<std::unique_ptr<M>()> make)
      : name_(std::move(name)),
        help_(std::move(help)),
        type_(type),
        label_names_(std::move(label_names)),
        make_(std::move(make)) {}
  void Render(std::string& out) const;

  const std::string name_;
  const std::string help_;
  const MetricType type_;
  const std::vector<std::string> label_names_;
  const std::function<std::unique_ptr<M>()> make_;
  mutable absl::Mutex mu_;
  std::map<std::vector<std::string>, std::unique_ptr<M>> series_ ABSL_GUARDED_BY(mu_);
};

// Owns metric families and renders them. Thread-safe: families may be added,
// updated and rendered from any thread. Names must follow the Prometheus
// conventions ([a-zA-Z_:][a-zA-Z0-9_:]*, `_total` for counters, base units
// such as `_seconds` and `_bytes`); a bad or duplicate name is a programming
// error and aborts.
class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // The returned family is owned by the registry and lives as long as it.
  Family<Counter>& AddCounter(const std::string& name, const std::string& help,
                              std::vector<std::string> label_names = {});
  Family<Gauge>& AddGauge(const std::string& name, const std::string& help,
                          std::vector<std::string> label_names = {});
  Family<Histogram>& AddHistogram(const std::string& name, const std::string& help,
                                  std::vector<double> upper_bounds,
                                  std::vector<std::string> label_names = {});

  // `collect` runs at the start of every Render(), on the rendering thread,
  // to refresh series from their sources. Collectors run one at a time.
  void AddCollector(std::function<void()> collect);

  // Runs the collectors, then renders every family in the order added, with
  // its # HELP and # TYPE lines.
  std::string Render();

 private:
  struct Entry;
  void CheckNewName(const std::string& name, const std::vector<std::string>& label_names)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex collect_mu_;  // one scrape's collect + render at a time
  absl::Mutex mu_;
  std::vector<std::unique_ptr<Entry>> entries_ ABSL_GUARDED_BY(mu_);
  std::vector<std::function<void()>> collectors_ ABSL_GUARDED_BY(mu_);
};

// Exposition-format helpers, exposed for tests.
// A sample value: integers without a fraction, "+Inf", "-Inf", "NaN".
std::string FormatValue(double value);
// A label value with \, " and newline escaped.
std::string EscapeLabelValue(const std::string& value);
// HELP text with \ and newline escaped.
std::string EscapeHelp(const std::string& help);

// The Content-Type of Registry::Render() output.
inline constexpr char kExpositionContentType[] = "text/plain; version=0.0.4; charset=utf-8";

}  // namespace longhaul::metrics

#endif  // LONGHAUL_DAEMON_METRICS_REGISTRY_H_
