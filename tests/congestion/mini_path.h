// A minimal closed loop for controller unit tests: one sender with infinite data, one FIFO
// bottleneck of fixed rate with an unlimited buffer, fixed propagation RTT, optional drops chosen
// by the test. Much simpler than tests/sim; enough to walk a controller through its states.
#ifndef LONGHAUL_TESTS_CONGESTION_MINI_PATH_H_
#define LONGHAUL_TESTS_CONGESTION_MINI_PATH_H_

#include <deque>
#include <functional>

#include "congestion/controller.h"
#include "congestion/pacer.h"

namespace longhaul::congestion::testing {

class MiniPath {
 public:
  MiniPath(Controller& cc, Bandwidth rate, TimeDelta rtt, Timestamp start)
      : cc_(cc), rate_(rate), rtt_(rtt), now_(start), link_free_(start) {}

  // Drops the packet if it returns true.
  void set_drop(std::function<bool(uint64_t pn)> drop) { drop_ = std::move(drop); }
  // Delays every packet sent from now on by `delay` more: a queue that someone else keeps.
  void set_extra_delay(TimeDelta delay) { extra_delay_ = delay; }
  // The bottleneck's rate from now on (e.g. a competitor left).
  void set_rate(Bandwidth rate) { rate_ = rate; }
  // The sender paces at `scale` x the controller's pacing rate: a sender that overshoots it, as
  // catch-up bursts on a busy host do.
  void set_pacing_scale(double scale) { pacing_scale_ = scale; }

  // Runs until `until`, calling `on_ack` after each congestion event.
  void RunUntil(Timestamp until, const std::function<void()>& on_ack = nullptr) {
    while (true) {
      Timestamp next_send = Timestamp::Infinite();
      if (inflight_ + kDefaultMss <= cc_.cwnd())
        next_send = std::max(now_, pacer_.EarliestDeparture(cc_.pacing_rate() * pacing_scale_));
      const Timestamp next_ack = acks_.empty() ? Timestamp::Infinite() : acks_.front().at;
      const Timestamp next = std::min(next_send, next_ack);
      if (next > until) {
        now_ = until;
        return;
      }
      now_ = next;
      if (next_ack <= next_send) {
        const Ack a = acks_.front();
        acks_.pop_front();
        const ByteCount prior = inflight_;
        inflight_ -= kDefaultMss;
        // Everything below a delivered packet that was dropped is declared lost now.
        lost_.clear();
        while (!dropped_.empty() && dropped_.front() < a.pn) {
          lost_.push_back(LostPacket{dropped_.front(), kDefaultMss});
          dropped_.pop_front();
          inflight_ -= kDefaultMss;
        }
        AckedPacket acked{a.pn, kDefaultMss, a.sent};
        cc_.OnCongestionEvent(now_, prior, absl::MakeConstSpan(&acked, 1), lost_);
        if (on_ack) on_ack();
      } else {
        const uint64_t pn = next_pn_++;
        cc_.OnPacketSent(now_, pn, kDefaultMss, inflight_, true);
        pacer_.OnPacketSent(now_, kDefaultMss, cc_.pacing_rate() * pacing_scale_,
                            cc_.send_quantum());
        inflight_ += kDefaultMss;
        if (drop_ && drop_(pn)) {
          dropped_.push_back(pn);
          continue;
        }
        link_free_ = std::max(link_free_, now_) + rate_.TransferTime(kDefaultMss);
        // In order even when extra_delay shrinks: a queue that drains does not reorder.
        const Timestamp ack_at = std::max(link_free_ + rtt_ + extra_delay_,
                                          acks_.empty() ? Timestamp::Zero() : acks_.back().at);
        acks_.push_back(Ack{ack_at, pn, now_});
      }
    }
  }

  Timestamp now() const { return now_; }
  ByteCount inflight() const { return inflight_; }

 private:
  struct Ack {
    Timestamp at;
    uint64_t pn;
    Timestamp sent;
  };
  Controller& cc_;
  Bandwidth rate_;
  TimeDelta rtt_;
  TimeDelta extra_delay_ = TimeDelta::Zero();
  double pacing_scale_ = 1.0;
  Timestamp now_;
  Timestamp link_free_;
  Pacer pacer_;
  std::deque<Ack> acks_;
  std::deque<uint64_t> dropped_;
  std::vector<LostPacket> lost_;
  std::function<bool(uint64_t)> drop_;
  uint64_t next_pn_ = 1;
  ByteCount inflight_ = 0;
};

}  // namespace longhaul::congestion::testing

#endif  // LONGHAUL_TESTS_CONGESTION_MINI_PATH_H_
