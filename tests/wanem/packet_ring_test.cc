#include "tests/wanem/packet_ring.h"

#include <cstring>
#include <deque>
#include <random>

#include "gtest/gtest.h"

namespace longhaul::wanem {
namespace {

void Push(PacketRing& r, size_t len, int64_t due, uint8_t fill) {
  absl::Span<uint8_t> slot = r.Reserve();
  ASSERT_GE(slot.size(), len);
  std::memset(slot.data(), fill, len);
  r.Commit(len, due);
}

TEST(PacketRingTest, FifoOrderAndContents) {
  PacketRing r(1 << 16, 1500);
  Push(r, 100, 1, 0xaa);
  Push(r, 1500, 2, 0xbb);
  Push(r, 1, 3, 0xcc);
  ASSERT_EQ(r.count(), 3u);
  EXPECT_EQ(r.FrontDue(), 1);
  EXPECT_EQ(r.Front().size(), 100u);
  EXPECT_EQ(r.Front()[99], 0xaa);
  r.Pop();
  EXPECT_EQ(r.FrontDue(), 2);
  EXPECT_EQ(r.Front().size(), 1500u);
  EXPECT_EQ(r.Front()[0], 0xbb);
  r.Pop();
  EXPECT_EQ(r.Front().size(), 1u);
  r.Pop();
  EXPECT_TRUE(r.empty());
}

TEST(PacketRingTest, ReportsFullInsteadOfOverwriting) {
  PacketRing r(10 * 1024, 1000);
  int pushed = 0;
  while (!r.Reserve().empty()) {
    Push(r, 1000, pushed, static_cast<uint8_t>(pushed));
    ++pushed;
  }
  EXPECT_GE(pushed, 8);
  EXPECT_LE(pushed, 10);
  r.Pop();
  EXPECT_FALSE(r.Reserve().empty());
}

TEST(PacketRingTest, RandomTrafficMatchesAModelQueue) {
  // Mixed sizes force many wrap-arounds; the ring must behave like a deque.
  PacketRing r(64 * 1024, 9000);
  std::deque<std::pair<size_t, uint8_t>> model;
  std::mt19937 rng(5);
  int64_t seq = 0;
  for (int step = 0; step < 200'000; ++step) {
    const bool push = rng() % 2 == 0;
    if (push) {
      const size_t len = 1 + rng() % 9000;
      if (r.Reserve().empty()) {
        ASSERT_FALSE(model.empty());
        continue;
      }
      const uint8_t fill = static_cast<uint8_t>(seq);
      Push(r, len, seq++, fill);
      model.emplace_back(len, fill);
    } else if (!model.empty()) {
      ASSERT_FALSE(r.empty());
      absl::Span<const uint8_t> f = r.Front();
      ASSERT_EQ(f.size(), model.front().first);
      ASSERT_EQ(f[0], model.front().second);
      ASSERT_EQ(f[f.size() - 1], model.front().second);
      r.Pop();
      model.pop_front();
    }
    ASSERT_EQ(r.count(), model.size());
  }
}

}  // namespace
}  // namespace longhaul::wanem
