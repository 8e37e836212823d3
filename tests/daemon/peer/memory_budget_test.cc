#include "daemon/peer/memory_budget.h"

#include <string>
#include <thread>
#include <utility>

#include "gtest/gtest.h"
#include "tests/test_tools/eventually.h"

namespace longhaul::peer {
namespace {

TEST(PeerMemoryBudgetTest, EachSiteHasItsOwnBudgetAndARefusalReservesNothing) {
  PeerMemoryBudget budget(100);
  EXPECT_TRUE(budget.TryReserve("site-a", 60));
  EXPECT_FALSE(budget.TryReserve("site-a", 41));
  EXPECT_EQ(budget.used("site-a"), 60u);
  EXPECT_TRUE(budget.TryReserve("site-b", 100));
  EXPECT_TRUE(budget.TryReserve("site-a", 40));
  budget.Release("site-a", 60);
  EXPECT_EQ(budget.used("site-a"), 40u);
  EXPECT_TRUE(budget.TryReserve("site-a", 60));
}

TEST(PeerMemoryBudgetTest, AReservationReturnsItsBytesWhenItEnds) {
  PeerMemoryBudget budget(10);
  {
    MemoryReservation r = MemoryReservation::TryTake(&budget, "site-a", 10);
    EXPECT_EQ(r.bytes(), 10u);
    EXPECT_EQ(MemoryReservation::TryTake(&budget, "site-a", 1).bytes(), 0u);
    MemoryReservation moved = std::move(r);
    EXPECT_EQ(budget.used("site-a"), 10u);
  }
  EXPECT_EQ(budget.used("site-a"), 0u);
}

TEST(PeerMemoryBudgetTest, AWaitingReserveTakesWhatAReleaseFreesAndGivesUpOtherwise) {
  PeerMemoryBudget budget(100);
  ASSERT_TRUE(budget.TryReserve("site-a", 100));
  EXPECT_FALSE(budget.Reserve("site-a", 1, absl::ZeroDuration()));
  bool reserved = false;
  std::thread waiter([&] { reserved = budget.Reserve("site-a", 50, absl::Seconds(10)); });
  ASSERT_TRUE(testing::Eventually([&] { return budget.waiting() == 1; }));
  // Many other sites' first reservations grow (and rehash) the map while
  // site-a waits; its own count must come through intact. (A reference to
  // its slot held across the wait never sees the release: the wait times
  // out.)
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(budget.TryReserve("site-" + std::to_string(i), 1));
  budget.Release("site-a", 60);
  waiter.join();
  EXPECT_TRUE(reserved);
  EXPECT_EQ(budget.used("site-a"), 90u);
  EXPECT_EQ(budget.used("site-7"), 1u);
}

}  // namespace
}  // namespace longhaul::peer
