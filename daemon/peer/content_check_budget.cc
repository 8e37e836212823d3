#include "daemon/peer/content_check_budget.h"

#include <algorithm>

namespace longhaul::peer {

ContentCheckBudget::ContentCheckBudget(uint64_t bytes_per_second, const Clock& clock)
    : bytes_per_second_(bytes_per_second),
      capacity_(static_cast<double>(bytes_per_second) * kBurst.ToSecondsF()),
      clock_(clock) {}

bool ContentCheckBudget::TryTake(const std::string& site, uint64_t bytes) {
  if (bytes_per_second_ == 0) return true;
  const Timestamp now = clock_.Now();
  absl::MutexLock lock(&mu_);
  auto [it, fresh] = buckets_.try_emplace(site, Bucket{capacity_, now});
  Bucket& bucket = it->second;
  if (!fresh) {
    const double refill = (now - bucket.last_refill).ToSecondsF() * bytes_per_second_;
    bucket.tokens = std::min(capacity_, bucket.tokens + refill);
    bucket.last_refill = now;
  }
  if (static_cast<double>(bytes) > bucket.tokens) return false;
  bucket.tokens -= static_cast<double>(bytes);
  return true;
}

}  // namespace longhaul::peer
