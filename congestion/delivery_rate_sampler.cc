#include "congestion/delivery_rate_sampler.h"

#include <algorithm>

namespace longhaul::congestion {

DeliveryRateSampler::DeliveryRateSampler() : packets_(4096) {}

// draft-ietf-ccwg-bbr-06, "Delivery Rate Samples: Transmitting a data packet".
void DeliveryRateSampler::OnPacketSent(Timestamp now, uint64_t packet_number, ByteCount bytes,
                                       ByteCount bytes_in_flight) {
  if (bytes_in_flight == 0) {
    // Start a new interval after idle, so the idle time is not counted as sending time.
    first_send_time_ = now;
    delivered_time_ = now;
  }
  PacketState p;
  p.send_time = now;
  p.first_send_time = first_send_time_;
  p.delivered_time = delivered_time_;
  p.size = bytes;
  p.delivered = delivered_;
  p.tx_in_flight = bytes_in_flight + bytes;
  p.lost = lost_;
  p.is_app_limited = app_limited_until_ != 0;
  packets_.Insert(packet_number, p);
}

// draft-ietf-ccwg-bbr-06, "Delivery Rate Samples: Upon receiving ACK" (UpdateRateSample).
bool DeliveryRateSampler::OnPacketAcked(Timestamp now, uint64_t packet_number) {
  PacketState* p = packets_.Find(packet_number);
  if (p == nullptr) return false;
  delivered_ += p->size;
  delivered_time_ = now;
  rs_.newly_acked += p->size;
  const TimeDelta rtt = now - p->send_time;
  min_rtt_ = std::min(min_rtt_, rtt);
  // Use the most recently sent packet acked by this ACK: it has the freshest snapshot.
  if (!has_data_ || p->delivered >= rs_.prior_delivered) {
    has_data_ = true;
    rs_.prior_delivered = p->delivered;
    prior_time_ = p->delivered_time;
    rs_.is_app_limited = p->is_app_limited;
    rs_.send_elapsed = p->send_time - p->first_send_time;
    rs_.ack_elapsed = delivered_time_ - p->delivered_time;
    rs_.tx_in_flight = p->tx_in_flight;
    rs_.lost = lost_ - p->lost;
    rs_.rtt = rtt;
    first_send_time_ = p->send_time;
  }
  packets_.Erase(packet_number);
  return true;
}

bool DeliveryRateSampler::OnPacketLost(uint64_t packet_number, LostPacketSnapshot* snapshot) {
  PacketState* p = packets_.Find(packet_number);
  if (p == nullptr) return false;
  lost_ += p->size;
  rs_.newly_lost += p->size;
  snapshot->size = p->size;
  snapshot->tx_in_flight = p->tx_in_flight;
  snapshot->lost = lost_ - p->lost;
  snapshot->is_app_limited = p->is_app_limited;
  packets_.Erase(packet_number);
  return true;
}

// draft-ietf-ccwg-bbr-06, "Delivery Rate Samples: Upon receiving ACK" (GenerateRateSample).
const RateSample& DeliveryRateSampler::GenerateRateSample(Timestamp now) {
  RateSample& rs = rs_;
  // Clear app-limited once the bubble has been delivered.
  if (app_limited_until_ != 0 && delivered_ > app_limited_until_) app_limited_until_ = 0;
  rs.valid = false;
  rs.delivery_rate = Bandwidth::Zero();
  if (has_data_) {
    // The interval is the larger of the send and ACK phases, so ACK compression cannot make the
    // path look faster than the sender sent, and a burst of sends cannot make it look faster than
    // the ACKs arrived.
    rs.interval = std::max(rs.send_elapsed, rs.ack_elapsed);
    rs.delivered = delivered_ - rs.prior_delivered;
    // An interval shorter than min_rtt cannot be a full-pipe measurement; skip it.
    if (rs.interval > TimeDelta::Zero() && !(rs.interval < min_rtt_)) {
      rs.delivery_rate = Bandwidth::FromBytesAndTimeDelta(rs.delivered, rs.interval);
      rs.valid = true;
    }
  } else {
    rs.rtt = TimeDelta::Infinite();
    rs.delivered = 0;
  }
  // Hand out a copy and reset the accumulators for the next ACK.
  out_ = rs;
  has_data_ = false;
  rs_ = RateSample();
  (void)now;
  return out_;
}

void DeliveryRateSampler::OnAppLimited(ByteCount bytes_in_flight) {
  app_limited_until_ = std::max<ByteCount>(delivered_ + bytes_in_flight, 1);
}

}  // namespace longhaul::congestion
