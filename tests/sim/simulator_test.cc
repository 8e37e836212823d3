#include "tests/sim/simulator.h"

#include <memory>

#include "congestion/bbr3.h"
#include "congestion/cubic.h"
#include "gtest/gtest.h"
#include "tests/sim/scenarios.h"

namespace longhaul::sim {
namespace {

// A controller with a fixed window and a fixed pacing rate, to check the simulator's arithmetic.
class FixedController final : public congestion::Controller {
 public:
  FixedController(ByteCount cwnd, Bandwidth rate) : cwnd_(cwnd), rate_(rate) {}
  void OnPacketSent(Timestamp, uint64_t, ByteCount, ByteCount, bool) override {}
  void OnCongestionEvent(Timestamp, ByteCount, absl::Span<const congestion::AckedPacket> acked,
                         absl::Span<const congestion::LostPacket> lost) override {
    acked_ += acked.size();
    lost_ += lost.size();
  }
  void OnAppLimited() override {}
  ByteCount cwnd() const override { return cwnd_; }
  Bandwidth pacing_rate() const override { return rate_; }
  ByteCount send_quantum() const override { return 1500; }
  congestion::ControllerState DebugState() const override { return {}; }
  uint64_t acked_ = 0;
  uint64_t lost_ = 0;

 private:
  ByteCount cwnd_;
  Bandwidth rate_;
};

TEST(SimulatorTest, SaturatedLinkCarriesItsRateAndRttIsPropagationPlusQueue) {
  LinkConfig link;
  link.rate = Bandwidth::MbitsPerSecond(100);
  link.queue_bytes = 1 << 30;
  Simulator sim(link, 1);
  FlowConfig f;
  f.rtt = TimeDelta::Milliseconds(20);
  // Window of exactly 1 BDP + 10 packets: the link stays busy with a 10-packet standing queue.
  const ByteCount bdp = link.rate * f.rtt;
  f.controller = std::make_unique<FixedController>(bdp + 10 * 1500, Bandwidth::Zero());
  sim.AddFlow(std::move(f));
  sim.RunUntil(TimeDelta::Seconds(1));
  sim.StartMeasurement();
  sim.RunUntil(TimeDelta::Seconds(3));
  EXPECT_NEAR(sim.Utilization(), 1.0, 0.001);
  EXPECT_EQ(sim.LossRate(), 0.0);
  // 176 packets in flight; the pipe (20 ms + one 120 us serialisation) holds 167.7 of them,
  // so ~8.3 packets queue: RTT = 20.12 ms + 8.3 x 0.12 ms.
  EXPECT_NEAR(sim.RttPercentileMs(0.5), 21.12, 0.03);
}

TEST(SimulatorTest, DropTailQueueDropsWhatDoesNotFit) {
  LinkConfig link;
  link.rate = Bandwidth::MbitsPerSecond(10);
  link.queue_bytes = 15000;  // 10 packets.
  Simulator sim(link, 1);
  FlowConfig f;
  f.controller = std::make_unique<FixedController>(1 << 30, Bandwidth::Zero());
  auto* cc = static_cast<FixedController*>(f.controller.get());
  sim.AddFlow(std::move(f));
  sim.RunUntil(TimeDelta::Seconds(2));
  EXPECT_GT(sim.flow_stats(0).packets_dropped, 0u);
  EXPECT_GT(cc->lost_, 0u);
  EXPECT_LE(sim.RttPercentileMs(0.99), 40.0 + 11 * 1.2 + 0.1);
}

TEST(SimulatorTest, RandomLossMatchesConfiguredRate) {
  LinkConfig link;
  link.rate = Bandwidth::MbitsPerSecond(100);
  link.queue_bytes = 1 << 30;
  link.loss = 0.01;
  Simulator sim(link, 7);
  FlowConfig f;
  f.controller = std::make_unique<FixedController>(500000, Bandwidth::MbitsPerSecond(90));
  sim.AddFlow(std::move(f));
  sim.RunUntil(TimeDelta::Seconds(10));
  EXPECT_NEAR(sim.LossRate(), 0.01, 0.001);
}

TEST(SimulatorTest, RateChangeTakesEffect) {
  LinkConfig link;
  link.rate = Bandwidth::MbitsPerSecond(100);
  link.queue_bytes = 1 << 30;
  link.rate_changes = {RateChange{TimeDelta::Seconds(1), Bandwidth::MbitsPerSecond(50)}};
  Simulator sim(link, 1);
  FlowConfig f;
  f.controller = std::make_unique<FixedController>(1 << 22, Bandwidth::Zero());
  sim.AddFlow(std::move(f));
  sim.RunUntil(TimeDelta::Seconds(2));
  sim.StartMeasurement();
  const ByteCount before = sim.link_bytes_total();
  sim.RunUntil(TimeDelta::Seconds(3));
  EXPECT_NEAR(static_cast<double>(sim.link_bytes_total() - before) * 8 / 1e6, 50.0, 0.1);
  EXPECT_NEAR(sim.Utilization(), 1.0, 0.001);
}

TEST(SimulatorTest, AckAggregationBatchesAcks) {
  LinkConfig link;
  link.rate = Bandwidth::MbitsPerSecond(100);
  link.queue_bytes = 1 << 30;
  link.ack_aggregation = TimeDelta::Milliseconds(5);
  Simulator sim(link, 1);
  FlowConfig f;
  f.controller = std::make_unique<FixedController>(1 << 20, Bandwidth::Zero());
  auto* cc = static_cast<FixedController*>(f.controller.get());
  sim.AddFlow(std::move(f));
  sim.RunUntil(TimeDelta::Seconds(1));
  // Every ACK was delivered, but in batches: the RTT samples include the hold time.
  EXPECT_GT(cc->acked_, 1000u);
  EXPECT_GT(sim.RttPercentileMs(0.99), sim.RttPercentileMs(0.01) + 3.0);
}

TEST(SimulatorTest, SameSeedGivesByteIdenticalJson) {
  ScenarioResult a, b, c;
  ASSERT_TRUE(RunScenario("app-limited", 7, &a));
  ASSERT_TRUE(RunScenario("app-limited", 7, &b));
  ASSERT_TRUE(RunScenario("app-limited", 8, &c));
  EXPECT_EQ(a.json, b.json);
  EXPECT_NE(a.json, c.json);
}

TEST(SimulatorTest, ListsEveryScenarioOfTheIssue) {
  const std::vector<std::string> want = {
      "startup",   "steady",           "loss-0.1",
      "loss-1",    "lossy-jumbo",      "lossy-jumbo-start",
      "shallow",   "step-up",          "step-down",
      "probe-rtt", "fair-4",           "coupled-8v1",
      "rtt-mix",   "vs-cubic",         "app-limited",
      "vs-bbr1",   "coupled-vs-cubic", "coupled-vs-cubic-buffers"};
  EXPECT_EQ(ScenarioNames(), want);
  ScenarioResult r;
  EXPECT_FALSE(RunScenario("no-such-scenario", 1, &r));
}

}  // namespace
}  // namespace longhaul::sim
