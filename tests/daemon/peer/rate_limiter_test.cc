#include "daemon/peer/rate_limiter.h"

#include <atomic>
#include <thread>

#include "gtest/gtest.h"

namespace longhaul::peer {
namespace {

constexpr ByteCount kMiB = 1 << 20;

class RateLimiterTest : public ::testing::Test {
 protected:
  // Sends `chunk`-byte chunks to `site` as fast as the limiter allows for
  // `duration` of fake time; returns the bytes sent.
  ByteCount SendFor(const std::string& site, v1::PriorityClass cls, ByteCount chunk,
                    TimeDelta duration) {
    const Timestamp end = clock_.Now() + duration;
    ByteCount sent = 0;
    while (clock_.Now() < end) {
      TimeDelta wait = limiter_.TryAcquire(site, cls, chunk);
      if (wait.IsZero()) {
        sent += chunk;
      } else {
        clock_.Advance(wait);
      }
    }
    return sent;
  }

  FakeClock clock_;
  RateLimiter limiter_{clock_};
};

TEST_F(RateLimiterTest, NoCapNeverWaits) {
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(limiter_.TryAcquire("site-b", v1::CHECKPOINT, 256 * kMiB), TimeDelta::Zero());
  }
  EXPECT_TRUE(limiter_.Limits().empty());
}

TEST_F(RateLimiterTest, PeerCapHoldsTheAverageRateWithChunksLargerThanTheBurst) {
  limiter_.SetPeerLimit("site-b", Bandwidth::MbitsPerSecond(100));  // 12.5 MB/s
  ByteCount sent = SendFor("site-b", v1::CHECKPOINT, 16 * kMiB, TimeDelta::Seconds(60));
  const double rate = static_cast<double>(sent) / 60.0;
  // Within one chunk of the cap over a minute.
  // Over a minute: the cap, plus at most the initial burst and one chunk.
  EXPECT_GE(rate, 12.5e6);
  EXPECT_LE(rate, 12.5e6 + (1.25e6 + 16.0 * kMiB) / 60.0);
}

TEST_F(RateLimiterTest, SmallChunksAreSmoothedToTheCap) {
  limiter_.SetPeerLimit("site-b", Bandwidth::MbitsPerSecond(8));  // 1 MB/s
  ByteCount sent = SendFor("site-b", v1::CHECKPOINT, 64 << 10, TimeDelta::Seconds(10));
  EXPECT_GE(static_cast<double>(sent), 10e6);
  EXPECT_LE(static_cast<double>(sent), 10e6 + 100e3 + (64 << 10));  // + burst + one chunk
}

TEST_F(RateLimiterTest, WaitIsTheTimeToRepayTheDebt) {
  limiter_.SetPeerLimit("site-b", Bandwidth::MbitsPerSecond(80));  // 10 MB/s, burst 1 MB
  ASSERT_EQ(limiter_.TryAcquire("site-b", v1::CHECKPOINT, 11'000'000), TimeDelta::Zero());
  // 1 MB of burst paid for 1 MB; 10 MB of debt at 10 MB/s is 1 s.
  TimeDelta wait = limiter_.TryAcquire("site-b", v1::CHECKPOINT, 1);
  EXPECT_EQ(wait.ToMilliseconds(), 1000);
  clock_.Advance(wait);
  EXPECT_EQ(limiter_.TryAcquire("site-b", v1::CHECKPOINT, 1), TimeDelta::Zero());
}

TEST_F(RateLimiterTest, CapsApplyOnlyToTheirPeerAndClass) {
  limiter_.SetPeerLimit("site-b", Bandwidth::MbitsPerSecond(8));
  limiter_.SetClassLimit(v1::BACKGROUND, Bandwidth::MbitsPerSecond(8));
  ASSERT_EQ(limiter_.TryAcquire("site-b", v1::CHECKPOINT, 100 * kMiB), TimeDelta::Zero());
  EXPECT_GT(limiter_.TryAcquire("site-b", v1::EXCHANGE, 1), TimeDelta::Zero());  // site-b in debt
  EXPECT_EQ(limiter_.TryAcquire("site-c", v1::CHECKPOINT, 100 * kMiB), TimeDelta::Zero());
  ASSERT_EQ(limiter_.TryAcquire("site-c", v1::BACKGROUND, 100 * kMiB), TimeDelta::Zero());
  EXPECT_GT(limiter_.TryAcquire("site-d", v1::BACKGROUND, 1), TimeDelta::Zero());  // class in debt
  EXPECT_EQ(limiter_.TryAcquire("site-d", v1::CHECKPOINT, 1), TimeDelta::Zero());
}

TEST_F(RateLimiterTest, UnspecifiedPriorityCountsAsCheckpoint) {
  limiter_.SetClassLimit(v1::PRIORITY_UNSPECIFIED, Bandwidth::MbitsPerSecond(8));
  ASSERT_EQ(limiter_.Limits().size(), 1u);
  EXPECT_EQ(limiter_.Limits()[0].priority, v1::CHECKPOINT);
  ASSERT_EQ(limiter_.TryAcquire("site-b", v1::PRIORITY_UNSPECIFIED, 100 * kMiB), TimeDelta::Zero());
  EXPECT_GT(limiter_.TryAcquire("site-b", v1::CHECKPOINT, 1), TimeDelta::Zero());
}

TEST_F(RateLimiterTest, BothCapsAreChargedAndTheSlowerOneSetsTheWait) {
  limiter_.SetPeerLimit("site-b", Bandwidth::MbitsPerSecond(800));     // 100 MB/s
  limiter_.SetClassLimit(v1::BACKGROUND, Bandwidth::MbitsPerSecond(80));  // 10 MB/s
  ByteCount sent = SendFor("site-b", v1::BACKGROUND, kMiB, TimeDelta::Seconds(10));
  EXPECT_GE(static_cast<double>(sent), 100e6);
  EXPECT_LE(static_cast<double>(sent), 100e6 + 1e6 + kMiB);  // + burst + one chunk
}

TEST_F(RateLimiterTest, RaisingTheCapTakesEffectForTheNextChunk) {
  limiter_.SetPeerLimit("site-b", Bandwidth::MbitsPerSecond(8));  // 1 MB/s
  // 100 kB of burst, then 10 MB of debt.
  ASSERT_EQ(limiter_.TryAcquire("site-b", v1::CHECKPOINT, 10'100'000), TimeDelta::Zero());
  EXPECT_NEAR(limiter_.TryAcquire("site-b", v1::CHECKPOINT, 1).ToSecondsF(), 10.0, 0.01);
  limiter_.SetPeerLimit("site-b", Bandwidth::MbitsPerSecond(800));  // 100 MB/s
  EXPECT_NEAR(limiter_.TryAcquire("site-b", v1::CHECKPOINT, 1).ToSecondsF(), 0.1, 0.01);
}

TEST_F(RateLimiterTest, TurningACapOffReleasesWaitersAtOnce) {
  limiter_.SetPeerLimit("site-b", Bandwidth::MbitsPerSecond(8));
  ASSERT_EQ(limiter_.TryAcquire("site-b", v1::CHECKPOINT, 100 * kMiB), TimeDelta::Zero());
  limiter_.SetPeerLimit("site-b", Bandwidth::Zero());
  EXPECT_EQ(limiter_.TryAcquire("site-b", v1::CHECKPOINT, 1), TimeDelta::Zero());
  EXPECT_TRUE(limiter_.Limits().empty());
}

TEST_F(RateLimiterTest, IdleTimeSavesAtMostTheBurst) {
  limiter_.SetPeerLimit("site-b", Bandwidth::MbitsPerSecond(80));  // burst: 100 ms = 1 MB
  clock_.Advance(TimeDelta::Seconds(3600));
  ASSERT_EQ(limiter_.TryAcquire("site-b", v1::CHECKPOINT, 3'000'000), TimeDelta::Zero());
  EXPECT_EQ(limiter_.TryAcquire("site-b", v1::CHECKPOINT, 1).ToMilliseconds(), 200);
}

TEST_F(RateLimiterTest, LimitsListsPeersThenClassesInRankOrder) {
  limiter_.SetClassLimit(v1::BACKGROUND, Bandwidth::MbitsPerSecond(1));
  limiter_.SetPeerLimit("site-c", Bandwidth::MbitsPerSecond(3));
  limiter_.SetClassLimit(v1::EXCHANGE, Bandwidth::MbitsPerSecond(2));
  limiter_.SetPeerLimit("site-b", Bandwidth::MbitsPerSecond(4));
  auto limits = limiter_.Limits();
  ASSERT_EQ(limits.size(), 4u);
  EXPECT_EQ(limits[0].peer, "site-b");
  EXPECT_EQ(limits[0].rate, Bandwidth::MbitsPerSecond(4));
  EXPECT_EQ(limits[1].peer, "site-c");
  EXPECT_EQ(limits[2].priority, v1::EXCHANGE);
  EXPECT_EQ(limits[3].priority, v1::BACKGROUND);
}

TEST_F(RateLimiterTest, AcquireReturnsFalseWhenCancelled) {
  limiter_.SetPeerLimit("site-b", Bandwidth::MbitsPerSecond(8));
  ASSERT_EQ(limiter_.TryAcquire("site-b", v1::CHECKPOINT, 100 * kMiB), TimeDelta::Zero());
  // The fake clock never repays the debt: only cancellation ends the wait.
  std::atomic<bool> cancel{false};
  std::thread canceller([&] { cancel = true; });
  EXPECT_FALSE(limiter_.Acquire("site-b", v1::CHECKPOINT, 1, [&] { return cancel.load(); }));
  canceller.join();
  EXPECT_TRUE(limiter_.Acquire("site-c", v1::CHECKPOINT, 1, [] { return false; }));
}

TEST_F(RateLimiterTest, AcquireWakesWhenTheCapIsLifted) {
  limiter_.SetPeerLimit("site-b", Bandwidth::MbitsPerSecond(8));
  ASSERT_EQ(limiter_.TryAcquire("site-b", v1::CHECKPOINT, 100 * kMiB), TimeDelta::Zero());
  std::thread lifter([&] { limiter_.SetPeerLimit("site-b", Bandwidth::Zero()); });
  EXPECT_TRUE(limiter_.Acquire("site-b", v1::CHECKPOINT, 1, [] { return false; }));
  lifter.join();
}

TEST(PriorityClassNameTest, RoundTrips) {
  for (v1::PriorityClass p : {v1::EXCHANGE, v1::CHECKPOINT, v1::BACKGROUND}) {
    auto parsed = ParsePriorityClass(PriorityClassName(p));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, p);
  }
  EXPECT_EQ(ParsePriorityClass("bulk").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace longhaul::peer
