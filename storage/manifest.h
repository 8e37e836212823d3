// Manifests: building them from local sources and validating them when they
// arrive from a peer. Chunk arithmetic is in chunk_plan.h.
#ifndef LONGHAUL_STORAGE_MANIFEST_H_
#define LONGHAUL_STORAGE_MANIFEST_H_

#include <sys/stat.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "longhaul/v1/peer.pb.h"

namespace longhaul::storage {

// What to do with a symlink found inside a source directory.
enum class SymlinkPolicy {
  // A relative symlink whose target, normalized lexically from the link's
  // directory, stays inside its source tree is sent as a symlink
  // (SymlinkTargetProblem); any other symlink is skipped and listed.
  kKeep,
  // Every symlink is followed: its target is sent as a regular file or a
  // directory under the link's name. A dangling link, a loop, or a target
  // that is neither is skipped and listed; whether the caller may read the
  // target is the caller's check (ManifestBuild::file_links).
  kFollow,
  // Any symlink fails the build (FailedPrecondition naming it).
  kRefuse,
};

// "keep" (or ""), "follow", "refuse"; InvalidArgument otherwise.
absl::StatusOr<SymlinkPolicy> ParseSymlinkPolicy(std::string_view name);

struct ManifestOptions {
  SymlinkPolicy symlinks = SymlinkPolicy::kKeep;
  // Files of the manifest that are names of one inode become a hard-link
  // group (GroupHardLinks). Off: each name is an independent file.
  bool hard_links = false;
};

// An entry of the sources that is not sent. `path` is relative to the
// transfer root, like manifest paths.
struct SkippedEntry {
  std::string path;
  std::string why;
};

struct ManifestBuild {
  v1::Manifest manifest;
  // Absolute source path of each manifest file, by file index.
  std::vector<std::string> source_paths;
  // Absolute source path of each manifest empty dir, by index.
  std::vector<std::string> empty_dir_paths;
  // kFollow: for each file (and each empty dir), the manifest path of the
  // innermost symlink followed to reach it; "" when none was. An entry
  // reached through a symlink may lie outside the source tree.
  std::vector<std::string> file_links;
  std::vector<std::string> empty_dir_links;
  // Entries not sent, in walk order: symlinks not kept or not followed,
  // special files (FIFOs, sockets, devices).
  std::vector<SkippedEntry> skipped;
  // True when the only source is a regular file: the destination path names
  // that file itself rather than a directory.
  bool single_file = false;
};

// Removes from `build` every file and empty dir reached through one of the
// symlinks `links` (manifest paths, as in file_links), keeping the vectors
// of `build` parallel to the manifest. Hard-link groups are formed again
// over the files kept (GroupHardLinks) when the manifest had any.
void DropFollowed(const std::vector<std::string>& links, ManifestBuild& build);

// Why a symlink at manifest path `link_path` with `target` may not be sent
// as a symlink, or "" when it may. The target must be relative, without
// "." or empty components, and made of zero or more leading ".." followed
// by plain components, with no more ".." than the link's directory is deep
// below the tree root (`root_depth` components of link_path are above the
// root: 1 for an entry of one of several sources). Such a target stays in
// the tree even through other symlinks of the tree that follow the same rule.
std::string SymlinkTargetProblem(std::string_view link_path, std::string_view target,
                                 size_t root_depth = 0);

// Builds the manifest of `sources` (absolute paths).
//  - One regular file: one entry whose path is its basename; single_file.
//  - One directory: its contents, relative to it (the directory itself maps
//    onto the destination).
//  - Several sources: each lands under its basename ("a/x", "b"); two
//    sources with the same basename are an error.
// Directories are walked in byte-wise sorted order, so the same tree gives
// the same manifest. Regular files are sent; symlinks inside a directory
// follow options.symlinks; special files are skipped. Everything skipped is
// listed in `skipped`. A source named explicitly that is a symlink is
// followed. Directories with nothing sent in them are listed in empty_dirs.
// Files get generation 0 and their source identity (RecordSourceIdentity).
// Errors name the offending path.
absl::StatusOr<ManifestBuild> BuildManifest(const std::vector<std::string>& sources,
                                            uint64_t chunk_size,
                                            const ManifestOptions& options = {});

// Sets ManifestFile.link_of for every file of `manifest` from the source
// identity it records: the first file of each (device, inode) in manifest
// order gets 0, every later one 1 + the index of that first file. Names of
// the inode that are not in the manifest play no part. Files with the same
// (device, inode) but another size or mode (a file changed between two
// stats) are left independent.
void GroupHardLinks(v1::Manifest& manifest);

// Sets the size, mode and source identity (mtime, ctime, inode, device) of
// `file` from `st`, a stat of its source. Path, generation and
// content_xxh128 are left as they are.
void RecordSourceIdentity(const struct stat& st, v1::ManifestFile& file);

// Records in `file` the data extents of the regular file at `path` (found
// with SEEK_DATA/SEEK_HOLE), of size file.size(), when it has holes: sets
// `sparse` and `data`. A file without holes, one whose file system does not
// tell, or one with more than kMaxDataExtents extents is recorded whole
// (not sparse). Call it after taking the stat the identity was recorded
// from: a change after that stat shows in the identity check
// (CheckSourceUnchanged), so stale extents are never trusted.
void RecordDataExtents(const std::string& path, const struct stat& st, v1::ManifestFile& file);

inline constexpr int kMaxDataExtents = 65536;

struct ManifestLimits {
  uint64_t min_chunk_size = uint64_t{64} << 10;  // 64 KiB
  uint64_t max_chunk_size = uint64_t{1} << 30;   // 1 GiB
  uint64_t max_files = 10'000'000;
  uint64_t max_file_size = uint64_t{1} << 50;
  size_t max_path_length = 4096;
  int max_data_extents = kMaxDataExtents;  // per file
};

// Checks a manifest received from the network before anything is written.
// Rejects (InvalidArgument, naming the file index and path): a chunk size
// out of limits; too many files; a path that is empty, absolute, longer
// than the limit, has an empty, "." or ".." component or a NUL; duplicate
// paths; a path that is both a file and a directory prefix of another file
// (or of an empty dir); a size beyond the limit or needing more than 2^32-1
// chunks; mode bits beyond 07777; a content_xxh128 that is neither empty
// nor 16 bytes; data extents on a file that is not sparse, more than
// max_data_extents of them, or extents that are empty, unsorted,
// overlapping or reach past the file's size; a link_of that does not name
// an earlier file with link_of 0 and the same size and mode. empty_dirs
// follow the same path rules. Symlinks follow the path rules too, may not
// share a path with another entry nor be a parent of one, and their targets
// must pass SymlinkTargetProblem.
absl::Status ValidateManifest(const v1::Manifest& manifest, const ManifestLimits& limits = {});

// Checks that the open source file `fd` is still the one in `file`: same
// size, mtime, ctime, inode and device. The ctime catches a rewrite in place
// whose writer put the size and mtime back; a file.ctime_ns() of 0 (a
// manifest journaled before ctimes were recorded) is not compared. Returns
// absl::AbortedError("source file changed since its manifest: <why>") when
// it is not the same — distinct from I/O errors so the caller re-sends the
// file whole with a new generation.
absl::Status CheckSourceUnchanged(const v1::ManifestFile& file, int fd);

}  // namespace longhaul::storage

#endif  // LONGHAUL_STORAGE_MANIFEST_H_
