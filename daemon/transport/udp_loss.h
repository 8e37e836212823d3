#ifndef LONGHAUL_DAEMON_TRANSPORT_UDP_LOSS_H_
#define LONGHAUL_DAEMON_TRANSPORT_UDP_LOSS_H_

// Sent-packet bookkeeping, RTT estimation and loss detection for one udp
// connection, after RFC 9002 §5 (RTT), §6.1 (ACK-based detection: packet
// threshold 3, time threshold 9/8 RTT) and §6.2 (probe timeout). Time is
// passed in; nothing here reads a clock or touches a socket, so tests drive it
// with scripted ACK sequences.
//
// Also RangeSet, the bounded interval set both ends use for stream offsets.
//
// Not thread-safe; owned by the connection's I/O thread.

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/status.h"
#include "common/units.h"
#include "congestion/packet_ring.h"
#include "daemon/transport/udp_packet.h"

namespace longhaul::transport::udp {

// Disjoint, non-adjacent half-open ranges [start, end) in increasing order.
// Storage is reserved up front, so steady-state use does not allocate.
class RangeSet {
 public:
  explicit RangeSet(size_t reserve = 256) { ranges_.reserve(reserve); }
  void Add(uint64_t start, uint64_t end);
  // Whether [start, end) is entirely inside the set.
  bool Contains(uint64_t start, uint64_t end) const;
  // Whether any of [start, end) is in the set.
  bool Overlaps(uint64_t start, uint64_t end) const;
  // Removes everything below `floor`.
  void RemoveBelow(uint64_t floor);
  // If a range starts at or below `from`, removes it and returns its end;
  // otherwise returns `from`.
  uint64_t PopContiguous(uint64_t from);
  bool empty() const { return ranges_.empty(); }
  size_t size() const { return ranges_.size(); }
  const std::vector<std::pair<uint64_t, uint64_t>>& ranges() const { return ranges_; }

 private:
  std::vector<std::pair<uint64_t, uint64_t>> ranges_;
};

struct SentPacket {
  Timestamp sent_time;
  uint32_t bytes = 0;          // datagram size
  uint64_t stream_offset = 0;  // stream data carried, if stream_length > 0
  uint32_t stream_length = 0;
  bool ack_eliciting = false;
  bool congestion_controlled = false;  // counted in flight and reported to the controller
  bool carries_max_data = false;
};

struct RttStats {
  TimeDelta latest = TimeDelta::Zero();
  TimeDelta smoothed = TimeDelta::Milliseconds(333);  // RFC 9002 §6.2.2 kInitialRtt
  TimeDelta variation = TimeDelta::Milliseconds(333) / 2;
  TimeDelta min = TimeDelta::Infinite();
  bool has_sample = false;
};

// What one ACK (or loss timer) resolved, reused between events.
struct LossEvent {
  absl::InlinedVector<std::pair<uint64_t, SentPacket>, 64> acked;
  absl::InlinedVector<std::pair<uint64_t, SentPacket>, 16> lost;
  ByteCount prior_in_flight = 0;
  bool largest_newly_acked = false;
  void Clear() {
    acked.clear();
    lost.clear();
    prior_in_flight = 0;
    largest_newly_acked = false;
  }
};

class LossDetector {
 public:
  static constexpr uint64_t kPacketThreshold = 3;              // RFC 9002 §6.1.1
  static constexpr double kTimeThreshold = 9.0 / 8.0;          // RFC 9002 §6.1.2
  static constexpr TimeDelta kGranularity = TimeDelta::Milliseconds(1);

  explicit LossDetector(TimeDelta max_ack_delay) : max_ack_delay_(max_ack_delay) {}

  // `pn` must exceed every packet number recorded before.
  void OnPacketSent(uint64_t pn, const SentPacket& packet);
  // A packet that needs no acknowledgement and is not tracked (a pure ACK);
  // its number still counts as sent.
  void OnUntrackedPacketSent(uint64_t pn) { largest_sent_ = std::max(largest_sent_, pn); }

  // Applies an ACK received at `now`. Fills `event` with the newly acked
  // packets and the packets now deemed lost (both in increasing order).
  // An ACK of a packet number never sent is InvalidArgument.
  absl::Status OnAck(const AckFrame& ack, Timestamp now, LossEvent* event);

  // Declares time-threshold losses due at `now` (call when LossTime() passed).
  void OnLossTimer(Timestamp now, LossEvent* event);

  // The earliest time an outstanding packet will be declared lost by the time
  // threshold, or Infinite.
  Timestamp LossTime() const { return loss_time_; }
  // When the probe timeout fires, or Infinite if nothing ack-eliciting is out.
  Timestamp PtoTime() const;
  // The probe timeout fired: backs off the next one (RFC 9002 §6.2.1).
  void OnPtoFired() { ++pto_count_; }
  // The oldest outstanding packet carrying stream data, if any (for probes).
  const SentPacket* OldestOutstandingStream(uint64_t* pn) const;

  const RttStats& rtt() const { return rtt_; }
  ByteCount bytes_in_flight() const { return bytes_in_flight_; }
  uint64_t largest_sent() const { return largest_sent_; }
  uint64_t largest_acked() const { return largest_acked_; }
  int pto_count() const { return pto_count_; }
  size_t outstanding() const { return packets_.size(); }

 private:
  void UpdateRtt(TimeDelta latest, TimeDelta ack_delay);
  void DetectLost(Timestamp now, LossEvent* event);
  void Remove(uint64_t pn, const SentPacket& p);
  TimeDelta LossDelay() const;

  TimeDelta max_ack_delay_;
  congestion::PacketRing<SentPacket> packets_{4096};
  RttStats rtt_;
  ByteCount bytes_in_flight_ = 0;
  size_t ack_eliciting_outstanding_ = 0;
  Timestamp last_ack_eliciting_sent_;
  uint64_t largest_sent_ = 0;
  uint64_t largest_acked_ = 0;
  bool has_largest_acked_ = false;
  Timestamp loss_time_ = Timestamp::Infinite();
  int pto_count_ = 0;
};

}  // namespace longhaul::transport::udp

#endif  // LONGHAUL_DAEMON_TRANSPORT_UDP_LOSS_H_
