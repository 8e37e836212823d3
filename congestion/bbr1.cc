#include "congestion/bbr1.h"

#include <algorithm>

namespace longhaul::congestion {

Bbr1::Bbr1(const Bbr1Params& params, Random& random, Timestamp now)
    : params_(params),
      random_(random),
      now_(now),
      // The filter keeps a sample while now - sample_time <= window: N rounds have window N - 1.
      btl_bw_filter_(params.btl_bw_filter_rounds - 1, Bandwidth::Zero(), 0) {
  // draft-cardwell-iccrg-bbr-congestion-control-00, "Initialization" (BBRInit).
  cwnd_ = InitialCwnd();
  rtprop_stamp_ = now;
  cycle_stamp_ = now;
  // BBRInitPacingRate: no RTT sample yet, so assume 1 ms.
  pacing_rate_ = Bandwidth::FromBytesAndTimeDelta(InitialCwnd(), TimeDelta::Milliseconds(1)) *
                 params_.high_gain;
  EnterStartup();
  SetSendQuantum();
}

std::string_view Bbr1::ModeName(Mode mode) {
  switch (mode) {
    case Mode::kStartup:
      return "Startup";
    case Mode::kDrain:
      return "Drain";
    case Mode::kProbeBw:
      return "ProbeBW";
    case Mode::kProbeRtt:
      return "ProbeRTT";
  }
  return "?";
}

ControllerState Bbr1::DebugState() const {
  ControllerState s;
  s.state = ModeName(mode_);
  s.max_bw = btl_bw_;
  s.bw = btl_bw_;
  s.min_rtt = rtprop_;
  s.cwnd = cwnd_;
  s.pacing_rate = pacing_rate_;
  s.pacing_gain = pacing_gain_;
  s.cwnd_gain = cwnd_gain_;
  s.round_count = round_count_;
  s.full_bw_reached = filled_pipe_;
  s.bytes_in_flight = inflight_;
  s.probe_rtt_entries = probe_rtt_entries_;
  return s;
}

void Bbr1::OnPacketSent(Timestamp now, uint64_t packet_number, ByteCount bytes,
                        ByteCount bytes_in_flight, bool is_retransmittable) {
  if (!is_retransmittable) return;
  now_ = now;
  // "Restarting From Idle": pace at BtlBw, not a probing gain, after an app-limited idle.
  if (bytes_in_flight == 0 && sampler_.is_app_limited()) {
    idle_restart_ = true;
    if (mode_ == Mode::kProbeBw) {
      const Bandwidth rate = btl_bw_ * (1.0 - params_.pacing_margin);
      if (!rate.IsZero()) pacing_rate_ = rate;
    }
  }
  sampler_.OnPacketSent(now, packet_number, bytes, bytes_in_flight);
  largest_sent_pn_ = packet_number;
  inflight_ = bytes_in_flight + bytes;
}

void Bbr1::OnAppLimited() { sampler_.OnAppLimited(inflight_); }

void Bbr1::OnCongestionEvent(Timestamp now, ByteCount prior_in_flight,
                             absl::Span<const AckedPacket> acked,
                             absl::Span<const LostPacket> lost) {
  now_ = now;
  ByteCount acked_bytes = 0;
  ByteCount lost_bytes = 0;
  uint64_t largest_acked = 0;
  for (const AckedPacket& a : acked) {
    if (sampler_.OnPacketAcked(now, a.packet_number)) acked_bytes += a.bytes;
    largest_acked = std::max(largest_acked, a.packet_number);
  }
  for (const LostPacket& l : lost) {
    LostPacketSnapshot snap;
    if (sampler_.OnPacketLost(l.packet_number, &snap)) lost_bytes += l.bytes;
  }
  rs_ = sampler_.GenerateRateSample(now);
  const ByteCount gone = acked_bytes + lost_bytes;
  inflight_ = prior_in_flight > gone ? prior_in_flight - gone : 0;

  // "Modulating cwnd in Loss Recovery": the first loss starts a recovery episode that lasts until
  // everything sent before it is acked; its first round trip conserves packets.
  if (lost_bytes > 0 && !in_recovery_) {
    in_recovery_ = true;
    recovery_end_pn_ = largest_sent_pn_;
    SaveCwnd();
    cwnd_ = inflight_ + std::max(acked_bytes, params_.mss);
    packet_conservation_ = true;
    conservation_end_delivered_ = sampler_.delivered() + inflight_;
  } else if (in_recovery_ && !acked.empty() && largest_acked > recovery_end_pn_) {
    in_recovery_ = false;
    packet_conservation_ = false;
    RestoreCwnd();
  }
  if (packet_conservation_ && sampler_.delivered() >= conservation_end_delivered_) {
    packet_conservation_ = false;
  }

  // BBRUpdateModelAndState.
  UpdateBtlBw();
  CheckCyclePhase(prior_in_flight, lost_bytes > 0);
  CheckFullPipe();
  CheckDrain();
  UpdateRtprop();
  CheckProbeRtt();
  // BBRUpdateControlParameters.
  SetPacingRate();
  SetSendQuantum();
  SetCwnd(acked_bytes, lost_bytes);
}

// ---------------------------------------------------------------------------------------------
// Model.

// "Tracking Time for the BBR.BtlBw Max Filter" (BBRUpdateRound).
void Bbr1::UpdateRound() {
  round_start_ = false;
  if (rs_.newly_acked > 0 && rs_.prior_delivered >= next_round_delivered_) {
    next_round_delivered_ = sampler_.delivered();
    ++round_count_;
    round_start_ = true;
  }
}

// BBRUpdateBtlBw: app-limited samples only raise the estimate.
void Bbr1::UpdateBtlBw() {
  UpdateRound();
  if (rs_.valid && (rs_.delivery_rate >= btl_bw_ || !rs_.is_app_limited)) {
    btl_bw_filter_.Update(rs_.delivery_rate, round_count_);
    btl_bw_ = btl_bw_filter_.GetBest();
  }
}

// BBRCheckCyclePhase.
void Bbr1::CheckCyclePhase(ByteCount prior_in_flight, bool lost) {
  if (mode_ == Mode::kProbeBw && IsNextCyclePhase(prior_in_flight, lost)) AdvanceCyclePhase();
}

// BBRIsNextCyclePhase: a phase lasts one RTprop; the probing phase (gain > 1) also until loss or
// inflight reaches gain x BDP; the draining phase (gain < 1) ends early once inflight <= BDP.
bool Bbr1::IsNextCyclePhase(ByteCount prior_in_flight, bool lost) const {
  const bool is_full_length = now_ - cycle_stamp_ > rtprop_;
  if (pacing_gain_ == 1.0) return is_full_length;
  if (pacing_gain_ > 1.0) {
    return is_full_length && (lost || prior_in_flight >= Inflight(pacing_gain_));
  }
  return is_full_length || prior_in_flight <= Inflight(1.0);
}

void Bbr1::AdvanceCyclePhase() {
  cycle_stamp_ = now_;
  cycle_index_ = (cycle_index_ + 1) % params_.pacing_gain_cycle.size();
  pacing_gain_ = params_.pacing_gain_cycle[cycle_index_];
}

// BBRCheckFullPipe: BtlBw grew by less than full_bw_growth for full_bw_rounds rounds.
void Bbr1::CheckFullPipe() {
  if (filled_pipe_ || !round_start_ || rs_.is_app_limited) return;
  if (btl_bw_ >= full_bw_ * params_.full_bw_growth) {
    full_bw_ = btl_bw_;
    full_bw_count_ = 0;
    return;
  }
  ++full_bw_count_;
  if (full_bw_count_ >= params_.full_bw_rounds) filled_pipe_ = true;
}

// BBRCheckDrain.
void Bbr1::CheckDrain() {
  if (mode_ == Mode::kStartup && filled_pipe_) EnterDrain();
  if (mode_ == Mode::kDrain && inflight_ <= Inflight(1.0)) EnterProbeBw();
}

// BBRUpdateRTprop.
void Bbr1::UpdateRtprop() {
  rtprop_expired_ = now_ > rtprop_stamp_ + params_.rtprop_filter_len;
  if (!rs_.rtt.IsInfinite() && (rs_.rtt <= rtprop_ || rtprop_expired_)) {
    rtprop_ = rs_.rtt;
    rtprop_stamp_ = now_;
  }
}

// BBRCheckProbeRTT.
void Bbr1::CheckProbeRtt() {
  if (mode_ != Mode::kProbeRtt && rtprop_expired_ && !idle_restart_) {
    EnterProbeRtt();
    SaveCwnd();
    probe_rtt_done_stamp_ = Timestamp::Zero();
  }
  if (mode_ == Mode::kProbeRtt) HandleProbeRtt();
  if (rs_.delivered > 0) idle_restart_ = false;
}

void Bbr1::HandleProbeRtt() {
  // Samples taken while inflight is held down say nothing about BtlBw.
  sampler_.OnAppLimited(inflight_);
  if (probe_rtt_done_stamp_ == Timestamp::Zero() && inflight_ <= MinPipeCwnd()) {
    probe_rtt_done_stamp_ = now_ + params_.probe_rtt_duration;
    probe_rtt_round_done_ = false;
    next_round_delivered_ = sampler_.delivered();
  } else if (probe_rtt_done_stamp_ != Timestamp::Zero()) {
    if (round_start_) probe_rtt_round_done_ = true;
    if (probe_rtt_round_done_ && now_ > probe_rtt_done_stamp_) {
      rtprop_stamp_ = now_;
      RestoreCwnd();
      ExitProbeRtt();
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Control parameters.

// BBRSetPacingRateWithGain: before the pipe is full, only raise the rate.
void Bbr1::SetPacingRate() {
  const Bandwidth rate = btl_bw_ * (pacing_gain_ * (1.0 - params_.pacing_margin));
  if (rate.IsZero()) return;
  if (filled_pipe_ || rate > pacing_rate_) pacing_rate_ = rate;
}

// BBRSetSendQuantum.
void Bbr1::SetSendQuantum() {
  if (pacing_rate_ < Bandwidth::KbitsPerSecond(1200)) {
    send_quantum_ = params_.mss;
  } else if (pacing_rate_ < Bandwidth::MbitsPerSecond(24)) {
    send_quantum_ = 2 * params_.mss;
  } else {
    send_quantum_ = std::min(pacing_rate_ * params_.send_quantum_time, params_.max_send_quantum);
    send_quantum_ = std::max(send_quantum_, 2 * params_.mss);
  }
}

// BBRSetCwnd with BBRModulateCwndForRecovery and BBRModulateCwndForProbeRTT.
void Bbr1::SetCwnd(ByteCount acked, ByteCount lost) {
  const ByteCount target = Inflight(cwnd_gain_);
  if (lost > 0) cwnd_ = std::max(cwnd_ > lost ? cwnd_ - lost : 0, params_.mss);
  if (packet_conservation_) {
    cwnd_ = std::max(cwnd_, inflight_ + acked);
  } else if (filled_pipe_) {
    cwnd_ = std::min(cwnd_ + acked, target);
  } else if (cwnd_ < target || sampler_.delivered() < InitialCwnd()) {
    cwnd_ += acked;
  }
  cwnd_ = std::max(cwnd_, MinPipeCwnd());
  if (mode_ == Mode::kProbeRtt) cwnd_ = std::min(cwnd_, MinPipeCwnd());
}

void Bbr1::SaveCwnd() {
  prior_cwnd_ = (!in_recovery_ && mode_ != Mode::kProbeRtt) ? cwnd_ : std::max(prior_cwnd_, cwnd_);
}

// ---------------------------------------------------------------------------------------------
// States.

void Bbr1::EnterStartup() {
  mode_ = Mode::kStartup;
  pacing_gain_ = params_.high_gain;
  cwnd_gain_ = params_.high_gain;
}

void Bbr1::EnterDrain() {
  mode_ = Mode::kDrain;
  pacing_gain_ = 1.0 / params_.high_gain;
  cwnd_gain_ = params_.high_gain;
}

// BBREnterProbeBW: start at a random phase other than the draining one (index 1).
void Bbr1::EnterProbeBw() {
  mode_ = Mode::kProbeBw;
  cwnd_gain_ = params_.probe_bw_cwnd_gain;
  const size_t len = params_.pacing_gain_cycle.size();
  cycle_index_ = len - 1 - static_cast<size_t>(random_.UniformInt(0, len - 2));
  AdvanceCyclePhase();
}

void Bbr1::EnterProbeRtt() {
  mode_ = Mode::kProbeRtt;
  pacing_gain_ = 1.0;
  cwnd_gain_ = 1.0;
  ++probe_rtt_entries_;
}

void Bbr1::ExitProbeRtt() {
  if (filled_pipe_) {
    EnterProbeBw();
  } else {
    EnterStartup();
  }
}

// BBRInflight with BBRUpdateTargetCwnd's quantization budget (3 x send quantum).
ByteCount Bbr1::Inflight(double gain) const {
  if (rtprop_.IsInfinite()) return InitialCwnd();
  return ScaleBytes(btl_bw_ * rtprop_, gain) + 3 * send_quantum_;
}

std::unique_ptr<Controller> CreateBbr1(const Bbr1Params& params, Random& random, Timestamp now) {
  return std::make_unique<Bbr1>(params, random, now);
}

}  // namespace longhaul::congestion
