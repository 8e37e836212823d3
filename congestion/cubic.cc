#include "congestion/cubic.h"

#include <algorithm>
#include <cmath>

namespace longhaul::congestion {

Cubic::Cubic(const CubicParams& params)
    : params_(params), cwnd_(params.initial_cwnd_packets * params.mss) {}

void Cubic::OnPacketSent(Timestamp now, uint64_t packet_number, ByteCount bytes,
                         ByteCount bytes_in_flight, bool is_retransmittable) {
  if (!is_retransmittable) return;
  largest_sent_ = packet_number;
  inflight_ = bytes_in_flight + bytes;
}

Bandwidth Cubic::pacing_rate() const {
  if (srtt_.IsInfinite()) return Bandwidth::Zero();  // Unpaced until the first RTT sample.
  const double gain =
      cwnd_ < ssthresh_ ? params_.slow_start_pacing_gain : params_.avoidance_pacing_gain;
  return Bandwidth::FromBytesAndTimeDelta(cwnd_, srtt_) * gain;
}

// RFC 9438 §4.2: W_cubic(t) = C * (t - K)^3 + W_max, in segments.
double Cubic::WCubicSegments(TimeDelta t) const {
  const double x = t.ToSecondsF() - k_seconds_;
  return params_.c * x * x * x + w_max_;
}

void Cubic::OnCongestion(Timestamp now) {
  const double mss = static_cast<double>(params_.mss);
  const double cwnd_seg = static_cast<double>(cwnd_) / mss;
  // RFC 9438 §4.7: fast convergence releases bandwidth to newer flows.
  if (params_.fast_convergence && cwnd_seg < w_max_) {
    w_max_ = cwnd_seg * (1.0 + params_.beta) / 2.0;
  } else {
    w_max_ = cwnd_seg;
  }
  // RFC 9438 §4.6: multiplicative decrease.
  const ByteCount min_cwnd = params_.min_cwnd_packets * params_.mss;
  ssthresh_ = std::max(static_cast<ByteCount>(static_cast<double>(cwnd_) * params_.beta), min_cwnd);
  cwnd_ = ssthresh_;
  cwnd_epoch_ = static_cast<double>(cwnd_) / mss;
  w_est_ = cwnd_epoch_;
  k_seconds_ = std::cbrt(std::max(0.0, w_max_ - cwnd_epoch_) / params_.c);
  epoch_start_ = now;
  epoch_started_ = true;
}

void Cubic::GrowInAvoidance(Timestamp now, ByteCount acked_bytes) {
  const double mss = static_cast<double>(params_.mss);
  if (!epoch_started_) {
    // First avoidance epoch after slow start without loss (RFC 9438 §4.2: W_max = cwnd).
    epoch_start_ = now;
    epoch_started_ = true;
    w_max_ = static_cast<double>(cwnd_) / mss;
    cwnd_epoch_ = w_max_;
    w_est_ = cwnd_epoch_;
    k_seconds_ = 0;
  }
  const double cwnd_seg = static_cast<double>(cwnd_) / mss;
  const double acked_seg = static_cast<double>(acked_bytes) / mss;
  const TimeDelta t = now - epoch_start_;
  // RFC 9438 §4.3: Reno-friendly estimate.
  const double alpha = 3.0 * (1.0 - params_.beta) / (1.0 + params_.beta);
  w_est_ += alpha * acked_seg / cwnd_seg;
  const double w_cubic_now = WCubicSegments(t);
  double new_cwnd_seg;
  if (w_cubic_now < w_est_) {
    new_cwnd_seg = std::max(cwnd_seg, w_est_);
  } else {
    // RFC 9438 §4.4/§4.5: aim for W_cubic one RTT ahead, clamped to [cwnd, 1.5 cwnd].
    const TimeDelta rtt = srtt_.IsInfinite() ? TimeDelta::Milliseconds(100) : srtt_;
    const double target = std::clamp(WCubicSegments(t + rtt), cwnd_seg, 1.5 * cwnd_seg);
    new_cwnd_seg = cwnd_seg + (target - cwnd_seg) / cwnd_seg * acked_seg;
  }
  cwnd_ = std::max(cwnd_, static_cast<ByteCount>(new_cwnd_seg * mss));
}

void Cubic::OnCongestionEvent(Timestamp now, ByteCount prior_in_flight,
                              absl::Span<const AckedPacket> acked,
                              absl::Span<const LostPacket> lost) {
  ByteCount acked_bytes = 0;
  ByteCount lost_bytes = 0;
  uint64_t largest_acked = 0;
  TimeDelta latest_rtt = TimeDelta::Infinite();
  for (const AckedPacket& a : acked) {
    acked_bytes += a.bytes;
    if (a.packet_number >= largest_acked) {
      largest_acked = a.packet_number;
      const TimeDelta rtt = now - a.sent_time;
      latest_rtt = rtt;
      min_rtt_ = std::min(min_rtt_, rtt);
      srtt_ = srtt_.IsInfinite() ? rtt : srtt_ * 0.875 + rtt * 0.125;
    }
  }
  for (const LostPacket& l : lost) lost_bytes += l.bytes;
  const ByteCount gone = acked_bytes + lost_bytes;
  inflight_ = prior_in_flight > gone ? prior_in_flight - gone : 0;

  if (in_recovery_ && !acked.empty() && largest_acked > recovery_end_) in_recovery_ = false;
  if (!lost.empty() && !in_recovery_) {
    // One reduction per round trip of loss: the window ends with the largest packet sent now.
    in_recovery_ = true;
    recovery_end_ = largest_sent_;
    OnCongestion(now);
    return;
  }
  if (in_recovery_ || acked_bytes == 0) return;
  if (cwnd_ < ssthresh_) {
    cwnd_ += acked_bytes;  // Slow start.
    if (params_.hystart && !latest_rtt.IsInfinite()) HyStartOnAck(latest_rtt, largest_acked);
    return;
  }
  GrowInAvoidance(now, acked_bytes);
}

// RFC 9406 §4.2 (HyStart++ delay increase), as Linux CUBIC's HyStart uses it: leave slow start
// when this round's minimum RTT rose by an eighth of the last round's (clamped to 4-16 ms).
void Cubic::HyStartOnAck(TimeDelta rtt, uint64_t largest_acked) {
  if (largest_acked >= hystart_round_end_) {
    hystart_round_end_ = largest_sent_ + 1;
    hystart_last_round_min_rtt_ = hystart_round_min_rtt_;
    hystart_round_min_rtt_ = TimeDelta::Infinite();
    hystart_samples_ = 0;
  }
  if (hystart_samples_ < params_.hystart_rtt_samples) {
    hystart_round_min_rtt_ = std::min(hystart_round_min_rtt_, rtt);
    ++hystart_samples_;
  }
  if (hystart_samples_ < params_.hystart_rtt_samples || hystart_last_round_min_rtt_.IsInfinite()) {
    return;
  }
  const TimeDelta thresh = std::clamp(hystart_last_round_min_rtt_ * 0.125,
                                      TimeDelta::Milliseconds(4), TimeDelta::Milliseconds(16));
  if (hystart_round_min_rtt_ >= hystart_last_round_min_rtt_ + thresh) ssthresh_ = cwnd_;
}

ControllerState Cubic::DebugState() const {
  ControllerState s;
  s.state = cwnd_ < ssthresh_ ? "SlowStart" : (in_recovery_ ? "Recovery" : "CongestionAvoidance");
  s.min_rtt = min_rtt_;
  s.cwnd = cwnd_;
  s.pacing_rate = pacing_rate();
  s.ssthresh = ssthresh_;
  s.bytes_in_flight = inflight_;
  return s;
}

std::unique_ptr<Controller> CreateCubic(const CubicParams& params) {
  return std::make_unique<Cubic>(params);
}

}  // namespace longhaul::congestion
