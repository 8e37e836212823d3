#include "daemon/metrics/exposition.h"

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "prometheus/counter.h"
#include "prometheus/registry.h"

namespace longhaul::metrics {
namespace {

// A collectable that returns the families it is given.
class Families : public prometheus::Collectable {
 public:
  explicit Families(std::vector<prometheus::MetricFamily> families)
      : families_(std::move(families)) {}
  std::vector<prometheus::MetricFamily> Collect() const override { return families_; }

 private:
  std::vector<prometheus::MetricFamily> families_;
};

std::string Render(std::vector<prometheus::MetricFamily> families) {
  return RenderText(Families(std::move(families)));
}

std::string RenderOne(FamilyBuilder family) { return Render({family.Build()}); }

TEST(ExpositionTest, RendersCounterWithHelpAndType) {
  EXPECT_EQ(
      RenderOne(FamilyBuilder::Counter("longhaul_bytes_sent_total", "Bytes sent.").Set({}, 1024)),
      "# HELP longhaul_bytes_sent_total Bytes sent.\n"
      "# TYPE longhaul_bytes_sent_total counter\n"
      "longhaul_bytes_sent_total 1024\n");
}

TEST(ExpositionTest, SamplesAreSortedByLabelValues) {
  EXPECT_EQ(RenderOne(FamilyBuilder::Gauge("longhaul_peer_rtt_seconds", "RTT.", {"peer"})
                          .Set({"site-c"}, 0.05)
                          .Set({"site-b"}, 0.0125)),
            "# HELP longhaul_peer_rtt_seconds RTT.\n"
            "# TYPE longhaul_peer_rtt_seconds gauge\n"
            "longhaul_peer_rtt_seconds{peer=\"site-b\"} 0.0125\n"
            "longhaul_peer_rtt_seconds{peer=\"site-c\"} 0.05\n");
}

// Scrapers that match series as text (tests, grep-based checks) see the
// labels as they were declared, not alphabetically.
TEST(ExpositionTest, LabelsKeepTheirDeclaredOrder) {
  std::string text = RenderOne(
      FamilyBuilder::Gauge("longhaul_rate_limit_bytes_per_second", "Caps.", {"scope", "name"})
          .Set({"peer", "site-b"}, 5e8));
  EXPECT_NE(text.find("longhaul_rate_limit_bytes_per_second{scope=\"peer\",name=\"site-b\"} "
                      "500000000\n"),
            std::string::npos)
      << text;
}

TEST(ExpositionTest, SettingTheSameLabelsAgainReplacesTheSample) {
  EXPECT_EQ(
      RenderOne(FamilyBuilder::Gauge("g", "G.", {"peer"}).Set({"site-b"}, 1).Set({"site-b"}, 2)),
      "# HELP g G.\n"
      "# TYPE g gauge\n"
      "g{peer=\"site-b\"} 2\n");
}

TEST(ExpositionTest, EscapesLabelValues) {
  std::string text = RenderOne(
      FamilyBuilder::Gauge("x_info", "X.", {"algorithm", "peer"}).Set({"b\"b", "a\\b\nc"}, 1));
  EXPECT_NE(text.find("x_info{algorithm=\"b\\\"b\",peer=\"a\\\\b\\nc\"} 1\n"), std::string::npos)
      << text;
}

TEST(ExpositionTest, ValuesUsePrometheusSpelling) {
  std::string text = RenderOne(FamilyBuilder::Gauge("v", "V.", {"k"})
                                   .Set({"a"}, 0.0001)
                                   .Set({"b"}, 1e15)
                                   .Set({"c"}, -7)
                                   .Set({"d"}, std::numeric_limits<double>::infinity())
                                   .Set({"e"}, -std::numeric_limits<double>::infinity()));
  EXPECT_NE(text.find("v{k=\"a\"} 0.0001\n"), std::string::npos) << text;
  EXPECT_NE(text.find("v{k=\"b\"} 1000000000000000\n"), std::string::npos) << text;
  EXPECT_NE(text.find("v{k=\"c\"} -7\n"), std::string::npos) << text;
  EXPECT_NE(text.find("v{k=\"d\"} +Inf\n"), std::string::npos) << text;
  EXPECT_NE(text.find("v{k=\"e\"} -Inf\n"), std::string::npos) << text;
}

TEST(ExpositionTest, HistogramBucketsAreCumulativeWithInfSumAndCount) {
  const uint64_t counts[] = {2, 0, 1, 1};  // per bucket; the last is the overflow
  std::string text = RenderOne(
      FamilyBuilder::Histogram("longhaul_journal_write_seconds", "Latency.", {0.001, 0.01, 0.1})
          .SetHistogram({}, counts, 3.0515));
  EXPECT_NE(text.find("# TYPE longhaul_journal_write_seconds histogram\n"), std::string::npos);
  EXPECT_NE(text.find("longhaul_journal_write_seconds_bucket{le=\"0.001\"} 2\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("longhaul_journal_write_seconds_bucket{le=\"0.01\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("longhaul_journal_write_seconds_bucket{le=\"0.1\"} 3\n"), std::string::npos);
  EXPECT_NE(text.find("longhaul_journal_write_seconds_bucket{le=\"+Inf\"} 4\n"), std::string::npos);
  EXPECT_NE(text.find("longhaul_journal_write_seconds_sum 3.0515\n"), std::string::npos);
  EXPECT_NE(text.find("longhaul_journal_write_seconds_count 4\n"), std::string::npos);
}

TEST(ExpositionTest, HistogramLabelsComeBeforeLe) {
  const uint64_t counts[] = {1, 0};
  std::string text = RenderOne(FamilyBuilder::Histogram("h_seconds", "H.", {1}, {"peer"})
                                   .SetHistogram({"site-b"}, counts, 0.5));
  EXPECT_NE(text.find("h_seconds_bucket{peer=\"site-b\",le=\"1\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("h_seconds_sum{peer=\"site-b\"} 0.5\n"), std::string::npos) << text;
}

TEST(ExpositionTest, FamiliesRenderInTheirOrderAndEmptyOnesKeepHelp) {
  std::string text = Render({FamilyBuilder::Gauge("b_gauge", "B.").Build(),
                             FamilyBuilder::Counter("a_total", "A.").Set({}, 1).Build()});
  EXPECT_EQ(text,
            "# HELP b_gauge B.\n"
            "# TYPE b_gauge gauge\n"
            "# HELP a_total A.\n"
            "# TYPE a_total counter\n"
            "a_total 1\n");
}

// The library's own live metrics render through the same path.
TEST(ExpositionTest, RendersAPrometheusRegistry) {
  prometheus::Registry registry;
  auto& counter = prometheus::BuildCounter().Name("c_total").Help("C.").Register(registry).Add({});
  counter.Increment(3);
  EXPECT_EQ(RenderText(registry),
            "# HELP c_total C.\n"
            "# TYPE c_total counter\n"
            "c_total 3\n");
}

TEST(ExpositionDeathTest, RejectsMisuse) {
  EXPECT_DEATH(FamilyBuilder::Counter("1bad", "x"), "bad metric name");
  EXPECT_DEATH(FamilyBuilder::Gauge("g", "x", {"__reserved"}), "bad label name");
  EXPECT_DEATH(FamilyBuilder::Histogram("h", "x", {1}, {"le"}), "bad label name");
  EXPECT_DEATH(FamilyBuilder::Histogram("h", "x", {1, 1}), "strictly increasing");
  EXPECT_DEATH(FamilyBuilder::Gauge("g", "two\nlines"), "help text");
  EXPECT_DEATH(FamilyBuilder::Gauge("g", "x", {"peer"}).Set({}, 1), "expected 1 label values");
  const uint64_t counts[] = {1};
  EXPECT_DEATH(FamilyBuilder::Histogram("h", "x", {1}).SetHistogram({}, counts, 0),
               "one count per bound");
  EXPECT_DEATH(FamilyBuilder::Histogram("h", "x", {1}).Set({}, 1), "for counters and gauges");
}

}  // namespace
}  // namespace longhaul::metrics
