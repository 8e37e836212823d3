#include "tests/wanem/star_topology.h"

#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace longhaul::wanem {
namespace {

// 198.18.1.0/24 in host byte order.
constexpr uint32_t kStarSubnet = (198u << 24) | (18u << 16) | (1u << 8);

enum class Which { kBoth, kUp, kDown };

// Splits "site3-up" into 3 and kUp. False when `key` is no site option.
bool ParseSiteKey(absl::string_view key, int& site, Which& which) {
  if (!absl::ConsumePrefix(&key, "site")) return false;
  which = Which::kBoth;
  if (absl::ConsumeSuffix(&key, "-up")) {
    which = Which::kUp;
  } else if (absl::ConsumeSuffix(&key, "-down")) {
    which = Which::kDown;
  }
  return absl::SimpleAtoi(key, &site);
}

}  // namespace

std::string StarSiteAddress(int site) { return absl::StrCat("198.18.1.", site); }

int DestinationSite(absl::Span<const uint8_t> packet, int num_sites) {
  // RFC 791 §3.1: version in the top nibble of byte 0, destination address in
  // bytes 16..19.
  if (packet.size() < 20 || (packet[0] >> 4) != 4) return 0;
  const uint32_t dst = (uint32_t{packet[16]} << 24) | (uint32_t{packet[17]} << 16) |
                       (uint32_t{packet[18]} << 8) | packet[19];
  if ((dst & 0xffffff00u) != kStarSubnet) return 0;
  const int host = static_cast<int>(dst & 0xff);
  return host >= 1 && host <= num_sites ? host : 0;
}

bool IsSiteOptionKey(absl::string_view key) {
  int site;
  Which which;
  return ParseSiteKey(key, site, which);
}

absl::StatusOr<std::vector<AccessLinkParams>> BuildStar(int sites, const DirectionSpec& base,
                                                        const std::vector<SiteOption>& options) {
  if (sites < kMinStarSites || sites > kMaxStarSites) {
    return absl::InvalidArgumentError(
        absl::StrCat("--sites must be within ", kMinStarSites, "..", kMaxStarSites));
  }
  std::vector<AccessLinkSpec> specs(sites, AccessLinkSpec{base, base});
  for (const SiteOption& option : options) {
    int site;
    Which which;
    if (!ParseSiteKey(option.key, site, which)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "unknown site option --", option.key, " (use --site<K>, --site<K>-up, --site<K>-down)"));
    }
    if (site < 1 || site > sites) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", option.key, ": no site ", site, " in a star of ", sites));
    }
    AccessLinkSpec& spec = specs[site - 1];
    for (DirectionSpec* d : {&spec.up, &spec.down}) {
      if (which == Which::kUp && d == &spec.down) continue;
      if (which == Which::kDown && d == &spec.up) continue;
      if (absl::Status s = ApplyOverrides(option.spec, *d); !s.ok()) {
        return absl::InvalidArgumentError(absl::StrCat("--", option.key, ": ", s.message()));
      }
    }
  }
  std::vector<AccessLinkParams> links;
  for (int k = 0; k < sites; ++k) {
    // "bdp" is a site-to-site round trip: it crosses each delay four times.
    absl::StatusOr<DirectionParams> up = Resolve(specs[k].up, 4);
    if (!up.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("site ", k + 1, " uplink: ", up.status().message()));
    }
    absl::StatusOr<DirectionParams> down = Resolve(specs[k].down, 4);
    if (!down.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("site ", k + 1, " downlink: ", down.status().message()));
    }
    links.push_back({*up, *down});
  }
  return links;
}

}  // namespace longhaul::wanem
