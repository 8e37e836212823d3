#include "congestion/cubic.h"

#include "gtest/gtest.h"
#include "tests/congestion/mini_path.h"

namespace longhaul::congestion {
namespace {

const Timestamp kT0 = Timestamp::FromNanoseconds(1000000000);

TEST(CubicTest, SlowStartGrowsByAckedBytes) {
  Cubic cubic{CubicParams()};
  const ByteCount initial = cubic.cwnd();
  cubic.OnPacketSent(kT0, 1, kDefaultMss, 0, true);
  cubic.OnPacketSent(kT0, 2, kDefaultMss, kDefaultMss, true);
  const AckedPacket acked[] = {{1, kDefaultMss, kT0}, {2, kDefaultMss, kT0}};
  cubic.OnCongestionEvent(kT0 + TimeDelta::Milliseconds(10), 2 * kDefaultMss, acked, {});
  EXPECT_EQ(cubic.cwnd(), initial + 2 * kDefaultMss);
  EXPECT_EQ(cubic.DebugState().state, "SlowStart");
}

// HyStart (CubicParams::hystart): the queue that slow start builds ends it before any loss. On
// MiniPath (no drops, unlimited buffer) plain slow start never ends.
TEST(CubicTest, HyStartLeavesSlowStartWhenTheRttRises) {
  const Bandwidth rate = Bandwidth::MbitsPerSecond(100);
  const TimeDelta rtt = TimeDelta::Milliseconds(20);
  CubicParams params;
  params.hystart = true;
  Cubic hystart(params);
  testing::MiniPath a(hystart, rate, rtt, kT0);
  a.RunUntil(kT0 + TimeDelta::Seconds(1));
  EXPECT_EQ(hystart.DebugState().state, "CongestionAvoidance");
  EXPECT_LT(hystart.DebugState().ssthresh, 4 * (rate * rtt));

  Cubic plain{CubicParams()};
  testing::MiniPath b(plain, rate, rtt, kT0);
  b.RunUntil(kT0 + TimeDelta::Seconds(1));
  EXPECT_EQ(plain.DebugState().state, "SlowStart");
}

TEST(CubicTest, LossCutsByBetaOncePerWindow) {
  Cubic cubic{CubicParams()};
  for (uint64_t pn = 1; pn <= 10; ++pn) cubic.OnPacketSent(kT0, pn, kDefaultMss, 0, true);
  const ByteCount before = cubic.cwnd();
  const LostPacket lost1[] = {{1, kDefaultMss}};
  cubic.OnCongestionEvent(kT0 + TimeDelta::Milliseconds(10), 10 * kDefaultMss, {}, lost1);
  EXPECT_EQ(cubic.cwnd(), static_cast<ByteCount>(before * 0.7));
  // A second loss from the same window does not cut again (RFC 9438 §4.6).
  const LostPacket lost2[] = {{2, kDefaultMss}};
  cubic.OnCongestionEvent(kT0 + TimeDelta::Milliseconds(11), 9 * kDefaultMss, {}, lost2);
  EXPECT_EQ(cubic.cwnd(), static_cast<ByteCount>(before * 0.7));
}

TEST(CubicTest, RegrowsTowardWmaxAfterLoss) {
  Cubic cubic{CubicParams()};
  testing::MiniPath path(cubic, Bandwidth::MbitsPerSecond(100), TimeDelta::Milliseconds(20), kT0);
  // One drop once the window is large, then a clean path.
  path.set_drop([](uint64_t pn) { return pn == 2000; });
  path.RunUntil(kT0 + TimeDelta::Seconds(1));
  const ByteCount after_loss = cubic.cwnd();
  path.RunUntil(kT0 + TimeDelta::Seconds(6));
  EXPECT_GT(cubic.cwnd(), after_loss);
  EXPECT_EQ(cubic.DebugState().state, "CongestionAvoidance");
}

}  // namespace
}  // namespace longhaul::congestion
