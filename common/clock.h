// Clock: the one seam through which code reads the time.
//
// Production code holds a `const Clock&` (usually a RealClock owned by main) and calls Now() for
// intervals and deadlines, WallNow() for dates that are persisted or shown. Tests hand in a
// FakeClock and advance it by hand, so nothing depends on the machine's speed or the date.
// Only RealClock reads std::chrono::steady_clock or absl::Now(); nothing else in longhaul may.
#ifndef LONGHAUL_COMMON_CLOCK_H_
#define LONGHAUL_COMMON_CLOCK_H_

#include <atomic>
#include <cstdint>

#include "absl/time/time.h"
#include "common/units.h"

namespace longhaul {

// A monotonic source of Timestamps, and the wall-clock date. Implementations must be thread-safe:
// Now() and WallNow() may be called concurrently from any thread.
class Clock {
 public:
  virtual ~Clock() = default;
  // The current time. Never goes backwards for a given Clock.
  virtual Timestamp Now() const = 0;
  // The current date, for records that outlive the process (creation and end times, expiry).
  // May step in either direction (NTP, an operator); never measure an interval with it.
  virtual absl::Time WallNow() const = 0;
};

// The machine's monotonic clock (std::chrono::steady_clock), whose epoch is arbitrary (boot time
// on Linux), and its wall clock (absl::Now()). Thread-safe.
class RealClock final : public Clock {
 public:
  Timestamp Now() const override;
  absl::Time WallNow() const override;
  // A process-wide instance, for code that has no clock injected yet. Prefer injection.
  static const RealClock& Get();
};

// A clock that only moves when told to. Starts at `start` (default: epoch + 1 s, so that
// `Now() - some_delta` stays positive in tests), its wall clock at `wall_start` (default: a
// fixed date in 2027). Thread-safe: both times are atomics (read separately: a reader racing
// Advance may see one moved and not yet the other).
class FakeClock final : public Clock {
 public:
  explicit FakeClock(Timestamp start = Timestamp::FromNanoseconds(1000000000),
                     absl::Time wall_start = absl::FromUnixSeconds(1800000000))
      : now_ns_(start.ToNanoseconds()), wall_ns_(absl::ToUnixNanos(wall_start)) {}

  Timestamp Now() const override {
    return Timestamp::FromNanoseconds(now_ns_.load(std::memory_order_acquire));
  }
  absl::Time WallNow() const override {
    return absl::FromUnixNanos(wall_ns_.load(std::memory_order_acquire));
  }
  // Moves both times forward by `d`. `d` must be non-negative.
  void Advance(TimeDelta d) {
    now_ns_.fetch_add(d.ToNanoseconds(), std::memory_order_acq_rel);
    wall_ns_.fetch_add(d.ToNanoseconds(), std::memory_order_acq_rel);
  }
  // Sets the monotonic time. Must not be earlier than Now().
  void Set(Timestamp t) { now_ns_.store(t.ToNanoseconds(), std::memory_order_release); }
  // Sets the wall time alone, in either direction (a stepped wall clock).
  void SetWall(absl::Time t) { wall_ns_.store(absl::ToUnixNanos(t), std::memory_order_release); }

 private:
  std::atomic<int64_t> now_ns_;
  std::atomic<int64_t> wall_ns_;
};

}  // namespace longhaul

#endif  // LONGHAUL_COMMON_CLOCK_H_
