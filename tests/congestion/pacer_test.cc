#include "congestion/pacer.h"

#include "gtest/gtest.h"

namespace longhaul::congestion {
namespace {

const Timestamp kT0 = Timestamp::FromNanoseconds(1000000000);

TEST(PacerTest, ReleasesAQuantumThenWaitsQuantumOverRate) {
  Pacer p;
  const Bandwidth rate = Bandwidth::GbitsPerSecond(1);
  const ByteCount quantum = 3000;
  ASSERT_TRUE(p.CanSend(kT0));
  p.OnPacketSent(kT0, 1500, rate, quantum);
  EXPECT_TRUE(p.CanSend(kT0));  // Second packet of the quantum goes back to back.
  p.OnPacketSent(kT0, 1500, rate, quantum);
  EXPECT_FALSE(p.CanSend(kT0));
  EXPECT_EQ(p.EarliestDeparture(), kT0 + TimeDelta::Microseconds(24));
}

TEST(PacerTest, AverageRateMatchesPacingRate) {
  Pacer p;
  const Bandwidth rate = Bandwidth::MbitsPerSecond(100);
  Timestamp now = kT0;
  ByteCount sent = 0;
  for (int i = 0; i < 1000; ++i) {
    now = std::max(now, p.EarliestDeparture());
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
  ASSERT_TRUE(p.CanSend(later));
  p.OnPacketSent(later, 1500, rate, 1500);
  EXPECT_FALSE(p.CanSend(later));
}

TEST(PacerTest, ZeroRateMeansUnpaced) {
  Pacer p;
  p.OnPacketSent(kT0, 1500, Bandwidth::Zero(), 1500);
  EXPECT_TRUE(p.CanSend(kT0));
}

}  // namespace
}  // namespace longhaul::congestion
