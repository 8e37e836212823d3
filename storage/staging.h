// Staging of received files and their atomic publish into the destination.
#ifndef LONGHAUL_STORAGE_STAGING_H_
#define LONGHAUL_STORAGE_STAGING_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "longhaul/v1/peer.pb.h"
#include "storage/exports.h"

namespace longhaul::storage {

struct PublishOptions {
  // Commit-marker globs (fnmatch). A file is a marker when a glob matches its
  // basename, or its full relative path (FNM_PATHNAME). Markers are
  // published after every other file.
  std::vector<std::string> commit_last;
  // The destination is the manifest's only file itself, not a directory.
  bool single_file = false;
  // File indices not staged and left alone (sync: already up to date).
  absl::flat_hash_set<uint32_t> skip_files;
  // Test hook: called once every non-marker file is in place at the
  // destination and before any marker is renamed there.
  std::function<void()> before_markers;
};

// The staging area of one incoming transfer:
// <export_root>/.longhaul/staging/<transfer_id>/ holding f/<file_index>
// (files are named by index, never by their untrusted relative path) and,
// during publish, tree/ (the tree being assembled for a new destination).
//
// Threading: OpenFile and DiscardFile are thread-safe (chunk writers of
// several streams share one Staging). Publish and Remove must not run
// concurrently with any other call, and invalidate the fds handed out.
// Ownership: fds returned by OpenFile stay owned by the Staging; they are
// valid until DiscardFile of that file, Publish, Remove or destruction.
// Movable, not copyable.
class Staging {
 public:
  // Creates (or re-opens, on resume) the staging directory of
  // `transfer_id`, refusing symlinks on the way. `transfer_id` must be a
  // single safe path component. Directories created are fsync'ed.
  static absl::StatusOr<Staging> Open(ResolvedDestination dest, std::string transfer_id);

  Staging(Staging&&) noexcept;
  Staging& operator=(Staging&&) noexcept;
  ~Staging();

  // The fd (O_RDWR) of the staged file for `file_index`, created with the
  // manifest size preallocated (fallocate, else ftruncate). An existing
  // staged file (resume) keeps its contents. Cached: later calls return the
  // same fd. A newly created file's directory entry is fsync'ed, so the
  // caller's fdatasync of the data is enough to make chunks durable.
  absl::StatusOr<int> OpenFile(uint32_t file_index, const v1::ManifestFile& file);

  // Like OpenFile, but never creates: NotFound when the file is not staged
  // (an interrupted Publish already moved it on, after verifying it).
  absl::StatusOr<int> OpenStagedFile(uint32_t file_index, const v1::ManifestFile& file);

  // Throws away the staged file (its source changed); the next OpenFile
  // starts from an empty file. Delete the file's chunks from the journal
  // first (Journal::DeleteFileChunks), then call this.
  absl::Status DiscardFile(uint32_t file_index);

  // Publishes the staged files into the destination. For each staged file:
  // chmod to the manifest mode, set its mtime (ns), fsync. Then:
  //  - single_file: rename f/0 onto the destination path.
  //  - destination missing: assemble tree/ (every file, markers included,
  //    parent and empty dirs; fsync'ed), then ONE rename(2) of tree/ onto
  //    the destination: the tree appears whole or not at all.
  //  - destination an existing directory: rename files into it one by one,
  //    creating parents, non-markers first and markers last.
  // Directories touched are fsync'ed; finally the staging dir is removed.
  // Idempotent: re-running after a crash at any point finishes the job. A
  // file no longer staged counts as published when the destination (or
  // tree/) holds a regular file with the manifest's size and mtime.
  // 0-byte files need no OpenFile; Publish creates them.
  absl::Status Publish(const v1::Manifest& manifest, const PublishOptions& options);

  // Removes the staging directory and everything in it (cancel/abort).
  absl::Status Remove();

  const std::string& dir() const { return state_->dir; }

 private:
  struct State {
    ResolvedDestination dest;
    std::string transfer_id;
    std::string dir;  // absolute path of the staging dir, for messages
    int root_fd = -1;     // export root
    int parent_fd = -1;   // <root>/.longhaul/staging
    int staging_fd = -1;  // <root>/.longhaul/staging/<id>
    int files_fd = -1;    // .../<id>/f
    absl::Mutex mu;
    absl::flat_hash_map<uint32_t, int> open_files ABSL_GUARDED_BY(mu);
    ~State();
  };
  explicit Staging(std::unique_ptr<State> state) : state_(std::move(state)) {}
  absl::StatusOr<int> Open(uint32_t file_index, const v1::ManifestFile& file, bool create);
  void CloseFiles();

  std::unique_ptr<State> state_;
};

// For sync: true when the published destination of `file` (the destination
// itself when single_file) is a regular file with the manifest's size and
// mtime_ns. False when it does not exist. Symlinks on the way are refused.
absl::StatusOr<bool> PublishedFileMatches(const ResolvedDestination& dest, bool single_file,
                                          const v1::ManifestFile& file);

}  // namespace longhaul::storage

#endif  // LONGHAUL_STORAGE_STAGING_H_
