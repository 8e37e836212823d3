// Pacer: turns a controller's pacing rate and send quantum into earliest departure times.
//
// The transport asks CanSend() / EarliestDeparture() before each packet and may send it at or after
// that time; it then calls OnPacketSent(). A whole send quantum may leave back to back; the next
// quantum is due quantum_bytes / rate after the previous one was due. After idle, no credit is
// carried beyond one quantum, so an idle sender does not burst.
//
// The gap after a quantum is timed at the rate the quantum was sent at, or at the rate given
// when the departure time is asked for if that is sooner. A rate that collapses for a moment (a
// model that restarts its bandwidth estimate after a round of heavy loss) and recovers, e.g. on
// the ACKs of that very quantum, then does not hold the sender back for the minutes the collapsed
// rate would take, when nothing is in flight to fail the flow or wake it. A rate that falls does
// not lengthen a gap already scheduled.
//
// Not thread-safe: a udp flow's pacer is used by that flow's I/O thread only.
#ifndef LONGHAUL_CONGESTION_PACER_H_
#define LONGHAUL_CONGESTION_PACER_H_

#include "common/units.h"

namespace longhaul::congestion {

class Pacer {
 public:
  Pacer() = default;

  // The earliest time the next packet may leave at pacing rate `rate` (zero or infinite:
  // unpaced).
  Timestamp EarliestDeparture(Bandwidth rate) const {
    return burst_bytes_ > 0 ? Timestamp::Zero() : NextQuantumDue(rate);
  }
  bool CanSend(Timestamp now, Bandwidth rate) const {
    return burst_bytes_ > 0 || now >= NextQuantumDue(rate);
  }

  // Records a packet of `bytes` sent at `now`, paced at `rate` in bursts of `quantum` bytes.
  void OnPacketSent(Timestamp now, ByteCount bytes, Bandwidth rate, ByteCount quantum);

 private:
  Timestamp NextQuantumDue(Bandwidth rate) const;

  Timestamp due_;                     // When the last (or current) quantum was due.
  Timestamp scheduled_;               // When the next is due at the rate the last was sent at.
  ByteCount last_quantum_bytes_ = 0;  // Bytes of the last completed quantum; 0: none yet.
  ByteCount burst_bytes_ = 0;         // Bytes sent in the current quantum.
};

}  // namespace longhaul::congestion

#endif  // LONGHAUL_CONGESTION_PACER_H_
