// Controller: the congestion-control seam between a transport and an algorithm.
//
// A transport (one UDP flow, or a simulator) reports every packet it sends and, for every ACK it
// processes, the packets that ACK newly acknowledged and the packets its loss detection newly
// declared lost, together in one OnCongestionEvent(). It then asks the controller how much it may
// have in flight (cwnd), how fast to send (pacing_rate) and how large a burst may leave at once
// (send_quantum). The transport does its own loss detection and retransmission; a retransmission
// is a new packet with a new packet number.
//
// Packet numbers passed to one Controller must increase strictly with each OnPacketSent.
// Time and randomness are injected: a Controller never reads a clock.
//
// Implementations: bbr3.h (CreateBbr3), cubic.h (CreateCubic), aggregate_controller.h (flows of
// one shared BBRv3 model).
//
// Not thread-safe: its caller serializes every call (the udp transport holds
// the flow's controller mutex).
#ifndef LONGHAUL_CONGESTION_CONTROLLER_H_
#define LONGHAUL_CONGESTION_CONTROLLER_H_

#include <cstdint>
#include <string_view>

#include "absl/types/span.h"
#include "common/units.h"

namespace longhaul::congestion {

// The default maximum segment size: payload bytes of a full-sized packet.
inline constexpr ByteCount kDefaultMss = 1500;

struct AckedPacket {
  uint64_t packet_number = 0;
  ByteCount bytes = 0;
  Timestamp sent_time;  // When the packet was sent (controllers may derive RTT from it).
};

struct LostPacket {
  uint64_t packet_number = 0;
  ByteCount bytes = 0;
};

// A snapshot of a controller's model, for logs, metrics and tests. Fields that an algorithm does
// not have are left at their defaults (Bandwidth::Zero(), TimeDelta::Infinite(), ~0 bytes).
struct ControllerState {
  std::string_view state = "";  // e.g. "Startup", "ProbeBW_UP", "CongestionAvoidance". Static.
  Bandwidth max_bw;
  Bandwidth bw_shortterm = Bandwidth::Infinite();
  Bandwidth bw;  // The bandwidth the model uses: min(max_bw, bw_shortterm) for BBR.
  TimeDelta min_rtt = TimeDelta::Infinite();
  ByteCount inflight_longterm = ~ByteCount{0};
  ByteCount inflight_shortterm = ~ByteCount{0};
  ByteCount cwnd = 0;
  Bandwidth pacing_rate;
  double pacing_gain = 1.0;
  double cwnd_gain = 1.0;
  uint64_t round_count = 0;
  bool full_bw_reached = false;
  ByteCount bytes_in_flight = 0;
  ByteCount ssthresh = ~ByteCount{0};
  uint64_t probe_rtt_entries = 0;  // How many times ProbeRTT was entered.
  // Bbr3: the flow is in someone else's standing queue, so loss counts only above
  // Bbr3Params::standing_queue_loss_tolerance (a loss-blind competitor keeps the queue full).
  bool loss_tolerant = false;
};

class Controller {
 public:
  virtual ~Controller() = default;

  // A packet of `bytes` left at `now`. `bytes_in_flight` is what was in flight before it.
  // Packets that are not retransmittable (pure ACKs) are not counted in flight and may be
  // ignored by the controller.
  virtual void OnPacketSent(Timestamp now, uint64_t packet_number, ByteCount bytes,
                            ByteCount bytes_in_flight, bool is_retransmittable) = 0;

  // One ACK was processed at `now`: `acked` lists the packets it newly acknowledged and `lost`
  // those newly declared lost, both in increasing packet-number order. `prior_in_flight` is what
  // was in flight before the ACK. Spans are only read during the call.
  virtual void OnCongestionEvent(Timestamp now, ByteCount prior_in_flight,
                                 absl::Span<const AckedPacket> acked,
                                 absl::Span<const LostPacket> lost) = 0;

  // The sender has nothing to send although cwnd and pacing would allow it. Samples taken until
  // the current flight is delivered will not raise the bandwidth estimate.
  virtual void OnAppLimited() = 0;

  // Bytes that may be in flight.
  virtual ByteCount cwnd() const = 0;
  // The rate to pace at. Never zero once a packet has been acked.
  virtual Bandwidth pacing_rate() const = 0;
  // The largest burst the pacer may release at once.
  virtual ByteCount send_quantum() const = 0;
  virtual ControllerState DebugState() const = 0;
};

}  // namespace longhaul::congestion

#endif  // LONGHAUL_CONGESTION_CONTROLLER_H_
