#include "storage/retention.h"

#include <unistd.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/checkpoints.h"
#include "storage/posix_util.h"

namespace longhaul::storage {

using internal::JoinPath;

namespace {

// The prune's own work directory in the trash: what it moves there is
// deleted at once. Publish's trash entries beside it are never touched.
constexpr char kPruningRel[] = ".longhaul/trash/pruning";

absl::StatusOr<bool> IsCheckpoint(FileSystem& fs, Directory& parent, const std::string& name,
                                  const RetentionPolicy& policy) {
  if (name.empty() || name[0] == '.') return false;
  absl::StatusOr<std::optional<FileInfo>> st = fs.Stat(parent, name);
  if (!st.ok()) return st.status();
  if (!st->has_value() || !(*st)->is_directory()) return false;
  absl::StatusOr<std::unique_ptr<Directory>> checkpoint = fs.OpenDir(parent, name, /*create=*/false, kDirMode);
  if (!checkpoint.ok()) return false;  // replaced meanwhile: not ours to judge
  if (!policy.complete_marker.empty()) {
    // The marker must be reached without following symlinks.
    std::string_view rel = policy.complete_marker;
    std::string_view dir_part, file_part = rel;
    if (size_t slash = rel.rfind('/'); slash != std::string_view::npos) {
      dir_part = rel.substr(0, slash);
      file_part = rel.substr(slash + 1);
    }
    absl::StatusOr<std::unique_ptr<Directory>> marker_dir =
        OpenDirBeneath(fs, **checkpoint, dir_part, /*create=*/false);
    if (!marker_dir.ok()) return false;
    st = fs.Stat(**marker_dir, std::string(file_part));
    return st.ok() && st->has_value() && (*st)->is_regular();
  }
  absl::StatusOr<std::vector<std::string>> names = fs.List(**checkpoint);
  if (!names.ok()) return names.status();
  for (const std::string& n : *names) {
    if (!IsCommitMarker(policy.marker_globs, n)) continue;
    st = fs.Stat(**checkpoint, n);
    if (st.ok() && st->has_value() && (*st)->is_regular()) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> PruneCheckpoints(FileSystem& fs,
                                                          const std::string& export_root,
                                                          std::string_view parent_relative,
                                                          const RetentionPolicy& policy) {
  std::vector<std::string> removed;
  if (policy.keep == 0 || policy.owned.empty()) return removed;
  if (absl::Status s = ValidateCheckpointMarker(policy.complete_marker); !s.ok()) return s;
  if (policy.complete_marker.empty() && policy.marker_globs.empty()) {
    return absl::InvalidArgumentError(
        "retention needs a commit marker to tell complete checkpoints from partial ones");
  }
  absl::StatusOr<std::unique_ptr<Directory>> root = fs.OpenRoot(export_root);
  if (!root.ok()) return root.status();
  absl::StatusOr<std::unique_ptr<Directory>> parent =
      OpenDirBeneath(fs, **root, parent_relative, /*create=*/false);
  if (!parent.ok()) return parent.status();
  absl::StatusOr<std::unique_ptr<Directory>> trash =
      OpenDirBeneath(fs, **root, kPruningRel, /*create=*/true);
  if (!trash.ok()) return trash.status();

  // Finish what a crash interrupted: everything in the prune's work
  // directory goes.
  absl::StatusOr<std::vector<std::string>> leftovers = fs.List(**trash);
  if (!leftovers.ok()) return leftovers.status();
  for (const std::string& n : *leftovers) {
    if (absl::Status s = RemoveTree(fs, **trash, n); !s.ok()) return s;
  }

  absl::StatusOr<std::vector<std::string>> names = fs.List(**parent);
  if (!names.ok()) return names.status();
  std::vector<std::string> checkpoints;
  for (const std::string& n : *names) {
    if (!policy.owned.contains(n)) continue;
    absl::StatusOr<bool> is = IsCheckpoint(fs, **parent, n, policy);
    if (!is.ok()) return is.status();
    if (*is) checkpoints.push_back(n);
  }
  if (checkpoints.size() <= policy.keep) return removed;
  std::sort(checkpoints.begin(), checkpoints.end(),
            [](const std::string& a, const std::string& b) { return NaturalLess(a, b); });
  checkpoints.resize(checkpoints.size() - policy.keep);  // the oldest ones

  // Each one leaves in one rename, so it is never seen half-deleted.
  std::vector<std::string> trashed;
  for (const std::string& n : checkpoints) {
    // A unique trash name: the same checkpoint name may be pruned again later.
    std::string trash_name = absl::StrCat(n, ".", getpid(), ".", trashed.size());
    absl::Status s = fs.Rename(**parent, n, **trash, trash_name, RenameMode::kReplace);
    if (absl::IsNotFound(s)) continue;  // pruned by a concurrent publish
    if (!s.ok()) return s;
    removed.push_back(n);
    trashed.push_back(std::move(trash_name));
  }
  if (absl::Status s = fs.SyncDir(**parent); !s.ok()) return s;
  for (const std::string& t : trashed) {
    if (absl::Status s = RemoveTree(fs, **trash, t); !s.ok()) return s;
  }
  return removed;
}

}  // namespace longhaul::storage
