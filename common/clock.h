// Clock: the one seam through which code reads the time.
//
// Production code holds a `const Clock&` (usually a RealClock owned by main) and calls Now().
// Tests hand in a FakeClock and advance it by hand, so nothing depends on the machine's speed.
// Only RealClock reads std::chrono::steady_clock; nothing else in longhaul may.
#ifndef LONGHAUL_COMMON_CLOCK_H_
#define LONGHAUL_COMMON_CLOCK_H_

#include <atomic>
#include <cstdint>

#include "common/units.h"

namespace longhaul {

// A monotonic source of Timestamps. Implementations must be thread-safe: Now() may be called
// concurrently from any thread.
class Clock {
 public:
  virtual ~Clock() = default;
  // The current time. Never goes backwards for a given Clock.
  virtual Timestamp Now() const = 0;
};

// The machine's monotonic clock (std::chrono::steady_clock). Its epoch is arbitrary (boot time on
// Linux). Thread-safe.
class RealClock final : public Clock {
 public:
  Timestamp Now() const override;
  // A process-wide instance, for code that has no clock injected yet. Prefer injection.
  static const RealClock& Get();
};

// A clock that only moves when told to. Starts at `start` (default: epoch + 1 s, so that
// `Now() - some_delta` stays positive in tests). Thread-safe: time is an atomic.
class FakeClock final : public Clock {
 public:
  explicit FakeClock(Timestamp start = Timestamp::FromNanoseconds(1000000000))
      : now_ns_(start.ToNanoseconds()) {}

  Timestamp Now() const override {
    return Timestamp::FromNanoseconds(now_ns_.load(std::memory_order_acquire));
  }
  // Moves time forward by `d`. `d` must be non-negative.
  void Advance(TimeDelta d) { now_ns_.fetch_add(d.ToNanoseconds(), std::memory_order_acq_rel); }
  // Sets the time. Must not be earlier than Now().
  void Set(Timestamp t) { now_ns_.store(t.ToNanoseconds(), std::memory_order_release); }

 private:
  std::atomic<int64_t> now_ns_;
};

}  // namespace longhaul

#endif  // LONGHAUL_COMMON_CLOCK_H_
