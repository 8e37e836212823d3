// What longhaul adds to prometheus-cpp's core: families built from figures
// read at scrape time, and the text rendering of a scrape.
//
// longhauld's series mirror counts that its components keep themselves
// (TransferManager::List, Receiver::stats, Journal::stats...). A collector
// (a prometheus::Collectable) reads those snapshots in Collect() and returns
// one prometheus::MetricFamily per metric, built with FamilyBuilder; the data
// path carries no metrics code. prometheus::TextSerializer writes the text.
#ifndef LONGHAUL_DAEMON_METRICS_EXPOSITION_H_
#define LONGHAUL_DAEMON_METRICS_EXPOSITION_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "prometheus/client_metric.h"
#include "prometheus/collectable.h"
#include "prometheus/metric_family.h"
#include "prometheus/metric_type.h"

namespace longhaul::metrics {

// Builds one metric family (the Prometheus "const metric" pattern): a sample
// per combination of label values, set from a snapshot rather than counted
// live. Labels render in the order of `label_names`; samples render sorted
// by their label values; setting the same label values again replaces the
// sample. Names must follow the Prometheus conventions
// ([a-zA-Z_:][a-zA-Z0-9_:]*, `_total` for counters, base units such as
// `_seconds` and `_bytes`). Misuse (a bad name, the wrong number of label
// values, a histogram's `le` label, help text with a newline or backslash)
// is a programming error and aborts.
//
// Not thread-safe: build a family on one thread, within one Collect().
class FamilyBuilder {
 public:
  static FamilyBuilder Counter(std::string name, std::string help,
                               std::vector<std::string> label_names = {});
  static FamilyBuilder Gauge(std::string name, std::string help,
                             std::vector<std::string> label_names = {});
  // `upper_bounds` must be finite and strictly increasing; the +Inf bucket
  // is implicit.
  static FamilyBuilder Histogram(std::string name, std::string help,
                                 std::vector<double> upper_bounds,
                                 std::vector<std::string> label_names = {});

  // A counter's or a gauge's sample. A counter's source keeps it monotonic;
  // a smaller value reads as a counter reset, as after a restart.
  FamilyBuilder& Set(const std::vector<std::string>& label_values, double value);
  // A histogram's sample from counts kept by a component: `bucket_counts`
  // holds one count per upper bound plus a last one for the overflow (not
  // cumulative); `sum` is the sum of all observations.
  FamilyBuilder& SetHistogram(const std::vector<std::string>& label_values,
                              absl::Span<const uint64_t> bucket_counts, double sum);

  // The family, with no samples if none was set (it still renders its
  // # HELP and # TYPE lines). Call once: the builder is spent after it.
  prometheus::MetricFamily Build();

 private:
  FamilyBuilder(std::string name, std::string help, prometheus::MetricType type,
                std::vector<std::string> label_names, std::vector<double> upper_bounds);
  prometheus::ClientMetric& Sample(const std::vector<std::string>& label_values);

  std::string name_;
  std::string help_;
  prometheus::MetricType type_;
  std::vector<std::string> label_names_;
  std::vector<double> upper_bounds_;
  std::map<std::vector<std::string>, prometheus::ClientMetric> samples_;
};

// The Prometheus text exposition (version 0.0.4) of `metrics.Collect()`,
// families in the order the collectable returns them.
std::string RenderText(const prometheus::Collectable& metrics);

// The Content-Type of RenderText() output.
inline constexpr char kExpositionContentType[] = "text/plain; version=0.0.4; charset=utf-8";

}  // namespace longhaul::metrics

#endif  // LONGHAUL_DAEMON_METRICS_EXPOSITION_H_
