#include "daemon/transport/udp_loss.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/check.h"

namespace longhaul::transport::udp {

void RangeSet::Add(uint64_t start, uint64_t end) {
  if (start >= end) return;
  // First range whose end reaches `start` (touching ranges merge).
  auto it = std::lower_bound(ranges_.begin(), ranges_.end(), start,
                             [](const auto& r, uint64_t v) { return r.second < v; });
  if (it == ranges_.end() || it->first > end) {
    ranges_.insert(it, {start, end});
    return;
  }
  it->first = std::min(it->first, start);
  it->second = std::max(it->second, end);
  auto next = it + 1;
  auto last = next;
  while (last != ranges_.end() && last->first <= it->second) {
    it->second = std::max(it->second, last->second);
    ++last;
  }
  ranges_.erase(next, last);
}

bool RangeSet::Contains(uint64_t start, uint64_t end) const {
  if (start >= end) return true;
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), start,
                             [](uint64_t v, const auto& r) { return v < r.first; });
  if (it == ranges_.begin()) return false;
  --it;
  return it->first <= start && end <= it->second;
}

bool RangeSet::Overlaps(uint64_t start, uint64_t end) const {
  if (start >= end) return false;
  // The first range ending after `start` overlaps iff it begins before `end`.
  auto it = std::upper_bound(ranges_.begin(), ranges_.end(), start,
                             [](uint64_t v, const auto& r) { return v < r.second; });
  return it != ranges_.end() && it->first < end;
}

void RangeSet::RemoveBelow(uint64_t floor) {
  auto it = ranges_.begin();
  while (it != ranges_.end() && it->second <= floor) ++it;
  ranges_.erase(ranges_.begin(), it);
  if (!ranges_.empty() && ranges_.front().first < floor) ranges_.front().first = floor;
}

uint64_t RangeSet::PopContiguous(uint64_t from) {
  if (ranges_.empty() || ranges_.front().first > from) return from;
  const uint64_t end = std::max(from, ranges_.front().second);
  ranges_.erase(ranges_.begin());
  return end;
}

void LossDetector::OnPacketSent(uint64_t pn, const SentPacket& packet) {
  LONGHAUL_CHECK(packets_.empty() || pn >= packets_.end_pn());
  LONGHAUL_CHECK(pn > largest_sent_);
  largest_sent_ = pn;
  packets_.Insert(pn, packet);
  if (packet.congestion_controlled) bytes_in_flight_ += packet.bytes;
  if (packet.ack_eliciting) {
    ++ack_eliciting_outstanding_;
    last_ack_eliciting_sent_ = packet.sent_time;
  }
}

void LossDetector::Remove(uint64_t pn, const SentPacket& p) {
  if (p.congestion_controlled) bytes_in_flight_ -= std::min<ByteCount>(bytes_in_flight_, p.bytes);
  if (p.ack_eliciting) --ack_eliciting_outstanding_;
  packets_.Erase(pn);
}

void LossDetector::UpdateRtt(TimeDelta latest, TimeDelta ack_delay) {
  // RFC 9002 §5.3.
  rtt_.latest = latest;
  if (!rtt_.has_sample) {
    rtt_.has_sample = true;
    rtt_.min = latest;
    rtt_.smoothed = latest;
    rtt_.variation = latest / 2;
    return;
  }
  rtt_.min = std::min(rtt_.min, latest);
  ack_delay = std::min(ack_delay, max_ack_delay_);
  TimeDelta adjusted = latest;
  if (latest >= rtt_.min + ack_delay) adjusted = latest - ack_delay;
  const TimeDelta diff = rtt_.smoothed > adjusted ? rtt_.smoothed - adjusted : adjusted - rtt_.smoothed;
  rtt_.variation = (rtt_.variation * 3 + diff) / 4;
  rtt_.smoothed = (rtt_.smoothed * 7 + adjusted) / 8;
}

absl::Status LossDetector::OnAck(const AckFrame& ack, Timestamp now, LossEvent* event) {
  event->Clear();
  event->prior_in_flight = bytes_in_flight_;
  if (ack.range_count == 0) return absl::OkStatus();
  if (ack.largest_acked() > largest_sent_) {
    return absl::InvalidArgumentError(absl::StrCat("ACK of packet ", ack.largest_acked(),
                                                   " which was never sent (largest sent ",
                                                   largest_sent_, ")"));
  }
  // Newly acked packets, walked in increasing order over the live ring only,
  // so a huge range costs no more than the packets actually outstanding.
  for (size_t i = ack.range_count; i-- > 0;) {
    const PacketRange& r = ack.ranges[i];
    if (packets_.empty()) break;
    uint64_t lo = std::max(r.smallest, packets_.front_pn());
    uint64_t hi = std::min(r.largest, packets_.end_pn() - 1);
    for (uint64_t pn = lo; pn <= hi && !packets_.empty(); ++pn) {
      SentPacket* p = packets_.Find(pn);
      if (p == nullptr) continue;
      event->acked.emplace_back(pn, *p);
      if (pn == ack.largest_acked()) event->largest_newly_acked = true;
      Remove(pn, *p);
    }
  }
  if (!has_largest_acked_ || ack.largest_acked() > largest_acked_) {
    largest_acked_ = ack.largest_acked();
    has_largest_acked_ = true;
  }
  if (event->acked.empty()) return absl::OkStatus();
  // RFC 9002 §5.1: an RTT sample only when the largest acked is newly acked
  // and at least one newly acked packet was ack-eliciting.
  if (event->largest_newly_acked) {
    bool any_eliciting = false;
    for (const auto& [pn, p] : event->acked) any_eliciting |= p.ack_eliciting;
    if (any_eliciting) {
      UpdateRtt(now - event->acked.back().second.sent_time,
                TimeDelta::Microseconds(static_cast<int64_t>(ack.ack_delay_us)));
    }
  }
  pto_count_ = 0;
  DetectLost(now, event);
  return absl::OkStatus();
}

TimeDelta LossDetector::LossDelay() const {
  // RFC 9002 §6.1.2: max(kTimeThreshold * max(smoothed_rtt, latest_rtt), kGranularity).
  TimeDelta base = std::max(rtt_.smoothed, rtt_.latest);
  return std::max(base * kTimeThreshold, kGranularity);
}

void LossDetector::DetectLost(Timestamp now, LossEvent* event) {
  loss_time_ = Timestamp::Infinite();
  if (!has_largest_acked_ || packets_.empty()) return;
  const TimeDelta loss_delay = LossDelay();
  const Timestamp lost_send_time = now - loss_delay;
  const uint64_t end = std::min(largest_acked_, packets_.end_pn() - 1);
  for (uint64_t pn = packets_.front_pn(); pn <= end && !packets_.empty(); ++pn) {
    SentPacket* p = packets_.Find(pn);
    if (p == nullptr) continue;
    if (p->sent_time <= lost_send_time || largest_acked_ >= pn + kPacketThreshold) {
      event->lost.emplace_back(pn, *p);
      Remove(pn, *p);
    } else {
      loss_time_ = std::min(loss_time_, p->sent_time + loss_delay);
    }
  }
}

void LossDetector::OnLossTimer(Timestamp now, LossEvent* event) {
  event->Clear();
  event->prior_in_flight = bytes_in_flight_;
  DetectLost(now, event);
}

Timestamp LossDetector::PtoTime() const {
  if (ack_eliciting_outstanding_ == 0) return Timestamp::Infinite();
  // RFC 9002 §6.2.1: smoothed_rtt + max(4 * rttvar, kGranularity) + max_ack_delay, doubled per PTO.
  TimeDelta pto = rtt_.smoothed + std::max(rtt_.variation * 4, kGranularity) + max_ack_delay_;
  pto = pto * (int64_t{1} << std::min(pto_count_, 16));
  return last_ack_eliciting_sent_ + pto;
}

const SentPacket* LossDetector::OldestOutstandingStream(uint64_t* pn) const {
  for (uint64_t i = packets_.front_pn(); !packets_.empty() && i < packets_.end_pn(); ++i) {
    const SentPacket* p = packets_.Find(i);
    if (p != nullptr && p->stream_length > 0) {
      *pn = i;
      return p;
    }
  }
  return nullptr;
}

}  // namespace longhaul::transport::udp
