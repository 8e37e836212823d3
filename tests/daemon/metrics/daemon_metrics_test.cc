#include "daemon/metrics/daemon_metrics.h"

#include <cstdlib>
#include <filesystem>
#include <string>

#include "common/clock.h"
#include "daemon/peer/rate_limiter.h"
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
  Registry registry;
  RegisterDaemonMetrics(registry, {"site-a", nullptr, nullptr, journal_.get(), nullptr});
  v1::OutgoingTransfer t;
  t.set_id("t1");
  ASSERT_TRUE(journal_->PutOutgoing(t, /*sync=*/true).ok());
  ASSERT_TRUE(journal_->PutOutgoing(t, /*sync=*/true).ok());
  ASSERT_TRUE(journal_->PutOutgoing(t, /*sync=*/false).ok());  // not a durability write
  std::string text = registry.Render();
  // The fake clock does not move: both synced writes took 0 s.
  EXPECT_NE(text.find("# TYPE longhaul_journal_write_seconds histogram\n"), std::string::npos);
  EXPECT_NE(text.find("longhaul_journal_write_seconds_bucket{le=\"0.0001\"} 2\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("longhaul_journal_write_seconds_bucket{le=\"+Inf\"} 2\n"), std::string::npos);
  EXPECT_NE(text.find("longhaul_journal_write_seconds_count 2\n"), std::string::npos);
  EXPECT_NE(text.find("longhaul_build_info{site=\"site-a\",version=\"0.1.0\"} 1\n"),
            std::string::npos);
}

TEST_F(DaemonMetricsTest, RateCapsFollowTheLimiter) {
  Registry registry;
  peer::RateLimiter limiter(clock_);
  RegisterDaemonMetrics(registry, {"site-a", nullptr, nullptr, nullptr, &limiter});
  limiter.SetPeerLimit("site-b", Bandwidth::MbitsPerSecond(500));
  limiter.SetClassLimit(v1::BACKGROUND, Bandwidth::MbitsPerSecond(100));
  std::string text = registry.Render();
  EXPECT_NE(text.find("longhaul_rate_limit_bits_per_second{scope=\"peer\",name=\"site-b\"} 500000000\n"),
            std::string::npos)
      << text;
  EXPECT_NE(
      text.find("longhaul_rate_limit_bits_per_second{scope=\"class\",name=\"background\"} 100000000\n"),
      std::string::npos);
  limiter.SetPeerLimit("site-b", Bandwidth::Zero());  // off
  EXPECT_EQ(registry.Render().find("name=\"site-b\""), std::string::npos);
}

}  // namespace
}  // namespace longhaul::metrics
