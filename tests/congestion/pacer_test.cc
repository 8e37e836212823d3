#include "congestion/pacer.h"

#include "gtest/gtest.h"

namespace longhaul::congestion {
namespace {

const Timestamp kT0 = Timestamp::FromNanoseconds(1000000000);

TEST(PacerTest, ReleasesAQuantumThenWaitsQuantumOverRate) {
  Pacer p;
  const Bandwidth rate = Bandwidth::GbitsPerSecond(1);
  const ByteCount quantum = 3000;
  ASSERT_TRUE(p.CanSend(kT0, rate));
  p.OnPacketSent(kT0, 1500, rate, quantum);
  EXPECT_TRUE(p.CanSend(kT0, rate));  // Second packet of the quantum goes back to back.
  p.OnPacketSent(kT0, 1500, rate, quantum);
  EXPECT_FALSE(p.CanSend(kT0, rate));
  EXPECT_EQ(p.EarliestDeparture(rate), kT0 + TimeDelta::Microseconds(24));
}

TEST(PacerTest, AverageRateMatchesPacingRate) {
  Pacer p;
  const Bandwidth rate = Bandwidth::MbitsPerSecond(100);
  Timestamp now = kT0;
  ByteCount sent = 0;
  for (int i = 0; i < 1000; ++i) {
    now = std::max(now, p.EarliestDeparture(rate));
    p.OnPacketSent(now, 1500, rate, 3000);
    sent += 1500;
  }
  const Bandwidth achieved = Bandwidth::FromBytesAndTimeDelta(sent, now - kT0);
  EXPECT_NEAR(achieved.ToMbitsPerSecondF(), 100.0, 1.0);
}

TEST(PacerTest, IdleSenderDoesNotBurstOnResume) {
  Pacer p;
  const Bandwidth rate = Bandwidth::MbitsPerSecond(100);
  p.OnPacketSent(kT0, 1500, rate, 1500);
  const Timestamp later = kT0 + TimeDelta::Seconds(1);
  ASSERT_TRUE(p.CanSend(later, rate));
  p.OnPacketSent(later, 1500, rate, 1500);
  EXPECT_FALSE(p.CanSend(later, rate));
}

TEST(PacerTest, ZeroRateMeansUnpaced) {
  Pacer p;
  p.OnPacketSent(kT0, 1500, Bandwidth::Zero(), 1500);
  EXPECT_TRUE(p.CanSend(kT0, Bandwidth::Zero()));
}

// A quantum sent while the rate had collapsed (a model that restarted its bandwidth estimate
// after a round of heavy loss) is followed by a gap at the rate in force when the next quantum is
// due, not by the minutes the collapsed rate would take.
TEST(PacerTest, GapAfterAQuantumFollowsTheRateNow) {
  Pacer p;
  const Bandwidth collapsed = Bandwidth::BytesPerSecond(100);
  const Bandwidth recovered = Bandwidth::MbitsPerSecond(100);
  const Timestamp t = kT0 + TimeDelta::Seconds(3600);  // later than one quantum at 100 bytes/s
  p.OnPacketSent(t, 3000, collapsed, 3000);
  EXPECT_FALSE(p.CanSend(t + TimeDelta::Seconds(1), collapsed));
  EXPECT_EQ(p.EarliestDeparture(collapsed), t + TimeDelta::Seconds(30));
  EXPECT_EQ(p.EarliestDeparture(recovered), t + recovered.TransferTime(3000));
  EXPECT_TRUE(p.CanSend(t + TimeDelta::Milliseconds(1), recovered));
}

// The other way round, a rate that falls after a quantum left does not lengthen its gap.
TEST(PacerTest, GapAfterAQuantumIsNotLengthenedWhenTheRateFalls) {
  Pacer p;
  const Bandwidth fast = Bandwidth::MbitsPerSecond(100);
  const Bandwidth slow = Bandwidth::MbitsPerSecond(1);
  p.OnPacketSent(kT0, 3000, fast, 3000);
  EXPECT_EQ(p.EarliestDeparture(slow), kT0 + fast.TransferTime(3000));
}

}  // namespace
}  // namespace longhaul::congestion
