#include "congestion/aggregate_controller.h"

#include "gtest/gtest.h"

namespace longhaul::congestion {
namespace {

const Timestamp kT0 = Timestamp::FromNanoseconds(1000000000);

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
  EXPECT_EQ(a->cwnd(), model / 3);
  EXPECT_EQ(a->pacing_rate(), agg.model().pacing_rate() / 3);
  // c has nothing more to send: a and b split the model, less what c still has in flight.
  c->OnAppLimited();
  EXPECT_EQ(a->cwnd(), (model - 1500) / 2);
  EXPECT_EQ(b->pacing_rate(), agg.model().pacing_rate() / 2);
  // c is quoted the share it would get if it sent again.
  EXPECT_EQ(c->cwnd(), model / 3);
  // Once c's packet is acked it holds nothing back.
  const AckedPacket acked[] = {{1, 1500, kT0}};
  c->OnCongestionEvent(kT0 + TimeDelta::Milliseconds(20), 1500, acked, {});
  EXPECT_EQ(a->cwnd(), agg.model().cwnd() / 2);
  // c sends again: three shares.
  c->OnPacketSent(kT0 + TimeDelta::Milliseconds(21), 2, 1500, 0, true);
  EXPECT_EQ(a->cwnd(), agg.model().cwnd() / 3);
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

}  // namespace
}  // namespace longhaul::congestion
