#include "congestion/packet_ring.h"

#include "gtest/gtest.h"

namespace longhaul::congestion {
namespace {

TEST(PacketRingTest, InsertFindEraseWithGaps) {
  PacketRing<int> ring(4);
  ring.Insert(10, 100);
  ring.Insert(12, 120);  // 11 is a gap.
  EXPECT_EQ(*ring.Find(10), 100);
  EXPECT_EQ(ring.Find(11), nullptr);
  EXPECT_EQ(*ring.Find(12), 120);
  EXPECT_TRUE(ring.Erase(10));
  EXPECT_FALSE(ring.Erase(10));
  EXPECT_EQ(ring.front_pn(), 12u);
  EXPECT_EQ(ring.size(), 1u);
}

TEST(PacketRingTest, GrowsWhenOutstandingSpanExceedsCapacity) {
  PacketRing<int> ring(4);
  for (int i = 1; i <= 100; ++i) ring.Insert(i, i * 2);
  for (int i = 1; i <= 100; ++i) ASSERT_EQ(*ring.Find(i), i * 2);
  for (int i = 1; i <= 100; ++i) ring.Erase(i);
  EXPECT_TRUE(ring.empty());
  ring.Insert(1000, 7);
  EXPECT_EQ(*ring.Find(1000), 7);
}

}  // namespace
}  // namespace longhaul::congestion
