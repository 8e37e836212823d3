// Bbr3: BBR version 3 congestion control, following draft-ietf-ccwg-bbr-06.
//
// The model: max_bw (windowed max of delivery-rate samples over two ProbeBW cycles), min_rtt
// (windowed min over 10 s), the long-term inflight bound inflight_longterm and the short-term
// bounds bw_shortterm / inflight_shortterm that react to loss within a round. States: Startup,
// Drain, ProbeBW (DOWN, CRUISE, REFILL, UP) and ProbeRTT. Every constant lives in Bbr3Params.
//
// Comments cite the draft's section titles (e.g. "ProbeBW_UP") and its pseudocode function names
// (e.g. BBRCheckFullBWReached) so each step can be checked against the text.
//
// Not thread-safe: its caller serializes every call (the udp transport holds
// the flow's controller mutex). Borrows `random`, which must outlive it.
#ifndef LONGHAUL_CONGESTION_BBR3_H_
#define LONGHAUL_CONGESTION_BBR3_H_

#include <array>
#include <cstdint>
#include <memory>

#include "common/units.h"
#include "congestion/controller.h"
#include "congestion/delivery_rate_sampler.h"
#include "congestion/random.h"
#include "congestion/windowed_filter.h"

namespace longhaul::congestion {

// Every constant of draft-ietf-ccwg-bbr-06 in one place. The defaults are the draft's, except the
// fields marked DEVIATION, whose measurements are in congestion/README.md ("Tuning history").
struct Bbr3Params {
  ByteCount mss = kDefaultMss;          // SMSS.
  ByteCount initial_cwnd_packets = 10;  // InitialCwnd, in SMSS.
  ByteCount min_pipe_cwnd_packets = 4;  // MinPipeCwnd, in SMSS.
  double startup_pacing_gain = 2.77;    // 4 * ln(2)
  double startup_cwnd_gain = 2.0;
  double drain_pacing_gain = 0.5;
  double default_cwnd_gain = 2.0;
  double probe_bw_down_pacing_gain = 0.90;
  double probe_bw_cruise_pacing_gain = 1.0;
  double probe_bw_refill_pacing_gain = 1.0;
  double probe_bw_up_pacing_gain = 1.25;
  double probe_bw_up_cwnd_gain = 2.25;
  double loss_threshold = 0.02;  // LossThresh
  // DEVIATION (0 = draft): a round's loss is congestion only above this rate, or in a standing
  // queue during ProbeBW_CRUISE; otherwise random loss ratchets bw_shortterm down every round.
  double random_loss_tolerance = 0.02;
  // The loss rate above is judged over the newest rounds that carried this many packets (0 = each
  // round alone), so a small jumbo-packet round does not exceed it by chance; Startup's loss exit
  // also waits for a full sample.
  ByteCount random_loss_min_sample_packets = 2000;
  // A round whose every RTT sample is above min_rtt by this factor shows a standing queue.
  double standing_queue_rtt_factor = 1.25;
  // DEVIATION (0 = draft): a non-probing round that loses this fraction (1 - Beta) restarts max_bw
  // from what it delivered, so a path that shrank is not overdriven until max_bw ages out.
  double heavy_loss_rate = 0.3;
  // In a standing queue, the restart also needs inflight above this many BDPs (0 = always), so a
  // flow squeezed by a competitor's probe keeps its max_bw while a shrunk path does not.
  double heavy_loss_min_inflight_bdp = 3.0;
  // DEVIATION: while in a loss-blind competitor's standing queue (see standing_queue_lossy_rounds),
  // loss counts as congestion only above this rate, so a BBRv1 flow that keeps the buffer full
  // cannot push this flow's share down round after round (0 = any such loss counts).
  double standing_queue_loss_tolerance = 0.25;
  // The flag above needs this many of the last 8 loss rounds to lose more than
  // random_loss_tolerance in a standing queue: loss that goes on although the flow yields.
  int standing_queue_lossy_rounds = 4;
  // ... or this many of the last standing_queue_foreign_window_rounds loss rounds outside the
  // flow's own probes, the DOWN after them and its ProbeRTT (0 = off). BBRv1 overfills the buffer
  // once per gain cycle (8 of its min_rtt), every fourth or fifth round of a flow that keeps a
  // small allowance in its queue: 2 in 8, never the 4 above, so that flow stayed at about
  // allowance / min_rtt (congestion/README.md). Loss that comes only with probes, the flow's own
  // or (in fair-4) its peers' once every 2-3 s, stays under it.
  int standing_queue_foreign_lossy_rounds = 6;
  int standing_queue_foreign_window_rounds = 24;
  // While in such a queue, ProbeBW_DOWN lasts one round and ProbeBW_UP restarts this many rounds
  // after DOWN began, as BBRv1 probes (0 = the draft's 2-3 s cadence).
  int competing_probe_rounds = 8;
  // ProbeBW_UP's pacing gain while in such a queue (probe_bw_up_pacing_gain = the draft's): the
  // competitor's full buffer shares the link by what each flow sends into it, so a flow left
  // small must probe harder to climb back.
  double competing_probe_up_pacing_gain = 1.5;
  // DEVIATION (0 = draft): cruising in a standing queue, cwnd is the delivered BDP plus this many
  // bytes, so every flow keeps the same queue share and the shares converge (Vegas/FAST alpha).
  // Bytes, not packets, so that flows with MTU 9000 and MTU 1500 hold the same queue.
  ByteCount standing_queue_allowance_bytes = 900 * 1000;
  // The allowance while in a loss-blind competitor's standing queue (see
  // standing_queue_loss_tolerance): that competitor keeps the buffer full, so each flow's share
  // goes by what it keeps there. A BBRv1 flow keeps 2 x its own BDP in flight, one BDP of it
  // queued; on the fairness link (1 Gbit/s, 40 ms, 5 MB of buffer) a flow that keeps its BDP
  // plus this allowance meets it near half of the link (once the flag held, 5.4 MB took up to
  // 0.83 of it in the simulator, 3.6 MB 0.41-0.53; congestion/README.md).
  ByteCount competing_standing_queue_allowance_bytes = 3600 * 1000;
  // Once the flag above has held this long it rides out a queue-free gap shorter than
  // competing_queue_gone_time, and queue-free rounds do not age its loss history: a BBRv1
  // competitor empties the queue in its ProbeRTT every 10 s, for 200 ms and a round trip, and
  // so does this flow's own ProbeRTT. A younger flag ends at the first queue-free round, since a
  // newcomer's Startup can raise a false one for a second or so (the simulator's fair-4).
  TimeDelta competing_flag_settle_time = TimeDelta::Seconds(2);
  TimeDelta competing_queue_gone_time = TimeDelta::Milliseconds(300);
  // DEVIATION (0 = draft): after a ProbeBW cycle whose DOWN or CRUISE lost data to congestion
  // without the loss-blind-competitor flag (a loss-based flow such as CUBIC filled the buffer),
  // the next ProbeBW_UP starts no sooner than CUBIC's epoch K = cbrt(W x (1 - 0.7) / C) seconds
  // (RFC 9438; W = the BDP in MSS-size packets, C = this constant) after the last one began, so
  // the CUBIC flow regrows its window between probes instead of losing it to each one.
  double loss_based_competitor_cubic_c = 0.4;
  // DEVIATION (0 = off): a cycle that cruised this many rounds in a shallow standing queue, and
  // more of them than in a deeper one, also waits, and for two CUBIC epochs (shallow: past the
  // standing-queue margin, at most shallow_queue_rtt_fraction x min_rtt over min_rtt; never
  // beside the loss-blind competitor). That queue is a CUBIC flow smaller than this one: it sees
  // none of this flow's loss, and each probe cuts its window by 30 %, which CUBIC regains after K
  // and grows back past only after 2 K (RFC 9438's W(t) = C (t - K)^3 + W_max). A CUBIC flow that
  // won the start keeps the queue deep, and there the wait above applies (congestion/README.md).
  int loss_based_competitor_shallow_queue_rounds = 2;
  double shallow_queue_rtt_fraction = 0.375;
  // DEVIATION (false = draft): outside Startup, ProbeBW_REFILL and ProbeBW_UP the flow sends at
  // most max_bw, so a higher delivery-rate sample measures a burst of the sender or of the ACKs
  // (a busy host), not the path; it refreshes max_bw but does not raise it.
  bool max_bw_grows_only_when_probing = true;
  double beta = 0.7;                     // Beta: multiplicative decrease of short-term bounds.
  double headroom = 0.15;                // Headroom left for other flows in CRUISE.
  double full_bw_growth = 1.25;          // Full pipe: growth below 25 %...
  int full_bw_rounds = 3;                // ...for 3 rounds.
  int startup_full_loss_count = 6;       // Loss events per round that end Startup.
  uint64_t max_bw_filter_len = 2;        // ProbeBW cycles.
  uint64_t extra_acked_filter_len = 10;  // Rounds.
  TimeDelta min_rtt_filter_len = TimeDelta::Seconds(10);
  TimeDelta probe_rtt_interval = TimeDelta::Seconds(5);
  TimeDelta probe_rtt_duration = TimeDelta::Milliseconds(200);
  double probe_rtt_cwnd_gain = 0.5;
  double pacing_margin = 0.01;                           // Pace 1 % below the estimate.
  TimeDelta probe_bw_wait_base = TimeDelta::Seconds(2);  // bw_probe_wait = 2 s + U[0, 1 s].
  TimeDelta probe_bw_wait_rand = TimeDelta::Seconds(1);
  int max_probe_rounds_reno = 63;  // Cap on Reno-coexistence rounds.
  int max_probe_up_rounds = 30;
  ByteCount max_send_quantum = 64 * 1024;
  TimeDelta send_quantum_time = TimeDelta::Milliseconds(1);
  Bandwidth one_packet_quantum_below = Bandwidth::KbitsPerSecond(1200);
};

class Bbr3 final : public Controller {
 public:
  enum class Mode {
    kStartup,
    kDrain,
    kProbeBwDown,
    kProbeBwCruise,
    kProbeBwRefill,
    kProbeBwUp,
    kProbeRtt
  };

  // `random` picks the ProbeBW wait; it must outlive this controller.
  Bbr3(const Bbr3Params& params, Random& random, Timestamp now);

  void OnPacketSent(Timestamp now, uint64_t packet_number, ByteCount bytes,
                    ByteCount bytes_in_flight, bool is_retransmittable) override;
  void OnCongestionEvent(Timestamp now, ByteCount prior_in_flight,
                         absl::Span<const AckedPacket> acked,
                         absl::Span<const LostPacket> lost) override;
  void OnAppLimited() override;
  // The sender could not send because cwnd was full (for senders, such as the flows of an
  // AggregateController, that stop short of cwnd() in aggregate).
  void OnCwndLimited() { cwnd_limited_this_round_ = true; }
  // Drops a packet from the model without a congestion signal (its flow went away).
  void ForgetPacket(uint64_t packet_number, ByteCount bytes);
  // The least the sender keeps in flight while it has data, whatever cwnd says (the flows of an
  // AggregateController keep two datagrams each). ProbeRTT waits for inflight to come down to
  // its cwnd, so that cwnd is never below this.
  void SetSenderFloor(ByteCount bytes) { sender_floor_ = bytes; }

  ByteCount cwnd() const override { return cwnd_; }
  Bandwidth pacing_rate() const override { return pacing_rate_; }
  ByteCount send_quantum() const override { return send_quantum_; }
  ControllerState DebugState() const override;

  Mode mode() const { return mode_; }
  static std::string_view ModeName(Mode mode);

 private:
  enum class AckPhase { kInit, kProbeStopping, kProbeStarting, kProbeFeedback, kRefilling };
  static constexpr ByteCount kInfiniteBytes = ~ByteCount{0};

  // Per-ACK model and state update (draft: BBRUpdateModelAndState).
  void UpdateRound();
  void UpdateLatestDeliverySignals();
  void UpdateCongestionSignals();
  void UpdateMaxBw();
  void AdaptLowerBoundsFromCongestion();
  void InitLowerBounds();
  void LossLowerBounds();
  void ResetShortTermModel();
  void ResetCongestionSignals();
  void UpdateAckAggregation();
  void CheckFullBwReached();
  void ResetFullBw();
  void CheckStartupDone();
  void CheckStartupHighLoss();
  void CheckDrain();
  void UpdateProbeBwCyclePhase();
  void AdaptLongTermModel();
  bool CheckInflightTooHigh();
  bool IsInflightTooHigh(ByteCount lost, ByteCount tx_in_flight) const;
  double LossThreshold() const;
  bool IsCongestiveLoss(ByteCount lost, ByteCount total) const;
  // `full_sample`: whether the judgement covered random_loss_min_sample_packets.
  bool IsCongestiveRound(ByteCount lost, ByteCount total, bool* full_sample);
  void UpdateCompetingStandingQueue(bool queue_in_round, ByteCount lost, ByteCount total);
  void HandleInflightTooHigh(bool is_app_limited, ByteCount tx_in_flight);
  void NoteLoss();
  void HandleLostPacket(const LostPacketSnapshot& p);
  bool HandleHeavyLoss(Bandwidth delivered_rate);
  void RaiseInflightLongtermSlope();
  void ProbeInflightLongtermUpward();
  bool IsTimeToProbeBw();
  bool IsTimeToCruise() const;
  bool IsTimeToGoDown();
  bool IsRenoCoexistenceProbeTime() const;
  bool IsCompetitorCadenceProbeTime() const;
  bool IsLossBasedCompetitorWaitOver() const;
  TimeDelta CubicEpoch() const;
  bool FollowsCompetitorCadence() const;
  void PickProbeWait();
  void UpdateMinRtt();
  void CheckProbeRtt();
  void HandleProbeRtt();
  void CheckProbeRttDone();
  void ExitProbeRtt();
  void AdvanceLatestDeliverySignals();
  void BoundBwForModel();
  bool IsCruisingInStandingQueue() const;
  void CountStandingQueueRound();
  ByteCount StandingQueueAllowance() const;

  // Control parameters (draft: BBRUpdateControlParameters).
  void SetPacingRateWithGain(double gain);
  void SetSendQuantum();
  void SetCwnd();
  void ModulateCwndForRecovery();
  void BoundCwndForModel();
  void SaveCwnd();
  void RestoreCwnd();

  // State entry.
  void EnterStartup();
  void EnterDrain();
  void EnterProbeBw();
  void StartProbeBwDown();
  void StartProbeBwCruise();
  void StartProbeBwRefill();
  void StartProbeBwUp();
  void EnterProbeRtt();
  void StartRound();

  // Model helpers.
  bool IsInProbeBwState() const;
  bool IsCwndLimited() const { return cwnd_limited_this_round_ || cwnd_limited_last_round_; }
  bool IsProbingBw() const;
  ByteCount BdpMultiple(Bandwidth bw, double gain) const;
  ByteCount QuantizationBudget(ByteCount inflight) const;
  ByteCount Inflight(Bandwidth bw, double gain) const;
  ByteCount InflightWithHeadroom() const;
  ByteCount TargetInflight() const;
  ByteCount ProbeRttCwnd() const;
  ByteCount MinPipeCwnd() const { return params_.min_pipe_cwnd_packets * params_.mss; }
  ByteCount InitialCwnd() const { return params_.initial_cwnd_packets * params_.mss; }
  bool HasElapsedInPhase(TimeDelta interval) const { return now_ > cycle_stamp_ + interval; }

  const Bbr3Params params_;
  Random& random_;
  ByteCount sender_floor_ = 0;  // SetSenderFloor.
  DeliveryRateSampler sampler_;

  // Per-event context.
  Timestamp now_;
  RateSample rs_;
  ByteCount inflight_ = 0;  // C.inflight after the current event.
  bool cwnd_limited_this_round_ = false;
  bool cwnd_limited_last_round_ = false;
  uint64_t largest_sent_pn_ = 0;

  Mode mode_ = Mode::kStartup;
  double pacing_gain_ = 1.0;
  double cwnd_gain_ = 1.0;
  Bandwidth pacing_rate_;
  ByteCount send_quantum_ = 0;
  ByteCount cwnd_ = 0;

  // Path model.
  WindowedMaxFilter<Bandwidth, uint64_t, uint64_t> max_bw_filter_;
  Bandwidth max_bw_;
  Bandwidth bw_shortterm_ = Bandwidth::Infinite();
  Bandwidth bw_;
  Bandwidth bw_latest_;
  ByteCount inflight_latest_ = 0;
  ByteCount inflight_longterm_ = kInfiniteBytes;
  ByteCount inflight_shortterm_ = kInfiniteBytes;
  TimeDelta min_rtt_ = TimeDelta::Infinite();
  Timestamp min_rtt_stamp_;
  TimeDelta probe_rtt_min_delay_ = TimeDelta::Infinite();
  Timestamp probe_rtt_min_stamp_;
  bool probe_rtt_expired_ = false;
  WindowedMaxFilter<ByteCount, uint64_t, uint64_t> extra_acked_filter_;
  Timestamp extra_acked_interval_start_;
  ByteCount extra_acked_delivered_ = 0;
  ByteCount extra_acked_ = 0;

  // Loss rounds' (lost, lost + acked) bytes, newest last, for IsCongestiveRound.
  static constexpr size_t kLossHistoryRounds = 8;
  struct RoundLoss {
    ByteCount lost = 0;
    ByteCount total = 0;
  };
  std::array<RoundLoss, kLossHistoryRounds> loss_history_{};
  size_t loss_history_size_ = 0;

  // Bbr3Params::loss_based_competitor_cubic_c: congestive loss outside probing, and the
  // loss-blind-competitor flag, each seen in the current ProbeBW cycle; whether the cycle that
  // ended last makes this one wait CUBIC's epoch; when the last probe (REFILL) began.
  bool loss_outside_probe_in_cycle_ = false;
  bool competing_queue_in_cycle_ = false;
  bool waits_for_loss_based_competitor_ = false;
  // Bbr3Params::loss_based_competitor_shallow_queue_rounds: the CRUISE rounds of this cycle in a
  // shallow and in a deeper standing queue, and whether the current wait is the two-epoch one.
  int shallow_queue_rounds_in_cycle_ = 0;
  int deep_queue_rounds_in_cycle_ = 0;
  bool waits_two_cubic_epochs_ = false;
  Timestamp last_probe_start_;

  // Rounds.
  uint64_t round_count_ = 0;
  bool round_start_ = false;
  ByteCount next_round_delivered_ = 0;
  // The last complete round trip (for standing_queue_allowance_bytes): its lowest RTT sample and
  // the rate it delivered at.
  Timestamp this_round_start_time_;
  ByteCount this_round_start_delivered_ = 0;
  TimeDelta this_round_min_rtt_ = TimeDelta::Infinite();
  TimeDelta last_round_min_rtt_ = TimeDelta::Infinite();
  // Bbr3Params::standing_queue_loss_tolerance: the flow is in someone else's standing queue,
  // since competing_since_. queue_free_time_: how long the loss rounds outside the flow's probes,
  // the DOWN after them and its ProbeRTT have been queue-free since the last one with a queue.
  bool competing_standing_queue_ = false;
  Timestamp competing_since_;
  TimeDelta queue_free_time_;
  // Bit i: the loss round i rounds back lost data in a standing queue; the low 8 bits count.
  static constexpr uint32_t kLossyQueuedRoundsMask = 0xff;
  uint32_t lossy_queued_rounds_ = 0;
  // The same for the loss rounds outside the flow's own probes, DOWN and ProbeRTT
  // (Bbr3Params::standing_queue_foreign_lossy_rounds); the low window bits count.
  uint32_t foreign_lossy_rounds_ = 0;
  Bandwidth last_round_delivery_rate_;

  // Full pipe.
  Bandwidth full_bw_;
  int full_bw_count_ = 0;
  bool full_bw_now_ = false;
  bool full_bw_reached_ = false;

  // Loss rounds.
  bool loss_in_round_ = false;
  bool loss_noted_in_round_ = false;  // draft: BBR.is_loss_in_round, set by BBRNoteLoss.
  Timestamp loss_round_start_time_;
  bool loss_round_start_ = false;
  ByteCount loss_round_delivered_ = 0;
  int loss_events_in_round_ = 0;
  // Whether the loss round that ended last lost more than random loss, judged over a full
  // sample (IsCongestiveRound): what lets Startup end on loss (see random_loss_min_sample_packets).
  bool last_loss_round_surely_congestive_ = false;
  ByteCount round_acked_ = 0;  // Bytes acked and lost in the current loss round.
  ByteCount round_lost_ = 0;
  TimeDelta round_min_rtt_ = TimeDelta::Infinite();
  uint64_t last_lost_pn_ = 0;
  bool has_last_lost_pn_ = false;

  uint64_t drain_start_round_ = 0;

  // ProbeBW.
  uint64_t cycle_count_ = 0;
  Timestamp cycle_stamp_;
  TimeDelta bw_probe_wait_;
  uint64_t rounds_since_bw_probe_ = 0;
  uint64_t probe_bw_down_start_round_ = 0;  // round_count_ when ProbeBW_DOWN began.
  int bw_probe_up_rounds_ = 0;
  ByteCount bw_probe_up_acks_ = 0;
  ByteCount probe_up_cnt_ = kInfiniteBytes;
  bool bw_probe_samples_ = false;
  AckPhase ack_phase_ = AckPhase::kInit;

  // ProbeRTT.
  Timestamp probe_rtt_done_stamp_;
  bool probe_rtt_round_done_ = false;
  bool idle_restart_ = false;
  uint64_t probe_rtt_entries_ = 0;
  bool drain_after_probe_rtt_ = false;

  // Recovery (packet conservation on the first round of loss).
  ByteCount prior_cwnd_ = 0;
  bool in_recovery_ = false;
  bool packet_conservation_ = false;
  uint64_t recovery_end_pn_ = 0;
  ByteCount recovery_round_end_delivered_ = 0;
};

// A BBRv3 controller with `params`, drawing randomness from `random` (which must outlive it).
std::unique_ptr<Controller> CreateBbr3(const Bbr3Params& params, Random& random, Timestamp now);

}  // namespace longhaul::congestion

#endif  // LONGHAUL_CONGESTION_BBR3_H_
