#include "congestion/delivery_rate_sampler.h"

#include "gtest/gtest.h"

namespace longhaul::congestion {
namespace {

constexpr ByteCount kMss = 1500;
const Timestamp kT0 = Timestamp::FromNanoseconds(1000000000);

// Sends `n` packets paced at `gap`, starting at `start` with packet number `first_pn`.
void SendPaced(DeliveryRateSampler& s, Timestamp start, TimeDelta gap, uint64_t first_pn, int n,
               ByteCount* inflight) {
  for (int i = 0; i < n; ++i) {
    s.OnPacketSent(start + gap * i, first_pn + i, kMss, *inflight);
    *inflight += kMss;
  }
}

TEST(DeliveryRateSamplerTest, SteadyFlowMeasuresItsRate) {
  DeliveryRateSampler s;
  const TimeDelta gap = TimeDelta::Microseconds(12);  // 1500 B / 12 us = 1 Gbit/s.
  const TimeDelta rtt = TimeDelta::Milliseconds(10);
  const int n = 4000;
  ByteCount inflight = 0;
  int next_ack = 0;
  RateSample last;
  // Sends and ACKs interleaved in time: each ACK returns one RTT after its packet left.
  for (int i = 0; i < n; ++i) {
    const Timestamp send_time = kT0 + gap * i;
    while (next_ack < i && kT0 + gap * next_ack + rtt <= send_time) {
      const Timestamp now = kT0 + gap * next_ack + rtt;
      ASSERT_TRUE(s.OnPacketAcked(now, 1 + next_ack));
      inflight -= kMss;
      last = s.GenerateRateSample(now);
      ++next_ack;
    }
    s.OnPacketSent(send_time, 1 + i, kMss, inflight);
    inflight += kMss;
  }
  ASSERT_TRUE(last.valid);
  EXPECT_NEAR(last.delivery_rate.ToMbitsPerSecondF(), 1000.0, 10.0);
  EXPECT_FALSE(last.is_app_limited);
  EXPECT_EQ(last.rtt, rtt);
  EXPECT_GE(last.interval, rtt);
}

TEST(DeliveryRateSamplerTest, AckCompressionDoesNotInflateTheRate) {
  DeliveryRateSampler s;
  const TimeDelta gap = TimeDelta::Microseconds(12);
  ByteCount inflight = 0;
  SendPaced(s, kT0, gap, 1, 1000, &inflight);
  // All ACKs arrive in one burst: ack_elapsed ~ 0, so send_elapsed must bound the rate.
  const Timestamp burst = kT0 + TimeDelta::Milliseconds(30);
  RateSample rs;
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(s.OnPacketAcked(burst, 1 + i));
  rs = s.GenerateRateSample(burst);
  ASSERT_TRUE(rs.valid);
  EXPECT_GE(rs.interval, rs.send_elapsed);
  EXPECT_LE(rs.delivery_rate.ToMbitsPerSecondF(), 1001.0);
}

TEST(DeliveryRateSamplerTest, AppLimitedMarksSamplesUntilBubbleIsDelivered) {
  DeliveryRateSampler s;
  ByteCount inflight = 0;
  const TimeDelta gap = TimeDelta::Microseconds(100);
  SendPaced(s, kT0, gap, 1, 4, &inflight);
  s.OnAppLimited(inflight);
  EXPECT_TRUE(s.is_app_limited());
  SendPaced(s, kT0 + gap * 4, gap, 5, 4, &inflight);
  const TimeDelta rtt = TimeDelta::Milliseconds(20);
  bool saw_app_limited = false;
  for (int i = 0; i < 8; ++i) {
    const Timestamp now = kT0 + gap * i + rtt;
    s.OnPacketAcked(now, 1 + i);
    const RateSample& rs = s.GenerateRateSample(now);
    if (i >= 4) saw_app_limited |= rs.is_app_limited;
    if (i < 4) {
      EXPECT_FALSE(rs.is_app_limited);
    }
  }
  EXPECT_TRUE(saw_app_limited);
  EXPECT_FALSE(s.is_app_limited());  // Everything in flight at the mark has been delivered.
}

TEST(DeliveryRateSamplerTest, LostPacketSnapshotCountsLossSinceSend) {
  DeliveryRateSampler s;
  ByteCount inflight = 0;
  SendPaced(s, kT0, TimeDelta::Microseconds(10), 1, 10, &inflight);
  LostPacketSnapshot snap;
  ASSERT_TRUE(s.OnPacketLost(3, &snap));
  EXPECT_EQ(snap.size, kMss);
  EXPECT_EQ(snap.tx_in_flight, 3 * kMss);
  EXPECT_EQ(snap.lost, kMss);
  ASSERT_TRUE(s.OnPacketLost(2, &snap));
  EXPECT_EQ(snap.lost, 2 * kMss);
  EXPECT_FALSE(s.OnPacketLost(2, &snap));  // Already gone.
  EXPECT_EQ(s.lost(), 2 * kMss);
}

}  // namespace
}  // namespace longhaul::congestion
