#include "daemon/metrics/daemon_metrics.h"

#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>

#include "common/clock.h"
#include "daemon/metrics/exposition.h"
#include "daemon/peer/rate_limiter.h"
#include "daemon/transport/transport.h"
#include "gtest/gtest.h"
#include "storage/journal.h"

namespace longhaul::metrics {
namespace {

class DaemonMetricsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (std::filesystem::temp_directory_path() / "lh-metrics-XXXXXX").string();
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    auto journal = storage::Journal::Open(dir_ + "/journal", &clock_);
    ASSERT_TRUE(journal.ok()) << journal.status();
    journal_ = std::move(*journal);
  }
  void TearDown() override {
    journal_.reset();
    std::filesystem::remove_all(dir_);
  }

  FakeClock clock_;
  std::string dir_;
  std::unique_ptr<storage::Journal> journal_;
};

TEST_F(DaemonMetricsTest, JournalLatencyIsAHistogramOfSyncedWrites) {
  DaemonCollector metrics({"site-a", nullptr, nullptr, journal_.get(), nullptr});
  v1::OutgoingTransfer t;
  t.set_id("t1");
  ASSERT_TRUE(journal_->PutOutgoing(t, /*sync=*/true).ok());
  ASSERT_TRUE(journal_->PutOutgoing(t, /*sync=*/true).ok());
  ASSERT_TRUE(journal_->PutOutgoing(t, /*sync=*/false).ok());  // not a durability write
  std::string text = RenderText(metrics);
  // The fake clock does not move: both synced writes took 0 s.
  EXPECT_NE(text.find("# TYPE longhaul_journal_write_seconds histogram\n"), std::string::npos);
  EXPECT_NE(text.find("longhaul_journal_write_seconds_bucket{le=\"0.0001\"} 2\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("longhaul_journal_write_seconds_bucket{le=\"+Inf\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("longhaul_journal_write_seconds_count 2\n"), std::string::npos);
  EXPECT_NE(text.find("longhaul_build_info{site=\"site-a\",version=\"0.1.0\"} 1\n"),
            std::string::npos);
}

TEST_F(DaemonMetricsTest, RateCapsFollowTheLimiter) {
  peer::RateLimiter limiter(clock_);
  DaemonCollector metrics({"site-a", nullptr, nullptr, nullptr, &limiter});
  limiter.SetPeerLimit("site-b", Bandwidth::MbitsPerSecond(500));
  limiter.SetClassLimit(v1::BACKGROUND, Bandwidth::MbitsPerSecond(100));
  std::string text = RenderText(metrics);
  EXPECT_NE(
      text.find("longhaul_rate_limit_bytes_per_second{scope=\"peer\",name=\"site-b\"} 62500000\n"),
      std::string::npos)
      << text;
  EXPECT_NE(
      text.find(
          "longhaul_rate_limit_bytes_per_second{scope=\"class\",name=\"background\"} 12500000\n"),
      std::string::npos);
  limiter.SetPeerLimit("site-b", Bandwidth::Zero());  // off
  EXPECT_EQ(RenderText(metrics).find("name=\"site-b\""), std::string::npos);
}

// A transport that only reports connection counters.
class CountingTransport : public transport::Transport {
 public:
  absl::StatusOr<std::unique_ptr<transport::Channel>> Dial(const std::string&,
                                                           const std::string&) override {
    return absl::UnimplementedError("no dialling");
  }
  absl::Status Listen(const std::string&, transport::ChannelHandler) override {
    return absl::UnimplementedError("no listening");
  }
  uint16_t listen_port() const override { return 0; }
  void Shutdown() override {}
  transport::ConnectionCounters connection_counters() const override { return counters; }

  transport::ConnectionCounters counters;
};

TEST(DaemonCollectorTest, ConnectionCountersAreSeriesByReason) {
  CountingTransport tcp;
  tcp.counters.refused_too_many_from_address = 3;
  tcp.counters.refused_no_fd = 2;
  tcp.counters.handshakes_timed_out = 5;
  tcp.counters.idle_closed = 7;
  tcp.counters.pending_handshakes = 4;
  DaemonSources sources;
  sources.tcp = &tcp;
  std::string text = RenderText(DaemonCollector(sources));
  for (const char* line : {
           "longhaul_peer_handshakes_refused_total{reason=\"too_many_from_address\"} 3\n",
           "longhaul_peer_handshakes_refused_total{reason=\"no_descriptor\"} 2\n",
           "longhaul_peer_handshakes_refused_total{reason=\"handshake_failed\"} 0\n",
           "longhaul_peer_handshakes_timed_out_total 5\n",
           "longhaul_peer_connections_idle_closed_total 7\n",
           "longhaul_peer_handshakes_pending 4\n",
       }) {
    EXPECT_NE(text.find(line), std::string::npos) << line << text;
  }
}

// Dashboards and alerts name these families: each is there once, with its
// type, whichever sources the daemon has.
TEST(DaemonCollectorTest, EveryFamilyIsPresentOnceWithoutSources) {
  DaemonCollector metrics({"site-a"});
  std::vector<prometheus::MetricFamily> families = metrics.Collect();
  std::set<std::string> names;
  for (const prometheus::MetricFamily& f : families) {
    EXPECT_TRUE(names.insert(f.name).second) << f.name << " twice";
    EXPECT_EQ(f.type == prometheus::MetricType::Counter,
              f.name.size() > 6 && f.name.substr(f.name.size() - 6) == "_total")
        << f.name;
  }
  EXPECT_EQ(families.size(), 30u);
  for (const char* name :
       {"longhaul_build_info", "longhaul_transfers", "longhaul_bytes_sent_total",
        "longhaul_peer_rtt_seconds", "longhaul_chunks_durable_total",
        "longhaul_journal_write_seconds", "longhaul_rate_limit_bytes_per_second",
        "longhaul_peer_handshakes_refused_total", "longhaul_peer_handshakes_pending"}) {
    EXPECT_EQ(names.count(name), 1u) << name;
  }
  std::string text = RenderText(metrics);
  EXPECT_NE(text.find("# TYPE longhaul_transfers gauge\n"), std::string::npos);
  EXPECT_EQ(text.find("longhaul_transfers{"), std::string::npos) << "no manager, no samples";
  EXPECT_LT(text.find("# HELP longhaul_build_info "), text.find("# HELP longhaul_transfers "));
}

}  // namespace
}  // namespace longhaul::metrics
