#include "daemon/transport/udp_loss.h"

#include <gtest/gtest.h>

#include <vector>

namespace longhaul::transport::udp {
namespace {

constexpr TimeDelta kMaxAckDelay = TimeDelta::Milliseconds(1);

Timestamp T(int64_t ms) { return Timestamp::FromNanoseconds(ms * 1'000'000); }

SentPacket Data(Timestamp at, uint64_t offset) {
  SentPacket p;
  p.sent_time = at;
  p.bytes = 1000;
  p.stream_offset = offset;
  p.stream_length = 950;
  p.ack_eliciting = true;
  p.congestion_controlled = true;
  return p;
}

AckFrame Ack(std::vector<PacketRange> ranges, uint64_t delay_us = 0) {
  AckFrame a;
  a.ack_delay_us = delay_us;
  a.range_count = ranges.size();
  for (size_t i = 0; i < ranges.size(); ++i) a.ranges[i] = ranges[i];
  return a;
}

std::vector<uint64_t> Pns(const auto& list) {
  std::vector<uint64_t> out;
  for (const auto& [pn, p] : list) out.push_back(pn);
  return out;
}

TEST(UdpLossTest, PacketThresholdDeclaresLossThreeBehind) {
  LossDetector d(kMaxAckDelay);
  for (uint64_t pn = 1; pn <= 6; ++pn) d.OnPacketSent(pn, Data(T(0), pn * 950));
  EXPECT_EQ(d.bytes_in_flight(), 6000u);
  LossEvent e;
  // 1 is missing; 2..4 acked: 4 - 1 >= 3 -> 1 lost.
  ASSERT_TRUE(d.OnAck(Ack({{2, 4}}), T(50), &e).ok());
  EXPECT_EQ(Pns(e.acked), (std::vector<uint64_t>{2, 3, 4}));
  EXPECT_EQ(Pns(e.lost), (std::vector<uint64_t>{1}));
  EXPECT_EQ(e.prior_in_flight, 6000u);
  EXPECT_EQ(d.bytes_in_flight(), 2000u);
  EXPECT_EQ(d.rtt().latest, TimeDelta::Milliseconds(50));
}

TEST(UdpLossTest, FewerThanThresholdWaitsForTheTimer) {
  LossDetector d(kMaxAckDelay);
  for (uint64_t pn = 1; pn <= 3; ++pn) d.OnPacketSent(pn, Data(T(0), pn * 950));
  LossEvent e;
  ASSERT_TRUE(d.OnAck(Ack({{2, 3}}), T(40), &e).ok());  // 3 - 1 < 3
  EXPECT_TRUE(e.lost.empty());
  // Time threshold: 9/8 * max(srtt, latest) = 45 ms after packet 1 was sent.
  EXPECT_EQ(d.LossTime(), T(45));
  d.OnLossTimer(T(44), &e);
  EXPECT_TRUE(e.lost.empty());
  d.OnLossTimer(T(45), &e);
  EXPECT_EQ(Pns(e.lost), (std::vector<uint64_t>{1}));
  EXPECT_EQ(d.LossTime(), Timestamp::Infinite());
  EXPECT_EQ(d.bytes_in_flight(), 0u);
}

TEST(UdpLossTest, ReorderedAckWithinThresholdIsNotLoss) {
  LossDetector d(kMaxAckDelay);
  for (uint64_t pn = 1; pn <= 4; ++pn) d.OnPacketSent(pn, Data(T(pn), pn * 950));
  LossEvent e;
  ASSERT_TRUE(d.OnAck(Ack({{3, 3}}), T(43), &e).ok());
  EXPECT_TRUE(e.lost.empty());
  ASSERT_TRUE(d.OnAck(Ack({{3, 4}, {1, 1}}), T(44), &e).ok());
  EXPECT_EQ(Pns(e.acked), (std::vector<uint64_t>{1, 4}));
  ASSERT_TRUE(d.OnAck(Ack({{1, 4}}), T(45), &e).ok());
  EXPECT_EQ(Pns(e.acked), (std::vector<uint64_t>{2}));
  EXPECT_TRUE(e.lost.empty());
}

TEST(UdpLossTest, DuplicateAckChangesNothing) {
  LossDetector d(kMaxAckDelay);
  d.OnPacketSent(1, Data(T(0), 0));
  LossEvent e;
  ASSERT_TRUE(d.OnAck(Ack({{1, 1}}), T(10), &e).ok());
  EXPECT_EQ(e.acked.size(), 1u);
  ASSERT_TRUE(d.OnAck(Ack({{1, 1}}), T(20), &e).ok());
  EXPECT_TRUE(e.acked.empty());
  EXPECT_EQ(d.rtt().latest, TimeDelta::Milliseconds(10));
}

TEST(UdpLossTest, AckOfUnsentPacketIsAnError) {
  LossDetector d(kMaxAckDelay);
  d.OnPacketSent(1, Data(T(0), 0));
  d.OnUntrackedPacketSent(2);
  LossEvent e;
  EXPECT_TRUE(d.OnAck(Ack({{2, 2}}), T(5), &e).ok());  // an untracked pure ACK
  EXPECT_FALSE(d.OnAck(Ack({{3, 3}}), T(5), &e).ok());
}

TEST(UdpLossTest, RttEstimateFollowsRfc9002) {
  LossDetector d(TimeDelta::Milliseconds(25));
  LossEvent e;
  d.OnPacketSent(1, Data(T(0), 0));
  ASSERT_TRUE(d.OnAck(Ack({{1, 1}}), T(100), &e).ok());
  EXPECT_EQ(d.rtt().smoothed, TimeDelta::Milliseconds(100));
  EXPECT_EQ(d.rtt().variation, TimeDelta::Milliseconds(50));
  d.OnPacketSent(2, Data(T(100), 950));
  // 140 ms with 20 ms of reported ack delay: adjusted sample 120 ms.
  ASSERT_TRUE(d.OnAck(Ack({{1, 2}}, 20'000), T(240), &e).ok());
  EXPECT_EQ(d.rtt().latest, TimeDelta::Milliseconds(140));
  EXPECT_EQ(d.rtt().min, TimeDelta::Milliseconds(100));
  EXPECT_EQ(d.rtt().smoothed, TimeDelta::Milliseconds(100) * 7 / 8 + TimeDelta::Milliseconds(120) / 8);
  EXPECT_EQ(d.rtt().variation, (TimeDelta::Milliseconds(50) * 3 + TimeDelta::Milliseconds(20)) / 4);
}

TEST(UdpLossTest, ProbeTimeoutBacksOff) {
  LossDetector d(kMaxAckDelay);
  EXPECT_EQ(d.PtoTime(), Timestamp::Infinite());
  LossEvent e;
  d.OnPacketSent(1, Data(T(0), 0));
  ASSERT_TRUE(d.OnAck(Ack({{1, 1}}), T(100), &e).ok());  // srtt 100, rttvar 50
  d.OnPacketSent(2, Data(T(200), 950));
  // 100 + 4 * 50 + 1 = 301 ms after the last ack-eliciting packet.
  EXPECT_EQ(d.PtoTime(), T(200) + TimeDelta::Milliseconds(301));
  d.OnPtoFired();
  EXPECT_EQ(d.PtoTime(), T(200) + TimeDelta::Milliseconds(602));
  uint64_t pn = 0;
  const SentPacket* oldest = d.OldestOutstandingStream(&pn);
  ASSERT_NE(oldest, nullptr);
  EXPECT_EQ(pn, 2u);
  ASSERT_TRUE(d.OnAck(Ack({{2, 2}}), T(700), &e).ok());
  EXPECT_EQ(d.pto_count(), 0);
  EXPECT_EQ(d.PtoTime(), Timestamp::Infinite());
}

TEST(UdpLossTest, HugeAckRangeCostsOnlyOutstandingPackets) {
  LossDetector d(kMaxAckDelay);
  for (uint64_t pn = 1; pn <= 3; ++pn) d.OnPacketSent(pn, Data(T(0), pn));
  LossEvent e;
  ASSERT_TRUE(d.OnAck(Ack({{0, 3}}), T(1), &e).ok());
  EXPECT_EQ(e.acked.size(), 3u);
}

TEST(UdpRangeSetTest, MergesAndPops) {
  RangeSet s;
  s.Add(10, 20);
  s.Add(30, 40);
  s.Add(20, 30);  // touching: one range
  ASSERT_EQ(s.size(), 1u);
  EXPECT_TRUE(s.Contains(12, 38));
  EXPECT_FALSE(s.Contains(5, 12));
  s.Add(50, 60);
  s.Add(0, 5);
  EXPECT_EQ(s.size(), 3u);
  EXPECT_EQ(s.PopContiguous(0), 5u);
  EXPECT_EQ(s.PopContiguous(5), 5u);  // gap at 5..10
  s.RemoveBelow(35);
  EXPECT_EQ(s.ranges().front(), (std::pair<uint64_t, uint64_t>{35, 40}));
  s.Add(0, 100);
  EXPECT_EQ(s.size(), 1u);
}

TEST(UdpRangeSetTest, OverlapsAnyPartOfARange) {
  RangeSet s;
  s.Add(10, 20);
  s.Add(30, 40);
  EXPECT_FALSE(s.Overlaps(0, 10));  // half-open: touching is not overlapping
  EXPECT_FALSE(s.Overlaps(20, 30));
  EXPECT_FALSE(s.Overlaps(40, 50));
  EXPECT_FALSE(s.Overlaps(15, 15));  // empty
  EXPECT_TRUE(s.Overlaps(19, 21));
  EXPECT_TRUE(s.Overlaps(25, 31));
  EXPECT_TRUE(s.Overlaps(0, 100));
  EXPECT_TRUE(s.Overlaps(32, 33));
}

}  // namespace
}  // namespace longhaul::transport::udp
