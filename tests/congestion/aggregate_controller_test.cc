#include "congestion/aggregate_controller.h"

#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "congestion/pacer.h"
#include "gtest/gtest.h"

namespace longhaul::congestion {
namespace {

const Timestamp kT0 = Timestamp::FromNanoseconds(1000000000);

// A flow's share of the model's cwnd, which is whole datagrams of Bbr3Params::mss.
ByteCount WholeDatagrams(ByteCount bytes) { return bytes / kDefaultMss * kDefaultMss; }

// The flows of one AggregateController over a FIFO bottleneck of fixed rate (unlimited buffer,
// fixed RTT, no loss), each flow sending as the udp transport does (udp_connection_send.cc): a
// datagram goes while anything of the flow's cwnd is left, at the flow's pacing rate.
class TransportLikeFlows {
 public:
  TransportLikeFlows(AggregateController& agg, int flows, ByteCount datagram, Bandwidth rate,
                     TimeDelta rtt, Timestamp start)
      : datagram_(datagram), rate_(rate), rtt_(rtt), now_(start), link_free_(start) {
    flows_.resize(flows);
    for (Flow& f : flows_) f.cc = agg.AddFlow();
  }

  // Runs until `until`, calling `on_ack` after each acknowledgement.
  void RunUntil(Timestamp until, const std::function<void()>& on_ack) {
    while (true) {
      Timestamp next_send = Timestamp::Infinite();
      Flow* sender = nullptr;
      for (Flow& f : flows_) {
        if (f.inflight >= f.cc->cwnd()) continue;
        const Timestamp t = std::max(now_, f.pacer.EarliestDeparture(f.cc->pacing_rate()));
        if (t < next_send) {
          next_send = t;
          sender = &f;
        }
      }
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
        Flow& f = flows_[a.flow];
        const ByteCount prior = f.inflight;
        f.inflight -= datagram_;
        const AckedPacket acked{a.pn, datagram_, a.sent};
        f.cc->OnCongestionEvent(now_, prior, absl::MakeConstSpan(&acked, 1), {});
        on_ack();
      } else {
        const uint64_t pn = sender->next_pn++;
        sender->cc->OnPacketSent(now_, pn, datagram_, sender->inflight, true);
        sender->pacer.OnPacketSent(now_, datagram_, sender->cc->pacing_rate(),
                                   sender->cc->send_quantum());
        sender->inflight += datagram_;
        link_free_ = std::max(link_free_, now_) + rate_.TransferTime(datagram_);
        acks_.push_back(
            Ack{link_free_ + rtt_, static_cast<size_t>(sender - flows_.data()), pn, now_});
      }
    }
  }

  Timestamp now() const { return now_; }

 private:
  struct Flow {
    std::unique_ptr<Controller> cc;
    Pacer pacer;
    ByteCount inflight = 0;
    uint64_t next_pn = 1;
  };
  struct Ack {
    Timestamp at;
    size_t flow;
    uint64_t pn;
    Timestamp sent;
  };
  ByteCount datagram_;
  Bandwidth rate_;
  TimeDelta rtt_;
  Timestamp now_;
  Timestamp link_free_;
  std::vector<Flow> flows_;
  std::deque<Ack> acks_;
};

// Sends as the transport does over `rate`, 40 ms and returns the longest ProbeRTT in 21 s (two
// or three of them).
TimeDelta LongestProbeRtt(int flows, ByteCount datagram, Bandwidth rate) {
  SplitMix64Random rng(1);
  Bbr3Params params;
  params.mss = datagram;
  AggregateController agg(params, rng, kT0);
  TransportLikeFlows path(agg, flows, datagram, rate, TimeDelta::Milliseconds(40), kT0);
  Timestamp entered = Timestamp::Infinite();
  TimeDelta longest = TimeDelta::Zero();
  const Timestamp end = kT0 + TimeDelta::Seconds(21);
  path.RunUntil(end, [&] {
    const bool in_probe_rtt = agg.model().DebugState().state == "ProbeRTT";
    if (in_probe_rtt && entered.IsInfinite()) entered = path.now();
    if (!in_probe_rtt && !entered.IsInfinite()) {
      longest = std::max(longest, path.now() - entered);
      entered = Timestamp::Infinite();
    }
  });
  if (!entered.IsInfinite()) longest = std::max(longest, end - entered);
  EXPECT_GE(agg.model().DebugState().probe_rtt_entries, 2u);
  return longest;
}

TEST(AggregateControllerTest, SplitsCwndAndPacingEquallyAcrossFlows) {
  SplitMix64Random rng(1);
  AggregateController agg(Bbr3Params(), rng, kT0);
  auto a = agg.AddFlow();
  auto b = agg.AddFlow();
  EXPECT_EQ(agg.num_flows(), 2);
  EXPECT_EQ(a->cwnd(), agg.model().cwnd() / 2);
  EXPECT_EQ(b->pacing_rate(), agg.model().pacing_rate() / 2);
  {
    auto c = agg.AddFlow();
    EXPECT_EQ(agg.num_flows(), 3);
  }
  EXPECT_EQ(agg.num_flows(), 2);
}

TEST(AggregateControllerTest, PoolsPacketsOfAllFlowsIntoOneModel) {
  SplitMix64Random rng(1);
  AggregateController agg(Bbr3Params(), rng, kT0);
  auto a = agg.AddFlow();
  auto b = agg.AddFlow();
  // Each flow numbers its own packets from 1.
  a->OnPacketSent(kT0, 1, 1500, 0, true);
  b->OnPacketSent(kT0, 1, 1500, 0, true);
  a->OnPacketSent(kT0, 2, 1500, 1500, true);
  EXPECT_EQ(agg.model().DebugState().bytes_in_flight, 4500u);
  EXPECT_EQ(a->DebugState().bytes_in_flight, 3000u);
  const AckedPacket acked[] = {{1, 1500, kT0}};
  b->OnCongestionEvent(kT0 + TimeDelta::Milliseconds(20), 1500, acked, {});
  EXPECT_EQ(agg.model().DebugState().bytes_in_flight, 3000u);
  EXPECT_EQ(b->DebugState().bytes_in_flight, 0u);
  // The model's min_rtt came from flow b's packet.
  EXPECT_EQ(agg.model().DebugState().min_rtt, TimeDelta::Milliseconds(20));
}

TEST(AggregateControllerTest, ModelIsAppLimitedOnlyWhenEveryFlowIs) {
  SplitMix64Random rng(1);
  AggregateController agg(Bbr3Params(), rng, kT0);
  auto a = agg.AddFlow();
  auto b = agg.AddFlow();
  a->OnPacketSent(kT0, 1, 1500, 0, true);
  b->OnPacketSent(kT0, 1, 1500, 0, true);
  a->OnAppLimited();
  // Ack b's packet: the sample must not be app-limited yet, so max_bw may grow.
  const AckedPacket acked[] = {{1, 1500, kT0}};
  b->OnCongestionEvent(kT0 + TimeDelta::Milliseconds(20), 1500, acked, {});
  EXPECT_EQ(agg.num_flows(), 2);
  b->OnAppLimited();
  // Now both are app-limited; nothing observable breaks and the flows keep working.
  a->OnPacketSent(kT0 + TimeDelta::Milliseconds(21), 2, 1500, 1500, true);
  EXPECT_EQ(agg.model().DebugState().bytes_in_flight, 3000u);
}

TEST(AggregateControllerTest, IdleFlowsGiveTheirShareToBusyFlows) {
  SplitMix64Random rng(1);
  AggregateController agg(Bbr3Params(), rng, kT0);
  auto a = agg.AddFlow();
  auto b = agg.AddFlow();
  auto c = agg.AddFlow();
  a->OnPacketSent(kT0, 1, 1500, 0, true);
  b->OnPacketSent(kT0, 1, 1500, 0, true);
  c->OnPacketSent(kT0, 1, 1500, 0, true);
  const ByteCount model = agg.model().cwnd();
  EXPECT_EQ(a->cwnd(), WholeDatagrams(model / 3));
  EXPECT_EQ(a->pacing_rate(), agg.model().pacing_rate() / 3);
  // c has nothing more to send: a and b split the model, less what c still has in flight.
  c->OnAppLimited();
  EXPECT_EQ(a->cwnd(), WholeDatagrams((model - 1500) / 2));
  EXPECT_EQ(b->pacing_rate(), agg.model().pacing_rate() / 2);
  // c is quoted the share it would get if it sent again.
  EXPECT_EQ(c->cwnd(), WholeDatagrams(model / 3));
  // Once c's packet is acked it holds nothing back.
  const AckedPacket acked[] = {{1, 1500, kT0}};
  c->OnCongestionEvent(kT0 + TimeDelta::Milliseconds(20), 1500, acked, {});
  EXPECT_EQ(a->cwnd(), WholeDatagrams(agg.model().cwnd() / 2));
  // c sends again: three shares.
  c->OnPacketSent(kT0 + TimeDelta::Milliseconds(21), 2, 1500, 0, true);
  EXPECT_EQ(a->cwnd(), WholeDatagrams(agg.model().cwnd() / 3));
  EXPECT_EQ(agg.num_flows(), 3);
}

TEST(AggregateControllerTest, DroppingAFlowForgetsItsPackets) {
  SplitMix64Random rng(1);
  AggregateController agg(Bbr3Params(), rng, kT0);
  auto a = agg.AddFlow();
  auto b = agg.AddFlow();
  a->OnPacketSent(kT0, 1, 1500, 0, true);
  b->OnPacketSent(kT0, 1, 1500, 0, true);
  b.reset();
  EXPECT_EQ(agg.num_flows(), 1);
  EXPECT_EQ(agg.model().DebugState().bytes_in_flight, 1500u);
  EXPECT_EQ(a->cwnd(), agg.model().cwnd());
}

// ProbeRTT waits until the aggregate's inflight is down to the ProbeRTT cwnd, then holds it for
// 200 ms and a round. The transport lets a flow send a datagram while any of its cwnd is left, so
// the flows' shares must add up to no more than that cwnd, whole datagrams included, and each
// flow's floor of two datagrams must fit in it; otherwise ProbeRTT never ends, and the model
// neither probes nor cruises (on the bench, a 15 s ProbeRTT at 0.3 MB of inflight beside BBRv1).
TEST(AggregateControllerTest, ProbeRttEndsWithJumboDatagramsSplitAcrossFlows) {
  const TimeDelta kExpected = TimeDelta::Milliseconds(200) + 4 * TimeDelta::Milliseconds(40);
  // Each flow's share of the ProbeRTT cwnd is a few 9000-byte datagrams and a fraction.
  EXPECT_LE(LongestProbeRtt(8, 9000, Bandwidth::MbitsPerSecond(125)), kExpected);
  // Half a BDP is less than eight flows' floor of two datagrams each.
  EXPECT_LE(LongestProbeRtt(8, 9000, Bandwidth::MbitsPerSecond(40)), kExpected);
  // One flow, as a plain Bbr3 would see it.
  EXPECT_LE(LongestProbeRtt(1, 9000, Bandwidth::MbitsPerSecond(125)), kExpected);
}

}  // namespace
}  // namespace longhaul::congestion
