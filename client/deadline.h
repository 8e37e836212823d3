// Deadlines and elapsed times of the client library, on monotonic clocks so
// that a step of the wall clock (NTP, an operator) neither fires a timeout
// early nor postpones it. Private to client/: not part of the public API.
#ifndef LONGHAUL_CLIENT_DEADLINE_H_
#define LONGHAUL_CLIENT_DEADLINE_H_

#include <grpc/support/time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>

#include "absl/time/time.h"

namespace longhaul::client_internal {

// The monotonic clock (std::chrono::steady_clock) as an absl::Time counted
// from the Unix epoch, so absl::Duration arithmetic applies. Never read it
// as a date, and never hand it to an API that expects wall time.
inline absl::Time MonotonicNow() {
  const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                         std::chrono::steady_clock::now().time_since_epoch())
                         .count();
  return absl::UnixEpoch() + absl::Nanoseconds(ns);
}

// A gRPC deadline (ClientContext::set_deadline, WaitForConnected, AsyncNext)
// `timeout` from now on gRPC's monotonic clock; an infinite timeout never
// expires.
inline gpr_timespec GrpcDeadlineIn(absl::Duration timeout) {
  if (timeout == absl::InfiniteDuration()) return gpr_inf_future(GPR_CLOCK_MONOTONIC);
  return gpr_time_add(
      gpr_now(GPR_CLOCK_MONOTONIC),
      gpr_time_from_nanos(absl::ToInt64Nanoseconds(std::max(timeout, absl::ZeroDuration())),
                          GPR_TIMESPAN));
}

// The same for a deadline `at` on the MonotonicNow() time line.
inline gpr_timespec GrpcDeadlineAt(absl::Time at) { return GrpcDeadlineIn(at - MonotonicNow()); }

}  // namespace longhaul::client_internal

#endif  // LONGHAUL_CLIENT_DEADLINE_H_
