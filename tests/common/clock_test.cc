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

TEST(ClockTest, FakeClockAdvanceMovesTheWallClockToo) {
  FakeClock clock(Timestamp::FromNanoseconds(1000000000), absl::FromUnixSeconds(1800000000));
  EXPECT_EQ(clock.WallNow(), absl::FromUnixSeconds(1800000000));
  clock.Advance(TimeDelta::Milliseconds(1500));
  EXPECT_EQ(clock.WallNow(), absl::FromUnixMillis(1800000001500));
  // A stepped wall clock leaves the monotonic time alone.
  const Timestamp before_step = clock.Now();
  clock.SetWall(absl::FromUnixSeconds(1700000000));
  EXPECT_EQ(clock.WallNow(), absl::FromUnixSeconds(1700000000));
  EXPECT_EQ(clock.Now(), before_step);
}

TEST(ClockTest, RealClockIsMonotonic) {
  const Clock& clock = RealClock::Get();
  const Timestamp a = clock.Now();
  const Timestamp b = clock.Now();
  EXPECT_LE(a, b);
}

}  // namespace
}  // namespace longhaul
