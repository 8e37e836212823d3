#include "common/clock.h"

#include <chrono>

#include "absl/time/clock.h"

namespace longhaul {

Timestamp RealClock::Now() const {
  const auto since_epoch = std::chrono::steady_clock::now().time_since_epoch();
  return Timestamp::FromNanoseconds(
      std::chrono::duration_cast<std::chrono::nanoseconds>(since_epoch).count());
}

absl::Time RealClock::WallNow() const { return absl::Now(); }

const RealClock& RealClock::Get() {
  static const RealClock* const clock = new RealClock();
  return *clock;
}

}  // namespace longhaul
