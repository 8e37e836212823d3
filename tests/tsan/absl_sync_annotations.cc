// ThreadSanitizer annotations for Debian's prebuilt abseil synchronization.
//
// Debian builds libabsl_synchronization without -fsanitize=thread, so its
// Mutex, CondVar and Notification hand off memory through futexes that TSan
// never sees, and every ABSL_GUARDED_BY field looks like a data race. This file
// restores the happens-before edges abseil itself records when it is built with
// TSan (ABSL_TSAN_MUTEX_* in mutex.cc): the TSan build links every executable
// with `--wrap=<symbol>` for the symbols below (LONGHAUL_TSAN_WRAPPED_SYMBOLS in
// the root CMakeLists.txt), so our calls land here, are annotated, and go on to
// the real function (`__real_<symbol>`).
//
// Waits that release the mutex inside abseil (Await, LockWhen, CondVar::Wait)
// are modelled as unlock-then-lock. Accesses made inside abseil while a call is
// under way (Condition callbacks run by whichever thread unlocks) are ignored,
// as abseil's own annotations ignore them.
//
// The mangled names pin abseil's Debian 12 inline namespace (`debian3`); another
// abseil fails the TSan link with undefined `__real_` symbols, never silently.

#include <sanitizer/tsan_interface.h>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"

namespace {

using absl::Condition;
using absl::CondVar;
using absl::Duration;
using absl::Mutex;
using absl::Notification;
using absl::Time;

constexpr unsigned kRead = __tsan_mutex_read_lock;
constexpr unsigned kTry = __tsan_mutex_try_lock;
constexpr unsigned kTryFailed = __tsan_mutex_try_lock_failed;

void Acquired(Mutex* mu, unsigned flags) { __tsan_mutex_post_lock(mu, flags, 0); }

void Releasing(Mutex* mu, unsigned flags) { __tsan_mutex_pre_unlock(mu, flags); }

// Brackets a call that releases `mu`, blocks, and returns with `mu` held again.
class ReleasedDuring {
 public:
  ReleasedDuring(Mutex* mu, unsigned flags) : mu_(mu), flags_(flags) { Releasing(mu_, flags_); }
  ~ReleasedDuring() {
    __tsan_mutex_post_unlock(mu_, flags_);
    __tsan_mutex_pre_lock(mu_, flags_);
    Acquired(mu_, flags_);
  }

 private:
  Mutex* mu_;
  unsigned flags_;
};

}  // namespace

#define REAL(sym) __real_##sym
#define WRAP(sym) __wrap_##sym

extern "C" {

// Mutex::Lock / Unlock / TryLock and the reader forms.
void REAL(_ZN4absl7debian35Mutex4LockEv)(Mutex*);
void WRAP(_ZN4absl7debian35Mutex4LockEv)(Mutex* mu) {
  __tsan_mutex_pre_lock(mu, 0);
  REAL(_ZN4absl7debian35Mutex4LockEv)(mu);
  Acquired(mu, 0);
}
void REAL(_ZN4absl7debian35Mutex6UnlockEv)(Mutex*);
void WRAP(_ZN4absl7debian35Mutex6UnlockEv)(Mutex* mu) {
  Releasing(mu, 0);
  REAL(_ZN4absl7debian35Mutex6UnlockEv)(mu);
  __tsan_mutex_post_unlock(mu, 0);
}
bool REAL(_ZN4absl7debian35Mutex7TryLockEv)(Mutex*);
bool WRAP(_ZN4absl7debian35Mutex7TryLockEv)(Mutex* mu) {
  __tsan_mutex_pre_lock(mu, kTry);
  const bool locked = REAL(_ZN4absl7debian35Mutex7TryLockEv)(mu);
  Acquired(mu, locked ? kTry : kTry | kTryFailed);
  return locked;
}
void REAL(_ZN4absl7debian35Mutex10ReaderLockEv)(Mutex*);
void WRAP(_ZN4absl7debian35Mutex10ReaderLockEv)(Mutex* mu) {
  __tsan_mutex_pre_lock(mu, kRead);
  REAL(_ZN4absl7debian35Mutex10ReaderLockEv)(mu);
  Acquired(mu, kRead);
}
void REAL(_ZN4absl7debian35Mutex12ReaderUnlockEv)(Mutex*);
void WRAP(_ZN4absl7debian35Mutex12ReaderUnlockEv)(Mutex* mu) {
  Releasing(mu, kRead);
  REAL(_ZN4absl7debian35Mutex12ReaderUnlockEv)(mu);
  __tsan_mutex_post_unlock(mu, kRead);
}
bool REAL(_ZN4absl7debian35Mutex13ReaderTryLockEv)(Mutex*);
bool WRAP(_ZN4absl7debian35Mutex13ReaderTryLockEv)(Mutex* mu) {
  __tsan_mutex_pre_lock(mu, kRead | kTry);
  const bool locked = REAL(_ZN4absl7debian35Mutex13ReaderTryLockEv)(mu);
  Acquired(mu, locked ? kRead | kTry : kRead | kTry | kTryFailed);
  return locked;
}

// Mutex::LockWhen and its timed and reader forms: they return with `mu` held.
void REAL(_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE)(Mutex*, const Condition&);
void WRAP(_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE)(Mutex* mu, const Condition& c) {
  __tsan_mutex_pre_lock(mu, 0);
  REAL(_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE)(mu, c);
  Acquired(mu, 0);
}
void REAL(_ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE)(Mutex*, const Condition&);
void WRAP(_ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE)(Mutex* mu, const Condition& c) {
  __tsan_mutex_pre_lock(mu, kRead);
  REAL(_ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE)(mu, c);
  Acquired(mu, kRead);
}
bool REAL(_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE)(
    Mutex*, const Condition&, Duration);
bool WRAP(_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE)(
    Mutex* mu, const Condition& c, Duration d) {
  __tsan_mutex_pre_lock(mu, 0);
  const bool met =
      REAL(_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE)(mu, c, d);
  Acquired(mu, 0);
  return met;
}
bool REAL(_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE)(
    Mutex*, const Condition&, Time);
bool WRAP(_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE)(
    Mutex* mu, const Condition& c, Time t) {
  __tsan_mutex_pre_lock(mu, 0);
  const bool met =
      REAL(_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE)(mu, c, t);
  Acquired(mu, 0);
  return met;
}

// Mutex::Await and its timed forms: called with `mu` held; release it while waiting.
void REAL(_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE)(Mutex*, const Condition&);
void WRAP(_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE)(Mutex* mu, const Condition& c) {
  ReleasedDuring released(mu, 0);
  REAL(_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE)(mu, c);
}
bool REAL(_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE)(
    Mutex*, const Condition&, Duration);
bool WRAP(_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE)(
    Mutex* mu, const Condition& c, Duration d) {
  ReleasedDuring released(mu, 0);
  return REAL(_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE)(mu, c, d);
}
bool REAL(_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE)(Mutex*,
                                                                                 const Condition&,
                                                                                 Time);
bool WRAP(_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE)(Mutex* mu,
                                                                                 const Condition& c,
                                                                                 Time t) {
  ReleasedDuring released(mu, 0);
  return REAL(_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE)(mu, c, t);
}

// Mutex::~Mutex: forget the lock's history before the memory is reused.
void REAL(_ZN4absl7debian35MutexD1Ev)(Mutex*);
void WRAP(_ZN4absl7debian35MutexD1Ev)(Mutex* mu) {
  __tsan_mutex_destroy(mu, 0);
  REAL(_ZN4absl7debian35MutexD1Ev)(mu);
}
void REAL(_ZN4absl7debian35MutexD2Ev)(Mutex*);
void WRAP(_ZN4absl7debian35MutexD2Ev)(Mutex* mu) {
  __tsan_mutex_destroy(mu, 0);
  REAL(_ZN4absl7debian35MutexD2Ev)(mu);
}

// CondVar::Wait and its timed forms release `mu` while waiting.
void REAL(_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE)(CondVar*, Mutex*);
void WRAP(_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE)(CondVar* cv, Mutex* mu) {
  ReleasedDuring released(mu, 0);
  REAL(_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE)(cv, mu);
}
bool REAL(_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE)(CondVar*, Mutex*,
                                                                                Duration);
bool WRAP(_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE)(CondVar* cv,
                                                                                Mutex* mu,
                                                                                Duration d) {
  ReleasedDuring released(mu, 0);
  return REAL(_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE)(cv, mu, d);
}
bool REAL(_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE)(CondVar*, Mutex*,
                                                                             Time);
bool WRAP(_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE)(CondVar* cv, Mutex* mu,
                                                                             Time t) {
  ReleasedDuring released(mu, 0);
  return REAL(_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE)(cv, mu, t);
}

// Notification: Notify releases, a wait that saw the notification acquires.
void REAL(_ZN4absl7debian312Notification6NotifyEv)(Notification*);
void WRAP(_ZN4absl7debian312Notification6NotifyEv)(Notification* n) {
  __tsan_release(n);
  REAL(_ZN4absl7debian312Notification6NotifyEv)(n);
}
void REAL(_ZNK4absl7debian312Notification19WaitForNotificationEv)(const Notification*);
void WRAP(_ZNK4absl7debian312Notification19WaitForNotificationEv)(const Notification* n) {
  REAL(_ZNK4absl7debian312Notification19WaitForNotificationEv)(n);
  __tsan_acquire(const_cast<Notification*>(n));
}
bool REAL(_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE)(
    const Notification*, Duration);
bool WRAP(_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE)(
    const Notification* n, Duration d) {
  const bool notified =
      REAL(_ZNK4absl7debian312Notification30WaitForNotificationWithTimeoutENS0_8DurationE)(n, d);
  if (notified) __tsan_acquire(const_cast<Notification*>(n));
  return notified;
}
bool REAL(_ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE)(
    const Notification*, Time);
bool WRAP(_ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE)(
    const Notification* n, Time t) {
  const bool notified =
      REAL(_ZNK4absl7debian312Notification31WaitForNotificationWithDeadlineENS0_4TimeE)(n, t);
  if (notified) __tsan_acquire(const_cast<Notification*>(n));
  return notified;
}

}  // extern "C"
