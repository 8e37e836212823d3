#include "storage/buffer_pool.h"

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "storage/file_system.h"

namespace longhaul::storage {
namespace {

constexpr size_t kBuffer = 64 << 10;

std::unique_ptr<BufferPool> MakePool(size_t count, size_t size = kBuffer) {
  auto pool = BufferPool::Create(count, size);
  EXPECT_TRUE(pool.ok()) << pool.status();
  return pool.ok() ? *std::move(pool) : nullptr;
}

// Yields until `pool` has `n` Acquire() calls blocked in it.
void WaitForWaiters(const BufferPool& pool, size_t n) {
  while (pool.waiting() < n) std::this_thread::yield();
}

TEST(BufferPoolTest, RefusesSizesThatAreNotWholeBlocks) {
  EXPECT_TRUE(absl::IsInvalidArgument(BufferPool::Create(0, kBuffer).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(BufferPool::Create(2, 0).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(BufferPool::Create(2, kDirectIoAlignment + 512).status()));
  EXPECT_TRUE(BufferPool::Create(1, kDirectIoAlignment).ok());
}

TEST(BufferPoolTest, BuffersArePageAlignedDistinctAndContiguous) {
  auto pool = MakePool(4);
  ASSERT_NE(pool, nullptr);
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pool->base()) % page, 0u);
  EXPECT_EQ(pool->region_size(), 4 * kBuffer);
  std::vector<BufferPool::Lease> leases;
  std::set<size_t> indices;
  for (int i = 0; i < 4; ++i) {
    auto lease = pool->Acquire(absl::InfiniteDuration());
    ASSERT_TRUE(lease.ok()) << lease.status();
    EXPECT_EQ(reinterpret_cast<uintptr_t>(lease->data()) % page, 0u);
    EXPECT_EQ(lease->size(), kBuffer);
    EXPECT_EQ(lease->data(), pool->base() + lease->index() * kBuffer);
    indices.insert(lease->index());
    leases.push_back(*std::move(lease));
  }
  EXPECT_EQ(indices, (std::set<size_t>{0, 1, 2, 3}));
  EXPECT_EQ(pool->free_count(), 0u);
  leases.clear();
  EXPECT_EQ(pool->free_count(), 4u);
}

TEST(BufferPoolTest, AcquireBeyondCountWaitsThenTimesOut) {
  auto pool = MakePool(2);
  ASSERT_NE(pool, nullptr);
  auto a = pool->Acquire(absl::InfiniteDuration());
  // A zero timeout still takes a free buffer.
  auto b = pool->Acquire(absl::ZeroDuration());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_FALSE(pool->TryAcquire().has_value());
  auto c = pool->Acquire(absl::Milliseconds(20));
  EXPECT_TRUE(absl::IsDeadlineExceeded(c.status())) << c.status();
  EXPECT_EQ(pool->waiting(), 0u);
  a->Reset();
  EXPECT_FALSE(a->valid());
  auto d = pool->TryAcquire();
  ASSERT_TRUE(d.has_value());
  EXPECT_TRUE(d->valid());
}

TEST(BufferPoolTest, ReturnedLeaseWakesAWaiter) {
  auto pool = MakePool(1);
  ASSERT_NE(pool, nullptr);
  auto held = pool->Acquire(absl::InfiniteDuration());
  ASSERT_TRUE(held.ok());
  const size_t index = held->index();
  absl::StatusOr<BufferPool::Lease> got = absl::UnknownError("not run");
  std::thread waiter([&] { got = pool->Acquire(absl::InfiniteDuration()); });
  WaitForWaiters(*pool, 1);
  *held = BufferPool::Lease();  // move-assigning returns the buffer
  waiter.join();
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->index(), index);
}

TEST(BufferPoolTest, ShutdownWakesEveryWaiterAndRefusesNewLeases) {
  auto pool = MakePool(1);
  ASSERT_NE(pool, nullptr);
  auto held = pool->Acquire(absl::InfiniteDuration());
  ASSERT_TRUE(held.ok());
  constexpr int kWaiters = 3;
  std::vector<absl::Status> results(kWaiters, absl::UnknownError("not run"));
  std::vector<std::thread> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.emplace_back([&, i] { results[i] = pool->Acquire(absl::InfiniteDuration()).status(); });
  }
  WaitForWaiters(*pool, kWaiters);
  pool->Shutdown();
  for (auto& t : waiters) t.join();
  for (const absl::Status& s : results) EXPECT_TRUE(absl::IsCancelled(s)) << s;
  EXPECT_TRUE(absl::IsCancelled(pool->Acquire(absl::InfiniteDuration()).status()));
  // The lease already out stays usable and goes back as usual.
  std::memset(held->data(), 0x5a, held->size());
  held->Reset();
  EXPECT_EQ(pool->free_count(), 1u);
  EXPECT_FALSE(pool->TryAcquire().has_value());
}

TEST(BufferPoolTest, ReuseHandsOutThePreviousBytesWithoutZeroing) {
  auto pool = MakePool(1);
  ASSERT_NE(pool, nullptr);
  {
    auto lease = pool->TryAcquire();
    ASSERT_TRUE(lease.has_value());
    for (size_t i = 0; i < lease->size(); ++i) lease->data()[i] = static_cast<uint8_t>(i * 7 + 1);
  }
  auto again = pool->TryAcquire();
  ASSERT_TRUE(again.has_value());
  size_t same = 0;
  for (size_t i = 0; i < again->size(); ++i) {
    same += again->data()[i] == static_cast<uint8_t>(i * 7 + 1);
  }
  EXPECT_EQ(same, again->size());
}

TEST(BufferPoolTest, MovedLeaseOwnsTheBufferOnce) {
  auto pool = MakePool(2);
  ASSERT_NE(pool, nullptr);
  auto a = pool->TryAcquire();
  ASSERT_TRUE(a.has_value());
  BufferPool::Lease moved = std::move(*a);
  EXPECT_FALSE(a->valid());
  EXPECT_TRUE(moved.valid());
  EXPECT_EQ(pool->free_count(), 1u);
  a.reset();  // destroying the moved-from lease returns nothing
  EXPECT_EQ(pool->free_count(), 1u);
  moved.Reset();
  EXPECT_EQ(pool->free_count(), 2u);
}

TEST(BufferPoolTest, FindsTheBufferHoldingASpan) {
  auto pool = MakePool(3);
  ASSERT_NE(pool, nullptr);
  uint8_t* base = pool->base();
  EXPECT_EQ(pool->BufferIndexOf(base, kBuffer), 0);
  EXPECT_EQ(pool->BufferIndexOf(base + kBuffer + 100, kBuffer - 100), 1);
  EXPECT_EQ(pool->BufferIndexOf(base + 3 * kBuffer - 1, 1), 2);
  EXPECT_EQ(pool->BufferIndexOf(base + kBuffer - 1, 2), -1);  // crosses into buffer 1
  EXPECT_EQ(pool->BufferIndexOf(base + 3 * kBuffer, 1), -1);  // past the end
  EXPECT_EQ(pool->BufferIndexOf(base - 1, 1), -1);
  EXPECT_EQ(pool->BufferIndexOf(base, 0), -1);
  std::vector<uint8_t> heap(16);
  EXPECT_EQ(pool->BufferIndexOf(heap.data(), heap.size()), -1);
}

TEST(BufferPoolDeathTest, DestroyingThePoolUnderALeaseAborts) {
  EXPECT_DEATH(
      {
        auto pool = MakePool(1);
        auto* leaked = new BufferPool::Lease(std::move(*pool->TryAcquire()));  // never returned
        (void)leaked;
        pool.reset();
      },
      "leases outstanding");
}

}  // namespace
}  // namespace longhaul::storage
