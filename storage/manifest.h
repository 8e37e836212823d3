// Manifests: building them from local sources and validating them when they
// arrive from a peer. Chunk arithmetic is in chunk_plan.h.
#ifndef LONGHAUL_STORAGE_MANIFEST_H_
#define LONGHAUL_STORAGE_MANIFEST_H_

#include <sys/stat.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "longhaul/v1/peer.pb.h"

namespace longhaul::storage {

struct ManifestBuild {
  v1::Manifest manifest;
  // Absolute source path of each manifest file, by file index.
  std::vector<std::string> source_paths;
  // True when the only source is a regular file: the destination path names
  // that file itself rather than a directory.
  bool single_file = false;
};

// Builds the manifest of `sources` (absolute paths).
//  - One regular file: one entry whose path is its basename; single_file.
//  - One directory: its contents, relative to it (the directory itself maps
//    onto the destination).
//  - Several sources: each lands under its basename ("a/x", "b"); two
//    sources with the same basename are an error.
// Directories are walked in byte-wise sorted order, so the same tree gives
// the same manifest. Only regular files are sent; symlinks and special files
// found inside a directory are skipped with a warning. A source named
// explicitly that is a symlink is followed. Directories with no file or
// subdirectory are listed in empty_dirs. Files get generation 0 and their
// source identity (RecordSourceIdentity). Errors name the offending path.
absl::StatusOr<ManifestBuild> BuildManifest(const std::vector<std::string>& sources,
                                            uint64_t chunk_size);

// Sets the size, mode and source identity (mtime, ctime, inode, device) of
// `file` from `st`, a stat of its source. Path, generation and
// content_xxh128 are left as they are.
void RecordSourceIdentity(const struct stat& st, v1::ManifestFile& file);

struct ManifestLimits {
  uint64_t min_chunk_size = uint64_t{64} << 10;  // 64 KiB
  uint64_t max_chunk_size = uint64_t{1} << 30;   // 1 GiB
  uint64_t max_files = 10'000'000;
  uint64_t max_file_size = uint64_t{1} << 50;
  size_t max_path_length = 4096;
};

// Checks a manifest received from the network before anything is written.
// Rejects (InvalidArgument, naming the file index and path): a chunk size
// out of limits; too many files; a path that is empty, absolute, longer
// than the limit, has an empty, "." or ".." component or a NUL; duplicate
// paths; a path that is both a file and a directory prefix of another file
// (or of an empty dir); a size beyond the limit or needing more than 2^32-1
// chunks; mode bits beyond 07777; a content_xxh128 that is neither empty
// nor 16 bytes. empty_dirs follow the same path rules.
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
