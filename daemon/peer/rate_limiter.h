#ifndef LONGHAUL_DAEMON_PEER_RATE_LIMITER_H_
#define LONGHAUL_DAEMON_PEER_RATE_LIMITER_H_

#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/clock.h"
#include "common/units.h"
#include "longhaul/v1/control.pb.h"

namespace longhaul::peer {

// Operators' caps on the sending rate: one per peer site (all traffic to
// it) and one per priority class (that class's traffic to every peer). A
// chunk is charged to both caps that apply to it.
//
// Each cap is a token bucket that may go into debt: a sender asks at a chunk
// boundary, and the chunk goes as soon as neither bucket is in debt, even if
// it is larger than the bucket. The debt then delays the next chunk, so over
// a few chunks the rate converges on the cap whatever the chunk size, and an
// idle link saves up at most kBurst worth of sending. Caps change at run
// time; a waiting sender re-evaluates at once.
//
// Thread-safe. Time comes from the injected Clock only.
class RateLimiter {
 public:
  // The most an idle cap saves up: this long at its rate.
  static constexpr TimeDelta kBurst = TimeDelta::Milliseconds(100);

  // `clock` must outlive the limiter.
  explicit RateLimiter(const Clock& clock);

  // Sets the cap on traffic to `site`; a zero or infinite rate removes it.
  void SetPeerLimit(const std::string& site, Bandwidth rate);
  // Sets the cap on `priority` (UNSPECIFIED means CHECKPOINT, as for
  // transfers); a zero or infinite rate removes it.
  void SetClassLimit(v1::PriorityClass priority, Bandwidth rate);

  struct Limit {
    std::string peer;  // empty for a class cap
    v1::PriorityClass priority = v1::PRIORITY_UNSPECIFIED;  // for a class cap
    Bandwidth rate;
  };
  // Caps in force: peers by name, then classes from exchange to background.
  std::vector<Limit> Limits() const;

  // Bytes charged so far to the cap of `priority` (UNSPECIFIED: checkpoint)
  // and to the cap of `site`: what went out while the cap was in force.
  // Zero for a class or peer that never had a cap.
  ByteCount ChargedToClass(v1::PriorityClass priority) const;
  ByteCount ChargedToPeer(const std::string& site) const;

  // Non-blocking. If neither cap of (`site`, `priority`) is in debt, charges
  // `bytes` to both and returns zero; otherwise charges nothing and returns
  // how long until the caps allow sending again (at the current rates).
  TimeDelta TryAcquire(const std::string& site, v1::PriorityClass priority, ByteCount bytes);

  // Blocks until TryAcquire succeeds or `cancelled` returns true (asked at
  // least every 50 ms of real time). Returns false if cancelled.
  bool Acquire(const std::string& site, v1::PriorityClass priority, ByteCount bytes,
               absl::FunctionRef<bool()> cancelled);

 private:
  struct Bucket {
    Bandwidth rate;
    double tokens = 0;  // bytes; negative while in debt
    Timestamp last_refill;
  };
  void SetLimitLocked(std::map<std::string, Bucket>& buckets, const std::string& key,
                      Bandwidth rate) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RefillLocked(Bucket& bucket, Timestamp now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Clock& clock_;
  mutable absl::Mutex mu_;
  absl::CondVar changed_;  // signalled when a cap changes
  std::map<std::string, Bucket> peers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Bucket> classes_ ABSL_GUARDED_BY(mu_);  // by PriorityClassName
  // Kept when a cap is lifted, so the accounting survives `limit off`.
  std::map<std::string, ByteCount> charged_peers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, ByteCount> charged_classes_ ABSL_GUARDED_BY(mu_);
};

// "exchange", "checkpoint", "background" (UNSPECIFIED reads as checkpoint).
std::string PriorityClassName(v1::PriorityClass priority);
// The inverse of PriorityClassName; InvalidArgument for another word.
absl::StatusOr<v1::PriorityClass> ParsePriorityClass(absl::string_view name);

}  // namespace longhaul::peer

#endif  // LONGHAUL_DAEMON_PEER_RATE_LIMITER_H_
