// Simulator throughput: simulated packets per CPU second (issue 3 asks for >= 2 million, so the
// scenario suite fits CI's budget). Each iteration simulates a fresh run.
#include <memory>

#include "benchmark/benchmark.h"
#include "congestion/aggregate_controller.h"
#include "congestion/bbr3.h"
#include "congestion/cubic.h"
#include "tests/sim/simulator.h"

namespace longhaul::sim {
namespace {

LinkConfig OneGigLink() {
  LinkConfig link;
  link.rate = Bandwidth::GbitsPerSecond(1);
  link.queue_bytes = link.rate * TimeDelta::Milliseconds(40);
  return link;
}

// One BBRv3 flow on 1 Gbit/s, 40 ms, 1 BDP buffer, for 10 simulated seconds.
void BM_SimOneBbr3Flow(benchmark::State& state) {
  uint64_t packets = 0;
  for (auto _ : state) {
    congestion::SplitMix64Random rng(1);
    Simulator sim(OneGigLink(), 1);
    FlowConfig f;
    f.controller = congestion::CreateBbr3(congestion::Bbr3Params(), rng, Simulator::Epoch());
    sim.AddFlow(std::move(f));
    sim.RunUntil(TimeDelta::Seconds(10));
    packets += sim.packets_sent();
  }
  state.counters["packets_per_cpu_second"] =
      benchmark::Counter(static_cast<double>(packets), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_SimOneBbr3Flow)->Unit(benchmark::kMillisecond);

// Nine flows (an 8-flow aggregate and one BBRv3) with 1 % random loss: the busiest scheduler case.
void BM_SimNineFlowsWithLoss(benchmark::State& state) {
  uint64_t packets = 0;
  for (auto _ : state) {
    congestion::SplitMix64Random rng(1);
    congestion::SplitMix64Random rng_agg(2);
    LinkConfig link = OneGigLink();
    link.loss = 0.01;
    Simulator sim(link, 1);
    congestion::AggregateController agg(congestion::Bbr3Params(), rng_agg, Simulator::Epoch());
    for (int i = 0; i < 8; ++i) {
      FlowConfig f;
      f.controller = agg.AddFlow();
      sim.AddFlow(std::move(f));
    }
    FlowConfig single;
    single.controller = congestion::CreateBbr3(congestion::Bbr3Params(), rng, Simulator::Epoch());
    sim.AddFlow(std::move(single));
    sim.RunUntil(TimeDelta::Seconds(10));
    packets += sim.packets_sent();
  }
  state.counters["packets_per_cpu_second"] =
      benchmark::Counter(static_cast<double>(packets), benchmark::Counter::kIsRate);
}
BENCHMARK(BM_SimNineFlowsWithLoss)->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace longhaul::sim

BENCHMARK_MAIN();
