// Retention of replicated checkpoints at a destination (`longhaul sync
// --keep K`): after a checkpoint is published, only the newest K checkpoint
// directories beside it are kept.
#ifndef LONGHAUL_STORAGE_RETENTION_H_
#define LONGHAUL_STORAGE_RETENTION_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "storage/file_system.h"

namespace longhaul::storage {

struct RetentionPolicy {
  // Checkpoints to keep; 0 keeps everything.
  uint32_t keep = 0;
  // A path relative to a checkpoint directory (e.g. "model.index.json").
  // When set, only directories holding it as a regular file are
  // checkpoints: anything else is never counted and never removed.
  std::string complete_marker;
  // Without complete_marker: commit-marker globs (IsCommitMarker); only
  // directories holding a regular file at their top level that matches one
  // are checkpoints. With neither set, PruneCheckpoints refuses: an
  // incomplete checkpoint must never be counted, and nothing could tell.
  std::vector<std::string> marker_globs;
  // The names in the parent directory that this prune may count and remove:
  // the checkpoints the pruning transfer's source site published there (the
  // receiver knows them from its journal). Nothing else is ever counted or
  // removed, so one site's --keep never takes another's checkpoints, nor
  // anything an operator put there. Empty: nothing is pruned.
  absl::flat_hash_set<std::string> owned;
};

// In the directory `parent_relative` ('/'-separated, clean, "" for the
// export root itself) below `export_root`, the checkpoints are the
// subdirectories named in `policy.owned` that are not symlinks, do not start
// with '.', and hold their marker (complete_marker, else one matching
// marker_globs). All but the newest `policy.keep` (by NaturalLess of their
// names) are removed: each is first renamed into
// <export_root>/.longhaul/trash/pruning (so it disappears at once and never
// shows half-deleted), then deleted. Leftovers of an earlier crash there are
// deleted too; the rest of the trash (storage/trash.h) is not touched. Returns the names removed,
// oldest first. Never follows a symlink.
absl::StatusOr<std::vector<std::string>> PruneCheckpoints(FileSystem& fs,
                                                          const std::string& export_root,
                                                          std::string_view parent_relative,
                                                          const RetentionPolicy& policy);

}  // namespace longhaul::storage

#endif  // LONGHAUL_STORAGE_RETENTION_H_
