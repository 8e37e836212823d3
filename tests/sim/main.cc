// longhaul-sim: runs one named congestion-control scenario in the simulator.
//
//   longhaul-sim --list
//   longhaul-sim --scenario NAME [--seed S] [--json]
//
// Prints one JSON object per run (the format is in tests/sim/scenarios.h). Exit status 2 on bad
// usage or an unknown scenario.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "tests/sim/scenarios.h"

int main(int argc, char** argv) {
  std::string scenario;
  uint64_t seed = 1;
  bool list = false;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--list") {
      list = true;
    } else if (arg == "--scenario" && i + 1 < argc) {
      scenario = argv[++i];
    } else if (arg == "--seed" && i + 1 < argc) {
      char* end = nullptr;
      seed = std::strtoull(argv[++i], &end, 10);
      if (end == nullptr || *end != '\0') {
        std::fprintf(stderr, "longhaul-sim: --seed needs a non-negative integer\n");
        return 2;
      }
    } else if (arg == "--json") {
      // JSON is the only output format; accepted for clarity in scripts.
    } else {
      std::fprintf(stderr, "usage: longhaul-sim --list | --scenario NAME [--seed S] [--json]\n");
      return 2;
    }
  }
  if (list) {
    for (const std::string& name : longhaul::sim::ScenarioNames())
      std::printf("%s\n", name.c_str());
    return 0;
  }
  if (scenario.empty()) {
    std::fprintf(stderr, "usage: longhaul-sim --list | --scenario NAME [--seed S] [--json]\n");
    return 2;
  }
  longhaul::sim::ScenarioResult result;
  if (!longhaul::sim::RunScenario(scenario, seed, &result)) {
    std::fprintf(stderr, "longhaul-sim: unknown scenario '%s' (try --list)\n", scenario.c_str());
    return 2;
  }
  std::printf("%s\n", result.json.c_str());
  return 0;
}
