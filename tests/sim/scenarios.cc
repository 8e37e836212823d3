#include "tests/sim/scenarios.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "congestion/aggregate_controller.h"
#include "congestion/bbr1.h"
#include "congestion/bbr3.h"
#include "congestion/cubic.h"
#include "tests/sim/simulator.h"

namespace longhaul::sim {
namespace {

using congestion::AggregateController;
using congestion::Bbr1Params;
using congestion::Bbr3Params;
using congestion::Controller;
using congestion::ControllerState;
using congestion::CubicParams;
using congestion::SplitMix64Random;

constexpr ByteCount kMss = congestion::kDefaultMss;

// ---------------------------------------------------------------------------------------------
// A tiny JSON writer with a fixed key order and fixed number formatting (for byte-identical
// output).
class JsonObject {
 public:
  JsonObject& Num(const std::string& key, double v) {
    return Raw(key, std::isfinite(v) ? absl::StrFormat("%.4f", v) : std::string("null"));
  }
  JsonObject& Int(const std::string& key, int64_t v) { return Raw(key, absl::StrFormat("%d", v)); }
  JsonObject& Str(const std::string& key, const std::string& v) {
    return Raw(key, absl::StrFormat("\"%s\"", v));
  }
  JsonObject& Bool(const std::string& key, bool v) { return Raw(key, v ? "true" : "false"); }
  JsonObject& Raw(const std::string& key, const std::string& json) {
    if (!body_.empty()) body_ += ", ";
    body_ += absl::StrFormat("\"%s\": %s", key, json);
    return *this;
  }
  std::string Build() const { return "{" + body_ + "}"; }

 private:
  std::string body_;
};

// ---------------------------------------------------------------------------------------------
// Running a set of flows and summarising them.

enum class Cc { kBbr3, kCubic, kAggregate, kBbr1, kLinuxCubic };

struct FlowSpec {
  Cc cc = Cc::kBbr3;
  TimeDelta rtt = TimeDelta::Milliseconds(40);
  TimeDelta start = TimeDelta::Zero();
  TimeDelta app_on = TimeDelta::Zero();
  TimeDelta app_off = TimeDelta::Zero();
  int group = -1;  // -1: the flow is its own group.
};

struct RunSpec {
  LinkConfig link;
  std::vector<FlowSpec> flows;
  TimeDelta duration = TimeDelta::Seconds(30);
  TimeDelta measure_start = TimeDelta::Zero();
  ByteCount mss = kMss;  // Packet size of every flow (and of the controllers' SMSS).
};

// Packets of an MTU-9000 path: 9000 bytes less the IPv4 and UDP headers, the udp transport's mss.
constexpr ByteCount kJumboMss = 8972;

// Appends `n` flows of controller `cc` that count as one group (e.g. one transfer's streams).
void AddGroup(RunSpec* spec, Cc cc, int n, int group) {
  for (int i = 0; i < n; ++i) {
    FlowSpec f;
    f.cc = cc;
    f.group = group;
    spec->flows.push_back(f);
  }
}

struct FlowSummary {
  double goodput_mbit = 0;
  double share = 0;
  double retransmit_rate = 0;
  std::string final_state;
};

struct Summary {
  double utilization = 0;
  double loss_rate = 0;
  double rtt_p50_ms = 0;
  double rtt_p99_ms = 0;
  double jain = 1;
  int groups = 0;
  std::vector<FlowSummary> flows;
  std::vector<double> group_share;
  std::vector<double> group_goodput_mbit;
};

class Run {
 public:
  Run(const RunSpec& spec, uint64_t seed) : spec_(spec), sim_(spec.link, seed, spec.mss) {
    Bbr3Params params;
    params.mss = spec.mss;
    int agg_flows = 0;
    for (const FlowSpec& f : spec.flows) agg_flows += f.cc == Cc::kAggregate;
    if (agg_flows > 0) {
      randoms_.push_back(std::make_unique<SplitMix64Random>(seed * 7919 + 17));
      aggregate_ =
          std::make_unique<AggregateController>(params, *randoms_.back(), Simulator::Epoch());
    }
    for (size_t i = 0; i < spec.flows.size(); ++i) {
      const FlowSpec& fs = spec.flows[i];
      FlowConfig fc;
      fc.rtt = fs.rtt;
      fc.start = fs.start;
      fc.app_on = fs.app_on;
      fc.app_off = fs.app_off;
      fc.group = fs.group < 0 ? static_cast<int>(i) : fs.group;
      switch (fs.cc) {
        case Cc::kBbr3:
          randoms_.push_back(std::make_unique<SplitMix64Random>(seed * 1000003 + i));
          fc.controller =
              congestion::CreateBbr3(params, *randoms_.back(), Simulator::Epoch() + fs.start);
          break;
        case Cc::kCubic:
        case Cc::kLinuxCubic: {
          CubicParams cp;
          cp.mss = spec.mss;
          cp.hystart = fs.cc == Cc::kLinuxCubic;
          fc.controller = congestion::CreateCubic(cp);
          break;
        }
        case Cc::kBbr1: {
          Bbr1Params bp;
          bp.mss = spec.mss;
          randoms_.push_back(std::make_unique<SplitMix64Random>(seed * 1000003 + i));
          fc.controller =
              congestion::CreateBbr1(bp, *randoms_.back(), Simulator::Epoch() + fs.start);
          break;
        }
        case Cc::kAggregate:
          fc.controller = aggregate_->AddFlow();
          break;
      }
      sim_.AddFlow(std::move(fc));
    }
  }

  Simulator& sim() { return sim_; }

  // Runs to the end of the spec, starting the measurement window on the way.
  void RunAll() {
    if (spec_.measure_start > sim_.elapsed()) sim_.RunUntil(spec_.measure_start);
    if (spec_.measure_start >= TimeDelta::Zero() && !measuring_) {
      sim_.StartMeasurement();
      measuring_ = true;
    }
    sim_.RunUntil(spec_.duration);
  }
  // Runs to `t` in steps of `step`, calling `poll` after each step.
  void RunStepped(TimeDelta step, const std::function<void(Simulator&)>& poll) {
    while (sim_.elapsed() < spec_.duration) {
      TimeDelta next = std::min(sim_.elapsed() + step, spec_.duration);
      if (!measuring_ && next >= spec_.measure_start) {
        sim_.RunUntil(spec_.measure_start);
        sim_.StartMeasurement();
        measuring_ = true;
      }
      sim_.RunUntil(next);
      poll(sim_);
    }
  }

  Summary Summarize() const {
    Summary s;
    s.utilization = sim_.Utilization();
    s.loss_rate = sim_.LossRate();
    s.rtt_p50_ms = sim_.RttPercentileMs(0.50);
    s.rtt_p99_ms = sim_.RttPercentileMs(0.99);
    const double window_s = sim_.window_length().ToSecondsF();
    int max_group = 0;
    for (int i = 0; i < sim_.num_flows(); ++i)
      max_group = std::max(max_group, sim_.flow_config(i).group);
    s.groups = max_group + 1;
    std::vector<double> group_bytes(s.groups, 0.0);
    double total = 0;
    for (int i = 0; i < sim_.num_flows(); ++i) {
      const double b = static_cast<double>(sim_.window_delivered(i));
      group_bytes[sim_.flow_config(i).group] += b;
      total += b;
    }
    for (int i = 0; i < sim_.num_flows(); ++i) {
      FlowSummary f;
      const FlowStats& st = sim_.flow_stats(i);
      const double b = static_cast<double>(sim_.window_delivered(i));
      f.goodput_mbit = window_s > 0 ? b * 8 / window_s / 1e6 : 0;
      f.share = total > 0 ? b / total : 0;
      f.retransmit_rate = st.bytes_sent == 0 ? 0
                                             : static_cast<double>(st.bytes_retransmitted) /
                                                   static_cast<double>(st.bytes_sent);
      f.final_state = std::string(sim_.controller(i).DebugState().state);
      s.flows.push_back(f);
    }
    double sum = 0, sum_sq = 0;
    for (double g : group_bytes) {
      s.group_share.push_back(total > 0 ? g / total : 0);
      s.group_goodput_mbit.push_back(window_s > 0 ? g * 8 / window_s / 1e6 : 0);
      sum += g;
      sum_sq += g * g;
    }
    s.jain = sum_sq > 0 ? sum * sum / (static_cast<double>(s.groups) * sum_sq) : 0;
    return s;
  }

 private:
  RunSpec spec_;
  std::vector<std::unique_ptr<SplitMix64Random>> randoms_;
  std::unique_ptr<AggregateController> aggregate_;
  Simulator sim_;
  bool measuring_ = false;
};

std::string FlowsJson(const Summary& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.flows.size(); ++i) {
    const FlowSummary& f = s.flows[i];
    if (i > 0) out += ", ";
    out += JsonObject()
               .Num("goodput_mbit", f.goodput_mbit)
               .Num("share", f.share)
               .Num("retransmit_rate", f.retransmit_rate)
               .Str("final_state", f.final_state)
               .Build();
  }
  return out + "]";
}

// The common head of every scenario's JSON.
JsonObject Head(const std::string& name, uint64_t seed, const Summary& s, ScenarioResult* r) {
  JsonObject j;
  j.Str("scenario", name).Int("seed", static_cast<int64_t>(seed));
  j.Num("utilization", s.utilization).Num("loss_rate", s.loss_rate);
  j.Num("rtt_p50_ms", s.rtt_p50_ms).Num("rtt_p99_ms", s.rtt_p99_ms);
  if (s.groups > 1) j.Num("jain", s.jain);
  j.Raw("flows", FlowsJson(s));
  r->figures["utilization"] = s.utilization;
  r->figures["loss_rate"] = s.loss_rate;
  r->figures["rtt_p50_ms"] = s.rtt_p50_ms;
  r->figures["rtt_p99_ms"] = s.rtt_p99_ms;
  if (s.groups > 1) r->figures["jain"] = s.jain;
  return j;
}

// A compact object for a side-by-side variant (e.g. the Cubic run beside loss-1).
std::string VariantJson(const Summary& s) {
  JsonObject j;
  j.Num("utilization", s.utilization).Num("loss_rate", s.loss_rate);
  j.Num("rtt_p50_ms", s.rtt_p50_ms).Num("rtt_p99_ms", s.rtt_p99_ms);
  if (s.groups > 1) j.Num("jain", s.jain);
  j.Raw("flows", FlowsJson(s));
  return j.Build();
}

// Figures: `Set` records a figure for the tests and puts it in the JSON.
void Set(ScenarioResult* r, JsonObject& j, const std::string& key, double v) {
  r->figures[key] = v;
  j.Num(key, v);
}

ByteCount Bdp(Bandwidth rate, TimeDelta rtt) { return rate * rtt; }
double Mbit(Bandwidth b) { return b.ToMbitsPerSecondF(); }
TimeDelta MinRtt(Bandwidth rate, TimeDelta rtt) { return rtt + rate.TransferTime(kMss); }

LinkConfig Link(Bandwidth rate, TimeDelta rtt, double bdp_multiple, double loss = 0.0) {
  LinkConfig l;
  l.rate = rate;
  l.queue_bytes = static_cast<ByteCount>(static_cast<double>(Bdp(rate, rtt)) * bdp_multiple);
  l.loss = loss;
  return l;
}

// ---------------------------------------------------------------------------------------------
// Scenarios.

void Startup(uint64_t seed, ScenarioResult* r) {
  const Bandwidth rate = Bandwidth::GbitsPerSecond(10);
  const TimeDelta rtt = TimeDelta::Milliseconds(100);
  RunSpec spec;
  spec.link = Link(rate, rtt, 2.0);
  spec.flows = {FlowSpec{}};
  spec.flows[0].rtt = rtt;
  spec.duration = TimeDelta::Milliseconds(2500);
  Run run(spec, seed);
  // Per-round bandwidth estimate, to find the last round that grew by >= 25 %.
  std::vector<double> round_bw;  // max_bw at the end of each round.
  uint64_t last_round = 0;
  int64_t drain_round = -1;
  Bandwidth max_bw_at_drain;
  run.sim().set_observer([&](int, Timestamp, const Controller& c) {
    const ControllerState st = c.DebugState();
    if (st.round_count != last_round) {
      round_bw.resize(st.round_count + 1, 0.0);
      for (uint64_t k = last_round; k < st.round_count; ++k) {
        round_bw[k] = static_cast<double>(st.max_bw.ToBitsPerSecond());
      }
      last_round = st.round_count;
    }
    if (drain_round < 0 && st.state == "Drain") {
      drain_round = static_cast<int64_t>(st.round_count);
      max_bw_at_drain = st.max_bw;
    }
  });
  run.RunAll();
  int64_t last_growth_round = -1;
  for (size_t k = 1;
       k < round_bw.size() && (drain_round < 0 || static_cast<int64_t>(k) < drain_round); ++k) {
    if (round_bw[k - 1] > 0 && round_bw[k] >= 1.25 * round_bw[k - 1])
      last_growth_round = static_cast<int64_t>(k);
  }
  const Summary s = run.Summarize();
  JsonObject j = Head("startup", seed, s, r);
  const ControllerState st = run.sim().controller(0).DebugState();
  Set(r, j, "link_mbit", Mbit(rate));
  Set(r, j, "max_bw_mbit", Mbit(st.max_bw));
  Set(r, j, "bw_estimate_ratio", st.max_bw / rate);
  Set(r, j, "bw_estimate_ratio_at_drain", drain_round < 0 ? 0.0 : max_bw_at_drain / rate);
  Set(r, j, "packets_lost", static_cast<double>(run.sim().flow_stats(0).packets_dropped));
  Set(r, j, "drain_round", static_cast<double>(drain_round));
  Set(r, j, "last_growth_round", static_cast<double>(last_growth_round));
  Set(r, j, "rounds_growth_to_drain", static_cast<double>(drain_round - last_growth_round));
  r->json = j.Build();
}

void Steady(uint64_t seed, ScenarioResult* r) {
  const Bandwidth rate = Bandwidth::GbitsPerSecond(1);
  const TimeDelta rtt = TimeDelta::Milliseconds(40);
  RunSpec spec;
  spec.link = Link(rate, rtt, 1.0);
  spec.flows = {FlowSpec{}};
  spec.duration = TimeDelta::Seconds(60);
  Run run(spec, seed);
  run.RunAll();
  const Summary s = run.Summarize();
  JsonObject j = Head("steady", seed, s, r);
  const double min_rtt_ms = MinRtt(rate, rtt).ToMillisecondsF();
  Set(r, j, "min_rtt_ms", min_rtt_ms);
  Set(r, j, "rtt_p50_over_min", s.rtt_p50_ms / min_rtt_ms);
  Set(r, j, "rtt_p99_over_min", s.rtt_p99_ms / min_rtt_ms);
  r->json = j.Build();
}

Summary LossRun(uint64_t seed, double p, Cc cc, TimeDelta duration) {
  const Bandwidth rate = Bandwidth::GbitsPerSecond(1);
  const TimeDelta rtt = TimeDelta::Milliseconds(40);
  RunSpec spec;
  spec.link = Link(rate, rtt, 4.0, p);  // Deep buffer: 4 x BDP.
  spec.flows = {FlowSpec{}};
  spec.flows[0].cc = cc;
  spec.duration = duration;
  Run run(spec, seed);
  run.RunAll();
  return run.Summarize();
}

void Loss(const std::string& name, double p, bool with_cubic, uint64_t seed, ScenarioResult* r) {
  const Bandwidth rate = Bandwidth::GbitsPerSecond(1);
  const Summary s = LossRun(seed, p, Cc::kBbr3, TimeDelta::Seconds(60));
  JsonObject j = Head(name, seed, s, r);
  Set(r, j, "random_loss", p);
  Set(r, j, "goodput_over_ideal", s.flows[0].goodput_mbit / ((1 - p) * Mbit(rate)));
  if (with_cubic) {
    const Summary c = LossRun(seed, p, Cc::kCubic, TimeDelta::Seconds(60));
    Set(r, j, "cubic_goodput_mbit", c.flows[0].goodput_mbit);
    Set(r, j, "cubic_goodput_over_ideal", c.flows[0].goodput_mbit / ((1 - p) * Mbit(rate)));
    j.Raw("cubic", VariantJson(c));
  }
  r->json = j.Build();
}

// The udp transport on the wan-lossy bench link: 8 flows coupled by one AggregateController,
// jumbo packets (MTU 9000: a datagram of 8972 bytes), 1 % random loss and a 1 x BDP buffer.
// With jumbo packets a round holds only ~560 packets, so a round's loss count is noisy: at 1 %
// random loss about one round in 90 loses more than 2 % by chance.
void LossyJumbo(uint64_t seed, ScenarioResult* r) {
  const Bandwidth rate = Bandwidth::GbitsPerSecond(1);
  const TimeDelta rtt = TimeDelta::Milliseconds(40);
  const double p = 0.01;
  RunSpec spec;
  spec.link = Link(rate, rtt, 1.0, p);
  spec.mss = kJumboMss;
  AddGroup(&spec, Cc::kAggregate, 8, 0);
  spec.duration = TimeDelta::Seconds(60);
  Run run(spec, seed);
  run.RunAll();
  const Summary s = run.Summarize();
  JsonObject j = Head("lossy-jumbo", seed, s, r);
  Set(r, j, "random_loss", p);
  Set(r, j, "goodput_over_ideal", s.group_goodput_mbit[0] / ((1 - p) * Mbit(rate)));
  r->json = j.Build();
}

// The first seconds of LossyJumbo, where a transfer spends its startup: random loss must not
// end Startup before the flows reach the link (the estimate at the exit), and the goodput of
// the first 3 s is what a 2 GiB transfer's total time feels.
void LossyJumboStart(uint64_t seed, ScenarioResult* r) {
  const Bandwidth rate = Bandwidth::GbitsPerSecond(1);
  const double p = 0.01;
  RunSpec spec;
  spec.link = Link(rate, TimeDelta::Milliseconds(40), 1.0, p);
  spec.mss = kJumboMss;
  AddGroup(&spec, Cc::kAggregate, 8, 0);
  spec.duration = TimeDelta::Seconds(3);
  Run run(spec, seed);
  Bandwidth max_bw_at_exit;
  bool exited = false;
  run.sim().set_observer([&](int, Timestamp, const Controller& c) {
    const ControllerState st = c.DebugState();
    if (!exited && st.state != "Startup") {
      exited = true;
      max_bw_at_exit = st.max_bw;
    }
  });
  run.RunAll();
  const Summary s = run.Summarize();
  JsonObject j = Head("lossy-jumbo-start", seed, s, r);
  Set(r, j, "random_loss", p);
  Set(r, j, "bw_estimate_ratio_at_exit", exited ? max_bw_at_exit / rate : 0.0);
  Set(r, j, "goodput_over_ideal", s.group_goodput_mbit[0] / ((1 - p) * Mbit(rate)));
  r->json = j.Build();
}

void Shallow(uint64_t seed, ScenarioResult* r) {
  const Bandwidth rate = Bandwidth::GbitsPerSecond(1);
  const TimeDelta rtt = TimeDelta::Milliseconds(40);
  RunSpec spec;
  spec.link = Link(rate, rtt, 0.5);
  spec.flows = {FlowSpec{}};
  spec.duration = TimeDelta::Seconds(30);
  Run run(spec, seed);
  run.RunAll();
  const Summary s = run.Summarize();
  JsonObject j = Head("shallow", seed, s, r);
  const ControllerState st = run.sim().controller(0).DebugState();
  Set(r, j, "max_bw_mbit", Mbit(st.max_bw));
  Set(r, j, "bw_estimate_ratio", st.max_bw / rate);
  r->json = j.Build();
}

void StepUp(uint64_t seed, ScenarioResult* r) {
  const Bandwidth low = Bandwidth::MbitsPerSecond(100);
  const Bandwidth high = Bandwidth::GbitsPerSecond(1);
  const TimeDelta rtt = TimeDelta::Milliseconds(40);
  const TimeDelta change = TimeDelta::Seconds(20);
  RunSpec spec;
  spec.link = Link(low, rtt, 1.0);
  spec.link.queue_bytes = Bdp(high, rtt);  // The buffer of the fast link: 1 x its BDP.
  spec.link.rate_changes = {RateChange{change, high}};
  spec.flows = {FlowSpec{}};
  spec.duration = TimeDelta::Seconds(30);
  Run run(spec, seed);
  // Delivery rate in 100 ms bins; find when it first reaches 90 % of the new rate.
  const TimeDelta bin = TimeDelta::Milliseconds(100);
  ByteCount last = 0;
  double reached_s = -1;
  run.RunStepped(bin, [&](Simulator& sim) {
    const ByteCount now_bytes = sim.link_bytes_total();
    const Bandwidth got = Bandwidth::FromBytesAndTimeDelta(now_bytes - last, bin);
    last = now_bytes;
    if (reached_s < 0 && sim.elapsed() > change && got >= high * 0.9) {
      reached_s = (sim.elapsed() - change).ToSecondsF();
    }
  });
  const Summary s = run.Summarize();
  JsonObject j = Head("step-up", seed, s, r);
  Set(r, j, "old_rate_mbit", Mbit(low));
  Set(r, j, "new_rate_mbit", Mbit(high));
  Set(r, j, "seconds_to_90pct_of_new_rate", reached_s);
  r->json = j.Build();
}

void StepDown(uint64_t seed, ScenarioResult* r) {
  const Bandwidth high = Bandwidth::GbitsPerSecond(1);
  const Bandwidth low = Bandwidth::MbitsPerSecond(100);
  const TimeDelta rtt = TimeDelta::Milliseconds(40);
  const TimeDelta change = TimeDelta::Seconds(20);
  RunSpec spec;
  spec.link = Link(high, rtt, 1.0);  // The buffer stays 1 x BDP of the fast link.
  spec.link.rate_changes = {RateChange{change, low}};
  spec.flows = {FlowSpec{}};
  spec.duration = TimeDelta::Seconds(30);
  Run run(spec, seed);
  const Timestamp change_at = Simulator::Epoch() + change;
  int64_t round_at_change = -1;
  int64_t rounds_to_bw_shortterm = -1;
  int64_t rounds_to_bw = -1;
  run.sim().set_observer([&](int, Timestamp now, const Controller& c) {
    if (now < change_at) return;
    const ControllerState st = c.DebugState();
    if (round_at_change < 0) round_at_change = static_cast<int64_t>(st.round_count);
    const int64_t rounds = static_cast<int64_t>(st.round_count) - round_at_change;
    if (rounds_to_bw_shortterm < 0 && st.bw_shortterm <= low * 1.1) rounds_to_bw_shortterm = rounds;
    if (rounds_to_bw < 0 && st.bw <= low * 1.1) rounds_to_bw = rounds;
  });
  const double min_rtt_ms = MinRtt(low, rtt).ToMillisecondsF();
  double rtt_recovered_s = -1;
  bool rtt_went_up = false;
  run.RunStepped(TimeDelta::Milliseconds(10), [&](Simulator& sim) {
    if (sim.elapsed() <= change) return;
    const double rtt_ms = sim.latest_rtt(0).ToMillisecondsF();
    if (rtt_ms >= 1.5 * min_rtt_ms) rtt_went_up = true;
    if (rtt_recovered_s < 0 && rtt_went_up && rtt_ms < 1.5 * min_rtt_ms) {
      rtt_recovered_s = (sim.elapsed() - change).ToSecondsF();
    }
  });
  const Summary s = run.Summarize();
  JsonObject j = Head("step-down", seed, s, r);
  Set(r, j, "old_rate_mbit", Mbit(high));
  Set(r, j, "new_rate_mbit", Mbit(low));
  Set(r, j, "rounds_to_bw_shortterm_within_1.1x", static_cast<double>(rounds_to_bw_shortterm));
  Set(r, j, "rounds_to_bw_within_1.1x", static_cast<double>(rounds_to_bw));
  Set(r, j, "seconds_to_rtt_under_1.5x_min", rtt_recovered_s);
  r->json = j.Build();
}

void ProbeRtt(uint64_t seed, ScenarioResult* r) {
  const Bandwidth rate = Bandwidth::GbitsPerSecond(1);
  const TimeDelta rtt = TimeDelta::Milliseconds(40);
  RunSpec spec;
  spec.link = Link(rate, rtt, 1.0);
  spec.flows = {FlowSpec{}};
  spec.duration = TimeDelta::Seconds(60);
  Run run(spec, seed);
  const ByteCount half_bdp = Bdp(rate, rtt) / 2;
  std::vector<Timestamp> entries;
  double min_held_ms = 1e9;
  double deficit_bytes = 0;
  bool in_probe = false;
  Timestamp entered;
  Timestamp held_since = Timestamp::Infinite();
  double held_ms = 0;
  // Utilisation loss: link capacity not used from ProbeRTT entry until one RTT after exit.
  Timestamp deficit_until = Timestamp::Infinite();
  Timestamp deficit_from;
  ByteCount link_at_entry = 0;
  Simulator* sim = &run.sim();
  run.sim().set_observer([&](int, Timestamp now, const Controller& c) {
    const ControllerState st = c.DebugState();
    const bool probing = st.state == "ProbeRTT";
    if (probing && !in_probe) {
      entries.push_back(now);
      entered = now;
      held_ms = 0;
      held_since = Timestamp::Infinite();
      if (deficit_until.IsInfinite()) {
        deficit_from = now;
        link_at_entry = sim->link_bytes_total();
      }
    }
    if (probing) {
      if (st.cwnd <= half_bdp + 4 * kMss) {
        if (held_since.IsInfinite()) held_since = now;
        held_ms = (now - held_since).ToMillisecondsF();
      }
    }
    if (!probing && in_probe) {
      min_held_ms = std::min(min_held_ms, held_ms);
      deficit_until = now + MinRtt(rate, rtt);
    }
    if (!deficit_until.IsInfinite() && now >= deficit_until) {
      const double cap = static_cast<double>(rate * (now - deficit_from));
      deficit_bytes += cap - static_cast<double>(sim->link_bytes_total() - link_at_entry);
      deficit_until = Timestamp::Infinite();
    }
    in_probe = probing;
  });
  run.RunAll();
  const Summary s = run.Summarize();
  JsonObject j = Head("probe-rtt", seed, s, r);
  double mean_interval = 0;
  double max_interval = 0;
  for (size_t i = 1; i < entries.size(); ++i) {
    const double d = (entries[i] - entries[i - 1]).ToSecondsF();
    mean_interval += d;
    max_interval = std::max(max_interval, d);
  }
  if (entries.size() > 1) mean_interval /= static_cast<double>(entries.size() - 1);
  const double total_cap = static_cast<double>(rate * spec.duration);
  Set(r, j, "probe_rtt_entries", static_cast<double>(entries.size()));
  Set(r, j, "first_probe_rtt_s",
      entries.empty() ? -1.0 : (entries[0] - Simulator::Epoch()).ToSecondsF());
  Set(r, j, "mean_probe_rtt_interval_s", mean_interval);
  Set(r, j, "max_probe_rtt_interval_s", max_interval);
  Set(r, j, "min_cwnd_held_at_half_bdp_ms", entries.empty() ? 0.0 : min_held_ms);
  Set(r, j, "utilization_loss_from_probe_rtt", deficit_bytes / total_cap);
  r->json = j.Build();
}

void Fair4(uint64_t seed, ScenarioResult* r) {
  const Bandwidth rate = Bandwidth::GbitsPerSecond(1);
  const TimeDelta rtt = TimeDelta::Milliseconds(40);
  RunSpec spec;
  spec.link = Link(rate, rtt, 1.0);
  for (int i = 0; i < 4; ++i) {
    FlowSpec f;
    f.start = TimeDelta::Seconds(2 * i);
    spec.flows.push_back(f);
  }
  spec.measure_start = TimeDelta::Seconds(6);
  spec.duration = TimeDelta::Seconds(36);
  Run run(spec, seed);
  run.RunAll();
  const Summary s = run.Summarize();
  JsonObject j = Head("fair-4", seed, s, r);
  Set(r, j, "measured_seconds", 30);
  r->json = j.Build();
}

Summary CoupledRun(uint64_t seed, Cc eight) {
  const Bandwidth rate = Bandwidth::GbitsPerSecond(1);
  const TimeDelta rtt = TimeDelta::Milliseconds(40);
  RunSpec spec;
  spec.link = Link(rate, rtt, 1.0);
  AddGroup(&spec, eight, 8, 0);
  FlowSpec single;
  single.group = 1;
  spec.flows.push_back(single);
  spec.measure_start = TimeDelta::Seconds(10);
  spec.duration = TimeDelta::Seconds(30);
  Run run(spec, seed);
  run.RunAll();
  return run.Summarize();
}

void Coupled8v1(uint64_t seed, ScenarioResult* r) {
  const Summary s = CoupledRun(seed, Cc::kAggregate);
  JsonObject j = Head("coupled-8v1", seed, s, r);
  Set(r, j, "aggregate_share", s.group_share[0]);
  Set(r, j, "single_share", s.group_share[1]);
  const Summary ind = CoupledRun(seed, Cc::kBbr3);
  Set(r, j, "independent8_share", ind.group_share[0]);
  Set(r, j, "independent8_single_share", ind.group_share[1]);
  j.Raw("independent8", VariantJson(ind));
  r->json = j.Build();
}

void RttMix(uint64_t seed, ScenarioResult* r) {
  const Bandwidth rate = Bandwidth::GbitsPerSecond(1);
  RunSpec spec;
  spec.link = Link(rate, TimeDelta::Milliseconds(40), 1.0);
  FlowSpec a;
  a.rtt = TimeDelta::Milliseconds(20);
  FlowSpec b;
  b.rtt = TimeDelta::Milliseconds(150);
  spec.flows = {a, b};
  spec.measure_start = TimeDelta::Seconds(10);
  spec.duration = TimeDelta::Seconds(40);
  Run run(spec, seed);
  run.RunAll();
  const Summary s = run.Summarize();
  JsonObject j = Head("rtt-mix", seed, s, r);
  Set(r, j, "share_20ms", s.flows[0].share);
  Set(r, j, "share_150ms", s.flows[1].share);
  r->json = j.Build();
}

Summary VsCubicRun(uint64_t seed, double buffer_bdp) {
  const Bandwidth rate = Bandwidth::GbitsPerSecond(1);
  const TimeDelta rtt = TimeDelta::Milliseconds(40);
  RunSpec spec;
  spec.link = Link(rate, rtt, buffer_bdp);
  FlowSpec bbr;
  FlowSpec cubic;
  cubic.cc = Cc::kCubic;
  spec.flows = {bbr, cubic};
  spec.measure_start = TimeDelta::Seconds(10);
  spec.duration = TimeDelta::Seconds(40);
  Run run(spec, seed);
  run.RunAll();
  return run.Summarize();
}

void VsCubic(uint64_t seed, ScenarioResult* r) {
  const Summary s = VsCubicRun(seed, 1.0);
  JsonObject j = Head("vs-cubic", seed, s, r);
  Set(r, j, "bbr3_share_1bdp", s.flows[0].share);
  Set(r, j, "cubic_share_1bdp", s.flows[1].share);
  const Summary deep = VsCubicRun(seed, 4.0);
  Set(r, j, "bbr3_share_4bdp", deep.flows[0].share);
  Set(r, j, "cubic_share_4bdp", deep.flows[1].share);
  j.Raw("buffer_4bdp", VariantJson(deep));
  r->json = j.Build();
}

// The `fairness` pair of docs/benchmarks.md: the udp transport's 8 coupled flows (one
// AggregateController) against one TCP flow, both started at once, 1 Gbit/s, 40 ms, a drop-tail
// queue of 1 x BDP, 30 s measured from the start, with packets of an MTU-9000 path (kJumboMss).

Summary FairnessPairRun(uint64_t seed, Cc eight, Cc single, double buffer_bdp = 1.0,
                        ByteCount mss = kJumboMss) {
  RunSpec spec;
  spec.link = Link(Bandwidth::GbitsPerSecond(1), TimeDelta::Milliseconds(40), buffer_bdp);
  spec.mss = mss;
  AddGroup(&spec, eight, 8, 0);
  FlowSpec tcp;
  tcp.cc = single;
  tcp.group = 1;
  spec.flows.push_back(tcp);
  spec.duration = TimeDelta::Seconds(30);
  Run run(spec, seed);
  run.RunAll();
  return run.Summarize();
}

// Against BBRv1, the kernel default on the bench machine (its iperf3 flow).
void VsBbr1(uint64_t seed, ScenarioResult* r) {
  const Summary s = FairnessPairRun(seed, Cc::kAggregate, Cc::kBbr1);
  JsonObject j = Head("vs-bbr1", seed, s, r);
  Set(r, j, "aggregate_share", s.group_share[0]);
  Set(r, j, "bbr1_share", s.group_share[1]);
  Set(r, j, "bbr1_retransmit_rate", s.flows[8].retransmit_rate);
  const Summary ind = FairnessPairRun(seed, Cc::kBbr3, Cc::kBbr1);
  Set(r, j, "independent8_share", ind.group_share[0]);
  j.Raw("independent8", VariantJson(ind));
  r->json = j.Build();
}

// The same pair against CUBIC (the bench's FAIR_CC=cubic) with HyStart, as Linux runs it; beside
// it the same pair against CUBIC without HyStart (slow start until the first loss).
void CoupledVsCubic(uint64_t seed, ScenarioResult* r) {
  const Summary s = FairnessPairRun(seed, Cc::kAggregate, Cc::kLinuxCubic);
  JsonObject j = Head("coupled-vs-cubic", seed, s, r);
  Set(r, j, "aggregate_share", s.group_share[0]);
  Set(r, j, "cubic_share", s.group_share[1]);
  Set(r, j, "cubic_retransmit_rate", s.flows[8].retransmit_rate);
  const Summary plain = FairnessPairRun(seed, Cc::kAggregate, Cc::kCubic);
  Set(r, j, "aggregate_share_no_hystart", plain.group_share[0]);
  j.Raw("no_hystart", VariantJson(plain));
  r->json = j.Build();
}

// The coupled aggregate against one CUBIC flow (with HyStart) at buffers of 0.5, 1, 2 and 4 x
// BDP, MTU-9000 packets, and at 1 x BDP with 1500-byte packets (an MTU-independent allowance
// must give that the same share): the shares the fairness work is judged by.
void CoupledVsCubicBuffers(uint64_t seed, ScenarioResult* r) {
  const Summary s = FairnessPairRun(seed, Cc::kAggregate, Cc::kLinuxCubic, 1.0);
  JsonObject j = Head("coupled-vs-cubic-buffers", seed, s, r);
  Set(r, j, "aggregate_share_1bdp", s.group_share[0]);
  for (const auto& [name, bdp] :
       {std::pair<const char*, double>{"0.5bdp", 0.5}, {"2bdp", 2.0}, {"4bdp", 4.0}}) {
    const Summary other = FairnessPairRun(seed, Cc::kAggregate, Cc::kLinuxCubic, bdp);
    Set(r, j, absl::StrCat("aggregate_share_", name), other.group_share[0]);
    j.Raw(absl::StrCat("buffer_", name), VariantJson(other));
  }
  const Summary small = FairnessPairRun(seed, Cc::kAggregate, Cc::kLinuxCubic, 1.0, kMss);
  Set(r, j, "aggregate_share_1bdp_mss1500", small.group_share[0]);
  j.Raw("mss1500", VariantJson(small));
  r->json = j.Build();
}

void AppLimited(uint64_t seed, ScenarioResult* r) {
  const Bandwidth rate = Bandwidth::GbitsPerSecond(1);
  const TimeDelta rtt = TimeDelta::Milliseconds(40);
  RunSpec spec;
  spec.link = Link(rate, rtt, 1.0);
  spec.link.ack_aggregation = TimeDelta::Milliseconds(1);
  FlowSpec f;
  f.app_on = TimeDelta::Milliseconds(250);
  f.app_off = TimeDelta::Milliseconds(250);
  spec.flows = {f};
  spec.duration = TimeDelta::Seconds(30);
  Run run(spec, seed);
  Bandwidth peak;
  run.sim().set_observer(
      [&](int, Timestamp, const Controller& c) { peak = std::max(peak, c.DebugState().max_bw); });
  run.RunAll();
  const Summary s = run.Summarize();
  JsonObject j = Head("app-limited", seed, s, r);
  Set(r, j, "ack_aggregation_ms", 1);
  Set(r, j, "peak_max_bw_mbit", Mbit(peak));
  Set(r, j, "peak_max_bw_over_link", peak / rate);
  r->json = j.Build();
}

struct Entry {
  const char* name;
  std::function<void(uint64_t, ScenarioResult*)> run;
};

const std::vector<Entry>& Entries() {
  static const auto* entries = new std::vector<Entry>{
      {"startup", Startup},
      {"steady", Steady},
      {"loss-0.1", [](uint64_t s, ScenarioResult* r) { Loss("loss-0.1", 0.001, false, s, r); }},
      {"loss-1", [](uint64_t s, ScenarioResult* r) { Loss("loss-1", 0.01, true, s, r); }},
      {"lossy-jumbo", LossyJumbo},
      {"lossy-jumbo-start", LossyJumboStart},
      {"shallow", Shallow},
      {"step-up", StepUp},
      {"step-down", StepDown},
      {"probe-rtt", ProbeRtt},
      {"fair-4", Fair4},
      {"coupled-8v1", Coupled8v1},
      {"rtt-mix", RttMix},
      {"vs-cubic", VsCubic},
      {"app-limited", AppLimited},
      {"vs-bbr1", VsBbr1},
      {"coupled-vs-cubic", CoupledVsCubic},
      {"coupled-vs-cubic-buffers", CoupledVsCubicBuffers},
  };
  return *entries;
}

}  // namespace

const std::vector<std::string>& ScenarioNames() {
  static const auto* names = [] {
    auto* v = new std::vector<std::string>();
    for (const Entry& e : Entries()) v->push_back(e.name);
    return v;
  }();
  return *names;
}

bool RunScenario(const std::string& name, uint64_t seed, ScenarioResult* result) {
  for (const Entry& e : Entries()) {
    if (name == e.name) {
      *result = ScenarioResult();
      e.run(seed, result);
      return true;
    }
  }
  return false;
}

}  // namespace longhaul::sim
