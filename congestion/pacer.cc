#include "congestion/pacer.h"

#include <algorithm>

namespace longhaul::congestion {

Timestamp Pacer::NextQuantumDue(Bandwidth rate) const {
  if (last_quantum_bytes_ == 0) return scheduled_;
  if (rate.IsZero() || rate.IsInfinite()) return due_;
  return std::min(scheduled_, due_ + rate.TransferTime(last_quantum_bytes_));
}

void Pacer::OnPacketSent(Timestamp now, ByteCount bytes, Bandwidth rate, ByteCount quantum) {
  if (rate.IsZero() || rate.IsInfinite()) {
    // Unpaced.
    due_ = now;
    scheduled_ = now;
    last_quantum_bytes_ = 0;
    burst_bytes_ = 0;
    return;
  }
  if (burst_bytes_ == 0) {
    // A new quantum. If the sender is late by more than one quantum's worth, it was idle or
    // blocked: restart the schedule from now instead of letting it catch up in a burst.
    Timestamp due = NextQuantumDue(rate);
    const TimeDelta quantum_time = rate.TransferTime(quantum);
    if (now > due + quantum_time || due.IsInfinite()) due = now;
    due_ = due;
    scheduled_ = due;
    last_quantum_bytes_ = 0;
  }
  burst_bytes_ += bytes;
  if (burst_bytes_ >= quantum) {
    last_quantum_bytes_ = burst_bytes_;
    scheduled_ = due_ + rate.TransferTime(burst_bytes_);
    burst_bytes_ = 0;
  }
}

}  // namespace longhaul::congestion
