#include "common/units.h"

#include "gtest/gtest.h"

namespace longhaul {
namespace {

TEST(UnitsTest, TimeDeltaConversionsAndArithmetic) {
  EXPECT_EQ(TimeDelta::Milliseconds(40).ToMicroseconds(), 40000);
  EXPECT_EQ(TimeDelta::Seconds(2) - TimeDelta::Milliseconds(500), TimeDelta::Milliseconds(1500));
  EXPECT_EQ(TimeDelta::Milliseconds(10) * 3, TimeDelta::Milliseconds(30));
  EXPECT_EQ(TimeDelta::Milliseconds(10) * 0.5, TimeDelta::Milliseconds(5));
  EXPECT_DOUBLE_EQ(TimeDelta::Milliseconds(30) / TimeDelta::Milliseconds(10), 3.0);
  EXPECT_LT(TimeDelta::Zero(), TimeDelta::Nanoseconds(1));
  EXPECT_TRUE(TimeDelta::Infinite().IsInfinite());
  EXPECT_EQ(TimeDelta::Milliseconds(3).ToString(), "3ms");
}

TEST(UnitsTest, TimestampDifferenceIsTimeDelta) {
  const Timestamp t0 = Timestamp::FromNanoseconds(1000);
  const Timestamp t1 = t0 + TimeDelta::Microseconds(5);
  EXPECT_EQ(t1 - t0, TimeDelta::Nanoseconds(5000));
  EXPECT_GT(t1, t0);
}

TEST(UnitsTest, BandwidthTimesTimeIsBytes) {
  const Bandwidth gbit = Bandwidth::GbitsPerSecond(1);
  EXPECT_EQ(gbit * TimeDelta::Milliseconds(40), 5000000u);  // 1 Gbit/s x 40 ms = 5 MB.
  EXPECT_EQ(TimeDelta::Seconds(1) * Bandwidth::BytesPerSecond(1500), 1500u);
  // 100 Gbit/s x 100 s must not overflow.
  EXPECT_EQ(Bandwidth::GbitsPerSecond(100) * TimeDelta::Seconds(100), 1250000000000u);
}

TEST(UnitsTest, BandwidthFromBytesAndTime) {
  EXPECT_EQ(Bandwidth::FromBytesAndTimeDelta(1250000, TimeDelta::Milliseconds(10)),
            Bandwidth::GbitsPerSecond(1));
  EXPECT_EQ(Bandwidth::FromBytesAndTimeDelta(100, TimeDelta::Zero()), Bandwidth::Zero());
  EXPECT_EQ(Bandwidth::GbitsPerSecond(1).TransferTime(1500), TimeDelta::Microseconds(12));
  EXPECT_EQ(Bandwidth::GbitsPerSecond(10) * 0.5, Bandwidth::GbitsPerSecond(5));
  EXPECT_DOUBLE_EQ(Bandwidth::GbitsPerSecond(1) / Bandwidth::MbitsPerSecond(500), 2.0);
}

}  // namespace
}  // namespace longhaul
