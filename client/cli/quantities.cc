#include "client/cli/quantities.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"

namespace longhaul::cli {
namespace {

// Splits " 1.5GiB" into 1.5 and "GiB".
absl::StatusOr<double> SplitNumber(absl::string_view text, absl::string_view what,
                                   absl::string_view example, absl::string_view* unit) {
  const absl::string_view s = absl::StripAsciiWhitespace(text);
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  const std::string number(s.substr(0, i));
  char* end = nullptr;
  const double value = number.empty() ? 0 : std::strtod(number.c_str(), &end);
  if (number.empty() || end != number.c_str() + number.size() || !std::isfinite(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", text, "' is not a number with a unit; write ", example));
  }
  *unit = absl::StripAsciiWhitespace(s.substr(i));
  return value;
}

// The factor of a unit prefix ("", "k", "Mi", ...); 0 when unknown.
double PrefixFactor(absl::string_view prefix) {
  if (prefix.empty()) return 1;
  const char p = absl::ascii_tolower(prefix[0]);
  int power = p == 'k' ? 1 : p == 'm' ? 2 : p == 'g' ? 3 : p == 't' ? 4 : 0;
  if (power == 0) return 0;
  if (prefix.size() == 1) return std::pow(1000.0, power);
  if (prefix.size() == 2 && absl::ascii_tolower(prefix[1]) == 'i') return std::pow(1024.0, power);
  return 0;
}

std::string Trimmed(double v) { return absl::StrFormat("%.15g", v); }

}  // namespace

absl::StatusOr<uint64_t> ParseRate(absl::string_view text, absl::string_view what,
                                   RateRange range) {
  const std::string hint = "100Mbit or 100MB/s";
  absl::string_view unit;
  absl::StatusOr<double> value = SplitNumber(text, what, hint, &unit);
  if (!value.ok()) return value.status();
  if (unit.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", text, "' has no unit; write ",
                                                   Trimmed(*value), "Mbit (bits) or ",
                                                   Trimmed(*value), "MB/s (bytes)"));
  }
  absl::ConsumeSuffix(&unit, "/s") || absl::ConsumeSuffix(&unit, "/S");
  bool bits = false;
  if (absl::ConsumeSuffix(&unit, "bps") || absl::ConsumeSuffix(&unit, "Bits") ||
      absl::ConsumeSuffix(&unit, "bits") || absl::ConsumeSuffix(&unit, "bit") ||
      absl::ConsumeSuffix(&unit, "Bit")) {
    bits = true;
  } else if (absl::ConsumeSuffix(&unit, "b")) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", text, "': a lower-case b is ambiguous; write ", Trimmed(*value),
                     unit, "bit for bits or ", Trimmed(*value), unit, "B/s for bytes"));
  } else {
    absl::ConsumeSuffix(&unit, "Bps") || absl::ConsumeSuffix(&unit, "B");
  }
  const double factor = PrefixFactor(unit);
  if (factor == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " '", text, "' has an unknown unit; write ", hint, " (k, M, G, T; Ki, Mi, Gi, Ti)"));
  }
  const double bps = *value * factor * (bits ? 1 : 8);
  if (bps < static_cast<double>(range.min_bits_per_second) ||
      bps > static_cast<double>(range.max_bits_per_second)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", text, "' is ", Trimmed(bps / 1e6),
                     " Mbit/s; accepted: ", Trimmed(range.min_bits_per_second / 1e6), " to ",
                     Trimmed(range.max_bits_per_second / 1e6), " Mbit/s"));
  }
  return static_cast<uint64_t>(std::llround(bps));
}

absl::StatusOr<uint64_t> ParseSize(absl::string_view text, absl::string_view what,
                                   SizeRange range) {
  const std::string hint = "16MiB or 16MB";
  absl::string_view unit;
  absl::StatusOr<double> value = SplitNumber(text, what, hint, &unit);
  if (!value.ok()) return value.status();
  if (unit.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", text, "' has no unit; write ",
                                                   Trimmed(*value), "B for bytes, or ", hint));
  }
  if (absl::ConsumeSuffix(&unit, "b") || absl::EndsWithIgnoreCase(unit, "bit")) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", text, "': a size counts bytes; write ", hint));
  }
  absl::ConsumeSuffix(&unit, "B");
  const double factor = PrefixFactor(unit);
  if (factor == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " '", text, "' has an unknown unit; write ", hint, " (k, M, G, T; Ki, Mi, Gi, Ti)"));
  }
  const double bytes = *value * factor;
  if (bytes < static_cast<double>(range.min_bytes) ||
      bytes > static_cast<double>(range.max_bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " '", text, "' is ", Trimmed(bytes / 1024), " KiB; accepted: ",
        Trimmed(range.min_bytes / 1024.0), " to ", Trimmed(range.max_bytes / 1024.0), " KiB"));
  }
  return static_cast<uint64_t>(std::llround(bytes));
}

absl::StatusOr<absl::Duration> ParseAge(absl::string_view text, absl::string_view what) {
  absl::string_view unit;
  absl::StatusOr<double> value = SplitNumber(text, what, "30m, 12h or 7d", &unit);
  if (!value.ok()) return value.status();
  const absl::Duration per = unit == "s"   ? absl::Seconds(1)
                             : unit == "m" ? absl::Minutes(1)
                             : unit == "h" ? absl::Hours(1)
                             : unit == "d" ? absl::Hours(24)
                                           : absl::ZeroDuration();
  if (per == absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " '", text, "' needs a unit s, m, h or d, e.g. 30m, 12h or 7d"));
  }
  return *value * per;
}

}  // namespace longhaul::cli
