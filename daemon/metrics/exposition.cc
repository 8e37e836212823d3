#include "daemon/metrics/exposition.h"

#include <cmath>
#include <limits>
#include <utility>

#include "common/check.h"
#include "prometheus/check_names.h"
#include "prometheus/text_serializer.h"

namespace longhaul::metrics {

FamilyBuilder::FamilyBuilder(std::string name, std::string help, prometheus::MetricType type,
                             std::vector<std::string> label_names, std::vector<double> upper_bounds)
    : name_(std::move(name)),
      help_(std::move(help)),
      type_(type),
      label_names_(std::move(label_names)),
      upper_bounds_(std::move(upper_bounds)) {
  LONGHAUL_CHECK(prometheus::CheckMetricName(name_)) << "bad metric name '" << name_ << "'";
  // prometheus-cpp 1.0 writes HELP text as it is.
  LONGHAUL_CHECK(help_.find_first_of("\\\n") == std::string::npos)
      << name_ << ": help text must not hold a newline or a backslash";
  for (const std::string& label : label_names_) {
    LONGHAUL_CHECK(prometheus::CheckLabelName(label) &&
                   !(type_ == prometheus::MetricType::Histogram && label == "le"))
        << name_ << ": bad label name '" << label << "'";
  }
  for (size_t i = 0; i < upper_bounds_.size(); ++i) {
    LONGHAUL_CHECK(std::isfinite(upper_bounds_[i]) &&
                   (i == 0 || upper_bounds_[i] > upper_bounds_[i - 1]))
        << name_ << ": histogram bounds must be finite and strictly increasing";
  }
}

FamilyBuilder FamilyBuilder::Counter(std::string name, std::string help,
                                     std::vector<std::string> label_names) {
  return FamilyBuilder(std::move(name), std::move(help), prometheus::MetricType::Counter,
                       std::move(label_names), {});
}

FamilyBuilder FamilyBuilder::Gauge(std::string name, std::string help,
                                   std::vector<std::string> label_names) {
  return FamilyBuilder(std::move(name), std::move(help), prometheus::MetricType::Gauge,
                       std::move(label_names), {});
}

FamilyBuilder FamilyBuilder::Histogram(std::string name, std::string help,
                                       std::vector<double> upper_bounds,
                                       std::vector<std::string> label_names) {
  return FamilyBuilder(std::move(name), std::move(help), prometheus::MetricType::Histogram,
                       std::move(label_names), std::move(upper_bounds));
}

prometheus::ClientMetric& FamilyBuilder::Sample(const std::vector<std::string>& label_values) {
  LONGHAUL_CHECK(label_values.size() == label_names_.size())
      << name_ << ": expected " << label_names_.size() << " label values, got "
      << label_values.size();
  prometheus::ClientMetric& sample = samples_[label_values];
  sample = {};
  for (size_t i = 0; i < label_names_.size(); ++i) {
    sample.label.push_back({label_names_[i], label_values[i]});
  }
  return sample;
}

FamilyBuilder& FamilyBuilder::Set(const std::vector<std::string>& label_values, double value) {
  switch (type_) {
    case prometheus::MetricType::Counter:
      Sample(label_values).counter.value = value;
      break;
    case prometheus::MetricType::Gauge:
      Sample(label_values).gauge.value = value;
      break;
    default:
      LONGHAUL_CHECK(false) << name_ << ": Set() is for counters and gauges";
  }
  return *this;
}

FamilyBuilder& FamilyBuilder::SetHistogram(const std::vector<std::string>& label_values,
                                           absl::Span<const uint64_t> bucket_counts, double sum) {
  LONGHAUL_CHECK(type_ == prometheus::MetricType::Histogram)
      << name_ << ": SetHistogram() is for histograms";
  LONGHAUL_CHECK(bucket_counts.size() == upper_bounds_.size() + 1)
      << name_ << ": a histogram needs one count per bound plus the overflow";
  prometheus::ClientMetric::Histogram& h = Sample(label_values).histogram;
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bucket_counts.size(); ++i) {
    cumulative += bucket_counts[i];
    h.bucket.push_back({cumulative, i < upper_bounds_.size()
                                        ? upper_bounds_[i]
                                        : std::numeric_limits<double>::infinity()});
  }
  h.sample_count = cumulative;
  h.sample_sum = sum;
  return *this;
}

prometheus::MetricFamily FamilyBuilder::Build() {
  prometheus::MetricFamily family{std::move(name_), std::move(help_), type_, {}};
  family.metric.reserve(samples_.size());
  for (auto& [values, sample] : samples_) family.metric.push_back(std::move(sample));
  return family;
}

std::string RenderText(const prometheus::Collectable& metrics) {
  return prometheus::TextSerializer().Serialize(metrics.Collect());
}

}  // namespace longhaul::metrics
