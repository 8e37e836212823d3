#include "congestion/bbr1.h"

#include <set>

#include "gtest/gtest.h"
#include "tests/congestion/mini_path.h"

namespace longhaul::congestion {
namespace {

const Timestamp kT0 = Timestamp::FromNanoseconds(1000000000);
const Bandwidth kRate = Bandwidth::MbitsPerSecond(100);
const TimeDelta kRtt = TimeDelta::Milliseconds(20);

TEST(Bbr1Test, StartsInStartupAtHighGain) {
  SplitMix64Random rng(1);
  Bbr1 bbr(Bbr1Params(), rng, kT0);
  EXPECT_EQ(bbr.mode(), Bbr1::Mode::kStartup);
  EXPECT_EQ(bbr.cwnd(), 10 * kDefaultMss);
  EXPECT_DOUBLE_EQ(bbr.DebugState().pacing_gain, 2.885);
}

TEST(Bbr1Test, FindsThePipeAndKeepsTwoBdpInFlight) {
  SplitMix64Random rng(1);
  Bbr1 bbr(Bbr1Params(), rng, kT0);
  testing::MiniPath path(bbr, kRate, kRtt, kT0);
  bool saw_drain = false;
  std::set<double> gains;
  path.RunUntil(kT0 + TimeDelta::Seconds(3), [&] {
    saw_drain |= bbr.mode() == Bbr1::Mode::kDrain;
    if (bbr.mode() == Bbr1::Mode::kProbeBw) gains.insert(bbr.DebugState().pacing_gain);
  });
  EXPECT_TRUE(saw_drain);
  const ControllerState st = bbr.DebugState();
  EXPECT_EQ(st.state, "ProbeBW");
  EXPECT_NEAR(st.max_bw.ToMbitsPerSecondF(), 100.0, 2.0);
  // The eight-phase gain cycle: probe, drain, cruise.
  EXPECT_EQ(gains, (std::set<double>{0.75, 1.0, 1.25}));
  // cwnd = 2 x BDP plus the quantization budget (3 send quanta of 1 ms at the pacing rate).
  const ByteCount bdp = kRate * kRtt;
  EXPECT_GE(st.cwnd, 2 * bdp);
  EXPECT_LE(st.cwnd, 2 * bdp + 3 * 64 * 1024);
}

// The property the simulator's fairness scenarios rely on: loss alone never lowers BtlBw or the
// 2 x BDP window (BBRv3 would cut inflight_longterm; see Bbr3Test).
TEST(Bbr1Test, LossDoesNotShrinkTheModel) {
  SplitMix64Random rng(1);
  Bbr1 bbr(Bbr1Params(), rng, kT0);
  testing::MiniPath path(bbr, kRate, kRtt, kT0);
  path.RunUntil(kT0 + TimeDelta::Seconds(1));
  ASSERT_EQ(bbr.mode(), Bbr1::Mode::kProbeBw);
  path.set_drop([](uint64_t pn) { return pn % 100 == 0; });  // 1 % loss.
  ByteCount min_cwnd_late = ~ByteCount{0};
  path.RunUntil(kT0 + TimeDelta::Seconds(8), [&] {
    if (bbr.mode() == Bbr1::Mode::kProbeBw) min_cwnd_late = std::min(min_cwnd_late, bbr.cwnd());
  });
  const ControllerState st = bbr.DebugState();
  EXPECT_GE(st.max_bw.ToMbitsPerSecondF(), 90.0);
  // Recovery holds cwnd at what is in flight (about one BDP) for a round trip, never lower.
  EXPECT_GE(min_cwnd_late, (kRate * kRtt) * 9 / 10);
}

TEST(Bbr1Test, ProbeRttHoldsFourPackets) {
  SplitMix64Random rng(1);
  Bbr1 bbr(Bbr1Params(), rng, kT0);
  testing::MiniPath path(bbr, kRate, kRtt, kT0);
  int entries = 0;
  bool in_probe_rtt = false;
  ByteCount max_cwnd_in_probe_rtt = 0;
  path.RunUntil(kT0 + TimeDelta::Seconds(12), [&] {
    const bool now_in = bbr.mode() == Bbr1::Mode::kProbeRtt;
    if (now_in && !in_probe_rtt) ++entries;
    if (now_in) max_cwnd_in_probe_rtt = std::max(max_cwnd_in_probe_rtt, bbr.cwnd());
    in_probe_rtt = now_in;
  });
  // The 2 x BDP window keeps a standing queue, so RTprop expires after 10 s.
  EXPECT_EQ(entries, 1);
  EXPECT_LE(max_cwnd_in_probe_rtt, 4 * kDefaultMss);
}

}  // namespace
}  // namespace longhaul::congestion
