#ifndef LONGHAUL_TESTS_WANEM_NETNS_H_
#define LONGHAUL_TESTS_WANEM_NETNS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace longhaul::wanem {

// Network namespaces and TUN devices for the emulator. Namespaces are named
// ones (under /run/netns, made with iproute2) so that tests and the benchmark
// harness can `ip netns exec` into them. Every namespace the emulator makes
// is named "lhw-<owner pid>-<site>", which is how a later run recognises the
// ones left behind by an emulator that died without cleaning up.
//
// All functions are thread-safe (they touch no shared state of their own) but
// need CAP_NET_ADMIN and CAP_SYS_ADMIN.

inline constexpr char kNamespacePrefix[] = "lhw-";

// Runs argv[0] with arguments (searched in PATH), waits, and fails unless it
// exits 0. Its stderr is kept in the error message.
absl::Status RunCommand(const std::vector<std::string>& argv);

// One site's end of the link.
struct SiteSpec {
  std::string ns;       // Namespace name.
  std::string device;   // TUN device name inside it.
  std::string address;  // Local address, e.g. "198.18.0.1".
  int prefix_len = 30;
  int mtu = 9000;
};

// Creates namespace `site.ns`, brings lo up, opens a TUN device inside it,
// configures its address, MTU and the TCP buffer limits of the namespace
// (large enough for long fat pipes), and returns the TUN file descriptor
// (non-blocking). The device disappears when the descriptor is closed.
absl::StatusOr<int> CreateSite(const SiteSpec& site);

// Pids of the processes whose network namespace is `ns`.
std::vector<int> PidsInNamespace(const std::string& ns);

// Terminates every process inside `ns` (SIGTERM, then SIGKILL after a grace
// period) and deletes the namespace. Succeeds if it did not exist.
absl::Status DeleteNamespace(const std::string& ns);

// Deletes every "lhw-<pid>-*" namespace whose owner is no longer a running
// longhaul-wanem. Returns the names it removed.
absl::StatusOr<std::vector<std::string>> CleanupStaleNamespaces();

}  // namespace longhaul::wanem

#endif  // LONGHAUL_TESTS_WANEM_NETNS_H_
