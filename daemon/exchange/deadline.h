#ifndef LONGHAUL_DAEMON_EXCHANGE_DEADLINE_H_
#define LONGHAUL_DAEMON_EXCHANGE_DEADLINE_H_

// Deadlines in the exchange. Every deadline and elapsed time is read from
// the hub's Clock (a monotonic Timestamp, never a date), so a step of the
// wall clock neither fires nor postpones one, and a test's FakeClock drives
// them all. A mutex knows only real time, so a mutex wait is given the time
// left but at most kClockPoll: a FakeClock moved forward is noticed within
// one poll.

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "common/units.h"

namespace longhaul::exchange {

inline constexpr absl::Duration kClockPoll = absl::Milliseconds(50);

// `d` as a TimeDelta; an infinite or larger one is TimeDelta::Infinite().
TimeDelta ToTimeDelta(absl::Duration d);
absl::Duration ToDuration(TimeDelta d);
// `start` + `d`, or Timestamp::Infinite() when that is past the end of time.
Timestamp After(Timestamp start, TimeDelta d);
// How long a mutex wait for `deadline` may take: the time left, at most
// kClockPoll, at least zero.
absl::Duration WaitSlice(const Clock& clock, Timestamp deadline);
// Waits on `mu` until `cond` holds or `clock` reaches `deadline`; returns
// whether `cond` holds.
bool AwaitUntil(absl::Mutex& mu, const absl::Condition& cond, const Clock& clock,
                Timestamp deadline) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu);

}  // namespace longhaul::exchange

#endif  // LONGHAUL_DAEMON_EXCHANGE_DEADLINE_H_
