#ifndef LONGHAUL_COMMON_UNITS_PARSE_H_
#define LONGHAUL_COMMON_UNITS_PARSE_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace longhaul {

// Human-friendly quantities in config files and on the command line.
// Sizes: "16MiB", "1GiB", "4096", "64k" (k/M/G are powers of 1000, Ki/Mi/Gi of 1024).
absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text);
// Rates in bits per second: "1Gbit", "500Mbit", "10G" (powers of 1000).
absl::StatusOr<uint64_t> ParseBitRate(absl::string_view text);
// Durations: "40ms", "1.5s", "200us", "2m".
absl::StatusOr<int64_t> ParseDurationMicros(absl::string_view text);

// "1.5 GiB", for people.
std::string FormatBytes(double bytes);

}  // namespace longhaul

#endif  // LONGHAUL_COMMON_UNITS_PARSE_H_
