#ifndef LONGHAUL_DAEMON_PEER_CONTENT_CHECK_BUDGET_H_
#define LONGHAUL_DAEMON_PEER_CONTENT_CHECK_BUDGET_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"

namespace longhaul::peer {

// How many bytes of this site's files each peer may have read and hashed
// for it by sync --checksum (peer_limits.content_check_bytes_per_second).
// A 78-byte open names files of any size, so without a bound one peer
// makes the destination read its disks at will.
//
// Per peer site, a token bucket that holds at most kBurst worth of the
// rate, full at first: a whole checkpoint compares at once, and a peer
// that opens again and again gets the rate on average. A file is charged
// whole before it is read; one larger than what is left is not read (the
// caller sends it instead), and charges nothing.
//
// Thread-safe. Time comes from the injected Clock only.
class ContentCheckBudget {
 public:
  static constexpr TimeDelta kBurst = TimeDelta::Seconds(60);

  // `bytes_per_second` 0: no bound. `clock` must outlive the budget.
  ContentCheckBudget(uint64_t bytes_per_second, const Clock& clock);

  // Charges `bytes` to `site` and returns true if that much is left.
  bool TryTake(const std::string& site, uint64_t bytes);

 private:
  struct Bucket {
    double tokens = 0;
    Timestamp last_refill;
  };

  const uint64_t bytes_per_second_;
  const double capacity_;
  const Clock& clock_;
  absl::Mutex mu_;
  std::map<std::string, Bucket> buckets_ ABSL_GUARDED_BY(mu_);
};

}  // namespace longhaul::peer

#endif  // LONGHAUL_DAEMON_PEER_CONTENT_CHECK_BUDGET_H_
