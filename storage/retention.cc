#include "storage/retention.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "absl/strings/str_cat.h"
#include "common/checkpoints.h"
#include "storage/exports.h"
#include "storage/posix_util.h"

namespace longhaul::storage {

using internal::ErrnoError;
using internal::FsyncFd;
using internal::JoinPath;
using internal::ListDirAt;
using internal::RemoveTreeAt;
using internal::ScopedFd;

namespace {

constexpr char kTrashRel[] = ".longhaul/trash";

bool IsCheckpoint(int parent_fd, const std::string& name, const std::string& marker) {
  if (name.empty() || name[0] == '.') return false;
  struct stat st;
  if (fstatat(parent_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode)) return false;
  if (marker.empty()) return true;
  // The marker must be reached without following symlinks.
  std::string_view rel = marker;
  std::string_view dir_part, file_part = rel;
  if (size_t slash = rel.rfind('/'); slash != std::string_view::npos) {
    dir_part = rel.substr(0, slash);
    file_part = rel.substr(slash + 1);
  }
  ScopedFd checkpoint(openat(parent_fd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC));
  if (!checkpoint.valid()) return false;
  absl::StatusOr<int> marker_dir = OpenDirBeneath(checkpoint.get(), dir_part, /*create=*/false, name);
  if (!marker_dir.ok()) return false;
  ScopedFd marker_dir_fd(*marker_dir);
  return fstatat(marker_dir_fd.get(), std::string(file_part).c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
         S_ISREG(st.st_mode);
}

}  // namespace

absl::StatusOr<std::vector<std::string>> PruneCheckpoints(const std::string& export_root,
                                                          std::string_view parent_relative,
                                                          const RetentionPolicy& policy) {
  std::vector<std::string> removed;
  if (policy.keep == 0) return removed;
  if (absl::Status s = ValidateCheckpointMarker(policy.complete_marker); !s.ok()) return s;
  ScopedFd root(open(export_root.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (!root.valid()) return ErrnoError(errno, "cannot open export", export_root);
  absl::StatusOr<int> parent_fd = OpenDirBeneath(root.get(), parent_relative, /*create=*/false, export_root);
  if (!parent_fd.ok()) return parent_fd.status();
  ScopedFd parent(*parent_fd);
  const std::string parent_desc = JoinPath(export_root, parent_relative);
  absl::StatusOr<int> trash_fd = OpenDirBeneath(root.get(), kTrashRel, /*create=*/true, export_root);
  if (!trash_fd.ok()) return trash_fd.status();
  ScopedFd trash(*trash_fd);
  const std::string trash_desc = JoinPath(export_root, kTrashRel);

  // Finish what a crash interrupted: everything in the trash goes.
  absl::StatusOr<std::vector<std::string>> leftovers = ListDirAt(trash.get(), trash_desc);
  if (!leftovers.ok()) return leftovers.status();
  for (const std::string& n : *leftovers) {
    if (absl::Status s = RemoveTreeAt(trash.get(), n, JoinPath(trash_desc, n)); !s.ok()) return s;
  }

  absl::StatusOr<std::vector<std::string>> names = ListDirAt(parent.get(), parent_desc);
  if (!names.ok()) return names.status();
  std::vector<std::string> checkpoints;
  for (const std::string& n : *names) {
    if (IsCheckpoint(parent.get(), n, policy.complete_marker)) checkpoints.push_back(n);
  }
  if (checkpoints.size() <= policy.keep) return removed;
  std::sort(checkpoints.begin(), checkpoints.end(),
            [](const std::string& a, const std::string& b) { return NaturalLess(a, b); });
  checkpoints.resize(checkpoints.size() - policy.keep);  // the oldest ones

  std::vector<std::string> trashed;
  for (const std::string& n : checkpoints) {
    // A unique trash name: the same checkpoint name may be pruned again later.
    std::string trash_name = absl::StrCat(n, ".", getpid(), ".", trashed.size());
    if (renameat(parent.get(), n.c_str(), trash.get(), trash_name.c_str()) != 0) {
      if (errno == ENOENT) continue;  // pruned by a concurrent publish
      return ErrnoError(errno, "cannot move old checkpoint to the trash", JoinPath(parent_desc, n));
    }
    removed.push_back(n);
    trashed.push_back(std::move(trash_name));
  }
  if (absl::Status s = FsyncFd(parent.get(), parent_desc); !s.ok()) return s;
  for (const std::string& t : trashed) {
    if (absl::Status s = RemoveTreeAt(trash.get(), t, JoinPath(trash_desc, t)); !s.ok()) return s;
  }
  return removed;
}

}  // namespace longhaul::storage
