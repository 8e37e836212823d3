#ifndef LONGHAUL_TESTS_WANEM_LINK_SHAPER_H_
#define LONGHAUL_TESTS_WANEM_LINK_SHAPER_H_

#include <cstdint>
#include <random>

#include "absl/time/time.h"

namespace longhaul::wanem {

// The impairments of one direction of an emulated link.
struct DirectionParams {
  // Bottleneck rate in bits per second; 0 means unlimited (no serialization
  // delay and no queue).
  int64_t rate_bps = 0;
  // One-way propagation delay added after serialization.
  absl::Duration delay = absl::ZeroDuration();
  // Each packet's delay is delay + U(-jitter, +jitter), clamped at zero.
  // Packets are never reordered: a packet leaves no earlier than the one
  // before it.
  absl::Duration jitter = absl::ZeroDuration();
  // Probability in [0, 1] that a packet is lost, independently of the others.
  double loss = 0.0;
  // Drop-tail limit on the bytes waiting for (or in) serialization. Only
  // meaningful with a rate. 0 means no limit.
  int64_t queue_bytes = 0;
};

// Why a packet did not make it through.
enum class Verdict {
  kForward,    // Deliver at `deliver_at`.
  kDropQueue,  // The drop-tail queue was full.
  kDropLoss,   // Lost at random.
  kDropCut,    // The link is cut (black hole).
};

struct Decision {
  Verdict verdict = Verdict::kForward;
  absl::Time deliver_at;  // Only meaningful for kForward.
};

// Decides the fate of each packet offered to one direction of a link: a
// serializing bottleneck of `rate_bps` behind a drop-tail byte queue, then a
// fixed propagation delay with optional jitter, with i.i.d. random loss and a
// cut switch. Loss is applied on arrival (as netem does), so a lost packet
// uses no bottleneck capacity.
//
// Pure and deterministic: time is passed in by the caller (arrival times must
// not decrease) and randomness comes from a generator seeded at construction,
// so the same seed and the same arrivals give the same decisions.
//
// Not thread-safe; owned by one relay thread (or one test).
class LinkShaper {
 public:
  LinkShaper(const DirectionParams& params, uint64_t seed);

  // Offers a packet of `bytes` (the whole IP packet) arriving at `now`.
  Decision Offer(absl::Time now, int64_t bytes);

  // While cut, every offered packet is dropped with kDropCut. The relay also
  // drops packets already in flight when they come due during a cut.
  void set_cut(bool cut) { cut_ = cut; }
  bool cut() const { return cut_; }

  // A loss burst: while `loss` > 0, packets are lost with the larger of it
  // and the configured loss (0 ends the burst). Set at run time, from the
  // same generator, so a seeded run with the same bursts decides the same.
  void set_burst_loss(double loss) { burst_loss_ = loss; }

  // Bytes in the bottleneck queue (including the one in serialization) at
  // `now`, given the packets offered so far.
  int64_t QueuedBytes(absl::Time now) const;

  const DirectionParams& params() const { return params_; }

 private:
  // A uniform double in [0, 1) from the top 53 bits of the generator, so the
  // sequence does not depend on the standard library's distributions.
  double NextUniform();

  DirectionParams params_;
  std::mt19937_64 rng_;
  bool cut_ = false;
  double burst_loss_ = 0.0;
  // When the bottleneck finishes serializing everything accepted so far.
  absl::Time link_free_at_ = absl::InfinitePast();
  // Sub-nanosecond remainder of serialization times, in units of
  // 1/rate_bps ns, so long runs keep the exact rate.
  int64_t serialization_remainder_ = 0;
  absl::Time last_deliver_at_ = absl::InfinitePast();
};

}  // namespace longhaul::wanem

#endif  // LONGHAUL_TESTS_WANEM_LINK_SHAPER_H_
