#ifndef LONGHAUL_TESTS_WANEM_STAR_TOPOLOGY_H_
#define LONGHAUL_TESTS_WANEM_STAR_TOPOLOGY_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "tests/wanem/link_config.h"
#include "tests/wanem/link_shaper.h"

namespace longhaul::wanem {

// The N-site star: addressing, routing and configuration. Pure (no I/O), so
// it is tested without root.
//
// Sites are numbered 1..N. Site k has address 198.18.1.k on the shared subnet
// 198.18.1.0/24, so each site's kernel sends every peer's packets into its
// own TUN device and the emulator routes them by destination address.
//
// Each site has one access link to the core with two directions: the uplink
// (site -> core) carries everything the site sends, to any peer, so all of
// its peers share its rate and queue; the downlink (core -> site) carries
// everything sent to it. A packet from i to j crosses i's uplink and then j's
// downlink, so its one-way delay is delay_i + delay_j and it is lost with
// probability 1 - (1 - loss_i)(1 - loss_j).

inline constexpr int kMinStarSites = 2;
inline constexpr int kMaxStarSites = 8;
inline constexpr int kStarPrefixLen = 24;

// "198.18.1.<site>".
std::string StarSiteAddress(int site);

// The site an IP packet is addressed to, or 0 when it is not an IPv4 packet
// (e.g. IPv6 neighbour discovery), is truncated, or its destination is no
// site of a `num_sites` star.
int DestinationSite(absl::Span<const uint8_t> packet, int num_sites);

// One site's access link, as text and resolved.
struct AccessLinkSpec {
  DirectionSpec up;
  DirectionSpec down;
};
struct AccessLinkParams {
  DirectionParams up;
  DirectionParams down;
};

// A per-site option: "site<K>" (both directions), "site<K>-up" or
// "site<K>-down", with an override SPEC as ApplyOverrides() reads it.
struct SiteOption {
  std::string key;
  std::string spec;
};

// The access links of a `sites`-site star (index 0 is site 1): every
// direction starts as `base`, then the site options apply in order. Fails on
// a bad site count, an unknown key, a site beyond `sites` or a bad value.
absl::StatusOr<std::vector<AccessLinkParams>> BuildStar(int sites, const DirectionSpec& base,
                                                        const std::vector<SiteOption>& options);

// Whether `key` (without "--") names a per-site option.
bool IsSiteOptionKey(absl::string_view key);

}  // namespace longhaul::wanem

#endif  // LONGHAUL_TESTS_WANEM_STAR_TOPOLOGY_H_
