#include "daemon/metrics/registry.h"

#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace longhaul::metrics {
namespace {

TEST(FormatValueTest, IntegersHaveNoFraction) {
  EXPECT_EQ(FormatValue(0), "0");
  EXPECT_EQ(FormatValue(42), "42");
  EXPECT_EQ(FormatValue(-7), "-7");
  EXPECT_EQ(FormatValue(1e15), "1000000000000000");
}

TEST(FormatValueTest, FractionsRoundTrip) {
  EXPECT_EQ(FormatValue(0.25), "0.25");
  EXPECT_EQ(FormatValue(0.001), "0.001");
  EXPECT_EQ(FormatValue(0.0001), "0.0001");
  EXPECT_EQ(FormatValue(1e-9), "1e-09");
  EXPECT_EQ(std::stod(FormatValue(0.1 + 0.2)), 0.1 + 0.2);
}

TEST(FormatValueTest, SpecialValuesUsePrometheusSpelling) {
  EXPECT_EQ(FormatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatValue(std::nan("")), "NaN");
}

TEST(EscapeTest, LabelValuesEscapeBackslashQuoteAndNewline) {
  EXPECT_EQ(EscapeLabelValue("a\\b\"c\nd"), "a\\\\b\\\"c\\nd");
  EXPECT_EQ(EscapeLabelValue("site-b"), "site-b");
}

TEST(EscapeTest, HelpEscapesBackslashAndNewlineButNotQuotes) {
  EXPECT_EQ(EscapeHelp("say \"hi\"\\\n"), "say \"hi\"\\\\\\n");
}

TEST(RegistryTest, RendersCounterWithHelpAndType) {
  Registry r;
  r.AddCounter("longhaul_bytes_sent_total", "Bytes sent.").WithLabels({}).Increment(1024);
  EXPECT_EQ(r.Render(),
            "# HELP longhaul_bytes_sent_total Bytes sent.\n"
            "# TYPE longhaul_bytes_sent_total counter\n"
            "longhaul_bytes_sent_total 1024\n");
}

TEST(RegistryTest, RendersLabelledGaugesSortedByLabelValues) {
  Registry r;
  auto& g = r.AddGauge("longhaul_peer_rtt_seconds", "RTT.", {"peer"});
  g.WithLabels({"site-c"}).Set(0.05);
  g.WithLabels({"site-b"}).Set(0.0125);
  EXPECT_EQ(r.Render(),
            "# HELP longhaul_peer_rtt_seconds RTT.\n"
            "# TYPE longhaul_peer_rtt_seconds gauge\n"
            "longhaul_peer_rtt_seconds{peer=\"site-b\"} 0.0125\n"
            "longhaul_peer_rtt_seconds{peer=\"site-c\"} 0.05\n");
}

TEST(RegistryTest, EscapesLabelValuesInSeries) {
  Registry r;
  r.AddGauge("x_info", "X.", {"algorithm", "peer"}).WithLabels({"b\"b", "a\\b"}).Set(1);
  EXPECT_NE(r.Render().find("x_info{algorithm=\"b\\\"b\",peer=\"a\\\\b\"} 1\n"), std::string::npos);
}

TEST(RegistryTest, HistogramBucketsAreCumulativeWithInfSumAndCount) {
  Registry r;
  auto& h = r.AddHistogram("longhaul_journal_write_seconds", "Latency.", {0.001, 0.01, 0.1});
  Histogram& series = h.WithLabels({});
  series.Observe(0.0005);
  series.Observe(0.001);  // on a bound: counts in that bucket (le is <=)
  series.Observe(0.05);
  series.Observe(3);
  EXPECT_EQ(r.Render(),
            "# HELP longhaul_journal_write_seconds Latency.\n"
            "# TYPE longhaul_journal_write_seconds histogram\n"
            "longhaul_journal_write_seconds_bucket{le=\"0.001\"} 2\n"
            "longhaul_journal_write_seconds_bucket{le=\"0.01\"} 2\n"
            "longhaul_journal_write_seconds_bucket{le=\"0.1\"} 3\n"
            "longhaul_journal_write_seconds_bucket{le=\"+Inf\"} 4\n"
            "longhaul_journal_write_seconds_sum 3.0515\n"
            "longhaul_journal_write_seconds_count 4\n");
}

TEST(RegistryTest, HistogramLabelsComeBeforeLe) {
  Registry r;
  auto& h = r.AddHistogram("h_seconds", "H.", {1}, {"peer"});
  h.WithLabels({"site-b"}).Observe(0.5);
  std::string text = r.Render();
  EXPECT_NE(text.find("h_seconds_bucket{peer=\"site-b\",le=\"1\"} 1\n"), std::string::npos) << text;
  EXPECT_NE(text.find("h_seconds_sum{peer=\"site-b\"} 0.5\n"), std::string::npos) << text;
}

TEST(RegistryTest, HistogramSetCountsMirrorsExternalBuckets) {
  Registry r;
  auto& h = r.AddHistogram("h_seconds", "H.", {0.1, 1});
  const uint64_t counts[] = {5, 3, 2};
  h.WithLabels({}).SetCounts(counts, 4.5);
  std::string text = r.Render();
  EXPECT_NE(text.find("h_seconds_bucket{le=\"0.1\"} 5\n"), std::string::npos);
  EXPECT_NE(text.find("h_seconds_bucket{le=\"1\"} 8\n"), std::string::npos);
  EXPECT_NE(text.find("h_seconds_bucket{le=\"+Inf\"} 10\n"), std::string::npos);
  EXPECT_NE(text.find("h_seconds_count 10\n"), std::string::npos);
  EXPECT_NE(text.find("h_seconds_sum 4.5\n"), std::string::npos);
}

TEST(RegistryTest, FamiliesRenderInRegistrationOrderAndEmptyOnesKeepHelp) {
  Registry r;
  r.AddGauge("b_gauge", "B.");
  r.AddCounter("a_total", "A.").WithLabels({}).Increment();
  std::string text = r.Render();
  EXPECT_LT(text.find("# HELP b_gauge"), text.find("# HELP a_total"));
  EXPECT_EQ(text.find("\nb_gauge "), std::string::npos);  // no series yet
}

TEST(RegistryTest, CollectorsRunBeforeEachRenderAndClearDropsSeries) {
  Registry r;
  auto& g = r.AddGauge("longhaul_transfers", "Transfers.", {"state"});
  int scrapes = 0;
  r.AddCollector([&] {
    ++scrapes;
    g.Clear();
    g.WithLabels({scrapes == 1 ? "queued" : "running"}).Set(scrapes);
  });
  EXPECT_NE(r.Render().find("longhaul_transfers{state=\"queued\"} 1\n"), std::string::npos);
  std::string second = r.Render();
  EXPECT_EQ(second.find("queued"), std::string::npos);
  EXPECT_NE(second.find("longhaul_transfers{state=\"running\"} 2\n"), std::string::npos);
}

TEST(RegistryTest, ConcurrentIncrementsAreNotLost) {
  Registry r;
  Counter& c = r.AddCounter("c_total", "C.").WithLabels({});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) c.Increment();
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(c.value(), 40000);
}

TEST(RegistryDeathTest, RejectsBadAndDuplicateNames) {
  EXPECT_DEATH(
      {
        Registry r;
        r.AddCounter("1bad", "x");
      },
      "bad metric name");
  EXPECT_DEATH(
      {
        Registry r;
        r.AddGauge("g", "x");
        r.AddGauge("g", "x");
      },
      "registered twice");
  EXPECT_DEATH(
      {
        Registry r;
        r.AddGauge("g", "x", {"peer"}).WithLabels({});
      },
      "expected 1 label values");
}

}  // namespace
}  // namespace longhaul::metrics
