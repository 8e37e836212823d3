#include "daemon/metrics/registry.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <type_traits>
#include <variant>

#include "absl/strings/str_cat.h"

namespace longhaul::metrics {
namespace {

[[noreturn]] void Die(const std::string& why) {
  std::fprintf(stderr, "metrics registry: %s\n", why.c_str());
  std::abort();
}

bool IsMetricName(const std::string& name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    bool digit = c >= '0' && c <= '9';
    if (!(alpha || (i > 0 && digit))) return false;
  }
  return true;
}

bool IsLabelName(const std::string& name) {
  if (name.empty() || name.rfind("__", 0) == 0) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    bool digit = c >= '0' && c <= '9';
    if (!(alpha || (i > 0 && digit))) return false;
  }
  return true;
}

void AtomicAdd(std::atomic<double>& target, double by) {
  double current = target.load(std::memory_order_relaxed);
  while (!target.compare_exchange_weak(current, current + by, std::memory_order_relaxed)) {
  }
}

// `{a="x",b="y"}`, with `extra` (e.g. le="0.5") appended; "" without labels.
std::string LabelSet(const std::vector<std::string>& names, const std::vector<std::string>& values,
                     const std::string& extra = "") {
  if (names.empty() && extra.empty()) return "";
  std::string out = "{";
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) out += ',';
    absl::StrAppend(&out, names[i], "=\"", EscapeLabelValue(values[i]), "\"");
  }
  if (!extra.empty()) {
    if (!names.empty()) out += ',';
    out += extra;
  }
  out += '}';
  return out;
}

const char* TypeName(MetricType type) {
  switch (type) {
    case MetricType::kCounter:
      return "counter";
    case MetricType::kGauge:
      return "gauge";
    case MetricType::kHistogram:
      return "histogram";
  }
  return "untyped";
}

}  // namespace

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  // Integers print without a fraction or exponent up to 2^53, where doubles
  // stop being exact.
  if (value == std::floor(value) && std::fabs(value) < 9007199254740992.0) {
    return absl::StrCat(static_cast<int64_t>(value));
  }
  // Shortest round-trip digits; plain decimals ("0.0001", not "1e-04") in
  // the range where they stay short, as Prometheus clients print them.
  char buf[400];
  const double magnitude = std::fabs(value);
  const auto format = magnitude >= 1e-6 && magnitude < 1e15 ? std::chars_format::fixed
                                                             : std::chars_format::general;
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), value, format);
  if (ec != std::errc()) return "NaN";
  return std::string(buf, end);
}

std::string EscapeLabelValue(const std::string& value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string EscapeHelp(const std::string& help) {
  std::string out;
  out.reserve(help.size());
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

void Counter::Increment(double by) {
  if (by < 0) Die("a counter cannot decrease");
  AtomicAdd(value_, by);
}

void Gauge::Add(double by) { AtomicAdd(value_, by); }

Histogram::Histogram(std::vector<double> upper_bounds) : upper_bounds_(std::move(upper_bounds)) {
  for (size_t i = 0; i < upper_bounds_.size(); ++i) {
    if (!std::isfinite(upper_bounds_[i]) || (i > 0 && upper_bounds_[i] <= upper_bounds_[i - 1])) {
      Die("histogram bounds must be finite and strictly increasing");
    }
  }
  counts_.assign(upper_bounds_.size() + 1, 0);
}

void Histogram::Observe(double value) {
  size_t i = 0;
  while (i < upper_bounds_.size() && value > upper_bounds_[i]) ++i;
  absl::MutexLock lock(&mu_);
  ++counts_[i];
  sum_ += value;
}

void Histogram::SetCounts(absl::Span<const uint64_t> bucket_counts, double sum) {
  if (bucket_counts.size() != upper_bounds_.size() + 1) {
    Die("histogram SetCounts needs one count per bound plus the overflow");
  }
  absl::MutexLock lock(&mu_);
  counts_.assign(bucket_counts.begin(), bucket_counts.end());
  sum_ = sum;
}

Histogram::Snapshot Histogram::Get() const {
  Snapshot s;
  s.upper_bounds = upper_bounds_;
  absl::MutexLock lock(&mu_);
  s.counts = counts_;
  s.sum = sum_;
  for (uint64_t c : counts_) s.count += c;
  return s;
}

template <typename M>
M& Family<M>::WithLabels(const std::vector<std::string>& label_values) {
  if (label_values.size() != label_names_.size()) {
    Die(absl::StrCat(name_, ": expected ", label_names_.size(), " label values, got ",
                     label_values.size()));
  }
  absl::MutexLock lock(&mu_);
  std::unique_ptr<M>& series = series_[label_values];
  if (!series) series = make_();
  return *series;
}

template <typename M>
void Family<M>::Clear() {
  absl::MutexLock lock(&mu_);
  series_.clear();
}

template <typename M>
void Family<M>::Render(std::string& out) const {
  absl::StrAppend(&out, "# HELP ", name_, " ", EscapeHelp(help_), "\n");
  absl::StrAppend(&out, "# TYPE ", name_, " ", TypeName(type_), "\n");
  absl::MutexLock lock(&mu_);
  for (const auto& [values, series] : series_) {
    if constexpr (std::is_same_v<M, Histogram>) {
      Histogram::Snapshot s = series->Get();
      uint64_t cumulative = 0;
      for (size_t i = 0; i < s.upper_bounds.size(); ++i) {
        cumulative += s.counts[i];
        absl::StrAppend(&out, name_, "_bucket",
                        LabelSet(label_names_, values,
                                 absl::StrCat("le=\"", FormatValue(s.upper_bounds[i]), "\"")),
                        " ", cumulative, "\n");
      }
      absl::StrAppend(&out, name_, "_bucket", LabelSet(label_names_, values, "le=\"+Inf\""), " ",
                      s.count, "\n");
      absl::StrAppend(&out, name_, "_sum", LabelSet(label_names_, values), " ", FormatValue(s.sum),
                      "\n");
      absl::StrAppend(&out, name_, "_count", LabelSet(label_names_, values), " ", s.count, "\n");
    } else {
      absl::StrAppend(&out, name_, LabelSet(label_names_, values), " ",
                      FormatValue(series->value()), "\n");
    }
  }
}

template class Family<Counter>;
template class Family<Gauge>;
template class Family<Histogram>;

struct Registry::Entry {
  std::string name;
  std::variant<std::unique_ptr<Family<Counter>>, std::unique_ptr<Family<Gauge>>,
               std::unique_ptr<Family<Histogram>>>
      family;
};

Registry::Registry() = default;
Registry::~Registry() = default;

void Registry::CheckNewName(const std::string& name, const std::vector<std::string>& label_names) {
  if (!IsMetricName(name)) Die(absl::StrCat("bad metric name '", name, "'"));
  for (const std::string& label : label_names) {
    if (!IsLabelName(label)) Die(absl::StrCat(name, ": bad label name '", label, "'"));
  }
  for (const auto& e : entries_) {
    if (e->name == name) Die(absl::StrCat("metric '", name, "' registered twice"));
  }
}

Family<Counter>& Registry::AddCounter(const std::string& name, const std::string& help,
                                      std::vector<std::string> label_names) {
  absl::MutexLock lock(&mu_);
  CheckNewName(name, label_names);
  auto family = std::unique_ptr<Family<Counter>>(new Family<Counter>(
      name, help, MetricType::kCounter, std::move(label_names),
      [] { return std::make_unique<Counter>(); }));
  Family<Counter>& ref = *family;
  entries_.push_back(std::make_unique<Entry>(Entry{name, std::move(family)}));
  return ref;
}

Family<Gauge>& Registry::AddGauge(const std::string& name, const std::string& help,
                                  std::vector<std::string> label_names) {
  absl::MutexLock lock(&mu_);
  CheckNewName(name, label_names);
  auto family = std::unique_ptr<Family<Gauge>>(
      new Family<Gauge>(name, help, MetricType::kGauge, std::move(label_names),
                        [] { return std::make_unique<Gauge>(); }));
  Family<Gauge>& ref = *family;
  entries_.push_back(std::make_unique<Entry>(Entry{name, std::move(family)}));
  return ref;
}

Family<Histogram>& Registry::AddHistogram(const std::string& name, const std::string& help,
                                          std::vector<double> upper_bounds,
                                          std::vector<std::string> label_names) {
  absl::MutexLock lock(&mu_);
  CheckNewName(name, label_names);
  for (const std::string& label : label_names) {
    if (label == "le") Die(absl::StrCat(name, ": a histogram cannot have an 'le' label"));
  }
  Histogram check(upper_bounds);  // dies here, not at first use, on bad bounds
  auto family = std::unique_ptr<Family<Histogram>>(new Family<Histogram>(
      name, help, MetricType::kHistogram, std::move(label_names),
      [bounds = std::move(upper_bounds)] { return std::make_unique<Histogram>(bounds); }));
  Family<Histogram>& ref = *family;
  entries_.push_back(std::make_unique<Entry>(Entry{name, std::move(family)}));
  return ref;
}

void Registry::AddCollector(std::function<void()> collect) {
  absl::MutexLock lock(&mu_);
  collectors_.push_back(std::move(collect));
}

std::string Registry::Render() {
  absl::MutexLock scrape(&collect_mu_);
  std::vector<std::function<void()>> collectors;
  {
    absl::MutexLock lock(&mu_);
    collectors = collectors_;
  }
  for (const auto& collect : collectors) collect();
  std::string out;
  absl::MutexLock lock(&mu_);
  for (const auto& e : entries_) {
    std::visit([&out](const auto& family) { family->Render(out); }, e->family);
  }
  return out;
}

}  // namespace longhaul::metrics
