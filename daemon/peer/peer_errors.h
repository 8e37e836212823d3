#ifndef LONGHAUL_DAEMON_PEER_PEER_ERRORS_H_
#define LONGHAUL_DAEMON_PEER_PEER_ERRORS_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace longhaul::peer {

// An export as a peer may know it (its name) and as this host knows it
// (its configured path and that path resolved).
struct ExportRoot {
  std::string name;
  std::string path;
  std::string real_path;  // realpath(path); empty if it did not resolve
};

// The export roots of `exports` (name, path) pairs, resolved now.
std::vector<ExportRoot> ResolveExportRoots(
    const std::vector<std::pair<std::string, std::string>>& exports);

// `message` as a peer may read it: the host's paths are this site's
// business. A path under an export root becomes `export:relative` (the
// export root itself `export:`), and any other absolute path becomes
// "(a path of this site)". The site's own log keeps the whole message.
std::string ForPeer(absl::string_view message, const std::vector<ExportRoot>& roots);

}  // namespace longhaul::peer

#endif  // LONGHAUL_DAEMON_PEER_PEER_ERRORS_H_
