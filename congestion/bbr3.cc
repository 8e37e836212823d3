// Bbr3 (draft-ietf-ccwg-bbr-06): its events, the path model, Startup, Drain
// and ProbeRTT, the control parameters and the helpers they share. The
// ProbeBW state machine and its long-term model are in bbr3_probe_bw.cc.
#include "congestion/bbr3.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "common/check.h"

namespace longhaul::congestion {

namespace {
// Whether `lost` of `total` bytes is some loss and more than `rate` of them (rate 0: any loss).
bool LostMoreThan(ByteCount lost, ByteCount total, double rate) {
  return lost > 0 && static_cast<double>(lost) > static_cast<double>(total) * rate;
}
}  // namespace

Bbr3::Bbr3(const Bbr3Params& params, Random& random, Timestamp now)
    : params_(params),
      random_(random),
      now_(now),
      // The filters keep a sample while now - sample_time <= window, so a filter over the last N
      // cycles (or rounds), the current one included, has window N - 1.
      max_bw_filter_(params.max_bw_filter_len - 1, Bandwidth::Zero(), 0),
      extra_acked_filter_(params.extra_acked_filter_len - 1, 0, 0) {
  // foreign_lossy_rounds_ holds 32 rounds.
  LONGHAUL_CHECK(params.standing_queue_foreign_window_rounds > 0 &&
                 params.standing_queue_foreign_window_rounds < 32)
      << "standing_queue_foreign_window_rounds must be within [1, 31]";
  // draft-ietf-ccwg-bbr-06, "Initialization" (BBROnInit).
  cwnd_ = InitialCwnd();
  min_rtt_stamp_ = now;
  probe_rtt_min_stamp_ = now;
  extra_acked_interval_start_ = now;
  cycle_stamp_ = now;
  this_round_start_time_ = now;
  ResetShortTermModel();
  // BBRInitPacingRate: no SRTT yet, so assume 1 ms.
  const Bandwidth nominal =
      Bandwidth::FromBytesAndTimeDelta(InitialCwnd(), TimeDelta::Milliseconds(1));
  pacing_rate_ = nominal * params_.startup_pacing_gain;
  EnterStartup();
  SetSendQuantum();
}

std::string_view Bbr3::ModeName(Mode mode) {
  switch (mode) {
    case Mode::kStartup:
      return "Startup";
    case Mode::kDrain:
      return "Drain";
    case Mode::kProbeBwDown:
      return "ProbeBW_DOWN";
    case Mode::kProbeBwCruise:
      return "ProbeBW_CRUISE";
    case Mode::kProbeBwRefill:
      return "ProbeBW_REFILL";
    case Mode::kProbeBwUp:
      return "ProbeBW_UP";
    case Mode::kProbeRtt:
      return "ProbeRTT";
  }
  return "?";
}

ControllerState Bbr3::DebugState() const {
  ControllerState s;
  s.state = ModeName(mode_);
  s.max_bw = max_bw_;
  s.bw_shortterm = bw_shortterm_;
  s.bw = bw_;
  s.min_rtt = min_rtt_;
  s.inflight_longterm = inflight_longterm_;
  s.inflight_shortterm = inflight_shortterm_;
  s.cwnd = cwnd_;
  s.pacing_rate = pacing_rate_;
  s.pacing_gain = pacing_gain_;
  s.cwnd_gain = cwnd_gain_;
  s.round_count = round_count_;
  s.full_bw_reached = full_bw_reached_;
  s.bytes_in_flight = inflight_;
  s.probe_rtt_entries = probe_rtt_entries_;
  s.loss_tolerant = competing_standing_queue_;
  return s;
}

// ---------------------------------------------------------------------------------------------
// Events.

void Bbr3::OnPacketSent(Timestamp now, uint64_t packet_number, ByteCount bytes,
                        ByteCount bytes_in_flight, bool is_retransmittable) {
  if (!is_retransmittable) return;
  now_ = now;
  // draft-ietf-ccwg-bbr-06, "Restarting From Idle" (BBRHandleRestartFromIdle).
  if (bytes_in_flight == 0 && sampler_.is_app_limited()) {
    idle_restart_ = true;
    extra_acked_interval_start_ = now;
    if (IsInProbeBwState())
      SetPacingRateWithGain(1.0);
    else if (mode_ == Mode::kProbeRtt)
      CheckProbeRttDone();
  }
  sampler_.OnPacketSent(now, packet_number, bytes, bytes_in_flight);
  largest_sent_pn_ = packet_number;
  inflight_ = bytes_in_flight + bytes;
  if (inflight_ + params_.mss > cwnd_) cwnd_limited_this_round_ = true;
}

void Bbr3::ForgetPacket(uint64_t packet_number, ByteCount bytes) {
  if (sampler_.Forget(packet_number)) inflight_ -= std::min(inflight_, bytes);
}

void Bbr3::OnAppLimited() { sampler_.OnAppLimited(inflight_); }

void Bbr3::OnCongestionEvent(Timestamp now, ByteCount prior_in_flight,
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
    if (!sampler_.OnPacketLost(l.packet_number, &snap)) continue;
    lost_bytes += l.bytes;
    // Count discontiguous runs of loss (draft: loss events, for BBRCheckStartupHighLoss).
    if (!has_last_lost_pn_ || l.packet_number != last_lost_pn_ + 1) ++loss_events_in_round_;
    last_lost_pn_ = l.packet_number;
    has_last_lost_pn_ = true;
    HandleLostPacket(snap);
  }
  rs_ = sampler_.GenerateRateSample(now);
  const ByteCount gone = acked_bytes + lost_bytes;
  inflight_ = prior_in_flight > gone ? prior_in_flight - gone : 0;

  // Loss recovery bookkeeping (draft "Modulating cwnd in Loss Recovery").
  if (lost_bytes > 0 && !in_recovery_ && IsCongestiveLoss(rs_.lost, rs_.tx_in_flight)) {
    in_recovery_ = true;
    recovery_end_pn_ = largest_sent_pn_;
    SaveCwnd();
    cwnd_ = inflight_ + acked_bytes;
    packet_conservation_ = true;
    recovery_round_end_delivered_ = sampler_.delivered() + inflight_;
  } else if (in_recovery_ && !acked.empty() && largest_acked > recovery_end_pn_) {
    in_recovery_ = false;
    packet_conservation_ = false;
    RestoreCwnd();
  }
  if (packet_conservation_ && sampler_.delivered() >= recovery_round_end_delivered_) {
    packet_conservation_ = false;  // Conservation lasts one round trip.
  }

  // draft-ietf-ccwg-bbr-06, "Per-ACK Steps" (BBRUpdateModelAndState).
  UpdateLatestDeliverySignals();
  UpdateCongestionSignals();
  UpdateAckAggregation();
  CheckFullBwReached();
  CheckStartupDone();
  CheckDrain();
  UpdateProbeBwCyclePhase();
  UpdateMinRtt();
  CheckProbeRtt();
  AdvanceLatestDeliverySignals();
  BoundBwForModel();
  // BBRUpdateControlParameters.
  SetPacingRateWithGain(pacing_gain_);
  SetSendQuantum();
  SetCwnd();
}

// ---------------------------------------------------------------------------------------------
// Path model.

// draft-ietf-ccwg-bbr-06, "Tracking Packet-Timed Round Trips" (BBRUpdateRound).
void Bbr3::UpdateRound() {
  round_start_ = false;
  this_round_min_rtt_ = std::min(this_round_min_rtt_, rs_.rtt);
  if (rs_.newly_acked == 0) return;
  if (rs_.prior_delivered >= next_round_delivered_) {
    const TimeDelta round_time = now_ - this_round_start_time_;
    last_round_delivery_rate_ =
        round_time > TimeDelta::Zero()
            ? Bandwidth::FromBytesAndTimeDelta(sampler_.delivered() - this_round_start_delivered_,
                                               round_time)
            : Bandwidth::Zero();
    last_round_min_rtt_ = this_round_min_rtt_;
    CountStandingQueueRound();
    this_round_min_rtt_ = TimeDelta::Infinite();
    this_round_start_time_ = now_;
    this_round_start_delivered_ = sampler_.delivered();
    StartRound();
    ++round_count_;
    ++rounds_since_bw_probe_;
    round_start_ = true;
    // C.is_cwnd_limited covers the round that just ended and the one in progress.
    cwnd_limited_last_round_ = cwnd_limited_this_round_;
    cwnd_limited_this_round_ = false;
  }
}

void Bbr3::StartRound() { next_round_delivered_ = sampler_.delivered(); }

// draft-ietf-ccwg-bbr-06, "BBR.max_bw Max Filter" (BBRUpdateMaxBw).
void Bbr3::UpdateMaxBw() {
  UpdateRound();
  if (rs_.valid && (rs_.delivery_rate >= max_bw_ || !rs_.is_app_limited)) {
    Bandwidth sample = rs_.delivery_rate;
    // A longhaul deviation (Bbr3Params::max_bw_grows_only_when_probing).
    if (params_.max_bw_grows_only_when_probing && !IsProbingBw() && !max_bw_.IsZero()) {
      sample = std::min(sample, max_bw_);
    }
    max_bw_filter_.Update(sample, cycle_count_);
    max_bw_ = max_bw_filter_.GetBest();
  }
}

// draft-ietf-ccwg-bbr-06, "Updating the Model Upon Packet Loss" (BBRUpdateLatestDeliverySignals).
void Bbr3::UpdateLatestDeliverySignals() {
  loss_round_start_ = false;
  if (rs_.valid) bw_latest_ = std::max(bw_latest_, rs_.delivery_rate);
  inflight_latest_ = std::max(inflight_latest_, rs_.delivered);
  if (rs_.newly_acked > 0 && rs_.prior_delivered >= loss_round_delivered_) {
    loss_round_delivered_ = sampler_.delivered();
    loss_round_start_ = true;
  }
}

void Bbr3::AdvanceLatestDeliverySignals() {
  if (loss_round_start_) {
    bw_latest_ = rs_.valid ? rs_.delivery_rate : Bandwidth::Zero();
    inflight_latest_ = rs_.delivered;
  }
}

// draft-ietf-ccwg-bbr-06, BBRUpdateCongestionSignals.
// With random_loss_tolerance > 0 (a longhaul deviation, see Bbr3Params), a round's loss counts
// only if its loss rate exceeds the tolerance.
void Bbr3::UpdateCongestionSignals() {
  UpdateMaxBw();
  round_acked_ += rs_.newly_acked;
  round_lost_ += rs_.newly_lost;
  round_min_rtt_ = std::min(round_min_rtt_, rs_.rtt);
  if (!loss_round_start_) return;
  const ByteCount round_total = round_acked_ + round_lost_;
  const double loss_rate = round_total == 0 ? 0.0
                                            : static_cast<double>(round_lost_) /
                                                  static_cast<double>(round_total);
  const bool queue_in_round = !min_rtt_.IsInfinite() && !round_min_rtt_.IsInfinite() &&
                              round_min_rtt_ > min_rtt_ * params_.standing_queue_rtt_factor;
  // Only in CRUISE: in DOWN the queue is usually the one our own ProbeBW_UP just built.
  const bool standing_queue = mode_ == Mode::kProbeBwCruise && queue_in_round;
  bool full_sample = false;
  const bool congestive_rate = IsCongestiveRound(round_lost_, round_total, &full_sample);
  last_loss_round_surely_congestive_ =
      params_.random_loss_tolerance <= 0 || (congestive_rate && full_sample);
  UpdateCompetingStandingQueue(queue_in_round, round_lost_, round_total);
  if (competing_standing_queue_) {
    loss_in_round_ = IsCongestiveLoss(round_lost_, round_total);  // Above the tolerance.
  } else {
    loss_in_round_ = round_lost_ > 0 && (standing_queue || congestive_rate);
  }
  // What the path delivered over the whole round: unlike bw_latest (a max over per-packet
  // samples), it has no samples whose interval straddles a drop in the path's rate.
  const TimeDelta round_time = now_ - loss_round_start_time_;
  const Bandwidth round_rate = round_time > TimeDelta::Zero()
                                   ? Bandwidth::FromBytesAndTimeDelta(round_acked_, round_time)
                                   : Bandwidth::Zero();
  loss_round_start_time_ = now_;
  round_acked_ = 0;
  round_lost_ = 0;
  round_min_rtt_ = TimeDelta::Infinite();
  // In a standing queue, a flow squeezed by a competitor holds about RTT / min_rtt BDPs at its
  // delivered rate; one on a path that shrank holds far more
  // (Bbr3Params::heavy_loss_min_inflight_bdp).
  const bool path_shrink_plausible =
      params_.heavy_loss_min_inflight_bdp <= 0 || !queue_in_round ||
      static_cast<double>(inflight_) >
          params_.heavy_loss_min_inflight_bdp * static_cast<double>(BdpMultiple(round_rate, 1.0));
  const bool heavy =
      params_.heavy_loss_rate > 0 && loss_rate >= params_.heavy_loss_rate && path_shrink_plausible;
  const bool path_shrank = heavy && HandleHeavyLoss(std::min(bw_latest_, round_rate));
  AdaptLowerBoundsFromCongestion();
  loss_in_round_ = false;
  loss_noted_in_round_ = false;
  // After AdaptLowerBoundsFromCongestion, which needs this round's bw_latest. From ProbeRTT, drain
  // once it ends (ExitProbeRtt) rather than cruise into the queue the old estimate built.
  if (path_shrank && mode_ == Mode::kProbeBwCruise) StartProbeBwDown();
  if (path_shrank && mode_ == Mode::kProbeRtt) drain_after_probe_rtt_ = true;
}

// Bbr3Params::standing_queue_loss_tolerance: once per loss round, decides whether the flow is in
// someone else's standing queue (competing_standing_queue_).
// A round counts as lossy only above random loss (random_loss_tolerance; why: bbr3.h).
void Bbr3::UpdateCompetingStandingQueue(bool queue_in_round, ByteCount lost, ByteCount total) {
  if (params_.standing_queue_loss_tolerance <= 0) return;
  // The rounds of the flow's own probes, of the DOWN that drains them, and of its ProbeRTT say
  // nothing about the competitor's queue (a BBRv1 competitor often drains in the same 200 ms as
  // this flow's ProbeRTT): they neither add to nor end a run of queue-free rounds, nor count
  // towards standing_queue_foreign_lossy_rounds.
  const bool own_doing = IsProbingBw() || mode_ == Mode::kProbeRtt;
  const bool competitors_round = !own_doing && mode_ != Mode::kProbeBwDown;
  if (competitors_round) {
    queue_free_time_ =
        queue_in_round ? TimeDelta::Zero() : queue_free_time_ + (now_ - loss_round_start_time_);
  }
  const bool settled =
      competing_standing_queue_ && now_ - competing_since_ >= params_.competing_flag_settle_time;
  const bool lossy_round =
      queue_in_round && LostMoreThan(lost, total, params_.random_loss_tolerance);
  // Bbr3Params::competing_flag_settle_time: a settled flag keeps its lossy rounds through a gap.
  if (queue_in_round || !settled) {
    lossy_queued_rounds_ = (lossy_queued_rounds_ << 1) | lossy_round;
  }
  if (competitors_round) foreign_lossy_rounds_ = (foreign_lossy_rounds_ << 1) | lossy_round;
  const int lossy = std::popcount(lossy_queued_rounds_ & kLossyQueuedRoundsMask);
  const uint32_t foreign_window_mask =
      (uint32_t{1} << params_.standing_queue_foreign_window_rounds) - 1;
  const bool foreign_loss_recurs = params_.standing_queue_foreign_lossy_rounds > 0 &&
                                   std::popcount(foreign_lossy_rounds_ & foreign_window_mask) >=
                                       params_.standing_queue_foreign_lossy_rounds;
  const bool queue_gone = settled ? queue_free_time_ >= params_.competing_queue_gone_time
                                  : !queue_in_round && !own_doing;
  if (IsInProbeBwState() && !IsProbingBw() && queue_in_round &&
      (lossy >= params_.standing_queue_lossy_rounds || foreign_loss_recurs)) {
    if (!competing_standing_queue_) {
      competing_since_ = now_;
      queue_free_time_ = TimeDelta::Zero();
    }
    competing_standing_queue_ = true;
    competing_queue_in_cycle_ = true;
  } else if (queue_gone || lossy == 0) {
    // The queue stayed away (the competitor left), or the loss stopped.
    competing_standing_queue_ = false;
  }
}

// A longhaul deviation (Bbr3Params::heavy_loss_rate): a round outside bandwidth probing lost at
// least heavy_loss_rate of its data, so the path delivers far less than max_bw. Restarts max_bw
// (and caps bw_shortterm) at `delivered_rate`, what the round actually delivered; returns whether
// it did.
bool Bbr3::HandleHeavyLoss(Bandwidth delivered_rate) {
  if (!full_bw_reached_ || IsProbingBw() || mode_ == Mode::kDrain) return false;
  if (delivered_rate.IsZero() || delivered_rate >= max_bw_) return false;
  // Later samples above it raise max_bw again at once, so an underestimate is short-lived.
  max_bw_filter_.Reset(delivered_rate, cycle_count_);
  max_bw_ = delivered_rate;
  bw_shortterm_ = std::min(bw_shortterm_, delivered_rate);
  bw_latest_ = std::min(bw_latest_, delivered_rate);
  return true;
}

// Whether `lost` of `total` is more than random loss (random_loss_tolerance) or, in someone
// else's standing queue, more than standing_queue_loss_tolerance. Judges recovery entry too.
bool Bbr3::IsCongestiveLoss(ByteCount lost, ByteCount total) const {
  return LostMoreThan(lost, total,
                      competing_standing_queue_ ? params_.standing_queue_loss_tolerance
                                                : params_.random_loss_tolerance);
}

// Records the loss round that just ended and says whether its loss counts as congestion under
// random_loss_tolerance, judged over the newest rounds that carried at least
// random_loss_min_sample_packets (see Bbr3Params). A round without loss never counts.
bool Bbr3::IsCongestiveRound(ByteCount lost, ByteCount total, bool* full_sample) {
  if (loss_history_size_ == kLossHistoryRounds) {
    std::move(loss_history_.begin() + 1, loss_history_.end(), loss_history_.begin());
    --loss_history_size_;
  }
  loss_history_[loss_history_size_++] = RoundLoss{lost, total};
  if (lost == 0) return false;
  const ByteCount min_sample = params_.random_loss_min_sample_packets * params_.mss;
  ByteCount sample_lost = 0;
  ByteCount sample_total = 0;
  for (size_t i = loss_history_size_; i > 0; --i) {
    sample_lost += loss_history_[i - 1].lost;
    sample_total += loss_history_[i - 1].total;
    if (sample_total >= min_sample) break;
  }
  *full_sample = sample_total >= min_sample;
  if (!IsCongestiveLoss(sample_lost, sample_total)) return false;
  loss_history_size_ = 0;
  return true;
}

// draft-ietf-ccwg-bbr-06, "Short-term model" (BBRAdaptLowerBoundsFromCongestion). Once per round
// with loss, outside bandwidth probing, cut bw_shortterm and inflight_shortterm by Beta but never
// below what the last round actually delivered.
void Bbr3::AdaptLowerBoundsFromCongestion() {
  if (IsProbingBw()) return;
  if (loss_in_round_) {
    if (IsInProbeBwState() && !competing_standing_queue_) loss_outside_probe_in_cycle_ = true;
    InitLowerBounds();
    LossLowerBounds();
  }
}

void Bbr3::InitLowerBounds() {
  if (bw_shortterm_.IsInfinite()) bw_shortterm_ = max_bw_;
  if (inflight_shortterm_ == kInfiniteBytes) inflight_shortterm_ = cwnd_;
}

void Bbr3::LossLowerBounds() {
  bw_shortterm_ = std::max(bw_latest_, bw_shortterm_ * params_.beta);
  inflight_shortterm_ = std::max(inflight_latest_, ScaleBytes(inflight_shortterm_, params_.beta));
}

void Bbr3::ResetShortTermModel() {
  bw_shortterm_ = Bandwidth::Infinite();
  inflight_shortterm_ = kInfiniteBytes;
}

void Bbr3::ResetCongestionSignals() {
  loss_in_round_ = false;
  loss_noted_in_round_ = false;
  bw_latest_ = Bandwidth::Zero();
  inflight_latest_ = 0;
}

// With standing_queue_allowance_bytes (a longhaul deviation), a flow cruising in a standing
// queue is held by its cwnd target (BoundCwndForModel), not by bw_shortterm: pacing at max_bw lets
// a flow below its share deliver more, and so raise its target, the next round trip.
void Bbr3::BoundBwForModel() {
  bw_ = IsCruisingInStandingQueue() ? max_bw_ : std::min(max_bw_, bw_shortterm_);
}

// A longhaul deviation (Bbr3Params::standing_queue_allowance_bytes): cruising, and every RTT
// sample of the last round trip was above min_rtt by the standing-queue margin
// (standing_queue_rtt_factor - 1) x min_rtt or by the time the allowance takes at max_bw,
// whichever is less. The second term lets flows with different min_rtt engage at about the same
// queueing delay (a 150 ms flow would otherwise need 37.5 ms of queue, a 20 ms flow 5 ms).
bool Bbr3::IsCruisingInStandingQueue() const {
  if (StandingQueueAllowance() == 0 || mode_ != Mode::kProbeBwCruise || min_rtt_.IsInfinite() ||
      last_round_min_rtt_.IsInfinite() || max_bw_.IsZero()) {
    return false;
  }
  const TimeDelta margin = std::min(min_rtt_ * (params_.standing_queue_rtt_factor - 1.0),
                                    max_bw_.TransferTime(StandingQueueAllowance()));
  return last_round_min_rtt_ > min_rtt_ + margin;
}

// Bbr3Params::loss_based_competitor_shallow_queue_rounds: counts the round that just ended if the
// flow cruised in a standing queue, not beside a loss-blind competitor, as shallow (no deeper
// than shallow_queue_rtt_fraction x min_rtt) or deep.
void Bbr3::CountStandingQueueRound() {
  if (params_.loss_based_competitor_shallow_queue_rounds <= 0 || competing_standing_queue_ ||
      !IsCruisingInStandingQueue()) {
    return;
  }
  if (last_round_min_rtt_ <= min_rtt_ * (1.0 + params_.shallow_queue_rtt_fraction)) {
    ++shallow_queue_rounds_in_cycle_;
  } else {
    ++deep_queue_rounds_in_cycle_;
  }
}

// Bbr3Params::standing_queue_allowance_bytes, or competing_standing_queue_allowance_bytes in a
// loss-blind competitor's queue.
ByteCount Bbr3::StandingQueueAllowance() const {
  if (params_.standing_queue_allowance_bytes == 0) return 0;
  return competing_standing_queue_ ? params_.competing_standing_queue_allowance_bytes
                                   : params_.standing_queue_allowance_bytes;
}

// draft-ietf-ccwg-bbr-06, "BBR.extra_acked" (BBRUpdateACKAggregation): how much more than the
// model's rate the ACKs delivered, to provision cwnd for ACK aggregation.
void Bbr3::UpdateAckAggregation() {
  const TimeDelta interval = now_ - extra_acked_interval_start_;
  ByteCount expected = bw_ * interval;
  if (extra_acked_delivered_ <= expected) {
    extra_acked_delivered_ = 0;
    extra_acked_interval_start_ = now_;
    expected = 0;
  }
  extra_acked_delivered_ += rs_.newly_acked;
  ByteCount extra = extra_acked_delivered_ > expected ? extra_acked_delivered_ - expected : 0;
  extra = std::min(extra, cwnd_);
  extra_acked_filter_.Update(extra, round_count_);
  extra_acked_ = extra_acked_filter_.GetBest();
}

// draft-ietf-ccwg-bbr-06, "Exiting Startup Based on Bandwidth Plateau" (BBRCheckFullBWReached).
// Runs in every state: ProbeBW_UP uses full_bw_now to end a probe.
void Bbr3::CheckFullBwReached() {
  if (full_bw_now_ || !rs_.valid || rs_.is_app_limited) return;
  if (rs_.delivery_rate >= full_bw_ * params_.full_bw_growth) {
    ResetFullBw();
    full_bw_ = rs_.delivery_rate;
    return;
  }
  if (!round_start_) return;
  ++full_bw_count_;
  full_bw_now_ = full_bw_count_ >= params_.full_bw_rounds;
  if (full_bw_now_) full_bw_reached_ = true;
}

void Bbr3::ResetFullBw() {
  full_bw_ = Bandwidth::Zero();
  full_bw_count_ = 0;
  full_bw_now_ = false;
}

// draft-ietf-ccwg-bbr-06, "Exiting Startup Based on Packet Loss" (BBRCheckStartupHighLoss), with
// a longhaul deviation: the round must also be surely congestive (see
// Bbr3Params::random_loss_min_sample_packets).
void Bbr3::CheckStartupHighLoss() {
  if (loss_round_start_) {
    if (mode_ == Mode::kStartup && !full_bw_reached_ &&
        loss_events_in_round_ >= params_.startup_full_loss_count &&
        IsInflightTooHigh(rs_.lost, rs_.tx_in_flight) && last_loss_round_surely_congestive_) {
      full_bw_reached_ = true;
      inflight_longterm_ = std::max(BdpMultiple(max_bw_, 1.0), inflight_latest_);
    }
    loss_events_in_round_ = 0;
  }
}

void Bbr3::CheckStartupDone() {
  CheckStartupHighLoss();
  if (mode_ == Mode::kStartup && full_bw_reached_) EnterDrain();
}

// draft-ietf-ccwg-bbr-06, "Drain" (BBRCheckDrainDone): leave once inflight is down to the
// estimated BDP, or after 3 rounds (the bandwidth was overestimated; ProbeBW will age it out).
void Bbr3::CheckDrain() {
  if (mode_ == Mode::kDrain &&
      (inflight_ <= Inflight(bw_, 1.0) || round_count_ > drain_start_round_ + 3)) {
    EnterProbeBw();
  }
}

// draft-ietf-ccwg-bbr-06, "ProbeRTT" (BBRUpdateMinRTT).
void Bbr3::UpdateMinRtt() {
  probe_rtt_expired_ = now_ > probe_rtt_min_stamp_ + params_.probe_rtt_interval;
  if (!rs_.rtt.IsInfinite() && (rs_.rtt < probe_rtt_min_delay_ || probe_rtt_expired_)) {
    probe_rtt_min_delay_ = rs_.rtt;
    probe_rtt_min_stamp_ = now_;
  }
  const bool min_rtt_expired = now_ > min_rtt_stamp_ + params_.min_rtt_filter_len;
  if (probe_rtt_min_delay_ < min_rtt_ || min_rtt_expired) {
    min_rtt_ = probe_rtt_min_delay_;
    min_rtt_stamp_ = probe_rtt_min_stamp_;
  }
}

// draft-ietf-ccwg-bbr-06, BBRCheckProbeRTT.
void Bbr3::CheckProbeRtt() {
  if (mode_ != Mode::kProbeRtt && probe_rtt_expired_ && !idle_restart_) {
    EnterProbeRtt();
    SaveCwnd();
    probe_rtt_done_stamp_ = Timestamp::Zero();
    ack_phase_ = AckPhase::kProbeStopping;
    StartRound();
  }
  if (mode_ == Mode::kProbeRtt) HandleProbeRtt();
  if (rs_.delivered > 0) idle_restart_ = false;
}

void Bbr3::HandleProbeRtt() {
  // Samples taken while inflight is held down say nothing about the path's bandwidth.
  sampler_.OnAppLimited(inflight_);
  if (probe_rtt_done_stamp_ == Timestamp::Zero() && inflight_ <= ProbeRttCwnd()) {
    probe_rtt_done_stamp_ = now_ + params_.probe_rtt_duration;
    probe_rtt_round_done_ = false;
    StartRound();
  } else if (probe_rtt_done_stamp_ != Timestamp::Zero()) {
    if (round_start_) probe_rtt_round_done_ = true;
    if (probe_rtt_round_done_) CheckProbeRttDone();
  }
}

void Bbr3::CheckProbeRttDone() {
  if (probe_rtt_done_stamp_ != Timestamp::Zero() && now_ > probe_rtt_done_stamp_) {
    probe_rtt_min_stamp_ = now_;  // Schedule the next ProbeRTT.
    RestoreCwnd();
    ExitProbeRtt();
  }
}

void Bbr3::ExitProbeRtt() {
  ResetShortTermModel();
  if (full_bw_reached_) {
    StartProbeBwDown();
    if (drain_after_probe_rtt_) {
      drain_after_probe_rtt_ = false;
      return;
    }
    StartProbeBwCruise();
  } else {
    EnterStartup();
  }
}

// ---------------------------------------------------------------------------------------------
// Control parameters.

// draft-ietf-ccwg-bbr-06, "Pacing Rate" (BBRSetPacingRateWithGain).
void Bbr3::SetPacingRateWithGain(double gain) {
  const Bandwidth rate = bw_ * (gain * (1.0 - params_.pacing_margin));
  if (full_bw_reached_ || rate > pacing_rate_) pacing_rate_ = rate;
}

// draft-ietf-ccwg-bbr-06, "Send Quantum" (BBRSetSendQuantum).
void Bbr3::SetSendQuantum() {
  const ByteCount floor =
      pacing_rate_ < params_.one_packet_quantum_below ? params_.mss : 2 * params_.mss;
  const ByteCount quantum =
      std::min(pacing_rate_ * params_.send_quantum_time, params_.max_send_quantum);
  send_quantum_ = std::max(quantum, floor);
}

// draft-ietf-ccwg-bbr-06, "Congestion Window" (BBRSetCwnd).
void Bbr3::SetCwnd() {
  // BBRUpdateMaxInflight.
  const ByteCount inflight_cap = BdpMultiple(bw_, cwnd_gain_) + extra_acked_;
  const ByteCount max_inflight = QuantizationBudget(inflight_cap);
  ModulateCwndForRecovery();
  if (!packet_conservation_) {
    if (full_bw_reached_) {
      cwnd_ = std::min(cwnd_ + rs_.newly_acked, max_inflight);
    } else if (cwnd_ < max_inflight || sampler_.delivered() < InitialCwnd()) {
      cwnd_ = cwnd_ + rs_.newly_acked;
    }
  }
  cwnd_ = std::max(cwnd_, MinPipeCwnd());
  // BBRBoundCwndForProbeRTT.
  if (mode_ == Mode::kProbeRtt) cwnd_ = std::min(cwnd_, ProbeRttCwnd());
  BoundCwndForModel();
}

// draft-ietf-ccwg-bbr-06, "Modulating cwnd in Loss Recovery".
void Bbr3::ModulateCwndForRecovery() {
  if (rs_.newly_lost > 0) {
    cwnd_ = std::max(cwnd_ > rs_.newly_lost ? cwnd_ - rs_.newly_lost : 0, params_.mss);
  }
  if (packet_conservation_) cwnd_ = std::max(cwnd_, inflight_ + rs_.newly_acked);
}

// draft-ietf-ccwg-bbr-06, BBRBoundCwndForModel.
void Bbr3::BoundCwndForModel() {
  ByteCount cap = kInfiniteBytes;
  if (IsInProbeBwState() && mode_ != Mode::kProbeBwCruise) {
    cap = inflight_longterm_;
  } else if (IsCruisingInStandingQueue()) {
    // A longhaul deviation (Bbr3Params::standing_queue_allowance_bytes): the same number of
    // bytes in the shared queue for every flow, whatever its inflight_longterm.
    cap = BdpMultiple(last_round_delivery_rate_, 1.0) + StandingQueueAllowance();
  } else if (mode_ == Mode::kProbeRtt || mode_ == Mode::kProbeBwCruise) {
    cap = InflightWithHeadroom();
  }
  cap = std::min(cap, inflight_shortterm_);
  cap = std::max(cap, MinPipeCwnd());
  cwnd_ = std::min(cwnd_, cap);
}

void Bbr3::SaveCwnd() {
  if (!in_recovery_ && mode_ != Mode::kProbeRtt) {
    prior_cwnd_ = cwnd_;
  } else {
    prior_cwnd_ = std::max(prior_cwnd_, cwnd_);
  }
}

void Bbr3::RestoreCwnd() { cwnd_ = std::max(cwnd_, prior_cwnd_); }

// ---------------------------------------------------------------------------------------------
// State entry.

void Bbr3::EnterStartup() {
  mode_ = Mode::kStartup;
  pacing_gain_ = params_.startup_pacing_gain;
  cwnd_gain_ = params_.startup_cwnd_gain;
}

void Bbr3::EnterDrain() {
  mode_ = Mode::kDrain;
  drain_start_round_ = round_count_;
  pacing_gain_ = params_.drain_pacing_gain;
  cwnd_gain_ = params_.startup_cwnd_gain;
}

void Bbr3::EnterProbeRtt() {
  mode_ = Mode::kProbeRtt;
  pacing_gain_ = 1.0;
  cwnd_gain_ = params_.probe_rtt_cwnd_gain;
  ++probe_rtt_entries_;
}

// ---------------------------------------------------------------------------------------------
// Helpers.

bool Bbr3::IsInProbeBwState() const {
  return mode_ == Mode::kProbeBwDown || mode_ == Mode::kProbeBwCruise ||
         mode_ == Mode::kProbeBwRefill || mode_ == Mode::kProbeBwUp;
}

bool Bbr3::IsProbingBw() const {
  return mode_ == Mode::kStartup || mode_ == Mode::kProbeBwRefill || mode_ == Mode::kProbeBwUp;
}

// draft-ietf-ccwg-bbr-06, BBRBDPMultiple.
ByteCount Bbr3::BdpMultiple(Bandwidth bw, double gain) const {
  if (min_rtt_.IsInfinite()) return InitialCwnd();
  return ScaleBytes(bw * min_rtt_, gain);
}

// draft-ietf-ccwg-bbr-06, BBRQuantizationBudget.
ByteCount Bbr3::QuantizationBudget(ByteCount inflight) const {
  inflight = std::max(inflight, 3 * send_quantum_);  // offload budget
  inflight = std::max(inflight, MinPipeCwnd());
  if (mode_ == Mode::kProbeBwUp) inflight += 2 * params_.mss;
  return inflight;
}

ByteCount Bbr3::Inflight(Bandwidth bw, double gain) const {
  return QuantizationBudget(BdpMultiple(bw, gain));
}

// draft-ietf-ccwg-bbr-06, BBRInflightWithHeadroom: leave Headroom of inflight_longterm free so
// other flows can take their share.
ByteCount Bbr3::InflightWithHeadroom() const {
  if (inflight_longterm_ == kInfiniteBytes) return kInfiniteBytes;
  const ByteCount headroom =
      std::max(params_.mss, ScaleBytes(inflight_longterm_, params_.headroom));
  return std::max(inflight_longterm_ > headroom ? inflight_longterm_ - headroom : 0, MinPipeCwnd());
}

ByteCount Bbr3::TargetInflight() const { return std::min(BdpMultiple(bw_, 1.0), cwnd_); }

ByteCount Bbr3::ProbeRttCwnd() const {
  return std::max({BdpMultiple(bw_, params_.probe_rtt_cwnd_gain), MinPipeCwnd(), sender_floor_});
}

std::unique_ptr<Controller> CreateBbr3(const Bbr3Params& params, Random& random, Timestamp now) {
  return std::make_unique<Bbr3>(params, random, now);
}

}  // namespace longhaul::congestion
