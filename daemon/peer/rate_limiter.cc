#include "daemon/peer/rate_limiter.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"

namespace longhaul::peer {
namespace {

// The most a blocked Acquire sleeps before it looks at `cancel` again.
constexpr absl::Duration kMaxSleep = absl::Milliseconds(50);

bool IsUnlimited(Bandwidth rate) { return rate.IsZero() || rate.IsInfinite() || rate < Bandwidth::Zero(); }

double BurstBytes(Bandwidth rate) {
  // At least 64 KiB, so a tiny cap still lets a small chunk go whole.
  return std::max<double>(64 << 10, static_cast<double>(rate.BytesIn(RateLimiter::kBurst)));
}

TimeDelta TimeToRepay(double debt_bytes, Bandwidth rate) {
  double seconds = debt_bytes * 8.0 / static_cast<double>(rate.ToBitsPerSecond());
  return std::max(TimeDelta::Microseconds(1), TimeDelta::SecondsF(seconds));
}

}  // namespace

std::string PriorityClassName(v1::PriorityClass priority) {
  switch (priority) {
    case v1::EXCHANGE:
      return "exchange";
    case v1::BACKGROUND:
      return "background";
    default:
      return "checkpoint";
  }
}

absl::StatusOr<v1::PriorityClass> ParsePriorityClass(absl::string_view name) {
  if (name == "exchange") return v1::EXCHANGE;
  if (name == "checkpoint") return v1::CHECKPOINT;
  if (name == "background") return v1::BACKGROUND;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown priority class '", name, "' (exchange, checkpoint or background)"));
}

RateLimiter::RateLimiter(const Clock& clock) : clock_(clock) {}

void RateLimiter::SetLimitLocked(std::map<std::string, Bucket>& buckets, const std::string& key,
                                 Bandwidth rate) {
  if (IsUnlimited(rate)) {
    buckets.erase(key);
  } else {
    const Timestamp now = clock_.Now();
    auto [it, inserted] = buckets.try_emplace(key);
    Bucket& b = it->second;
    if (inserted) {
      b.tokens = BurstBytes(rate);  // a new cap starts with a full bucket
    } else {
      RefillLocked(b, now);  // settle the time spent at the old rate
      b.tokens = std::min(b.tokens, BurstBytes(rate));
    }
    b.rate = rate;
    b.last_refill = now;
  }
  changed_.SignalAll();
}

void RateLimiter::SetPeerLimit(const std::string& site, Bandwidth rate) {
  absl::MutexLock lock(&mu_);
  SetLimitLocked(peers_, site, rate);
}

void RateLimiter::SetClassLimit(v1::PriorityClass priority, Bandwidth rate) {
  absl::MutexLock lock(&mu_);
  SetLimitLocked(classes_, PriorityClassName(priority), rate);
}

std::vector<RateLimiter::Limit> RateLimiter::Limits() const {
  absl::MutexLock lock(&mu_);
  std::vector<Limit> out;
  for (const auto& [site, b] : peers_) out.push_back({site, v1::PRIORITY_UNSPECIFIED, b.rate});
  for (v1::PriorityClass p : {v1::EXCHANGE, v1::CHECKPOINT, v1::BACKGROUND}) {
    auto it = classes_.find(PriorityClassName(p));
    if (it != classes_.end()) out.push_back({"", p, it->second.rate});
  }
  return out;
}

void RateLimiter::RefillLocked(Bucket& bucket, Timestamp now) {
  if (now <= bucket.last_refill) return;
  const TimeDelta elapsed = now - bucket.last_refill;
  const double earned = static_cast<double>(bucket.rate.ToBitsPerSecond()) / 8.0 * elapsed.ToSecondsF();
  bucket.tokens = std::min(BurstBytes(bucket.rate), bucket.tokens + earned);
  bucket.last_refill = now;
}

TimeDelta RateLimiter::TryAcquire(const std::string& site, v1::PriorityClass priority,
                                  ByteCount bytes) {
  absl::MutexLock lock(&mu_);
  const Timestamp now = clock_.Now();
  Bucket* buckets[2] = {nullptr, nullptr};
  if (auto it = peers_.find(site); it != peers_.end()) buckets[0] = &it->second;
  if (auto it = classes_.find(PriorityClassName(priority)); it != classes_.end()) {
    buckets[1] = &it->second;
  }
  TimeDelta wait = TimeDelta::Zero();
  for (Bucket* b : buckets) {
    if (b == nullptr) continue;
    RefillLocked(*b, now);
    if (b->tokens < 0) wait = std::max(wait, TimeToRepay(-b->tokens, b->rate));
  }
  if (!wait.IsZero()) return wait;
  for (Bucket* b : buckets) {
    if (b != nullptr) b->tokens -= static_cast<double>(bytes);
  }
  if (buckets[0] != nullptr) charged_peers_[site] += bytes;
  if (buckets[1] != nullptr) charged_classes_[PriorityClassName(priority)] += bytes;
  return TimeDelta::Zero();
}

ByteCount RateLimiter::ChargedToClass(v1::PriorityClass priority) const {
  absl::MutexLock lock(&mu_);
  auto it = charged_classes_.find(PriorityClassName(priority));
  return it == charged_classes_.end() ? 0 : it->second;
}

ByteCount RateLimiter::ChargedToPeer(const std::string& site) const {
  absl::MutexLock lock(&mu_);
  auto it = charged_peers_.find(site);
  return it == charged_peers_.end() ? 0 : it->second;
}

bool RateLimiter::Acquire(const std::string& site, v1::PriorityClass priority, ByteCount bytes,
                          absl::FunctionRef<bool()> cancelled) {
  while (!cancelled()) {
    TimeDelta wait = TryAcquire(site, priority, bytes);
    if (wait.IsZero()) return true;
    absl::MutexLock lock(&mu_);
    // Wakes early when a cap changes; the loop then asks again.
    changed_.WaitWithTimeout(&mu_, std::min(kMaxSleep, absl::Nanoseconds(wait.ToNanoseconds())));
  }
  return false;
}

}  // namespace longhaul::peer
