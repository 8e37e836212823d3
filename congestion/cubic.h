// Cubic: CUBIC congestion control (RFC 9438) behind the Controller interface.
//
// Slow start, then the cubic window growth of RFC 9438 §4.2 with the Reno-friendly region
// (§4.3), fast convergence (§4.7) and multiplicative decrease by beta = 0.7 (§4.6), at most once
// per round trip of loss. It paces at 2x cwnd/srtt in slow start and 1.2x in congestion
// avoidance so a sender does not burst a whole window; that pacing is not part of RFC 9438.
// It is here as a loss-based control for comparisons and to prove the Controller seam is real.
//
// Not thread-safe: its caller serializes every call (the udp transport holds
// the flow's controller mutex).
#ifndef LONGHAUL_CONGESTION_CUBIC_H_
#define LONGHAUL_CONGESTION_CUBIC_H_

#include <memory>

#include "congestion/controller.h"

namespace longhaul::congestion {

struct CubicParams {
  ByteCount mss = kDefaultMss;
  ByteCount initial_cwnd_packets = 10;
  ByteCount min_cwnd_packets = 2;
  double c = 0.4;     // RFC 9438 §5: C.
  double beta = 0.7;  // RFC 9438 §4.6: beta_cubic.
  bool fast_convergence = true;
  double slow_start_pacing_gain = 2.0;
  double avoidance_pacing_gain = 1.2;
  // HyStart's delay-increase exit from slow start (RFC 9406 §4.2, without its Conservative Slow
  // Start; Linux CUBIC's default, `hystart`): a round whose lowest of its first
  // hystart_rtt_samples RTT samples is above the previous round's lowest by
  // clamp(that / 8, 4 ms, 16 ms) ends slow start (ssthresh = cwnd). Off by default: the
  // simulator's older scenarios were measured without it.
  bool hystart = false;
  int hystart_rtt_samples = 8;
};

class Cubic final : public Controller {
 public:
  explicit Cubic(const CubicParams& params);

  void OnPacketSent(Timestamp now, uint64_t packet_number, ByteCount bytes,
                    ByteCount bytes_in_flight, bool is_retransmittable) override;
  void OnCongestionEvent(Timestamp now, ByteCount prior_in_flight,
                         absl::Span<const AckedPacket> acked,
                         absl::Span<const LostPacket> lost) override;
  void OnAppLimited() override {}

  ByteCount cwnd() const override { return cwnd_; }
  Bandwidth pacing_rate() const override;
  ByteCount send_quantum() const override { return 2 * params_.mss; }
  ControllerState DebugState() const override;

 private:
  void OnCongestion(Timestamp now);
  void HyStartOnAck(TimeDelta rtt, uint64_t largest_acked);
  void GrowInAvoidance(Timestamp now, ByteCount acked_bytes);
  double WCubicSegments(TimeDelta t) const;

  const CubicParams params_;
  ByteCount cwnd_;
  ByteCount ssthresh_ = ~ByteCount{0};
  double w_max_ = 0;       // Segments.
  double w_est_ = 0;       // Segments.
  double cwnd_epoch_ = 0;  // Segments.
  double k_seconds_ = 0;
  Timestamp epoch_start_;
  bool epoch_started_ = false;
  uint64_t largest_sent_ = 0;
  uint64_t recovery_end_ = 0;
  bool in_recovery_ = false;
  TimeDelta srtt_ = TimeDelta::Infinite();
  TimeDelta min_rtt_ = TimeDelta::Infinite();
  ByteCount inflight_ = 0;
  // HyStart rounds: a round ends when a packet sent after the previous round ended is acked.
  uint64_t hystart_round_end_ = 0;
  TimeDelta hystart_last_round_min_rtt_ = TimeDelta::Infinite();
  TimeDelta hystart_round_min_rtt_ = TimeDelta::Infinite();
  int hystart_samples_ = 0;
};

std::unique_ptr<Controller> CreateCubic(const CubicParams& params);

}  // namespace longhaul::congestion

#endif  // LONGHAUL_CONGESTION_CUBIC_H_
