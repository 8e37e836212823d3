// Destination path resolution against the site's exports. Security
// critical: every destination path comes from a peer and is untrusted.
#ifndef LONGHAUL_STORAGE_EXPORTS_H_
#define LONGHAUL_STORAGE_EXPORTS_H_

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace longhaul::storage {

// A directory this site accepts transfers into, from the daemon config.
struct Export {
  std::string name;
  std::string path;
};

// Name of the per-export directory that holds staging; never a destination.
inline constexpr char kLonghaulDirName[] = ".longhaul";

struct ResolvedDestination {
  std::string export_root;  // realpath of the export directory
  std::string relative;     // clean, non-empty, '/'-separated, below export_root
  std::string absolute;     // export_root + "/" + relative
};

// Resolves `dest_path` below the export named `export_name`. Refuses with
// absl::PermissionDeniedError and a message naming the problem: an unknown
// export (listing the known ones), an empty, absolute or NUL-containing
// path, a ".." component, a path into .longhaul, and any existing component
// that is a symlink (walked with O_NOFOLLOW, so nothing resolves outside the
// export). "" and "." components are dropped. An existing intermediate
// component that is not a directory is FailedPrecondition. Components that
// do not exist yet are fine; Staging re-checks when it creates them.
absl::StatusOr<ResolvedDestination> ResolveDestination(const std::vector<Export>& exports,
                                                       std::string_view export_name,
                                                       std::string_view dest_path);

// Opens the directory `relative` ('/'-separated, clean; "" means dir_fd's
// own directory) beneath the directory `dir_fd`, one component at a time
// with O_NOFOLLOW, so a symlink anywhere is refused (PermissionDenied)
// rather than followed. With `create`, missing components are made (mode
// 0755) and their parents fsync'ed. Returns an O_RDONLY|O_DIRECTORY fd owned
// by the caller; NotFound when a component is missing and !create.
// `what` names the tree in error messages (e.g. the absolute path of dir_fd).
absl::StatusOr<int> OpenDirBeneath(int dir_fd, std::string_view relative, bool create,
                                   std::string_view what);

}  // namespace longhaul::storage

#endif  // LONGHAUL_STORAGE_EXPORTS_H_
