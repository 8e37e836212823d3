// An in-memory storage::FileSystem for crash-consistency tests: it counts
// every mutating step, can crash at any one of them, and can then either
// keep everything (a process crash, kill -9) or drop what was not made
// durable (a power loss).
//
// Durability model (the journaled-metadata model of ext4 data=ordered and
// XFS):
//  - File data and size survive a power loss as of the file's last Sync().
//  - The namespace (creates, mkdirs, renames, links, unlinks, rmdirs) and
//    file attributes (mode, mtime) survive as of the last Sync() or
//    SyncDir() of anything: an fsync commits every earlier metadata change
//    with it. A rename is atomic.
// Bytes a file's metadata says it has but whose data was never synced read
// back as zeros, as unwritten extents do.
//
// Deterministic: inode numbers are allocated in order, nothing reads a
// clock. Thread-safe (one mutex), so it can stand in for the POSIX one
// anywhere.
#ifndef LONGHAUL_TESTS_TEST_TOOLS_FAULT_INJECTION_FS_H_
#define LONGHAUL_TESTS_TEST_TOOLS_FAULT_INJECTION_FS_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "storage/file_system.h"

namespace longhaul::storage::testing {

class FaultInjectionFileSystem : public FileSystem {
 public:
  enum class Restart { kProcessCrash, kPowerLoss };

  FaultInjectionFileSystem();

  // The `n`-th mutating step from now (1-based) fails with Aborted, without
  // taking effect, and every call after it fails too, as if the process
  // died there. 0 disarms.
  void CrashAtStep(uint64_t n);
  bool crashed() const;
  // Comes back from a crash (or simulates one now): handles opened before
  // are stale; with kPowerLoss, everything not durable is dropped first.
  void RestartAfter(Restart how);
  // Mutating steps taken since construction, and their descriptions.
  uint64_t steps() const;
  std::vector<std::string> step_log() const;

  // File system features, to try the fallbacks.
  void set_exchange_supported(bool supported);
  // mtimes are stored truncated to this granularity (1 s: ext4 with
  // 128-byte inodes).
  void set_mtime_granularity_ns(int64_t granularity);

  // Test setup, outside the step count and durable at once. Paths are
  // absolute, '/'-separated.
  void MakeDirs(const std::string& path);
  void PutFile(const std::string& path, const std::string& contents, int64_t mtime_ns = 0,
               uint32_t mode = 0644);
  void PutSymlink(const std::string& path, const std::string& target = "");
  // What a reader sees now: every regular file below `path`, by relative
  // path, with its contents, every directory (relative path + "/") and
  // every symlink ("<symlink>" or "-> target" when it has one).
  // nullopt when `path` does not exist.
  std::optional<std::map<std::string, std::string>> Tree(const std::string& path) const;

  // storage::FileSystem
  absl::StatusOr<std::unique_ptr<Directory>> OpenRoot(const std::string& path) override;
  absl::StatusOr<std::unique_ptr<Directory>> OpenDir(Directory& dir, const std::string& name,
                                                     bool create, uint32_t mode) override;
  absl::StatusOr<std::optional<FileInfo>> Stat(Directory& dir, const std::string& name) override;
  absl::StatusOr<std::unique_ptr<File>> OpenFile(Directory& dir, const std::string& name,
                                                 OpenMode mode) override;
  absl::Status Rename(Directory& from_dir, const std::string& from, Directory& to_dir,
                      const std::string& to, RenameMode mode) override;
  absl::Status Link(Directory& from_dir, const std::string& from, Directory& to_dir,
                    const std::string& to) override;
  absl::Status Symlink(const std::string& target, Directory& dir, const std::string& name) override;
  absl::StatusOr<std::string> ReadLink(Directory& dir, const std::string& name) override;
  absl::Status Unlink(Directory& dir, const std::string& name) override;
  absl::Status RemoveDir(Directory& dir, const std::string& name) override;
  absl::StatusOr<std::vector<std::string>> List(Directory& dir) override;
  absl::Status SyncDir(Directory& dir) override;

 private:
  class MemDirectory;
  class MemFile;
  enum class Kind { kFile, kDir, kSymlink };
  struct Node {
    Kind kind = Kind::kFile;
    std::string data;  // kFile; kSymlink: the target
    uint32_t mode = 0644;
    int64_t mtime_ns = 0;
    std::map<std::string, uint64_t> entries;  // kDir
  };

  // Counts a mutating step; an error when the crash fires here or fired.
  absl::Status Step(const std::string& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Remove(Directory& dir, const std::string& name, bool directory);
  absl::Status Live(uint64_t epoch) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CommitMetadata() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t NewNode(Kind kind) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::optional<uint64_t> Walk(const std::string& path) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  FileInfo InfoOf(uint64_t ino) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The directory node of a live handle, or an error.
  absl::StatusOr<Node*> DirOf(Directory& dir) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<uint64_t, Node> nodes_ ABSL_GUARDED_BY(mu_);
  std::map<uint64_t, Node> durable_nodes_ ABSL_GUARDED_BY(mu_);  // metadata as of the last sync
  std::map<uint64_t, std::string> durable_data_ ABSL_GUARDED_BY(mu_);
  uint64_t next_inode_ ABSL_GUARDED_BY(mu_) = 2;  // 1 is the root
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t steps_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t crash_at_ ABSL_GUARDED_BY(mu_) = 0;
  bool crashed_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::string> log_ ABSL_GUARDED_BY(mu_);
  bool exchange_supported_ ABSL_GUARDED_BY(mu_) = true;
  int64_t mtime_granularity_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace longhaul::storage::testing

#endif  // LONGHAUL_TESTS_TEST_TOOLS_FAULT_INJECTION_FS_H_
