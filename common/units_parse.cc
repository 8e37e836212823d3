#include "absl/strings/string_view.h"
#include "common/units_parse.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace longhaul {
namespace {

struct Suffix {
  absl::string_view text;
  double factor;
};

// Splits "1.5GiB" into 1.5 and "GiB"; the number must be finite and >= 0.
absl::StatusOr<double> SplitNumber(absl::string_view text, absl::string_view what,
                                   absl::string_view* suffix) {
  std::string s(absl::StripAsciiWhitespace(text));
  if (s.empty()) return absl::InvalidArgumentError(absl::StrCat("empty ", what));
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  if (i == 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", text, "' does not start with a number"));
  }
  char* end = nullptr;
  std::string number = s.substr(0, i);
  double value = std::strtod(number.c_str(), &end);
  if (end != number.c_str() + number.size() || !std::isfinite(value) || value < 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, " '", text, "' is not a number"));
  }
  *suffix = absl::StripAsciiWhitespace(text.substr(text.find(number) + number.size()));
  return value;
}

absl::StatusOr<double> Scale(absl::string_view text, absl::string_view what,
                             std::initializer_list<Suffix> suffixes) {
  absl::string_view suffix;
  absl::StatusOr<double> value = SplitNumber(text, what, &suffix);
  if (!value.ok()) return value.status();
  for (const Suffix& s : suffixes) {
    if (absl::EqualsIgnoreCase(suffix, s.text)) return *value * s.factor;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what, " '", text, "' has an unknown unit '", suffix, "'"));
}

}  // namespace

absl::StatusOr<uint64_t> ParseByteSize(absl::string_view text) {
  absl::StatusOr<double> v =
      Scale(text, "size",
            {{"", 1}, {"b", 1}, {"k", 1e3}, {"kb", 1e3}, {"ki", 1024.0}, {"kib", 1024.0},
             {"m", 1e6}, {"mb", 1e6}, {"mi", 1048576.0}, {"mib", 1048576.0}, {"g", 1e9},
             {"gb", 1e9}, {"gi", 1073741824.0}, {"gib", 1073741824.0}, {"t", 1e12},
             {"tib", 1099511627776.0}});
  if (!v.ok()) return v.status();
  return static_cast<uint64_t>(std::llround(*v));
}

absl::StatusOr<uint64_t> ParseBitRate(absl::string_view text) {
  absl::StatusOr<double> v = Scale(text, "rate",
                                   {{"", 1},
                                    {"bit", 1},
                                    {"k", 1e3},
                                    {"kbit", 1e3},
                                    {"m", 1e6},
                                    {"mbit", 1e6},
                                    {"g", 1e9},
                                    {"gbit", 1e9}});
  if (!v.ok()) return v.status();
  return static_cast<uint64_t>(std::llround(*v));
}

absl::StatusOr<int64_t> ParseDurationMicros(absl::string_view text) {
  absl::StatusOr<double> v =
      Scale(text, "duration", {{"us", 1}, {"ms", 1e3}, {"s", 1e6}, {"m", 60e6}, {"h", 3600e6}});
  if (!v.ok()) return v.status();
  return static_cast<int64_t>(std::llround(*v));
}

std::string FormatBytes(double bytes) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (bytes >= 1024.0 && unit < 4) {
    bytes /= 1024.0;
    ++unit;
  }
  return unit == 0 ? absl::StrFormat("%.0f %s", bytes, kUnits[unit])
                   : absl::StrFormat("%.1f %s", bytes, kUnits[unit]);
}

}  // namespace longhaul
