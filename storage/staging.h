// Staging of received files and their atomic publish into the destination.
#ifndef LONGHAUL_STORAGE_STAGING_H_
#define LONGHAUL_STORAGE_STAGING_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
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
#include "storage/file_system.h"

namespace longhaul::storage {

struct PublishOptions {
  // Commit-marker globs (fnmatch). A file is a marker when a glob matches its
  // basename, or its full relative path (FNM_PATHNAME). With RENAME_EXCHANGE
  // the whole version appears at once, markers included; where the file
  // system lacks it, the old version's markers are removed before the old
  // version is moved away (see storage/README.md, "Publish protocol").
  std::vector<std::string> commit_last;
  // The destination is the manifest's only file itself, not a directory.
  bool single_file = false;
  // Files not staged: the current destination already holds them
  // (sync: unchanged). They are hard-linked into the new version.
  absl::flat_hash_set<uint32_t> skip_files;
  // sync --checksum: skip_files were found unchanged by content digest, so
  // before one is linked its content is checked again (not its mtime).
  bool compare_content = false;
  // The permission bits a published file may keep of its manifest mode, and
  // the mode of every directory publish creates in the export (0777 &
  // mode_mask): the export's 0777 & ~umask. Bits above 0777 (setuid, setgid,
  // sticky) are never kept, whatever this says.
  uint32_t mode_mask = 0755;
  // sync --no-delete: files and symlinks of the current destination that the
  // manifest does not name are hard-linked (symlinks made again) into the
  // new version, where no manifest entry takes their place.
  bool keep_deleted = false;
  // The trash entry (storage/trash.h, TrashEntryName) that keeps the version
  // this publish replaces, recoverable; empty: the replaced version is
  // deleted. A re-run after a crash may name another entry: the replaced
  // version goes to whichever run moves it.
  std::string trash_entry;
  // When set, filled with what the publish replaced and deleted (left empty
  // by a re-run that finds the replaced version moved away already).
  v1::PublishReport* report = nullptr;
  // Test hook: called once the new version is complete and durable beside
  // the destination, right before the point of no return.
  std::function<void()> before_install;
};

// The staging area of one incoming transfer, on the destination's file
// system so that publishing is a rename:
//   <export_root>/.longhaul/staging/<transfer_id>/
//     f/<file_index>  staged files, named by index, never by their untrusted path
//     next/           publish: the complete new version being assembled
//     installing      publish: the point of no return (identity of next/ or f/0)
//     old/            publish fallback: the old version moved away
//
// Threading: OpenFile, OpenStagedFile, HoldsFile and DiscardFile are
// thread-safe (chunk writers of several streams share one Staging). Publish
// and Remove must not run concurrently with any other call, and invalidate
// the files handed out. Two Stagings must not publish to one destination at
// once: the caller serializes publishes per destination path.
// Ownership: Files returned by OpenFile stay owned by the Staging; they are
// valid until DiscardFile of that file, Publish, Remove or destruction.
// Movable, not copyable.
class Staging {
 public:
  // Creates (or re-opens, on resume) the staging directory of
  // `transfer_id`, refusing symlinks on the way. `transfer_id` must be a
  // single safe path component. Directories created are fsync'ed. `fs` must
  // outlive the Staging.
  static absl::StatusOr<Staging> Open(FileSystem& fs, ResolvedDestination dest,
                                      std::string transfer_id);

  Staging(Staging&&) noexcept;
  Staging& operator=(Staging&&) noexcept;
  ~Staging();

  // The staged file for `file_index`, created at the manifest size without
  // reserving it (sparse: disk is used only by the bytes written). An
  // existing staged file (resume) keeps its contents. Cached: later calls
  // return the same File. A newly created file's directory entry is
  // fsync'ed, so the caller's fdatasync of the data is enough to make
  // chunks durable.
  absl::StatusOr<File*> OpenFile(uint32_t file_index, const v1::ManifestFile& file);

  // Like OpenFile, but never creates: NotFound when the file is not in f/
  // (an interrupted Publish may have moved it into next/ already).
  absl::StatusOr<File*> OpenStagedFile(uint32_t file_index, const v1::ManifestFile& file);

  // A descriptor of its own on the staged file, for reading it back on
  // another thread (direct I/O where the staging takes it): unlike the Files
  // of OpenFile it stays valid after DiscardFile, Publish or Remove, and then
  // reads what the file held (or holds, wherever it was moved). NotFound
  // when the file is not in f/.
  absl::StatusOr<std::unique_ptr<File>> OpenForReadBack(uint32_t file_index,
                                                        const v1::ManifestFile& file);

  // Whether the bytes of `file` are still held here at full size: in f/, in
  // next/ (an interrupted publish moved them), or past the point of no
  // return. False means chunks journaled durable for it were lost with the
  // staged file (removed, truncated) and must be asked for again.
  absl::StatusOr<bool> HoldsFile(uint32_t file_index, const v1::ManifestFile& file);

  // Throws away the staged file (its source changed); the next OpenFile
  // starts from an empty file. Delete the file's chunks from the journal
  // first (Journal::DeleteFileChunks), then call this.
  absl::Status DiscardFile(uint32_t file_index);

  // True once a Publish passed its point of no return: from then on the new
  // version is what the destination becomes, and a cancel must complete the
  // publish (run Publish again) rather than Remove the staging.
  absl::StatusOr<bool> PastPointOfNoReturn();

  // Publishes the staged files as one whole new version of the destination.
  // Until the point of no return the destination is not touched; after it,
  // one rename installs the new version:
  //  1. Each staged file gets its manifest mode (masked by mode_mask) and
  //     mtime and is fsync'ed.
  //  2. single_file: f/0 is the new version. A tree: next/ is assembled,
  //     holding every file (staged ones moved in, skip_files hard-linked
  //     from the current destination, each ManifestFile.link_of name
  //     hard-linked to its target's file in next/) and every empty dir; all
  //     of it fsync'ed.
  //  3. Point of no return: `installing` records the identity of what will
  //     be installed, durably.
  //  4. Install: rename (single file, or a new destination) or
  //     renameat2(RENAME_EXCHANGE) of next/ with the destination; parents
  //     fsync'ed. Without RENAME_EXCHANGE: the old version's markers are
  //     unlinked, the old version is renamed away, next/ renamed in.
  //  5. The old version (now in next/ or old/) moves to the trash entry
  //     (options.trash_entry; for a single file, old/ is a hard link of it
  //     made before the rename), or is removed; f/ is removed.
  // Re-running after a crash at any step converges to the new version; a
  // re-run that finds the installed version gone from staging and replaced
  // at the destination since (by a newer publish) returns OK and leaves it.
  // Afterwards the staging dir holds only its `installing` record: journal
  // the publish, then call Remove(); a Publish re-run in between finds the
  // version installed and returns OK.
  //
  // When bytes needed for the new version are gone (a staged file removed or
  // short, a skip_files file no longer the same at the destination), returns
  // Unavailable, lists their indices in `*resend` (if given) and leaves the
  // destination untouched: the caller asks for those files again.
  absl::Status Publish(const v1::Manifest& manifest, const PublishOptions& options,
                       std::vector<uint32_t>* resend = nullptr);

  // Removes the staging directory and everything in it (cancel/abort, or
  // after a publish was journaled).
  absl::Status Remove();

  // Removes what is left of the staging directory of `transfer_id`, if
  // anything (a crash between journaling PUBLISHED and Remove). Creates
  // nothing.
  static absl::Status RemoveLeftover(FileSystem& fs, const ResolvedDestination& dest,
                                     const std::string& transfer_id);

  // The transfer ids that have a staging directory under `export_root`
  // (a realpath), in no order. Creates nothing: an export without staging
  // has none.
  static absl::StatusOr<std::vector<std::string>> ListStaged(FileSystem& fs,
                                                             const std::string& export_root);

  const std::string& dir() const { return state_->dir; }

 private:
  struct State {
    FileSystem* fs = nullptr;
    ResolvedDestination dest;
    std::string transfer_id;
    std::string dir;  // absolute path of the staging dir, for messages
    std::unique_ptr<Directory> root;     // export root
    std::unique_ptr<Directory> parent;   // <root>/.longhaul/staging
    std::unique_ptr<Directory> staging;  // <root>/.longhaul/staging/<id>
    std::unique_ptr<Directory> files;    // .../<id>/f
    absl::Mutex mu;
    absl::flat_hash_map<uint32_t, std::unique_ptr<File>> open_files ABSL_GUARDED_BY(mu);
  };
  explicit Staging(std::unique_ptr<State> state) : state_(std::move(state)) {}
  absl::StatusOr<File*> Open(uint32_t file_index, const v1::ManifestFile& file, bool create);
  void CloseFiles();

  std::unique_ptr<State> state_;
};

// For cp without --replace: why the destination holds something else than
// `manifest` would publish (a short reason a peer may read: no path of the
// destination's content), or nullopt when the destination is absent or holds
// exactly the manifest's files and symlinks, each file with its size and an
// mtime as PublishedFileMatches compares them. Symlinks on the way are
// refused (PermissionDenied).
absl::StatusOr<std::optional<std::string>> DestinationDiffers(FileSystem& fs,
                                                              const ResolvedDestination& dest,
                                                              bool single_file,
                                                              const v1::Manifest& manifest);

// For sync: true when the published destination of `file` (the destination
// itself when single_file) is a regular file with the manifest's size and
// an mtime the file system stored for the manifest's (StoredMtimeMatches),
// or, with `compare_content` (sync --checksum), whose content has the
// manifest's digest (ContentMatches; the mtime is not compared). False when
// it does not exist. Symlinks on the way are refused (PermissionDenied).
absl::StatusOr<bool> PublishedFileMatches(FileSystem& fs, const ResolvedDestination& dest,
                                          bool single_file, const v1::ManifestFile& file,
                                          bool compare_content = false);

}  // namespace longhaul::storage

#endif  // LONGHAUL_STORAGE_STAGING_H_
