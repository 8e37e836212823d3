#include "tests/wanem/link_shaper.h"

#include <algorithm>

namespace longhaul::wanem {

LinkShaper::LinkShaper(const DirectionParams& params, uint64_t seed)
    : params_(params), rng_(seed) {}

double LinkShaper::NextUniform() { return static_cast<double>(rng_() >> 11) * 0x1.0p-53; }

int64_t LinkShaper::QueuedBytes(absl::Time now) const {
  if (params_.rate_bps <= 0 || link_free_at_ <= now) return 0;
  const int64_t backlog_ns = absl::ToInt64Nanoseconds(link_free_at_ - now);
  // bytes = ns * rate / 8e9, without overflow for any sane rate and backlog.
  return static_cast<int64_t>(static_cast<__int128>(backlog_ns) * params_.rate_bps / 8'000'000'000);
}

Decision LinkShaper::Offer(absl::Time now, int64_t bytes) {
  Decision d;
  if (cut_) {
    d.verdict = Verdict::kDropCut;
    return d;
  }
  const double loss = std::max(params_.loss, burst_loss_);
  if (loss > 0 && NextUniform() < loss) {
    d.verdict = Verdict::kDropLoss;
    return d;
  }
  absl::Time sent_at = now;
  if (params_.rate_bps > 0) {
    if (params_.queue_bytes > 0 && QueuedBytes(now) + bytes > params_.queue_bytes) {
      d.verdict = Verdict::kDropQueue;
      return d;
    }
    if (link_free_at_ < now) {
      link_free_at_ = now;
      serialization_remainder_ = 0;
    }
    const int64_t numerator = bytes * 8 * 1'000'000'000 + serialization_remainder_;
    serialization_remainder_ = numerator % params_.rate_bps;
    link_free_at_ += absl::Nanoseconds(numerator / params_.rate_bps);
    sent_at = link_free_at_;
  }
  absl::Duration delay = params_.delay;
  if (params_.jitter > absl::ZeroDuration()) {
    delay += params_.jitter * (2 * NextUniform() - 1);
    delay = std::max(delay, absl::ZeroDuration());
  }
  d.deliver_at = std::max(sent_at + delay, last_deliver_at_);
  last_deliver_at_ = d.deliver_at;
  return d;
}

}  // namespace longhaul::wanem
