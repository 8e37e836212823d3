// The export's trash: what a publish replaced stays recoverable there for a
// while instead of being deleted at once.
#ifndef LONGHAUL_STORAGE_TRASH_H_
#define LONGHAUL_STORAGE_TRASH_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "longhaul/v1/control.pb.h"
#include "longhaul/v1/peer.pb.h"
#include "storage/exports.h"
#include "storage/file_system.h"

namespace longhaul::storage {

// Below the export root. Never a source for a peer (the source site refuses
// `.longhaul`) and never a destination (ResolveDestination refuses it).
inline constexpr char kTrashRel[] = ".longhaul/trash";

// One replaced version:
//   <export_root>/.longhaul/trash/<unix_ms>.<transfer_id>/
//     origin    the export-relative path it was published at, one line
//     version   the replaced tree or file, as it was (hard links it shared
//               with the new version are still links: it costs only the
//               bytes that changed or went)
// Restoring it is one rename of `version` back to `origin`.
inline constexpr char kTrashOrigin[] = "origin";
inline constexpr char kTrashVersion[] = "version";

// The entry name for a version replaced at `unix_ms` by `transfer_id`.
std::string TrashEntryName(int64_t unix_ms, std::string_view transfer_id);

// Creates (or opens again, after a crash) the trash entry `entry` of the
// export whose root is `root`, with its `origin` record durable. Returns the
// entry's directory, into which the caller renames `version`.
absl::StatusOr<std::unique_ptr<Directory>> OpenTrashEntry(FileSystem& fs, Directory& root,
                                                          const std::string& entry,
                                                          const std::string& origin);

// Removes every trash entry of the export at `export_root` (a realpath)
// replaced more than `retention` before `now`, and returns their names.
// Names that are no entry of a publish (the prune's work directory) are left
// alone. An export without a trash has nothing to expire. Never follows a
// symlink.
absl::StatusOr<std::vector<std::string>> ExpireTrash(FileSystem& fs, const std::string& export_root,
                                                     absl::Time now, absl::Duration retention);

// The relative paths ('/'-separated) of the regular files and symlinks in
// the tree `name` of `dir` (`name` itself, "", when it is not a directory),
// in no order. Never follows a symlink. A missing `name` has none.
absl::StatusOr<std::vector<std::string>> ListVersion(FileSystem& fs, Directory& dir,
                                                     const std::string& name);

// What replacing a version holding `there` (ListVersion's paths) with
// `manifest` changes: `changed`, the manifest's files there that are not in
// `skip_files` (the destination itself, "", for a single file); `deleted`,
// the paths there that the manifest does not name (none with keep_deleted).
// Lists hold at most kReportListed paths, sorted; the counts count all.
inline constexpr int kReportListed = 1000;
void CompareVersions(std::vector<std::string> there, const v1::Manifest& manifest, bool single_file,
                     const absl::flat_hash_set<uint32_t>& skip_files, bool keep_deleted,
                     v1::PublishReport& report);

// What publishing `manifest` at `dest` would replace and delete now (a dry
// run): `replaced` when the destination exists; `changed`, the manifest's
// files there that are not in `skip_files`; `deleted`, the files and
// symlinks there that the manifest does not name (none with keep_deleted).
// Lists hold at most 1000 paths, sorted. Reads only; never follows a
// symlink.
absl::StatusOr<v1::PublishReport> WouldReplace(FileSystem& fs, const ResolvedDestination& dest,
                                               bool single_file, const v1::Manifest& manifest,
                                               const absl::flat_hash_set<uint32_t>& skip_files,
                                               bool keep_deleted);

}  // namespace longhaul::storage

#endif  // LONGHAUL_STORAGE_TRASH_H_
