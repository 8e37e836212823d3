#include "common/clock.h"

#include "gtest/gtest.h"

namespace longhaul {
namespace {

TEST(ClockTest, FakeClockMovesOnlyWhenAdvanced) {
  FakeClock clock;
  const Timestamp t0 = clock.Now();
  EXPECT_EQ(clock.Now(), t0);
  clock.Advance(TimeDelta::Milliseconds(7));
  EXPECT_EQ(clock.Now() - t0, TimeDelta::Milliseconds(7));
  clock.Set(t0 + TimeDelta::Seconds(1));
  EXPECT_EQ(clock.Now() - t0, TimeDelta::Seconds(1));
}

TEST(ClockTest, RealClockIsMonotonic) {
  const Clock& clock = RealClock::Get();
  const Timestamp a = clock.Now();
  const Timestamp b = clock.Now();
  EXPECT_LE(a, b);
}

}  // namespace
}  // namespace longhaul
