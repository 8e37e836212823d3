// Bbr1: BBR version 1 congestion control, following draft-cardwell-iccrg-bbr-congestion-control-00
// (Cardwell et al., "BBR: Congestion-Based Congestion Control", ACM Queue 2016).
//
// A model of the competitor that most Linux hosts run (net.ipv4.tcp_congestion_control = bbr is
// BBRv1), so the simulator can show how our Bbr3 shares a bottleneck with it. It is not used by
// any transport.
//
// The model: BtlBw (windowed max of delivery-rate samples over 10 round trips) and RTprop
// (windowed min RTT over 10 s). States: Startup, Drain, ProbeBW (an eight-phase pacing-gain
// cycle 1.25, 0.75, 1 x 6, each phase about one RTprop long) and ProbeRTT (cwnd of 4 packets for
// 200 ms and a round trip, when RTprop was not refreshed for 10 s). cwnd is cwnd_gain (2) x BDP
// plus a quantization allowance. Loss does not change the model: its only effect is the packet
// conservation of the first round of a recovery episode and cwnd reduced by the bytes lost, as in
// the draft's BBRModulateCwndForRecovery. So in a drop-tail queue shallower than one BDP the flow
// keeps 2 x BDP in flight whatever the loss rate.
//
// Not modelled (Linux tcp_bbr.c has them): the long-term "policer" bandwidth (lt_bw, which needs
// a loss rate of about 20 %), the ack-aggregation allowance (extra_acked) and TSO autosizing.
// Known gap: with 5 % random loss on tests/congestion's MiniPath, recovery episodes follow each
// other and BtlBw sinks to about half the link (Linux BBRv1 keeps most of it); 1 % is fine. The
// simulator's fairness pair loses about 2 %.
//
// Comments cite the draft's pseudocode function names (e.g. BBRCheckFullPipe).
//
// Not thread-safe: its caller serializes every call (the udp transport holds
// the flow's controller mutex). Borrows `random`, which must outlive it.
#ifndef LONGHAUL_CONGESTION_BBR1_H_
#define LONGHAUL_CONGESTION_BBR1_H_

#include <array>
#include <cstdint>
#include <memory>

#include "common/units.h"
#include "congestion/controller.h"
#include "congestion/delivery_rate_sampler.h"
#include "congestion/random.h"
#include "congestion/windowed_filter.h"

namespace longhaul::congestion {

// The constants of draft-cardwell-iccrg-bbr-congestion-control-00. The defaults are the draft's.
struct Bbr1Params {
  ByteCount mss = kDefaultMss;
  ByteCount initial_cwnd_packets = 10;
  ByteCount min_pipe_cwnd_packets = 4;  // BBRMinPipeCwnd, also the ProbeRTT cwnd.
  double high_gain = 2.885;             // BBRHighGain = 2 / ln(2): Startup pacing and cwnd gain.
  double probe_bw_cwnd_gain = 2.0;
  std::array<double, 8> pacing_gain_cycle = {1.25, 0.75, 1, 1, 1, 1, 1, 1};
  uint64_t btl_bw_filter_rounds = 10;  // BtlBwFilterLen.
  TimeDelta rtprop_filter_len = TimeDelta::Seconds(10);
  TimeDelta probe_rtt_duration = TimeDelta::Milliseconds(200);
  double full_bw_growth = 1.25;  // Full pipe: BtlBw grew by less than 25 %...
  int full_bw_rounds = 3;        // ...for 3 round trips.
  // Linux tcp_bbr.c paces 1 % below the estimate (bbr_pacing_margin_percent); the draft does not.
  double pacing_margin = 0.01;
  ByteCount max_send_quantum = 64 * 1024;
  TimeDelta send_quantum_time = TimeDelta::Milliseconds(1);
};

class Bbr1 final : public Controller {
 public:
  enum class Mode { kStartup, kDrain, kProbeBw, kProbeRtt };

  // `random` picks the first ProbeBW phase; it must outlive this controller.
  Bbr1(const Bbr1Params& params, Random& random, Timestamp now);

  void OnPacketSent(Timestamp now, uint64_t packet_number, ByteCount bytes,
                    ByteCount bytes_in_flight, bool is_retransmittable) override;
  void OnCongestionEvent(Timestamp now, ByteCount prior_in_flight,
                         absl::Span<const AckedPacket> acked,
                         absl::Span<const LostPacket> lost) override;
  void OnAppLimited() override;

  ByteCount cwnd() const override { return cwnd_; }
  Bandwidth pacing_rate() const override { return pacing_rate_; }
  ByteCount send_quantum() const override { return send_quantum_; }
  ControllerState DebugState() const override;

  Mode mode() const { return mode_; }
  static std::string_view ModeName(Mode mode);

 private:
  void UpdateRound();
  void UpdateBtlBw();
  void CheckCyclePhase(ByteCount prior_in_flight, bool lost);
  bool IsNextCyclePhase(ByteCount prior_in_flight, bool lost) const;
  void AdvanceCyclePhase();
  void CheckFullPipe();
  void CheckDrain();
  void UpdateRtprop();
  void CheckProbeRtt();
  void HandleProbeRtt();
  void SetPacingRate();
  void SetSendQuantum();
  void SetCwnd(ByteCount acked, ByteCount lost);

  void EnterStartup();
  void EnterDrain();
  void EnterProbeBw();
  void EnterProbeRtt();
  void ExitProbeRtt();

  ByteCount Inflight(double gain) const;  // BBRInflight: gain x BDP + quantization budget.
  ByteCount MinPipeCwnd() const { return params_.min_pipe_cwnd_packets * params_.mss; }
  ByteCount InitialCwnd() const { return params_.initial_cwnd_packets * params_.mss; }
  void SaveCwnd();
  void RestoreCwnd() { cwnd_ = std::max(cwnd_, prior_cwnd_); }

  const Bbr1Params params_;
  Random& random_;
  DeliveryRateSampler sampler_;

  Timestamp now_;
  RateSample rs_;
  ByteCount inflight_ = 0;
  uint64_t largest_sent_pn_ = 0;

  Mode mode_ = Mode::kStartup;
  double pacing_gain_ = 1.0;
  double cwnd_gain_ = 1.0;
  Bandwidth pacing_rate_;
  ByteCount send_quantum_ = 0;
  ByteCount cwnd_ = 0;

  WindowedMaxFilter<Bandwidth, uint64_t, uint64_t> btl_bw_filter_;
  Bandwidth btl_bw_;
  TimeDelta rtprop_ = TimeDelta::Infinite();
  Timestamp rtprop_stamp_;
  bool rtprop_expired_ = false;

  uint64_t round_count_ = 0;
  bool round_start_ = false;
  ByteCount next_round_delivered_ = 0;

  Bandwidth full_bw_;
  int full_bw_count_ = 0;
  bool filled_pipe_ = false;

  size_t cycle_index_ = 0;
  Timestamp cycle_stamp_;

  Timestamp probe_rtt_done_stamp_;
  bool probe_rtt_round_done_ = false;
  bool idle_restart_ = false;
  uint64_t probe_rtt_entries_ = 0;

  ByteCount prior_cwnd_ = 0;
  bool in_recovery_ = false;
  bool packet_conservation_ = false;
  uint64_t recovery_end_pn_ = 0;
  ByteCount conservation_end_delivered_ = 0;
};

// A BBRv1 controller with `params`, drawing randomness from `random` (which must outlive it).
std::unique_ptr<Controller> CreateBbr1(const Bbr1Params& params, Random& random, Timestamp now);

}  // namespace longhaul::congestion

#endif  // LONGHAUL_CONGESTION_BBR1_H_
