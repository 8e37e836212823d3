// DeliveryRateSampler: per-ACK delivery-rate samples, following draft-ietf-ccwg-bbr-06,
// section "Delivery Rate Samples".
//
// Contract:
//  - OnPacketSent() is called for every packet in send order, with increasing packet numbers. It
//    snapshots the connection's delivery state into the packet's record.
//  - For each ACK, call OnPacketAcked() for every newly acked packet and OnPacketLost() for every
//    newly lost one, then GenerateRateSample() once. The sample describes the most recently sent
//    of the packets acked by that ACK.
//  - OnAppLimited() marks the connection app-limited until everything now in flight is delivered;
//    samples taken in that period carry is_app_limited.
//
// Records live in a PacketRing, so there is no allocation per packet in steady state.
// Not thread-safe; owned by one controller.
#ifndef LONGHAUL_CONGESTION_DELIVERY_RATE_SAMPLER_H_
#define LONGHAUL_CONGESTION_DELIVERY_RATE_SAMPLER_H_

#include <cstdint>

#include "common/units.h"
#include "congestion/packet_ring.h"

namespace longhaul::congestion {

// One delivery-rate sample (draft "rs").
struct RateSample {
  Bandwidth delivery_rate;  // delivered / interval. Zero when the sample is not valid.
  bool is_app_limited = false;
  TimeDelta interval;  // max(send_elapsed, ack_elapsed).
  TimeDelta send_elapsed;
  TimeDelta ack_elapsed;
  ByteCount delivered = 0;        // Bytes delivered over the interval.
  ByteCount prior_delivered = 0;  // C.delivered when the sampled packet was sent.
  ByteCount tx_in_flight = 0;     // In flight when the sampled packet was sent (incl. itself).
  ByteCount lost = 0;             // Bytes lost between the sampled packet's send and this ACK.
  ByteCount newly_acked = 0;      // Bytes acked by this ACK.
  ByteCount newly_lost = 0;       // Bytes declared lost by this ACK.
  TimeDelta rtt = TimeDelta::Infinite();  // RTT of the most recently sent acked packet.
  bool valid = false;                     // delivery_rate is meaningful.
};

// The send-time snapshot of a lost packet, for BBR's per-loss checks (draft "BBRHandleLostPacket").
struct LostPacketSnapshot {
  ByteCount size = 0;
  ByteCount tx_in_flight = 0;
  ByteCount lost = 0;  // C.lost - P.lost, including this packet.
  bool is_app_limited = false;
};

class DeliveryRateSampler {
 public:
  DeliveryRateSampler();

  // `bytes_in_flight` is the amount in flight before this packet.
  void OnPacketSent(Timestamp now, uint64_t packet_number, ByteCount bytes,
                    ByteCount bytes_in_flight);
  // Returns false if the packet is unknown (never sent, or already acked or lost).
  bool OnPacketAcked(Timestamp now, uint64_t packet_number);
  // Fills `*snapshot` for the lost packet. Returns false if the packet is unknown.
  bool OnPacketLost(uint64_t packet_number, LostPacketSnapshot* snapshot);
  // Drops the packet's record without counting it as delivered or lost.
  bool Forget(uint64_t packet_number) { return packets_.Erase(packet_number); }
  // Completes the sample for the current ACK and resets the per-ACK accumulators. Returns the
  // sample; sample.valid says whether delivery_rate may be used.
  const RateSample& GenerateRateSample(Timestamp now);
  // draft: "C.app_limited = (C.delivered + C.inflight) ? : 1".
  void OnAppLimited(ByteCount bytes_in_flight);

  ByteCount delivered() const { return delivered_; }
  ByteCount lost() const { return lost_; }
  bool is_app_limited() const { return app_limited_until_ != 0; }
  // The smallest RTT ever seen by this sampler (used to reject too-short intervals).
  TimeDelta min_rtt() const { return min_rtt_; }
  size_t tracked_packets() const { return packets_.size(); }

 private:
  struct PacketState {
    Timestamp send_time;
    Timestamp first_send_time;
    Timestamp delivered_time;
    ByteCount size = 0;
    ByteCount delivered = 0;
    ByteCount tx_in_flight = 0;
    ByteCount lost = 0;
    bool is_app_limited = false;
  };

  PacketRing<PacketState> packets_;
  ByteCount delivered_ = 0;          // C.delivered
  Timestamp delivered_time_;         // C.delivered_time
  Timestamp first_send_time_;        // C.first_send_time
  ByteCount app_limited_until_ = 0;  // C.app_limited
  ByteCount lost_ = 0;               // C.lost
  TimeDelta min_rtt_ = TimeDelta::Infinite();

  // Per-ACK accumulation.
  bool has_data_ = false;
  Timestamp prior_time_;
  RateSample rs_;
  RateSample out_;
};

}  // namespace longhaul::congestion

#endif  // LONGHAUL_CONGESTION_DELIVERY_RATE_SAMPLER_H_
