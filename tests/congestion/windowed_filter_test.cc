#include "congestion/windowed_filter.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace longhaul::congestion {
namespace {

using MaxFilter = WindowedMaxFilter<int64_t, uint64_t, uint64_t>;
using MinFilter = WindowedMinFilter<int64_t, uint64_t, uint64_t>;

TEST(WindowedFilterTest, MaxTracksLargestWithinWindow) {
  MaxFilter f(/*window=*/10, /*zero=*/0, /*zero_time=*/0);
  f.Update(5, 1);
  f.Update(9, 2);
  f.Update(7, 3);
  EXPECT_EQ(f.GetBest(), 9);
  f.Update(3, 11);  // 9 (t=2) is still inside the window of 10.
  EXPECT_EQ(f.GetBest(), 9);
}

TEST(WindowedFilterTest, MaxForgetsExpiredBest) {
  MaxFilter f(10, 0, 0);
  f.Update(100, 1);
  for (uint64_t t = 2; t <= 30; ++t) f.Update(10, t);
  EXPECT_EQ(f.GetBest(), 10);
}

TEST(WindowedFilterTest, MaxFallsBackToRecentSecondBest) {
  MaxFilter f(10, 0, 0);
  f.Update(100, 0);
  f.Update(50, 6);   // Recorded as a later, smaller candidate.
  f.Update(20, 11);  // 100 expires; 50 (t=6) is still in the window.
  EXPECT_EQ(f.GetBest(), 50);
}

TEST(WindowedFilterTest, MinTracksSmallest) {
  MinFilter f(10, 0, 0);
  f.Update(40, 1);
  f.Update(42, 2);
  f.Update(39, 3);
  EXPECT_EQ(f.GetBest(), 39);
  for (uint64_t t = 4; t <= 20; ++t) f.Update(45, t);
  EXPECT_EQ(f.GetBest(), 45);
}

TEST(WindowedFilterTest, ResetStartsOver) {
  MaxFilter f(10, 0, 0);
  f.Update(100, 1);
  f.Reset(3, 2);
  EXPECT_EQ(f.GetBest(), 3);
}

}  // namespace
}  // namespace longhaul::congestion
