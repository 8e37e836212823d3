#include "common/clock.h"

#include <chrono>

namespace longhaul {

Timestamp RealClock::Now() const {
  const auto since_epoch = std::chrono::steady_clock::now().time_since_epoch();
  return Timestamp::FromNanoseconds(
      std::chrono::duration_cast<std::chrono::nanoseconds>(since_epoch).count());
}

const RealClock& RealClock::Get() {
  static const RealClock* const clock = new RealClock();
  return *clock;
}

}  // namespace longhaul
