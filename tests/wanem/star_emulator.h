#ifndef LONGHAUL_TESTS_WANEM_STAR_EMULATOR_H_
#define LONGHAUL_TESTS_WANEM_STAR_EMULATOR_H_

#include <memory>
#include <string>
#include <vector>

#include "tests/wanem/emulator.h"
#include "tests/wanem/star_topology.h"

namespace longhaul::wanem {

struct StarOptions {
  // links[k - 1] is site k's access link; 2..8 sites.
  std::vector<AccessLinkParams> links;
  int mtu = 9000;
  uint64_t seed = 1;
  std::string control;  // Only echoed into the ready file.
};

// The N-site star (star_topology.h): site k is namespace "lhw-<pid>-<k>" with
// TUN device lhw0 at StarSiteAddress(k)/24, and one thread per site
// (StarSite).
//
// SetCut() takes "" (every site), "<k>" (both directions of site k's access
// link: the site is lost), "<k> up" or "<k> down".
std::unique_ptr<Emulator> NewStarEmulator(StarOptions options);

}  // namespace longhaul::wanem

#endif  // LONGHAUL_TESTS_WANEM_STAR_EMULATOR_H_
