#include "congestion/bbr3.h"

#include <functional>
#include <string_view>
#include <vector>

#include "gtest/gtest.h"
#include "tests/congestion/mini_path.h"

namespace longhaul::congestion {
namespace {

const Timestamp kT0 = Timestamp::FromNanoseconds(1000000000);
const Bandwidth kRate = Bandwidth::MbitsPerSecond(100);
const TimeDelta kRtt = TimeDelta::Milliseconds(20);

TEST(Bbr3ParamsTest, DefaultsAreTheDraftConstants) {
  const Bbr3Params p;
  EXPECT_DOUBLE_EQ(p.startup_pacing_gain, 2.77);
  EXPECT_DOUBLE_EQ(p.drain_pacing_gain, 0.5);
  EXPECT_DOUBLE_EQ(p.probe_bw_down_pacing_gain, 0.9);
  EXPECT_DOUBLE_EQ(p.probe_bw_cruise_pacing_gain, 1.0);
  EXPECT_DOUBLE_EQ(p.probe_bw_refill_pacing_gain, 1.0);
  EXPECT_DOUBLE_EQ(p.probe_bw_up_pacing_gain, 1.25);
  EXPECT_DOUBLE_EQ(p.default_cwnd_gain, 2.0);
  EXPECT_DOUBLE_EQ(p.probe_bw_up_cwnd_gain, 2.25);
  EXPECT_DOUBLE_EQ(p.loss_threshold, 0.02);
  EXPECT_DOUBLE_EQ(p.beta, 0.7);
  EXPECT_DOUBLE_EQ(p.headroom, 0.15);
  EXPECT_DOUBLE_EQ(p.full_bw_growth, 1.25);
  EXPECT_EQ(p.full_bw_rounds, 3);
  EXPECT_EQ(p.min_rtt_filter_len, TimeDelta::Seconds(10));
  EXPECT_EQ(p.probe_rtt_interval, TimeDelta::Seconds(5));
  EXPECT_EQ(p.probe_rtt_duration, TimeDelta::Milliseconds(200));
  EXPECT_DOUBLE_EQ(p.probe_rtt_cwnd_gain, 0.5);
}

TEST(Bbr3Test, StartsInStartupWithInitialWindow) {
  SplitMix64Random rng(1);
  Bbr3 bbr(Bbr3Params(), rng, kT0);
  EXPECT_EQ(bbr.mode(), Bbr3::Mode::kStartup);
  EXPECT_EQ(bbr.cwnd(), 10 * kDefaultMss);
  // No RTT yet: InitialCwnd / 1 ms at the Startup gain.
  EXPECT_NEAR(bbr.pacing_rate().ToMbitsPerSecondF(), 120.0 * 2.77, 1.0);
  EXPECT_EQ(bbr.DebugState().state, "Startup");
}

TEST(Bbr3Test, FindsThePipeThenDrainsIntoProbeBw) {
  SplitMix64Random rng(1);
  Bbr3 bbr(Bbr3Params(), rng, kT0);
  testing::MiniPath path(bbr, kRate, kRtt, kT0);
  bool saw_drain = false;
  path.RunUntil(kT0 + TimeDelta::Seconds(2),
                [&] { saw_drain |= bbr.mode() == Bbr3::Mode::kDrain; });
  EXPECT_TRUE(saw_drain);
  const ControllerState st = bbr.DebugState();
  EXPECT_TRUE(st.full_bw_reached);
  EXPECT_NE(st.state.find("ProbeBW"), std::string_view::npos) << st.state;
  EXPECT_NEAR(st.max_bw.ToMbitsPerSecondF(), 100.0, 2.0);
  EXPECT_NEAR(st.min_rtt.ToMillisecondsF(), 20.12, 0.05);
  // cwnd is about cwnd_gain x BDP, not unbounded.
  const ByteCount bdp = kRate * kRtt;
  EXPECT_LE(st.cwnd, 3 * bdp);
}

TEST(Bbr3Test, EntersProbeRttEveryFiveSecondsAndHoldsHalfBdp) {
  SplitMix64Random rng(1);
  Bbr3 bbr(Bbr3Params(), rng, kT0);
  testing::MiniPath path(bbr, kRate, kRtt, kT0);
  int entries = 0;
  bool in_probe_rtt = false;
  ByteCount max_cwnd_in_probe_rtt = 0;
  path.RunUntil(kT0 + TimeDelta::Seconds(11), [&] {
    const bool now_in = bbr.mode() == Bbr3::Mode::kProbeRtt;
    if (now_in && !in_probe_rtt) ++entries;
    if (now_in) max_cwnd_in_probe_rtt = std::max(max_cwnd_in_probe_rtt, bbr.cwnd());
    in_probe_rtt = now_in;
  });
  EXPECT_EQ(entries, 2);
  EXPECT_LE(max_cwnd_in_probe_rtt, (kRate * kRtt) / 2 + 4 * kDefaultMss);
  EXPECT_EQ(bbr.DebugState().probe_rtt_entries, 2u);
}

TEST(Bbr3Test, HeavyLossWhileProbingSetsInflightLongterm) {
  SplitMix64Random rng(1);
  Bbr3 bbr(Bbr3Params(), rng, kT0);
  testing::MiniPath path(bbr, kRate, kRtt, kT0);
  path.RunUntil(kT0 + TimeDelta::Seconds(1));
  ASSERT_TRUE(bbr.DebugState().full_bw_reached);
  // Drop 10 % of packets from now on: far above the 2 % LossThresh.
  path.set_drop([](uint64_t pn) { return pn % 10 == 0; });
  path.RunUntil(kT0 + TimeDelta::Seconds(8));
  const ControllerState st = bbr.DebugState();
  EXPECT_NE(st.inflight_longterm, ~ByteCount{0});
  EXPECT_LT(st.inflight_longterm, 3 * (kRate * kRtt));
}

// Bbr3Params::heavy_loss_rate (a longhaul deviation): a round outside bandwidth probing that
// loses most of its data restarts max_bw from what the round delivered; with the option off
// (the draft), max_bw keeps the old rate until it ages out over two ProbeBW cycles.
Bandwidth MaxBwAfterHeavyLoss(double heavy_loss_rate) {
  SplitMix64Random rng(1);
  Bbr3Params params;
  params.heavy_loss_rate = heavy_loss_rate;
  Bbr3 bbr(params, rng, kT0);
  testing::MiniPath path(bbr, kRate, kRtt, kT0);
  path.RunUntil(kT0 + TimeDelta::Seconds(1));
  EXPECT_TRUE(bbr.DebugState().full_bw_reached);
  // Three of every four packets lost, for 0.3 s (about ten rounds).
  path.set_drop([](uint64_t pn) { return pn % 4 != 0; });
  path.RunUntil(kT0 + TimeDelta::Milliseconds(1300));
  return bbr.DebugState().max_bw;
}

TEST(Bbr3Test, HeavyLossRestartsMaxBwFromTheDeliveredRate) {
  EXPECT_LT(MaxBwAfterHeavyLoss(0.3), kRate * 0.5);
  EXPECT_GT(MaxBwAfterHeavyLoss(0.0), kRate * 0.9);
}

// A Bbr3 with `params` on the 100 Mbit/s, 20 ms MiniPath, run for 1 s: past Startup, in ProbeBW.
struct FlowInProbeBw {
  explicit FlowInProbeBw(const Bbr3Params& params)
      : bbr(params, rng, kT0), path(bbr, kRate, kRtt, kT0) {
    path.RunUntil(kT0 + TimeDelta::Seconds(1));
    EXPECT_TRUE(bbr.DebugState().full_bw_reached);
  }
  SplitMix64Random rng{1};
  Bbr3 bbr;
  testing::MiniPath path;
};

// Bbr3Params::standing_queue_loss_tolerance (a longhaul deviation): a queue someone else keeps
// standing (the RTT doubled) with 5 % loss that goes on whatever the flow does, as a loss-blind
// competitor causes. With the option the flow keeps its rate for 8 s, longer than max_bw's
// window, so neither the short-term bounds nor loss recovery may wear it down; without it (0)
// every lossy round cuts bw_shortterm and the pacing rate falls round after round.
struct InSomeoneElsesLossyQueue {
  Bandwidth lowest_pacing_rate = Bandwidth::Infinite();
  int probes = 0;                // ProbeBW_UP entries in the 8 s.
  double highest_up_gain = 0.0;  // The highest pacing gain seen in ProbeBW_UP.
};

InSomeoneElsesLossyQueue RunInSomeoneElsesLossyQueue(const Bbr3Params& params) {
  FlowInProbeBw flow(params);
  Bbr3& bbr = flow.bbr;
  testing::MiniPath& path = flow.path;
  path.set_extra_delay(kRtt);
  path.set_drop([](uint64_t pn) { return pn % 20 == 0; });
  InSomeoneElsesLossyQueue r;
  Bbr3::Mode last_mode = bbr.mode();
  path.RunUntil(kT0 + TimeDelta::Seconds(9), [&] {
    if (bbr.mode() != Bbr3::Mode::kProbeRtt) {
      r.lowest_pacing_rate = std::min(r.lowest_pacing_rate, bbr.pacing_rate());
    }
    if (bbr.mode() == Bbr3::Mode::kProbeBwUp) {
      if (last_mode != Bbr3::Mode::kProbeBwUp) ++r.probes;
      r.highest_up_gain = std::max(r.highest_up_gain, bbr.DebugState().pacing_gain);
    }
    last_mode = bbr.mode();
  });
  return r;
}

Bbr3Params WithLossTolerance(double tolerance) {
  Bbr3Params params;
  params.standing_queue_loss_tolerance = tolerance;
  return params;
}

Bbr3Params WithDraftCadence() {
  Bbr3Params params;
  params.competing_probe_rounds = 0;
  return params;
}

TEST(Bbr3Test, LossInSomeoneElsesStandingQueueIsToleratedUpToTheLimit) {
  EXPECT_GT(RunInSomeoneElsesLossyQueue(Bbr3Params()).lowest_pacing_rate, kRate * 0.8);
  EXPECT_GT(RunInSomeoneElsesLossyQueue(WithDraftCadence()).lowest_pacing_rate, kRate * 0.8);
  EXPECT_LT(RunInSomeoneElsesLossyQueue(WithLossTolerance(0.0)).lowest_pacing_rate, kRate * 0.5);
}

// Bbr3Params::competing_probe_rounds (a longhaul deviation): in someone else's standing queue the
// flow probes every few round trips (40 ms here), as a BBRv1 competitor does, instead of every
// 2-3 s.
TEST(Bbr3Test, ProbesAsOftenAsALossBlindCompetitorInItsQueue) {
  EXPECT_GE(RunInSomeoneElsesLossyQueue(Bbr3Params()).probes, 8);
  EXPECT_LE(RunInSomeoneElsesLossyQueue(WithDraftCadence()).probes, 4);
}

// Bbr3Params::competing_probe_up_pacing_gain (a longhaul deviation): in someone else's standing
// queue ProbeBW_UP paces at 1.5 x, elsewhere at the draft's 1.25 x.
TEST(Bbr3Test, ProbesHarderInSomeoneElsesQueue) {
  EXPECT_DOUBLE_EQ(RunInSomeoneElsesLossyQueue(Bbr3Params()).highest_up_gain, 1.5);
  EXPECT_DOUBLE_EQ(RunInSomeoneElsesLossyQueue(WithLossTolerance(0.0)).highest_up_gain, 1.25);
}

// The loss-blind-competitor flag (loss_tolerant) in such a competitor's lossy standing queue (as
// in RunInSomeoneElsesLossyQueue), when the queue empties for `length`, starting from 4 s (the
// flag has held about 3 s by then) at the first moment the flow is in `drain_from`. Returns
// whether the flag was set before the drain and held through it.
// The competing allowance is 50 KB here: the default 3.6 MB would be a 290 ms queue of the flow's
// own at 100 Mbit/s, which no drain of the competitor's could empty.
struct ThroughADrain {
  bool flagged_before = false;
  bool held_through_drain = true;
};

ThroughADrain RunThroughADrain(Bbr3Params params, Bbr3::Mode drain_from, TimeDelta length) {
  params.competing_standing_queue_allowance_bytes = 50 * 1000;
  FlowInProbeBw flow(params);
  Bbr3& bbr = flow.bbr;
  testing::MiniPath& path = flow.path;
  path.set_extra_delay(kRtt);
  path.set_drop([](uint64_t pn) { return pn % 20 == 0; });
  path.RunUntil(kT0 + TimeDelta::Seconds(4));
  ThroughADrain r;
  r.flagged_before = bbr.DebugState().loss_tolerant;
  Timestamp drain_end = Timestamp::Infinite();
  path.RunUntil(kT0 + TimeDelta::Seconds(10), [&] {
    if (drain_end.IsInfinite()) {
      if (bbr.mode() != drain_from) return;
      drain_end = path.now() + length;
      path.set_extra_delay(TimeDelta::Zero());
    }
    if (path.now() < drain_end) {
      r.held_through_drain = r.held_through_drain && bbr.DebugState().loss_tolerant;
    } else {
      path.set_extra_delay(kRtt);
    }
  });
  EXPECT_FALSE(drain_end.IsInfinite());
  return r;
}

// A flag that stays younger than competing_flag_settle_time for the whole run.
Bbr3Params WithFlagThatNeverSettles() {
  Bbr3Params params;
  params.competing_flag_settle_time = TimeDelta::Seconds(100);
  return params;
}

// A queue-free round of the flow's own ProbeRTT never ends the flag: a BBRv1 competitor often
// drains in the same 200 ms.
TEST(Bbr3Test, TheFlowsOwnProbeRttDoesNotEndTheLossBlindCompetitorFlag) {
  const ThroughADrain r = RunThroughADrain(WithFlagThatNeverSettles(), Bbr3::Mode::kProbeRtt,
                                           TimeDelta::Milliseconds(100));
  EXPECT_TRUE(r.flagged_before);
  EXPECT_TRUE(r.held_through_drain);
}

// Bbr3Params::competing_flag_settle_time and competing_queue_gone_time: a flag that has held 2 s
// rides out a 200 ms queue-free gap in ProbeBW_CRUISE (a BBRv1 competitor's ProbeRTT), but not a
// gap of 1 s (the competitor left; at this path's 20 ms round trips the flow's own probes take
// about half of it, and their rounds do not count towards the 300 ms); a younger flag ends at
// the first queue-free round.
TEST(Bbr3Test, ASettledLossBlindCompetitorFlagRidesOutItsProbeRtt) {
  const TimeDelta probe_rtt = TimeDelta::Milliseconds(200);
  const ThroughADrain settled =
      RunThroughADrain(Bbr3Params(), Bbr3::Mode::kProbeBwCruise, probe_rtt);
  EXPECT_TRUE(settled.flagged_before);
  EXPECT_TRUE(settled.held_through_drain);

  const ThroughADrain left =
      RunThroughADrain(Bbr3Params(), Bbr3::Mode::kProbeBwCruise, TimeDelta::Seconds(1));
  EXPECT_TRUE(left.flagged_before);
  EXPECT_FALSE(left.held_through_drain);

  const ThroughADrain young =
      RunThroughADrain(WithFlagThatNeverSettles(), Bbr3::Mode::kProbeBwCruise, probe_rtt);
  EXPECT_TRUE(young.flagged_before);
  EXPECT_FALSE(young.held_through_drain);
}

// Whether the flow ever decided it was in someone else's standing queue (loss_tolerant) in 9 s on
// a path whose RTT doubled (a standing queue) and which drops the packets `drop` picks, given the
// packet number and the time since the start.
bool BecomesLossTolerantInAQueue(const Bbr3Params& params,
                                 std::function<bool(uint64_t pn, TimeDelta since_start)> drop) {
  FlowInProbeBw flow(params);
  Bbr3& bbr = flow.bbr;
  testing::MiniPath& path = flow.path;
  path.set_extra_delay(kRtt);
  path.set_drop([&path, &drop](uint64_t pn) { return drop(pn, path.now() - kT0); });
  bool loss_tolerant = false;
  path.RunUntil(kT0 + TimeDelta::Seconds(9),
                [&] { loss_tolerant = loss_tolerant || bbr.DebugState().loss_tolerant; });
  return loss_tolerant;
}

// One packet in 100: random loss, below Bbr3Params::random_loss_tolerance.
bool BecomesLossTolerantWithRandomLossInAQueue(const Bbr3Params& params) {
  return BecomesLossTolerantInAQueue(params, [](uint64_t pn, TimeDelta) { return pn % 100 == 0; });
}

// Only loss above random loss marks a round as lossy for the standing-queue flag: alone on the
// wan-lossy link (1 % loss), the queue of the flow's own ProbeBW_UP plus random loss set it, and
// the flow then kept overflowing its own queue (see congestion/README.md).
TEST(Bbr3Test, RandomLossInAStandingQueueIsNotACompetitor) {
  EXPECT_FALSE(BecomesLossTolerantWithRandomLossInAQueue(Bbr3Params()));
  Bbr3Params any_loss_counts;
  any_loss_counts.random_loss_tolerance = 0.0;
  EXPECT_TRUE(BecomesLossTolerantWithRandomLossInAQueue(any_loss_counts));
}

// Bbr3Params::standing_queue_foreign_lossy_rounds (a longhaul deviation): in a queue someone else
// keeps standing, a loss burst every 160 ms, as BBRv1 overfills the buffer once per gain cycle,
// is every fourth round of this 40 ms path: 2 lossy rounds in 8, under
// standing_queue_lossy_rounds, but 6 in 24 rounds outside the flow's own probes.
bool BecomesLossTolerantBesideAPeriodicOverfill(const Bbr3Params& params) {
  // The first 2 ms of every 160 ms: about 17 packets, 10 % of a round.
  return BecomesLossTolerantInAQueue(params, [](uint64_t, TimeDelta since_start) {
    return since_start.ToNanoseconds() % 160000000 < 2000000;
  });
}

TEST(Bbr3Test, LossThatRecursEveryFewRoundsOutsideItsProbesIsALossBlindCompetitor) {
  EXPECT_TRUE(BecomesLossTolerantBesideAPeriodicOverfill(Bbr3Params()));
  Bbr3Params eight_rounds_only;
  eight_rounds_only.standing_queue_foreign_lossy_rounds = 0;
  EXPECT_FALSE(BecomesLossTolerantBesideAPeriodicOverfill(eight_rounds_only));
}

// Bbr3Params::loss_based_competitor_cubic_c (a longhaul deviation): in a queue someone else
// keeps standing, a loss episode once a second (a loss-based flow filling the buffer, as CUBIC
// does) makes the flow wait CUBIC's epoch between probes: K = cbrt(167 x 0.3 / 0.4) = 5.0 s for
// the 167-packet BDP of this path. With the draft's cadence (0) it probes 2-3 s (or 63 rounds)
// after the last probe ended. The loss is not loss-blind competition: the flow stays
// loss-intolerant.
struct BesideALossBasedFlow {
  std::vector<Timestamp> probe_starts;  // ProbeBW_REFILL entries.
  bool loss_tolerant = false;
};

// A flow in ProbeBW for 10.5 s, before min_rtt (10 s) expires and takes the extra delay in, on a
// path whose queue is `queue_at(since_start)` for the packets sent then and which drops the
// packets `drop` picks (none if empty).
BesideALossBasedFlow RunInAQueue(const Bbr3Params& params,
                                 const std::function<TimeDelta(TimeDelta)>& queue_at,
                                 const std::function<bool(TimeDelta since_start)>& drop) {
  FlowInProbeBw flow(params);
  Bbr3& bbr = flow.bbr;
  testing::MiniPath& path = flow.path;
  path.set_extra_delay(queue_at(path.now() - kT0));
  if (drop) path.set_drop([&path, &drop](uint64_t) { return drop(path.now() - kT0); });
  BesideALossBasedFlow r;
  Bbr3::Mode last_mode = bbr.mode();
  path.RunUntil(kT0 + TimeDelta::Milliseconds(10500), [&] {
    path.set_extra_delay(queue_at(path.now() - kT0));
    if (bbr.mode() == Bbr3::Mode::kProbeBwRefill && last_mode != Bbr3::Mode::kProbeBwRefill) {
      r.probe_starts.push_back(path.now());
    }
    r.loss_tolerant = r.loss_tolerant || bbr.DebugState().loss_tolerant;
    last_mode = bbr.mode();
  });
  return r;
}

BesideALossBasedFlow RunBesideALossBasedFlow(const Bbr3Params& params) {
  // The first 2 ms of every second: about 17 packets, 10 % of a round.
  return RunInAQueue(
      params, [](TimeDelta) { return kRtt / 2; },
      [](TimeDelta since_start) { return since_start.ToNanoseconds() % 1000000000 < 2000000; });
}

TimeDelta LongestGap(const std::vector<Timestamp>& starts) {
  TimeDelta longest = TimeDelta::Zero();
  for (size_t i = 1; i < starts.size(); ++i) longest = std::max(longest, starts[i] - starts[i - 1]);
  return longest;
}

// The first probe (1.9 s) follows the draft's cadence after Startup; its cycle met the loss, so
// the second waits K (5.0 s) plus up to 1 s.
TEST(Bbr3Test, WaitsCubicsEpochBetweenProbesBesideALossBasedFlow) {
  const BesideALossBasedFlow paced = RunBesideALossBasedFlow(Bbr3Params());
  EXPECT_FALSE(paced.loss_tolerant);
  ASSERT_GE(paced.probe_starts.size(), 2u);
  EXPECT_GE(LongestGap(paced.probe_starts), TimeDelta::Seconds(5));

  Bbr3Params draft_cadence;
  draft_cadence.loss_based_competitor_cubic_c = 0;
  const BesideALossBasedFlow draft = RunBesideALossBasedFlow(draft_cadence);
  EXPECT_FALSE(draft.loss_tolerant);
  ASSERT_GE(draft.probe_starts.size(), 3u);
  EXPECT_LT(LongestGap(draft.probe_starts), TimeDelta::Seconds(4));
}

// Bbr3Params::loss_based_competitor_shallow_queue_rounds (a longhaul deviation): without any loss,
// a queue someone else keeps standing just past the standing-queue margin (5 ms of this 20 ms
// path) and under shallow_queue_rtt_fraction (7.5 ms) is a smaller CUBIC flow's: after the first
// probe the flow waits two CUBIC epochs (2 x 5.0 s), so no second probe comes before the run ends
// at 10.5 s. A deeper queue (10 ms), one that is shallow only 300 ms of every second (a larger
// CUBIC flow after its losses), or the rule off, keeps the draft's 2-3 s cadence.
std::vector<Timestamp> ProbeStartsInAQueue(const Bbr3Params& params,
                                           const std::function<TimeDelta(TimeDelta)>& queue_at) {
  return RunInAQueue(params, queue_at, nullptr).probe_starts;
}

TEST(Bbr3Test, WaitsTwoCubicEpochsInAShallowQueueWithoutLoss) {
  const auto shallow = [](TimeDelta) { return TimeDelta::Microseconds(5500); };
  const auto deep = [](TimeDelta) { return TimeDelta::Milliseconds(10); };
  const auto mostly_deep = [](TimeDelta since_start) {
    return since_start.ToNanoseconds() % 1000000000 < 300000000 ? TimeDelta::Microseconds(5500)
                                                                : TimeDelta::Milliseconds(10);
  };
  EXPECT_EQ(ProbeStartsInAQueue(Bbr3Params(), shallow).size(), 1u);
  EXPECT_GE(ProbeStartsInAQueue(Bbr3Params(), deep).size(), 3u);
  EXPECT_GE(ProbeStartsInAQueue(Bbr3Params(), mostly_deep).size(), 3u);
  Bbr3Params rule_off;
  rule_off.loss_based_competitor_shallow_queue_rounds = 0;
  EXPECT_GE(ProbeStartsInAQueue(rule_off, shallow).size(), 3u);
}

// Bbr3Params::max_bw_grows_only_when_probing (a longhaul deviation): a sender that overshoots its
// pacing rate by 10 % on a path that just doubled delivers samples above max_bw between probes.
// With the option max_bw rises only in Startup, ProbeBW_REFILL and ProbeBW_UP; without it (the
// draft) it creeps up while the flow cruises.
bool MaxBwRisesOutsideProbing(const Bbr3Params& params) {
  FlowInProbeBw flow(params);
  Bbr3& bbr = flow.bbr;
  testing::MiniPath& path = flow.path;
  path.set_rate(kRate * 2.0);
  path.set_pacing_scale(1.1);
  Bandwidth last_max_bw = bbr.DebugState().max_bw;
  bool rose_outside_probing = false;
  path.RunUntil(kT0 + TimeDelta::Seconds(6), [&] {
    const Bandwidth max_bw = bbr.DebugState().max_bw;
    const bool probing =
        bbr.mode() == Bbr3::Mode::kProbeBwRefill || bbr.mode() == Bbr3::Mode::kProbeBwUp;
    if (max_bw > last_max_bw && !probing) rose_outside_probing = true;
    last_max_bw = max_bw;
  });
  return rose_outside_probing;
}

TEST(Bbr3Test, MaxBwGrowsOnlyWhileProbing) {
  EXPECT_FALSE(MaxBwRisesOutsideProbing(Bbr3Params()));
  Bbr3Params draft;
  draft.max_bw_grows_only_when_probing = false;
  EXPECT_TRUE(MaxBwRisesOutsideProbing(draft));
}

TEST(Bbr3Test, SameSeedSameTrajectory) {
  SplitMix64Random rng_a(42);
  SplitMix64Random rng_b(42);
  Bbr3 a(Bbr3Params(), rng_a, kT0);
  Bbr3 b(Bbr3Params(), rng_b, kT0);
  testing::MiniPath pa(a, kRate, kRtt, kT0);
  testing::MiniPath pb(b, kRate, kRtt, kT0);
  pa.RunUntil(kT0 + TimeDelta::Seconds(7));
  pb.RunUntil(kT0 + TimeDelta::Seconds(7));
  EXPECT_EQ(a.cwnd(), b.cwnd());
  EXPECT_EQ(a.pacing_rate(), b.pacing_rate());
  EXPECT_EQ(a.DebugState().round_count, b.DebugState().round_count);
}

}  // namespace
}  // namespace longhaul::congestion
