// Eventually: waiting in a test for what another thread does.
#ifndef LONGHAUL_TESTS_TEST_TOOLS_EVENTUALLY_H_
#define LONGHAUL_TESTS_TEST_TOOLS_EVENTUALLY_H_

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace longhaul::testing {

// Polls `done` every 5 ms of real time until it holds (true) or `within` has
// passed (false). For handing off between threads: the bound only ends a test
// that would otherwise hang, it judges no speed.
template <typename F>
bool Eventually(F done, absl::Duration within = absl::Seconds(10)) {
  const absl::Time deadline = absl::Now() + within;
  while (!done()) {
    if (absl::Now() > deadline) return done();
    absl::SleepFor(absl::Milliseconds(5));
  }
  return true;
}

}  // namespace longhaul::testing

#endif  // LONGHAUL_TESTS_TEST_TOOLS_EVENTUALLY_H_
