#include "congestion/pacer.h"

namespace longhaul::congestion {

void Pacer::OnPacketSent(Timestamp now, ByteCount bytes, Bandwidth rate, ByteCount quantum) {
  if (rate.IsZero() || rate.IsInfinite()) {
    // Unpaced.
    next_ = now;
    burst_bytes_ = 0;
    return;
  }
  if (burst_bytes_ == 0) {
    // A new quantum. If the sender is late by more than one quantum's worth, it was idle or
    // blocked: restart the schedule from now instead of letting it catch up in a burst.
    const TimeDelta quantum_time = rate.TransferTime(quantum);
    if (now > next_ + quantum_time || next_.IsInfinite()) next_ = now;
  }
  burst_bytes_ += bytes;
  if (burst_bytes_ >= quantum) {
    next_ = next_ + rate.TransferTime(burst_bytes_);
    burst_bytes_ = 0;
  }
}

}  // namespace longhaul::congestion
