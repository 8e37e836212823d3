// Bbr3's ProbeBW state machine (draft-ietf-ccwg-bbr-06, "ProbeBW"): the DOWN,
// CRUISE, REFILL and UP phases, when each one starts and ends, and the
// long-term model (inflight_longterm) that a probe adapts when it ends and
// when it meets loss.
#include <algorithm>
#include <cmath>

#include "congestion/bbr3.h"

namespace longhaul::congestion {

// draft-ietf-ccwg-bbr-06, "ProbeBW Algorithm Details" (BBRUpdateProbeBWCyclePhase).
void Bbr3::UpdateProbeBwCyclePhase() {
  if (!full_bw_reached_) return;
  AdaptLongTermModel();
  if (!IsInProbeBwState()) return;
  switch (mode_) {
    case Mode::kProbeBwDown:
      if (IsTimeToProbeBw()) return;
      if (IsTimeToCruise()) StartProbeBwCruise();
      break;
    case Mode::kProbeBwCruise:
      if (IsTimeToProbeBw()) return;
      break;
    case Mode::kProbeBwRefill:
      // One round of REFILL, then probe.
      if (round_start_) {
        bw_probe_samples_ = true;
        StartProbeBwUp();
      }
      break;
    case Mode::kProbeBwUp:
      if (IsTimeToGoDown()) StartProbeBwDown();
      break;
    default:
      break;
  }
}

// draft-ietf-ccwg-bbr-06, "Long-term model" (BBRAdaptLongTermModel): advance the max_bw cycle
// at the end of each probe, and raise inflight_longterm while the loss rate stays under
// LossThresh.
void Bbr3::AdaptLongTermModel() {
  if (ack_phase_ == AckPhase::kProbeStarting && round_start_) {
    ack_phase_ = AckPhase::kProbeFeedback;  // Samples from the probe start arriving.
  }
  if (ack_phase_ == AckPhase::kProbeStopping && round_start_) {
    // End of the samples from the probe. Now is the best time to forget the previous cycle's
    // bandwidth samples: age the max_bw filter by one cycle.
    bw_probe_samples_ = false;
    ack_phase_ = AckPhase::kInit;
    if (IsInProbeBwState() && !rs_.is_app_limited) ++cycle_count_;
  }
  if (!CheckInflightTooHigh()) {
    if (inflight_longterm_ == kInfiniteBytes) return;
    if (rs_.tx_in_flight > inflight_longterm_) inflight_longterm_ = rs_.tx_in_flight;
    if (mode_ == Mode::kProbeBwUp) ProbeInflightLongtermUpward();
  }
}

bool Bbr3::CheckInflightTooHigh() {
  if (IsInflightTooHigh(rs_.lost, rs_.tx_in_flight)) {
    if (bw_probe_samples_) HandleInflightTooHigh(rs_.is_app_limited, rs_.tx_in_flight);
    return true;
  }
  return false;
}

// draft-ietf-ccwg-bbr-06, IsInflightTooHigh: the loss rate over the sampled flight exceeds
// LossThresh (2 %).
bool Bbr3::IsInflightTooHigh(ByteCount lost, ByteCount tx_in_flight) const {
  return static_cast<double>(lost) > static_cast<double>(tx_in_flight) * LossThreshold();
}

// LossThresh, or Bbr3Params::standing_queue_loss_tolerance in someone else's standing queue.
double Bbr3::LossThreshold() const {
  return competing_standing_queue_ ? params_.standing_queue_loss_tolerance : params_.loss_threshold;
}

void Bbr3::HandleInflightTooHigh(bool is_app_limited, ByteCount tx_in_flight) {
  bw_probe_samples_ = false;
  if (!is_app_limited) {
    inflight_longterm_ = std::max(tx_in_flight, ScaleBytes(TargetInflight(), params_.beta));
  }
  if (mode_ == Mode::kProbeBwUp) StartProbeBwDown();
}

// draft-ietf-ccwg-bbr-06, "Probing for Bandwidth In ProbeBW" (BBRNoteLoss): the first loss of a
// round restarts the loss round, so the round that ends with the next loss_round_start measures
// a full round trip of delivery (bw_latest, inflight_latest) after the loss was seen.
void Bbr3::NoteLoss() {
  if (!loss_noted_in_round_) {
    loss_round_delivered_ = sampler_.delivered();
    loss_round_start_time_ = now_;
    round_acked_ = 0;
    round_lost_ = 0;
    round_min_rtt_ = TimeDelta::Infinite();
  }
  loss_noted_in_round_ = true;
}

// draft-ietf-ccwg-bbr-06, BBRHandleLostPacket and BBRInflightAtLoss: on a loss during a probe,
// estimate the inflight at which the loss rate crossed LossThresh.
void Bbr3::HandleLostPacket(const LostPacketSnapshot& p) {
  NoteLoss();
  if (!bw_probe_samples_) return;
  if (!IsInflightTooHigh(p.lost, p.tx_in_flight)) return;
  const double inflight_prev = static_cast<double>(p.tx_in_flight) - static_cast<double>(p.size);
  const double lost_prev = static_cast<double>(p.lost) - static_cast<double>(p.size);
  const double lost_prefix =
      (LossThreshold() * inflight_prev - lost_prev) / (1.0 - LossThreshold());
  const double at_loss = std::max(0.0, inflight_prev + lost_prefix);
  HandleInflightTooHigh(p.is_app_limited, static_cast<ByteCount>(at_loss));
}

// draft-ietf-ccwg-bbr-06, BBRRaiseInflightLongtermSlope: grow inflight_longterm by 1, 2, 4, ...
// packets per round while probing up.
void Bbr3::RaiseInflightLongtermSlope() {
  const ByteCount growth_packets = ByteCount{1} << bw_probe_up_rounds_;
  bw_probe_up_rounds_ = std::min(bw_probe_up_rounds_ + 1, params_.max_probe_up_rounds);
  const ByteCount cwnd_packets = cwnd_ / params_.mss;
  probe_up_cnt_ = std::max<ByteCount>(cwnd_packets / growth_packets, 1) * params_.mss;
}

// draft-ietf-ccwg-bbr-06, BBRProbeInflightLongtermUpward.
void Bbr3::ProbeInflightLongtermUpward() {
  if (!IsCwndLimited() || cwnd_ < inflight_longterm_) return;
  bw_probe_up_acks_ += rs_.newly_acked;
  if (bw_probe_up_acks_ >= probe_up_cnt_) {
    const ByteCount delta = bw_probe_up_acks_ / probe_up_cnt_;
    bw_probe_up_acks_ -= delta * probe_up_cnt_;
    inflight_longterm_ += delta * params_.mss;
  }
  if (round_start_) RaiseInflightLongtermSlope();
}

// draft-ietf-ccwg-bbr-06, BBRIsTimeToProbeBW.
bool Bbr3::IsTimeToProbeBw() {
  if (waits_for_loss_based_competitor_ && !competing_standing_queue_) {
    // A longhaul deviation (Bbr3Params::loss_based_competitor_cubic_c): neither the draft's
    // 2-3 s nor its Reno rounds, but CUBIC's epoch.
    if (!IsLossBasedCompetitorWaitOver()) return false;
    StartProbeBwRefill();
    return true;
  }
  if (HasElapsedInPhase(bw_probe_wait_) || IsRenoCoexistenceProbeTime() ||
      IsCompetitorCadenceProbeTime()) {
    StartProbeBwRefill();
    return true;
  }
  return false;
}

// draft-ietf-ccwg-bbr-06, BBRIsRenoCoexistenceProbeTime: probe at least as often as a Reno flow
// with the same BDP would regrow its window (capped at 63 rounds).
bool Bbr3::IsRenoCoexistenceProbeTime() const {
  const uint64_t reno_rounds = TargetInflight() / params_.mss;
  const uint64_t rounds = std::min<uint64_t>(reno_rounds, params_.max_probe_rounds_reno);
  return rounds_since_bw_probe_ >= rounds;
}

// A longhaul deviation (Bbr3Params::competing_probe_rounds): beside a loss-blind competitor,
// probe as often as it does.
bool Bbr3::IsCompetitorCadenceProbeTime() const {
  return FollowsCompetitorCadence() &&
         rounds_since_bw_probe_ >= static_cast<uint64_t>(params_.competing_probe_rounds);
}

// Bbr3Params::competing_probe_rounds applies: the flow is in someone else's standing queue.
bool Bbr3::FollowsCompetitorCadence() const {
  return competing_standing_queue_ && params_.competing_probe_rounds > 0;
}

// Bbr3Params::loss_based_competitor_cubic_c: CUBIC's epoch (plus the draft's random part of
// bw_probe_wait, which desynchronises flows) has passed since the last probe began, and at least
// bw_probe_wait since this cycle began. Timed from the last probe rather than from the cycle,
// which each ProbeRTT restarts: beside a flow that keeps a queue standing, min_rtt expires and
// ProbeRTT comes every 5 s, sooner than K.
bool Bbr3::IsLossBasedCompetitorWaitOver() const {
  const TimeDelta random_part = bw_probe_wait_ - params_.probe_bw_wait_base;
  const TimeDelta epochs = waits_two_cubic_epochs_ ? CubicEpoch() * 2 : CubicEpoch();
  return HasElapsedInPhase(bw_probe_wait_) && now_ > last_probe_start_ + epochs + random_part;
}

// RFC 9438's K = cbrt(W_max x (1 - beta_cubic) / C) for a window of one BDP at max_bw.
TimeDelta Bbr3::CubicEpoch() const {
  const double bdp_packets =
      static_cast<double>(BdpMultiple(max_bw_, 1.0)) / static_cast<double>(params_.mss);
  constexpr double kCubicBeta = 0.7;
  return TimeDelta::SecondsF(
      std::cbrt(bdp_packets * (1.0 - kCubicBeta) / params_.loss_based_competitor_cubic_c));
}

// draft-ietf-ccwg-bbr-06, BBRPickProbeWait: randomised so competing flows desynchronise.
void Bbr3::PickProbeWait() {
  rounds_since_bw_probe_ = random_.UniformInt(0, 1);
  bw_probe_wait_ = params_.probe_bw_wait_base + params_.probe_bw_wait_rand * random_.NextDouble();
}

// draft-ietf-ccwg-bbr-06, BBRIsTimeToCruise. The draft's ProbeBW_DOWN text ("C.inflight is less
// than or equal to BBR.bdp"), its test case A.8 ("BBRInflight(1.0)") and Linux TCP BBRv3 compare
// with the BDP at BBR.bw; the pseudocode's Inflight(BBR.max_bw, 1.0) would end DOWN before the
// queue built on a stale max_bw drains.
bool Bbr3::IsTimeToCruise() const {
  // A longhaul deviation (Bbr3Params::competing_probe_rounds): the standing queue is someone
  // else's, so there is nothing of ours to drain after one round.
  if (FollowsCompetitorCadence() && round_count_ > probe_bw_down_start_round_) return true;
  if (inflight_ > InflightWithHeadroom()) return false;
  return inflight_ <= Inflight(bw_, 1.0);
}

// draft-ietf-ccwg-bbr-06, BBRIsTimeToGoDown.
bool Bbr3::IsTimeToGoDown() {
  if (IsCwndLimited() && cwnd_ >= inflight_longterm_) {
    // Limited by inflight_longterm, not by the path: restart the plateau detection.
    ResetFullBw();
    full_bw_ = rs_.delivery_rate;
  } else if (full_bw_now_) {
    return true;
  }
  return false;
}

void Bbr3::EnterProbeBw() {
  last_probe_start_ = now_;
  cwnd_gain_ = params_.default_cwnd_gain;
  StartProbeBwDown();
}

void Bbr3::StartProbeBwDown() {
  ResetCongestionSignals();
  probe_up_cnt_ = kInfiniteBytes;
  PickProbeWait();
  cycle_stamp_ = now_;
  ack_phase_ = AckPhase::kProbeStopping;
  StartRound();
  probe_bw_down_start_round_ = round_count_;
  mode_ = Mode::kProbeBwDown;
  pacing_gain_ = params_.probe_bw_down_pacing_gain;
  cwnd_gain_ = params_.default_cwnd_gain;
}

void Bbr3::StartProbeBwCruise() {
  mode_ = Mode::kProbeBwCruise;
  pacing_gain_ = params_.probe_bw_cruise_pacing_gain;
  cwnd_gain_ = params_.default_cwnd_gain;
}

void Bbr3::StartProbeBwRefill() {
  // A longhaul deviation (Bbr3Params::loss_based_competitor_cubic_c): the cycle that ends here
  // decides the next one's wait. A cycle that met the loss-blind competitor keeps the draft's.
  // Bbr3Params::loss_based_competitor_shallow_queue_rounds: or a smaller CUBIC flow's shallow
  // queue, which asks for two epochs. A CUBIC flow that won the start keeps the queue deep, and
  // shallow only for a while after each of its losses.
  // CountStandingQueueRound counts nothing with the rule off, so the majority is never met.
  const bool smaller_competitor =
      shallow_queue_rounds_in_cycle_ >= params_.loss_based_competitor_shallow_queue_rounds &&
      shallow_queue_rounds_in_cycle_ > deep_queue_rounds_in_cycle_;
  waits_for_loss_based_competitor_ = params_.loss_based_competitor_cubic_c > 0 &&
                                     (loss_outside_probe_in_cycle_ || smaller_competitor) &&
                                     !competing_queue_in_cycle_ && !competing_standing_queue_;
  waits_two_cubic_epochs_ = waits_for_loss_based_competitor_ && smaller_competitor;
  shallow_queue_rounds_in_cycle_ = 0;
  deep_queue_rounds_in_cycle_ = 0;
  loss_outside_probe_in_cycle_ = false;
  competing_queue_in_cycle_ = false;
  last_probe_start_ = now_;
  ResetShortTermModel();
  bw_probe_up_rounds_ = 0;
  bw_probe_up_acks_ = 0;
  ack_phase_ = AckPhase::kRefilling;
  StartRound();
  mode_ = Mode::kProbeBwRefill;
  pacing_gain_ = params_.probe_bw_refill_pacing_gain;
  cwnd_gain_ = params_.default_cwnd_gain;
}

void Bbr3::StartProbeBwUp() {
  ack_phase_ = AckPhase::kProbeStarting;
  StartRound();
  ResetFullBw();
  full_bw_ = rs_.valid ? rs_.delivery_rate : Bandwidth::Zero();
  mode_ = Mode::kProbeBwUp;
  // A longhaul deviation (Bbr3Params::competing_probe_up_pacing_gain).
  pacing_gain_ = competing_standing_queue_ ? params_.competing_probe_up_pacing_gain
                                           : params_.probe_bw_up_pacing_gain;
  cwnd_gain_ = params_.probe_bw_up_cwnd_gain;
  RaiseInflightLongtermSlope();
}

}  // namespace longhaul::congestion
