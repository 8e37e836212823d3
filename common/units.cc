#include "common/units.h"

#include "absl/strings/str_format.h"

namespace longhaul {

std::string TimeDelta::ToString() const {
  if (IsInfinite()) return "inf";
  if (ns_ % 1000000 == 0) return absl::StrFormat("%dms", ns_ / 1000000);
  if (ns_ % 1000 == 0) return absl::StrFormat("%dus", ns_ / 1000);
  return absl::StrFormat("%dns", ns_);
}

std::string Timestamp::ToString() const {
  if (IsInfinite()) return "inf";
  return absl::StrFormat("%.6fs", static_cast<double>(ns_) * 1e-9);
}

std::string Bandwidth::ToString() const {
  if (IsInfinite()) return "inf";
  return absl::StrFormat("%.3fMbit/s", static_cast<double>(bps_) * 1e-6);
}

std::ostream& operator<<(std::ostream& os, TimeDelta d) { return os << d.ToString(); }
std::ostream& operator<<(std::ostream& os, Timestamp t) { return os << t.ToString(); }
std::ostream& operator<<(std::ostream& os, Bandwidth b) { return os << b.ToString(); }

}  // namespace longhaul
