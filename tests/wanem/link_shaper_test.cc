#include "tests/wanem/link_shaper.h"

#include <cmath>
#include <vector>

#include "gtest/gtest.h"

namespace longhaul::wanem {
namespace {

const absl::Time kStart = absl::FromUnixSeconds(1000);

DirectionParams Params(int64_t rate_bps, absl::Duration delay, int64_t queue_bytes = 0,
                       double loss = 0) {
  DirectionParams p;
  p.rate_bps = rate_bps;
  p.delay = delay;
  p.queue_bytes = queue_bytes;
  p.loss = loss;
  return p;
}

TEST(LinkShaperTest, UnlimitedLinkAddsOnlyTheDelay) {
  LinkShaper s(Params(0, absl::Milliseconds(20)), 1);
  Decision d = s.Offer(kStart, 9000);
  ASSERT_EQ(d.verdict, Verdict::kForward);
  EXPECT_EQ(d.deliver_at, kStart + absl::Milliseconds(20));
}

TEST(LinkShaperTest, SerializesAtTheRate) {
  // 9000 bytes at 1 Gbit/s take 72 us on the wire.
  LinkShaper s(Params(1'000'000'000, absl::Milliseconds(10)), 1);
  Decision first = s.Offer(kStart, 9000);
  Decision second = s.Offer(kStart, 9000);
  EXPECT_EQ(first.deliver_at, kStart + absl::Microseconds(72) + absl::Milliseconds(10));
  EXPECT_EQ(second.deliver_at - first.deliver_at, absl::Microseconds(72));
}

TEST(LinkShaperTest, LongRunKeepsTheExactRate) {
  // 1500 bytes at 7 Mbit/s is not a whole number of nanoseconds; the
  // remainder must carry so a long burst ends exactly on time.
  LinkShaper s(Params(7'000'000, absl::ZeroDuration()), 1);
  Decision last;
  for (int i = 0; i < 7000; ++i) last = s.Offer(kStart, 1500);
  // 7000 * 1500 * 8 bits / 7e6 bit/s = 12 s.
  EXPECT_EQ(last.deliver_at, kStart + absl::Seconds(12));
}

TEST(LinkShaperTest, IdleLinkDoesNotBankCredit) {
  LinkShaper s(Params(1'000'000'000, absl::ZeroDuration()), 1);
  s.Offer(kStart, 9000);
  const absl::Time later = kStart + absl::Seconds(1);
  Decision d = s.Offer(later, 9000);
  EXPECT_EQ(d.deliver_at, later + absl::Microseconds(72));
}

TEST(LinkShaperTest, DropTailQueueLimitsBacklog) {
  // Queue of 5 packets: a burst of 8 keeps the first 5 and drops 3.
  LinkShaper s(Params(1'000'000'000, absl::ZeroDuration(), 5 * 9000), 1);
  int forwarded = 0, dropped = 0;
  for (int i = 0; i < 8; ++i) {
    Decision d = s.Offer(kStart, 9000);
    (d.verdict == Verdict::kForward ? forwarded : dropped)++;
    if (d.verdict != Verdict::kForward) {
      EXPECT_EQ(d.verdict, Verdict::kDropQueue);
    }
  }
  EXPECT_EQ(forwarded, 5);
  EXPECT_EQ(dropped, 3);
  EXPECT_EQ(s.QueuedBytes(kStart), 5 * 9000);
  // After one packet time the queue has room for exactly one more.
  const absl::Time t = kStart + absl::Microseconds(72);
  EXPECT_EQ(s.QueuedBytes(t), 4 * 9000);
  EXPECT_EQ(s.Offer(t, 9000).verdict, Verdict::kForward);
  EXPECT_EQ(s.Offer(t, 9000).verdict, Verdict::kDropQueue);
}

TEST(LinkShaperTest, QueueDrainsOverTime) {
  LinkShaper s(Params(8'000'000, absl::ZeroDuration(), 10'000), 1);
  s.Offer(kStart, 10'000);  // 10 ms at 8 Mbit/s.
  EXPECT_EQ(s.QueuedBytes(kStart), 10'000);
  EXPECT_EQ(s.QueuedBytes(kStart + absl::Milliseconds(5)), 5'000);
  EXPECT_EQ(s.QueuedBytes(kStart + absl::Milliseconds(10)), 0);
}

TEST(LinkShaperTest, LossRateMatchesWithinStatisticalBounds) {
  LinkShaper s(Params(0, absl::ZeroDuration(), 0, 0.01), 42);
  const int n = 1'000'000;
  int lost = 0;
  for (int i = 0; i < n; ++i) {
    if (s.Offer(kStart, 100).verdict == Verdict::kDropLoss) ++lost;
  }
  // Binomial(1e6, 0.01): sd ~ 99.5; allow 5 sd.
  EXPECT_NEAR(lost, 10'000, 500);
}

TEST(LinkShaperTest, LossBurstLosesAtItsRateUntilEnded) {
  LinkShaper s(Params(0, absl::ZeroDuration()), 42);
  auto lost_of = [&s](int n) {
    int lost = 0;
    for (int i = 0; i < n; ++i) {
      if (s.Offer(kStart, 100).verdict == Verdict::kDropLoss) ++lost;
    }
    return lost;
  };
  EXPECT_EQ(lost_of(10'000), 0);
  s.set_burst_loss(0.5);
  // Binomial(1e5, 0.5): sd ~ 158; allow 5 sd.
  EXPECT_NEAR(lost_of(100'000), 50'000, 800);
  s.set_burst_loss(0);
  EXPECT_EQ(lost_of(10'000), 0);
}

TEST(LinkShaperTest, LossBurstBelowTheConfiguredLossChangesNothing) {
  LinkShaper with_burst(Params(0, absl::ZeroDuration(), 0, 0.2), 7);
  LinkShaper without(Params(0, absl::ZeroDuration(), 0, 0.2), 7);
  with_burst.set_burst_loss(0.05);
  for (int i = 0; i < 10'000; ++i) {
    ASSERT_EQ(with_burst.Offer(kStart, 100).verdict, without.Offer(kStart, 100).verdict) << i;
  }
}

TEST(LinkShaperTest, LossesAreIndependentOfEachOther) {
  // With i.i.d. loss, P(lost | previous lost) = P(lost).
  LinkShaper s(Params(0, absl::ZeroDuration(), 0, 0.1), 7);
  int lost = 0, pairs = 0;
  bool prev = false;
  for (int i = 0; i < 500'000; ++i) {
    const bool l = s.Offer(kStart, 100).verdict == Verdict::kDropLoss;
    if (prev && l) ++pairs;
    if (l) ++lost;
    prev = l;
  }
  EXPECT_NEAR(static_cast<double>(pairs) / lost, 0.1, 0.01);
}

TEST(LinkShaperTest, SameSeedSameDecisions) {
  DirectionParams p = Params(1'000'000'000, absl::Milliseconds(5), 100'000, 0.05);
  p.jitter = absl::Milliseconds(1);
  LinkShaper a(p, 99), b(p, 99), c(p, 100);
  bool differs_from_other_seed = false;
  for (int i = 0; i < 10'000; ++i) {
    const absl::Time t = kStart + absl::Microseconds(10 * i);
    Decision da = a.Offer(t, 1500), db = b.Offer(t, 1500), dc = c.Offer(t, 1500);
    ASSERT_EQ(da.verdict, db.verdict);
    if (da.verdict == Verdict::kForward) {
      ASSERT_EQ(da.deliver_at, db.deliver_at);
    }
    if (da.verdict != dc.verdict) differs_from_other_seed = true;
  }
  EXPECT_TRUE(differs_from_other_seed);
}

TEST(LinkShaperTest, JitterStaysInBoundsAndNeverReorders) {
  DirectionParams p = Params(0, absl::Milliseconds(20));
  p.jitter = absl::Milliseconds(5);
  LinkShaper s(p, 3);
  absl::Time prev = absl::InfinitePast();
  absl::Duration min_extra = absl::InfiniteDuration(), max_extra = -absl::InfiniteDuration();
  for (int i = 0; i < 10'000; ++i) {
    const absl::Time t = kStart + absl::Milliseconds(i);  // Sparse: no FIFO clamp.
    Decision d = s.Offer(t, 100);
    ASSERT_GE(d.deliver_at, prev);
    prev = d.deliver_at;
    min_extra = std::min(min_extra, d.deliver_at - t);
    max_extra = std::max(max_extra, d.deliver_at - t);
  }
  EXPECT_GE(min_extra, absl::Milliseconds(15));
  EXPECT_LE(max_extra, absl::Milliseconds(25));
  // The spread is actually used.
  EXPECT_LT(min_extra, absl::Milliseconds(16));
  EXPECT_GT(max_extra, absl::Milliseconds(24));
}

TEST(LinkShaperTest, CutDropsEverythingUntilRestored) {
  LinkShaper s(Params(1'000'000'000, absl::Milliseconds(1)), 1);
  s.set_cut(true);
  for (int i = 0; i < 10; ++i) {
    EXPECT_EQ(s.Offer(kStart, 1500).verdict, Verdict::kDropCut);
  }
  EXPECT_EQ(s.QueuedBytes(kStart), 0);  // Cut packets use no capacity.
  s.set_cut(false);
  EXPECT_EQ(s.Offer(kStart, 1500).verdict, Verdict::kForward);
}

TEST(LinkShaperTest, SteadyOverloadDeliversAtTheRate) {
  // Offer 2 Gbit/s to a 1 Gbit/s link with a 1 MB queue for one second: what
  // gets through must be 1 Gbit/s (plus the queue), the rest tail-dropped.
  LinkShaper s(Params(1'000'000'000, absl::Milliseconds(20), 1'000'000), 1);
  int64_t forwarded_bytes = 0;
  absl::Time last = kStart;
  for (int i = 0; i < 2'000'000'000 / 8 / 9000; ++i) {
    const absl::Time t = kStart + absl::Microseconds(36) * i;
    Decision d = s.Offer(t, 9000);
    if (d.verdict == Verdict::kForward) {
      forwarded_bytes += 9000;
      last = d.deliver_at;
    }
  }
  const double seconds = absl::ToDoubleSeconds(last - kStart - absl::Milliseconds(20));
  EXPECT_NEAR(forwarded_bytes * 8 / seconds, 1e9, 1e6);
}

}  // namespace
}  // namespace longhaul::wanem
