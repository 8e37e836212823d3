// Pacer: turns a controller's pacing rate and send quantum into earliest departure times.
//
// The transport asks EarliestDeparture() before each packet and may send it at or after that time;
// it then calls OnPacketSent(). A whole send quantum may leave back to back; the next quantum is
// due quantum_bytes / rate after the previous one was due. After idle, no credit is carried beyond
// one quantum, so an idle sender does not burst.
//
// Not thread-safe: a udp flow's pacer is used by that flow's I/O thread only.
#ifndef LONGHAUL_CONGESTION_PACER_H_
#define LONGHAUL_CONGESTION_PACER_H_

#include "common/units.h"

namespace longhaul::congestion {

class Pacer {
 public:
  Pacer() = default;

  // The earliest time the next packet may leave.
  Timestamp EarliestDeparture() const { return burst_bytes_ > 0 ? Timestamp::Zero() : next_; }
  bool CanSend(Timestamp now) const { return burst_bytes_ > 0 || now >= next_; }

  // Records a packet of `bytes` sent at `now`, paced at `rate` in bursts of `quantum` bytes.
  void OnPacketSent(Timestamp now, ByteCount bytes, Bandwidth rate, ByteCount quantum);

 private:
  Timestamp next_;             // When the next quantum may start.
  ByteCount burst_bytes_ = 0;  // Bytes sent in the current quantum.
};

}  // namespace longhaul::congestion

#endif  // LONGHAUL_CONGESTION_PACER_H_
