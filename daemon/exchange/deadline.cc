#include "daemon/exchange/deadline.h"

#include <algorithm>
#include <cstdint>
#include <limits>

namespace longhaul::exchange {

TimeDelta ToTimeDelta(absl::Duration d) {
  // ToInt64Nanoseconds saturates: an infinite duration is int64 max.
  return TimeDelta::Nanoseconds(absl::ToInt64Nanoseconds(d));
}

absl::Duration ToDuration(TimeDelta d) {
  if (d.IsInfinite()) return absl::InfiniteDuration();
  return absl::Nanoseconds(d.ToNanoseconds());
}

Timestamp After(Timestamp start, TimeDelta d) {
  if (start.IsInfinite() || d.IsInfinite() ||
      d.ToNanoseconds() > std::numeric_limits<int64_t>::max() - start.ToNanoseconds()) {
    return Timestamp::Infinite();
  }
  return start + d;
}

absl::Duration WaitSlice(const Clock& clock, Timestamp deadline) {
  if (deadline.IsInfinite()) return kClockPoll;
  const TimeDelta left = deadline - clock.Now();
  if (left <= TimeDelta::Zero()) return absl::ZeroDuration();
  return std::min(ToDuration(left), kClockPoll);
}

bool AwaitUntil(absl::Mutex& mu, const absl::Condition& cond, const Clock& clock,
                Timestamp deadline) {
  while (!cond.Eval()) {
    if (clock.Now() >= deadline) return false;
    mu.AwaitWithTimeout(cond, WaitSlice(clock, deadline));
  }
  return true;
}

}  // namespace longhaul::exchange
