// A seeded discrete-event simulator of flows sharing one bottleneck link.
//
// Model: each flow's sender feeds a single drop-tail FIFO (sized in bytes) in front of a link of
// a given rate (which may change at given times). Before the queue, each packet is dropped with
// an i.i.d. probability. After the link, a packet reaches its receiver and its ACK returns to the
// sender one flow-specific RTT after it left the link; with ACK aggregation, ACKs are held and
// released together at multiples of the aggregation interval. Senders run RFC 9002-style loss
// detection (packet threshold 3, time threshold 9/8 RTT, and a probe timeout), retransmit lost
// data in new packets, pace with congestion::Pacer and drive a congestion::Controller through the
// same calls a transport makes.
//
// Every event source is a FIFO (the link, each flow's ACK stream) or a per-flow timer, so the
// scheduler only compares a handful of head times per event and allocates nothing per packet.
// The same seed gives the same run, bit for bit.
//
// Not thread-safe.
#ifndef LONGHAUL_TESTS_SIM_SIMULATOR_H_
#define LONGHAUL_TESTS_SIM_SIMULATOR_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "common/units.h"
#include "congestion/controller.h"
#include "congestion/pacer.h"
#include "congestion/packet_ring.h"
#include "congestion/random.h"

namespace longhaul::sim {

struct RateChange {
  TimeDelta at;
  Bandwidth rate;
};

struct LinkConfig {
  Bandwidth rate = Bandwidth::GbitsPerSecond(1);
  ByteCount queue_bytes = 0;
  double loss = 0.0;                              // i.i.d. drop probability per packet.
  std::vector<RateChange> rate_changes;           // In increasing time order.
  TimeDelta ack_aggregation = TimeDelta::Zero();  // Zero: each ACK returns on its own.
};

struct FlowConfig {
  std::unique_ptr<congestion::Controller> controller;
  TimeDelta rtt = TimeDelta::Milliseconds(40);  // Propagation RTT (excluding serialisation).
  TimeDelta start = TimeDelta::Zero();
  // App-limited pattern: data is available for `app_on`, then none for `app_off`, repeating.
  // app_off == 0 means a bulk sender that always has data.
  TimeDelta app_on = TimeDelta::Zero();
  TimeDelta app_off = TimeDelta::Zero();
  int group = 0;  // Flows of one group are counted together in shares (e.g. an aggregate).
};

struct FlowStats {
  uint64_t packets_sent = 0;
  ByteCount bytes_sent = 0;
  ByteCount bytes_retransmitted = 0;
  ByteCount bytes_delivered = 0;  // Reached the receiver.
  ByteCount bytes_lost_declared = 0;
  uint64_t packets_dropped = 0;  // i.i.d. plus tail drops.
};

class Simulator {
 public:
  Simulator(const LinkConfig& link, uint64_t seed, ByteCount mss = congestion::kDefaultMss);
  ~Simulator();

  // Returns the flow index.
  int AddFlow(FlowConfig config);
  // Called after every congestion event of a flow (for probes in tests). Optional.
  using Observer = std::function<void(int flow, Timestamp now, const congestion::Controller&)>;
  void set_observer(Observer observer) { observer_ = std::move(observer); }

  // Runs until simulated time `t` (since the start).
  void RunUntil(TimeDelta t);
  // Starts (or restarts) the measurement window at the current time: utilization, RTT
  // percentiles and window goodputs count from here.
  void StartMeasurement();

  Timestamp now() const { return now_; }
  static Timestamp Epoch() { return Timestamp::FromNanoseconds(1000000000); }
  TimeDelta elapsed() const { return now_ - Epoch(); }
  int num_flows() const { return static_cast<int>(flows_.size()); }
  const FlowStats& flow_stats(int i) const;
  const FlowConfig& flow_config(int i) const;
  const congestion::Controller& controller(int i) const;
  // Bytes the flow delivered in the measurement window.
  ByteCount window_delivered(int i) const;
  TimeDelta window_length() const { return now_ - measure_start_; }
  Bandwidth current_link_rate() const { return link_rate_; }
  // Link bytes transmitted / link capacity over the window.
  double Utilization() const;
  // Dropped / sent packets over the whole run.
  double LossRate() const;
  // RTT percentile over the window, in ms (0 <= q <= 1).
  double RttPercentileMs(double q) const;
  // Latest RTT sample of flow i (zero before the first).
  TimeDelta latest_rtt(int i) const;
  // Bytes the link has transmitted since the start (monotonic).
  ByteCount link_bytes_total() const { return link_bytes_total_; }
  // Total packets simulated (sent), for benchmarks.
  uint64_t packets_sent() const { return total_packets_sent_; }

 private:
  struct Flow;
  struct Queued {
    int flow;
    uint64_t pn;
    ByteCount bytes;
  };

  void ProcessLinkDone();
  void ProcessAcks(Flow& f);
  void ProcessSend(Flow& f);
  void ProcessPto(Flow& f);
  void ProcessRateChange();
  void DeclareLost(Flow& f, uint64_t pn, absl::InlinedVector<congestion::LostPacket, 16>& lost);
  Timestamp NextSendTime(const Flow& f) const;
  Timestamp PtoDeadline(const Flow& f) const;
  bool AppHasData(const Flow& f, Timestamp t) const;
  Timestamp NextAppOn(const Flow& f, Timestamp t) const;
  void AccumulateCapacity(Timestamp until);

  LinkConfig link_;
  ByteCount mss_;
  congestion::SplitMix64Random rng_;
  Timestamp now_;
  std::vector<std::unique_ptr<Flow>> flows_;
  Observer observer_;

  // Link.
  Bandwidth link_rate_;
  size_t next_rate_change_ = 0;
  std::vector<Queued> queue_;  // Ring buffer.
  size_t q_head_ = 0;
  size_t q_size_ = 0;
  ByteCount queue_bytes_ = 0;
  Timestamp link_done_;  // When the head of the queue finishes transmission.

  // Measurement.
  Timestamp measure_start_;
  Timestamp capacity_mark_;
  double capacity_bytes_ = 0;  // Link capacity since measure_start_, in bytes.
  ByteCount link_bytes_ = 0;   // Bytes transmitted since measure_start_.
  ByteCount link_bytes_total_ = 0;
  std::vector<uint32_t> rtt_hist_;  // 10 us buckets.
  uint64_t rtt_samples_ = 0;
  uint64_t total_packets_sent_ = 0;
  uint64_t total_packets_dropped_ = 0;

  // Scratch for congestion events.
  absl::InlinedVector<congestion::AckedPacket, 64> acked_;
  absl::InlinedVector<congestion::LostPacket, 16> lost_;
};

}  // namespace longhaul::sim

#endif  // LONGHAUL_TESTS_SIM_SIMULATOR_H_
