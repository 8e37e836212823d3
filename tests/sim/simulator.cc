#include "tests/sim/simulator.h"

#include <algorithm>
#include <cassert>

namespace longhaul::sim {

using congestion::AckedPacket;
using congestion::LostPacket;

namespace {
constexpr uint64_t kPacketThreshold = 3;  // RFC 9002 §6.1.1.
constexpr int64_t kRttBucketNs = 10000;   // 10 us.
constexpr size_t kRttBuckets = 400000;    // Up to 4 s.
}  // namespace

struct Simulator::Flow {
  struct Sent {
    Timestamp sent_time;
    ByteCount bytes = 0;
  };
  struct Ack {
    Timestamp arrival;
    uint64_t pn;
  };

  FlowConfig config;
  int index = 0;
  Timestamp start;
  congestion::Pacer pacer;
  congestion::PacketRing<Sent> sent{8192};
  std::vector<Ack> acks;  // Ring buffer of ACKs in flight back to the sender.
  size_t acks_head = 0;
  size_t acks_size = 0;
  uint64_t next_pn = 1;
  uint64_t largest_acked = 0;
  ByteCount inflight = 0;
  ByteCount retx_pending = 0;
  TimeDelta srtt = TimeDelta::Zero();
  TimeDelta latest_rtt = TimeDelta::Zero();
  bool app_limited_reported = false;
  ByteCount window_mark = 0;
  FlowStats stats;

  void PushAck(Timestamp arrival, uint64_t pn) {
    if (acks_size == acks.size()) {
      std::vector<Ack> bigger(std::max<size_t>(1024, acks.size() * 2));
      for (size_t i = 0; i < acks_size; ++i) bigger[i] = acks[(acks_head + i) & (acks.size() - 1)];
      acks.swap(bigger);
      acks_head = 0;
    }
    acks[(acks_head + acks_size) & (acks.size() - 1)] = Ack{arrival, pn};
    ++acks_size;
  }
  const Ack& FrontAck() const { return acks[acks_head]; }
  void PopAck() {
    acks_head = (acks_head + 1) & (acks.size() - 1);
    --acks_size;
  }
};

Simulator::Simulator(const LinkConfig& link, uint64_t seed, ByteCount mss)
    : link_(link),
      mss_(mss),
      rng_(seed),
      now_(Epoch()),
      link_rate_(link.rate),
      queue_(1024),
      measure_start_(Epoch()),
      capacity_mark_(Epoch()),
      rtt_hist_(kRttBuckets, 0) {}

Simulator::~Simulator() = default;

int Simulator::AddFlow(FlowConfig config) {
  auto f = std::make_unique<Flow>();
  f->start = Epoch() + config.start;
  f->index = static_cast<int>(flows_.size());
  f->config = std::move(config);
  flows_.push_back(std::move(f));
  return static_cast<int>(flows_.size()) - 1;
}

const FlowStats& Simulator::flow_stats(int i) const { return flows_[i]->stats; }
const FlowConfig& Simulator::flow_config(int i) const { return flows_[i]->config; }
const congestion::Controller& Simulator::controller(int i) const {
  return *flows_[i]->config.controller;
}
TimeDelta Simulator::latest_rtt(int i) const { return flows_[i]->latest_rtt; }

ByteCount Simulator::window_delivered(int i) const {
  return flows_[i]->stats.bytes_delivered - flows_[i]->window_mark;
}

void Simulator::AccumulateCapacity(Timestamp until) {
  if (until > capacity_mark_) {
    capacity_bytes_ += static_cast<double>(link_rate_.BytesIn(until - capacity_mark_));
    capacity_mark_ = until;
  }
}

void Simulator::StartMeasurement() {
  measure_start_ = now_;
  capacity_mark_ = now_;
  capacity_bytes_ = 0;
  link_bytes_ = 0;
  std::fill(rtt_hist_.begin(), rtt_hist_.end(), 0);
  rtt_samples_ = 0;
  for (auto& f : flows_) f->window_mark = f->stats.bytes_delivered;
}

double Simulator::Utilization() const {
  double cap = capacity_bytes_;
  if (now_ > capacity_mark_) cap += static_cast<double>(link_rate_.BytesIn(now_ - capacity_mark_));
  return cap > 0 ? static_cast<double>(link_bytes_) / cap : 0.0;
}

double Simulator::LossRate() const {
  return total_packets_sent_ == 0 ? 0.0
                                  : static_cast<double>(total_packets_dropped_) /
                                        static_cast<double>(total_packets_sent_);
}

double Simulator::RttPercentileMs(double q) const {
  if (rtt_samples_ == 0) return 0.0;
  const uint64_t target = static_cast<uint64_t>(q * static_cast<double>(rtt_samples_ - 1)) + 1;
  uint64_t seen = 0;
  for (size_t i = 0; i < rtt_hist_.size(); ++i) {
    seen += rtt_hist_[i];
    if (seen >= target) return static_cast<double>(i * kRttBucketNs + kRttBucketNs / 2) * 1e-6;
  }
  return static_cast<double>(rtt_hist_.size() * kRttBucketNs) * 1e-6;
}

bool Simulator::AppHasData(const Flow& f, Timestamp t) const {
  if (f.config.app_off.IsZero()) return true;
  const int64_t period = (f.config.app_on + f.config.app_off).ToNanoseconds();
  const int64_t phase = (t - f.start).ToNanoseconds() % period;
  return phase < f.config.app_on.ToNanoseconds();
}

Timestamp Simulator::NextAppOn(const Flow& f, Timestamp t) const {
  const int64_t period = (f.config.app_on + f.config.app_off).ToNanoseconds();
  const int64_t since = (t - f.start).ToNanoseconds();
  return f.start + TimeDelta::Nanoseconds((since / period + 1) * period);
}

Timestamp Simulator::NextSendTime(const Flow& f) const {
  if (now_ < f.start) return f.start;
  if (f.inflight + mss_ > f.config.controller->cwnd()) return Timestamp::Infinite();
  Timestamp t = std::max(now_, f.pacer.EarliestDeparture(f.config.controller->pacing_rate()));
  if (!AppHasData(f, t)) t = NextAppOn(f, t);
  return t;
}

Timestamp Simulator::PtoDeadline(const Flow& f) const {
  if (f.sent.empty()) return Timestamp::Infinite();
  const Flow::Sent* oldest = f.sent.Find(f.sent.front_pn());
  if (oldest == nullptr) return Timestamp::Infinite();
  const TimeDelta base = f.srtt.IsZero() ? TimeDelta::Seconds(1) : f.srtt;
  return oldest->sent_time + std::max(base * 3, TimeDelta::Milliseconds(200));
}

void Simulator::RunUntil(TimeDelta until_delta) {
  const Timestamp until = Epoch() + until_delta;
  while (true) {
    // Pick the earliest event. Ties resolve in a fixed order: link, rate change, then per flow
    // ACKs, timers, sends, by flow index. That order is part of determinism.
    enum Kind { kNone, kLink, kRate, kAck, kPto, kSend };
    Kind kind = kNone;
    int which = -1;
    Timestamp best = until;
    if (q_size_ > 0 && link_done_ < best) {
      best = link_done_;
      kind = kLink;
    }
    if (next_rate_change_ < link_.rate_changes.size()) {
      const Timestamp t = Epoch() + link_.rate_changes[next_rate_change_].at;
      if (t < best) {
        best = t;
        kind = kRate;
      }
    }
    for (size_t i = 0; i < flows_.size(); ++i) {
      const Flow& f = *flows_[i];
      if (f.acks_size > 0 && f.FrontAck().arrival < best) {
        best = f.FrontAck().arrival;
        kind = kAck;
        which = static_cast<int>(i);
      }
      const Timestamp pto = PtoDeadline(f);
      if (pto < best) {
        best = pto;
        kind = kPto;
        which = static_cast<int>(i);
      }
      const Timestamp send = NextSendTime(f);
      if (send < best) {
        best = send;
        kind = kSend;
        which = static_cast<int>(i);
      }
    }
    if (kind == kNone) {
      AccumulateCapacity(until);
      now_ = until;
      return;
    }
    now_ = best;
    switch (kind) {
      case kLink:
        ProcessLinkDone();
        break;
      case kRate:
        ProcessRateChange();
        break;
      case kAck:
        ProcessAcks(*flows_[which]);
        break;
      case kPto:
        ProcessPto(*flows_[which]);
        break;
      case kSend:
        ProcessSend(*flows_[which]);
        break;
      case kNone:
        break;
    }
  }
}

void Simulator::ProcessRateChange() {
  AccumulateCapacity(now_);
  link_rate_ = link_.rate_changes[next_rate_change_].rate;
  ++next_rate_change_;
}

void Simulator::ProcessLinkDone() {
  const Queued q = queue_[q_head_];
  q_head_ = (q_head_ + 1) & (queue_.size() - 1);
  --q_size_;
  queue_bytes_ -= q.bytes;
  if (now_ >= measure_start_) link_bytes_ += q.bytes;
  link_bytes_total_ += q.bytes;
  Flow& f = *flows_[q.flow];
  f.stats.bytes_delivered += q.bytes;
  Timestamp arrival = now_ + f.config.rtt;
  if (!link_.ack_aggregation.IsZero()) {
    const int64_t a = link_.ack_aggregation.ToNanoseconds();
    const int64_t ns = arrival.ToNanoseconds();
    arrival = Timestamp::FromNanoseconds((ns + a - 1) / a * a);
  }
  f.PushAck(arrival, q.pn);
  if (q_size_ > 0) link_done_ = now_ + link_rate_.TransferTime(queue_[q_head_].bytes);
}

void Simulator::DeclareLost(Flow& f, uint64_t pn, absl::InlinedVector<LostPacket, 16>& lost) {
  const Flow::Sent* s = f.sent.Find(pn);
  if (s == nullptr) return;
  lost.push_back(LostPacket{pn, s->bytes});
  f.inflight -= s->bytes;
  f.retx_pending += s->bytes;
  f.stats.bytes_lost_declared += s->bytes;
  f.sent.Erase(pn);
}

void Simulator::ProcessAcks(Flow& f) {
  acked_.clear();
  lost_.clear();
  const ByteCount prior_in_flight = f.inflight;
  // All ACKs arriving at this instant form one congestion event.
  while (f.acks_size > 0 && f.FrontAck().arrival == now_) {
    const uint64_t pn = f.FrontAck().pn;
    f.PopAck();
    const Flow::Sent* s = f.sent.Find(pn);
    if (s == nullptr) continue;  // Already declared lost (spurious): nothing to do.
    const TimeDelta rtt = now_ - s->sent_time;
    acked_.push_back(AckedPacket{pn, s->bytes, s->sent_time});
    f.inflight -= s->bytes;
    f.largest_acked = std::max(f.largest_acked, pn);
    f.latest_rtt = rtt;
    f.srtt = f.srtt.IsZero() ? rtt : f.srtt * 0.875 + rtt * 0.125;
    if (now_ >= measure_start_) {
      const size_t bucket = std::min<size_t>(
          static_cast<size_t>(rtt.ToNanoseconds() / kRttBucketNs), kRttBuckets - 1);
      ++rtt_hist_[bucket];
      ++rtt_samples_;
    }
    f.sent.Erase(pn);
  }
  // RFC 9002 §6.1: packet and time thresholds.
  const TimeDelta loss_delay = std::max(f.srtt, f.latest_rtt) * 1.125;
  while (!f.sent.empty() && f.sent.front_pn() < f.largest_acked) {
    const uint64_t pn = f.sent.front_pn();
    const Flow::Sent* s = f.sent.Find(pn);
    if (pn + kPacketThreshold <= f.largest_acked || s->sent_time + loss_delay <= now_) {
      DeclareLost(f, pn, lost_);
    } else {
      break;
    }
  }
  if (acked_.empty() && lost_.empty()) return;
  f.config.controller->OnCongestionEvent(now_, prior_in_flight, acked_, lost_);
  if (!AppHasData(f, now_)) f.config.controller->OnAppLimited();
  if (observer_) observer_(f.index, now_, *f.config.controller);
}

void Simulator::ProcessPto(Flow& f) {
  // Probe timeout: everything outstanding for much longer than an RTT is treated as lost.
  lost_.clear();
  acked_.clear();
  const ByteCount prior_in_flight = f.inflight;
  const TimeDelta base = f.srtt.IsZero() ? TimeDelta::Seconds(1) : f.srtt;
  const TimeDelta age = std::max(base * 3, TimeDelta::Milliseconds(200));
  while (!f.sent.empty()) {
    const uint64_t pn = f.sent.front_pn();
    const Flow::Sent* s = f.sent.Find(pn);
    if (s->sent_time + age > now_) break;
    DeclareLost(f, pn, lost_);
  }
  if (!lost_.empty()) {
    f.config.controller->OnCongestionEvent(now_, prior_in_flight, acked_, lost_);
  }
}

void Simulator::ProcessSend(Flow& f) {
  congestion::Controller& cc = *f.config.controller;
  if (!AppHasData(f, now_)) return;
  while (f.inflight + mss_ <= cc.cwnd() && f.pacer.CanSend(now_, cc.pacing_rate())) {
    const uint64_t pn = f.next_pn++;
    const bool retx = f.retx_pending >= mss_;
    if (retx) {
      f.retx_pending -= mss_;
      f.stats.bytes_retransmitted += mss_;
    }
    f.sent.Insert(pn, Flow::Sent{now_, mss_});
    cc.OnPacketSent(now_, pn, mss_, f.inflight, true);
    f.pacer.OnPacketSent(now_, mss_, cc.pacing_rate(), cc.send_quantum());
    f.inflight += mss_;
    ++f.stats.packets_sent;
    f.stats.bytes_sent += mss_;
    ++total_packets_sent_;
    // The path: i.i.d. loss, then the drop-tail queue.
    const bool random_drop = link_.loss > 0 && rng_.NextDouble() < link_.loss;
    if (random_drop || queue_bytes_ + mss_ > link_.queue_bytes) {
      ++f.stats.packets_dropped;
      ++total_packets_dropped_;
      continue;
    }
    if (q_size_ == queue_.size()) {
      std::vector<Queued> bigger(queue_.size() * 2);
      for (size_t i = 0; i < q_size_; ++i) bigger[i] = queue_[(q_head_ + i) & (queue_.size() - 1)];
      queue_.swap(bigger);
      q_head_ = 0;
    }
    queue_[(q_head_ + q_size_) & (queue_.size() - 1)] = Queued{f.index, pn, mss_};
    if (q_size_ == 0) link_done_ = now_ + link_rate_.TransferTime(mss_);
    ++q_size_;
    queue_bytes_ += mss_;
  }
}

}  // namespace longhaul::sim
