#ifndef LONGHAUL_TESTS_WANEM_LINK_CONFIG_H_
#define LONGHAUL_TESTS_WANEM_LINK_CONFIG_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "tests/wanem/link_shaper.h"

namespace longhaul::wanem {

// "1Gbit", "500mbit", "64kbit", "1e9" (bits per second), "0" = unlimited.
absl::StatusOr<int64_t> ParseRate(absl::string_view text);
// "1500", "64KiB", "5MB", "2MiB", "1GiB".
absl::StatusOr<int64_t> ParseBytes(absl::string_view text);
// "0.01" or "1%".
absl::StatusOr<double> ParseLoss(absl::string_view text);

// A direction's parameters as text, before the queue size can be resolved
// against the rate and delay ("bdp" means one bandwidth-delay product of the
// round trip: rate x 2 x delay on the two-site link, whose round trip crosses
// the delay twice).
struct DirectionSpec {
  std::string rate = "0";
  std::string delay = "0ms";
  std::string jitter = "0ms";
  std::string loss = "0";
  std::string queue = "bdp";
};

// Overrides fields of `spec` from "rate=1Gbit,delay=20ms,loss=1%,queue=bdp,
// jitter=1ms".
absl::Status ApplyOverrides(absl::string_view overrides, DirectionSpec& spec);

// `delays_per_round_trip` is how many times a round trip crosses this
// direction's delay, for "bdp": 2 on the two-site link, 4 on a star access
// link (site -> core -> site and back).
absl::StatusOr<DirectionParams> Resolve(const DirectionSpec& spec, int delays_per_round_trip = 2);

std::string FormatRate(int64_t bps);

}  // namespace longhaul::wanem

#endif  // LONGHAUL_TESTS_WANEM_LINK_CONFIG_H_
