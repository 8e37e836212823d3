// Named simulator scenarios: the figures issue 3 demands of the congestion controllers.
//
// Each scenario builds a link and flows, runs the Simulator with a seed, and returns both a JSON
// object (what `longhaul-sim --scenario NAME --json` prints) and the named figures the gtests
// assert. The same seed gives byte-identical JSON.
#ifndef LONGHAUL_TESTS_SIM_SCENARIOS_H_
#define LONGHAUL_TESTS_SIM_SCENARIOS_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace longhaul::sim {

struct ScenarioResult {
  std::string json;
  // Figures by name (the same values as in the JSON), for assertions.
  std::map<std::string, double> figures;
};

// The names of all scenarios, in table order.
const std::vector<std::string>& ScenarioNames();
// Runs scenario `name`. Returns false if there is no such scenario.
bool RunScenario(const std::string& name, uint64_t seed, ScenarioResult* result);

}  // namespace longhaul::sim

#endif  // LONGHAUL_TESTS_SIM_SCENARIOS_H_
