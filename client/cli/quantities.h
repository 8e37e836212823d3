#ifndef LONGHAUL_CLIENT_CLI_QUANTITIES_H_
#define LONGHAUL_CLIENT_CLI_QUANTITIES_H_

// Rates, sizes and ages as an operator types them on the command line.
//
// Units: k, M, G, T are powers of 1000; Ki, Mi, Gi, Ti powers of 1024.
// Rates: a `bit` or `bps` suffix counts bits ("100Mbit", "1Gbps",
// "10Gbit/s"); otherwise the rate counts bytes ("100M", "100MB/s",
// "50MiB/s"), as rclone does. A bare number, and a lower-case `b` ("100Mb",
// bits or bytes?), are refused with a hint. Each error says what to write.

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace longhaul::cli {

// The accepted range of a rate option, in bits per second.
struct RateRange {
  uint64_t min_bits_per_second = 0;
  uint64_t max_bits_per_second = 0;
};
// The rate `text` in bits per second. `what` names the option in errors
// ("RATE", "--limit"). Out of `range` is an error that states the range in
// Mbit/s.
absl::StatusOr<uint64_t> ParseRate(absl::string_view text, absl::string_view what, RateRange range);

// The accepted range of a size option, in bytes.
struct SizeRange {
  uint64_t min_bytes = 0;
  uint64_t max_bytes = 0;
};
// The size `text` in bytes ("16MiB", "100M", "1TB", "4096B"). Out of
// `range` is an error that states the range in KiB.
absl::StatusOr<uint64_t> ParseSize(absl::string_view text, absl::string_view what, SizeRange range);

// An age such as "30m", "12h", "7d" or "90s" (`ls --since`).
absl::StatusOr<absl::Duration> ParseAge(absl::string_view text, absl::string_view what);

}  // namespace longhaul::cli

#endif  // LONGHAUL_CLIENT_CLI_QUANTITIES_H_
