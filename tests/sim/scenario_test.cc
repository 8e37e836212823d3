// One test per scenario of issue 3, asserting the figure the issue demands. Label: sim.
#include <cstdio>
#include <string>

#include "gtest/gtest.h"
#include "tests/sim/scenarios.h"

namespace longhaul::sim {
namespace {

constexpr uint64_t kSeed = 1;

class ScenarioTest : public ::testing::Test {
 protected:
  ScenarioResult Run(const std::string& name) {
    ScenarioResult r;
    EXPECT_TRUE(RunScenario(name, kSeed, &r));
    RecordProperty("json", r.json);
    std::printf("%s\n", r.json.c_str());
    return r;
  }
};

TEST_F(ScenarioTest, StartupFindsTheLinkWithoutLossAndDrainsPromptly) {
  const ScenarioResult r = Run("startup");
  EXPECT_NEAR(r.figures.at("bw_estimate_ratio"), 1.0, 0.02);
  EXPECT_NEAR(r.figures.at("bw_estimate_ratio_at_drain"), 1.0, 0.02);
  EXPECT_EQ(r.figures.at("packets_lost"), 0.0);
  EXPECT_GE(r.figures.at("last_growth_round"), 0.0);
  EXPECT_LE(r.figures.at("rounds_growth_to_drain"), 3.0);
}

TEST_F(ScenarioTest, SteadyFillsThePipeWithoutBloat) {
  const ScenarioResult r = Run("steady");
  EXPECT_GE(r.figures.at("utilization"), 0.95);
  EXPECT_LE(r.figures.at("rtt_p50_over_min"), 1.25);
  EXPECT_LE(r.figures.at("rtt_p99_over_min"), 2.0);
}

TEST_F(ScenarioTest, Loss01KeepsGoodput) {
  const ScenarioResult r = Run("loss-0.1");
  EXPECT_GE(r.figures.at("goodput_over_ideal"), 0.95);
}

TEST_F(ScenarioTest, Loss1KeepsGoodputWhileCubicCollapses) {
  const ScenarioResult r = Run("loss-1");
  EXPECT_GE(r.figures.at("goodput_over_ideal"), 0.90);
  // Reported beside it: Cubic collapses (well under half the link).
  EXPECT_LT(r.figures.at("cubic_goodput_over_ideal"), 0.5);
}

// The udp transport's shape on the wan-lossy link: few packets per round make the per-round loss
// rate noisy, and chance rounds above the loss tolerance must not drag the rate down.
TEST_F(ScenarioTest, LossyJumboCoupledFlowsKeepGoodput) {
  const ScenarioResult r = Run("lossy-jumbo");
  EXPECT_GE(r.figures.at("goodput_over_ideal"), 0.94);
}

// The start of a wan-lossy udp transfer: Startup must not end on random loss. Seeds 21, 24 and
// 26 are those (of 1-60) where it did before Startup's loss exit needed a full sample: it ended
// at 0.41, 0.38 and 0.24 of the link, and the first 3 s delivered 0.57, 0.54 and 0.36 of ideal.
TEST_F(ScenarioTest, LossyJumboStartupIsNotEndedByRandomLoss) {
  for (uint64_t seed : {uint64_t{21}, uint64_t{24}, uint64_t{26}}) {
    ScenarioResult r;
    ASSERT_TRUE(RunScenario("lossy-jumbo-start", seed, &r));
    std::printf("%s\n", r.json.c_str());
    EXPECT_GE(r.figures.at("bw_estimate_ratio_at_exit"), 0.9) << "seed " << seed;
    EXPECT_GE(r.figures.at("goodput_over_ideal"), 0.85) << "seed " << seed;
  }
}

TEST_F(ScenarioTest, ShallowBufferEstimatesBandwidthAndBoundsLoss) {
  const ScenarioResult r = Run("shallow");
  EXPECT_NEAR(r.figures.at("bw_estimate_ratio"), 1.0, 0.05);
  EXPECT_LE(r.figures.at("loss_rate"), 0.05);
}

TEST_F(ScenarioTest, StepUpReachesTheNewRateWithinFourSeconds) {
  const ScenarioResult r = Run("step-up");
  EXPECT_GE(r.figures.at("seconds_to_90pct_of_new_rate"), 0.0);
  EXPECT_LE(r.figures.at("seconds_to_90pct_of_new_rate"), 4.0);
}

TEST_F(ScenarioTest, StepDownAdaptsModelAndDrainsQueue) {
  const ScenarioResult r = Run("step-down");
  EXPECT_GE(r.figures.at("rounds_to_bw_shortterm_within_1.1x"), 0.0);
  EXPECT_LE(r.figures.at("rounds_to_bw_shortterm_within_1.1x"), 5.0);
  EXPECT_GE(r.figures.at("seconds_to_rtt_under_1.5x_min"), 0.0);
  EXPECT_LE(r.figures.at("seconds_to_rtt_under_1.5x_min"), 2.0);
}

TEST_F(ScenarioTest, ProbeRttEveryFiveSecondsAtHalfBdpCheaply) {
  const ScenarioResult r = Run("probe-rtt");
  // 60 s: about every 5 s (the first after 5 s), so 10 to 12 entries.
  EXPECT_GE(r.figures.at("probe_rtt_entries"), 10.0);
  EXPECT_LE(r.figures.at("probe_rtt_entries"), 12.0);
  EXPECT_NEAR(r.figures.at("mean_probe_rtt_interval_s"), 5.0, 0.5);
  EXPECT_GE(r.figures.at("min_cwnd_held_at_half_bdp_ms"), 200.0);
  EXPECT_LE(r.figures.at("utilization_loss_from_probe_rtt"), 0.03);
}

TEST_F(ScenarioTest, FourStaggeredFlowsShareFairly) {
  const ScenarioResult r = Run("fair-4");
  EXPECT_GE(r.figures.at("jain"), 0.95);
}

TEST_F(ScenarioTest, EightCoupledFlowsTakeOneShare) {
  const ScenarioResult r = Run("coupled-8v1");
  EXPECT_GE(r.figures.at("aggregate_share"), 0.40);
  EXPECT_LE(r.figures.at("aggregate_share"), 0.60);
  // Reported beside it: eight independent flows take far more than one share.
  EXPECT_GT(r.figures.at("independent8_share"), r.figures.at("aggregate_share"));
}

TEST_F(ScenarioTest, MixedRttFlowsBothGetAShare) {
  const ScenarioResult r = Run("rtt-mix");
  EXPECT_GE(r.figures.at("share_20ms"), 0.10);
  EXPECT_GE(r.figures.at("share_150ms"), 0.10);
}

TEST_F(ScenarioTest, Bbr3AndCubicCoexist) {
  const ScenarioResult r = Run("vs-cubic");
  EXPECT_GE(r.figures.at("bbr3_share_1bdp"), 0.10);
  EXPECT_GE(r.figures.at("cubic_share_1bdp"), 0.10);
  EXPECT_GE(r.figures.at("bbr3_share_4bdp"), 0.10);
  EXPECT_GE(r.figures.at("cubic_share_4bdp"), 0.10);
}

// The `fairness` pair of docs/benchmarks.md in the simulator (8 coupled flows, MTU-9000
// packets) against one BBRv1 flow: the aggregate's share is in the 0.35-0.65 band the bench pair
// is judged by, BBRv1 keeps losing packets (the real pair: 1.9 % retransmits), and eight
// independent flows take more than the coupled aggregate.
TEST_F(ScenarioTest, CoupledAggregateSharesWithBbr1) {
  const ScenarioResult r = Run("vs-bbr1");
  EXPECT_GE(r.figures.at("bbr1_retransmit_rate"), 0.01);
  EXPECT_GE(r.figures.at("aggregate_share"), 0.35);
  EXPECT_LE(r.figures.at("aggregate_share"), 0.65);
  EXPECT_GT(r.figures.at("independent8_share"), r.figures.at("aggregate_share"));
}

TEST_F(ScenarioTest, HyStartCubicGetsLessThanSlowStartCubic) {
  const ScenarioResult r = Run("coupled-vs-cubic");
  EXPECT_GE(r.figures.at("cubic_share"), 0.10);
  EXPECT_GT(r.figures.at("aggregate_share"), r.figures.at("aggregate_share_no_hystart"));
}

// The same aggregate against one CUBIC flow (congestion/README.md, "Against CUBIC by buffer
// depth"): in the 0.35-0.65 band at 0.5 and 1 x BDP of buffer, with 9000- and 1500-byte packets.
// Deeper buffers favour CUBIC, as they do BBRv3 itself (the draft's rules: 0.46 at 4 x BDP): 2 and
// 4 x BDP are held to 0.25-0.65, below the band's floor (open work).
TEST_F(ScenarioTest, CoupledAggregateSharesWithCubicAtEveryBufferDepth) {
  const ScenarioResult r = Run("coupled-vs-cubic-buffers");
  for (const char* key :
       {"aggregate_share_0.5bdp", "aggregate_share_1bdp", "aggregate_share_1bdp_mss1500"}) {
    EXPECT_GE(r.figures.at(key), 0.35) << key;
    EXPECT_LE(r.figures.at(key), 0.65) << key;
  }
  for (const char* key : {"aggregate_share_2bdp", "aggregate_share_4bdp"}) {
    EXPECT_GE(r.figures.at(key), 0.25) << key;
    EXPECT_LE(r.figures.at(key), 0.65) << key;
  }
}

TEST_F(ScenarioTest, AppLimitedNeverOverestimatesBandwidth) {
  const ScenarioResult r = Run("app-limited");
  EXPECT_LE(r.figures.at("peak_max_bw_over_link"), 1.02);
}

}  // namespace
}  // namespace longhaul::sim
