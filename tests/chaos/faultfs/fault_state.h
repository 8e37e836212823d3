// The fault model of longhaul-faultfs: which operations fail with EIO, and
// the undo log that a power loss replays. Thread-safe; independent of FUSE.

#ifndef LONGHAUL_TESTS_CHAOS_FAULTFS_FAULT_STATE_H_
#define LONGHAUL_TESTS_CHAOS_FAULTFS_FAULT_STATE_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <string_view>
#include <utility>

namespace longhaul::faultfs {

// Operation kinds that `eio` can target. Each names a group of FUSE
// operations (see README.md).
enum class OpKind : uint32_t {
  kOther = 0,  // counted, never failed (getattr, chmod, utimens, statfs...)
  kRead = 1u << 0,
  kWrite = 1u << 1,   // write, truncate, fallocate
  kFsync = 1u << 2,   // fsync, fdatasync, fsyncdir
  kCreate = 1u << 3,  // create, mknod, symlink, link
  kRename = 1u << 4,
  kUnlink = 1u << 5,  // unlink, rmdir
  kMkdir = 1u << 6,
  kOpen = 1u << 7,  // open, opendir
};

// Parses "read,write,fsync" into a mask; empty string on success, else the
// name that is not an operation kind.
std::string ParseOpKinds(std::string_view list, uint32_t* mask);

struct Counters {
  uint64_t ops = 0;
  uint64_t eio_injected = 0;
  uint64_t bytes_undone = 0;
  uint64_t files_undone = 0;
  uint64_t unsynced_files = 0;
};

class FaultState {
 public:
  FaultState() = default;
  FaultState(const FaultState&) = delete;
  FaultState& operator=(const FaultState&) = delete;

  // --- EIO injection -------------------------------------------------------

  void SetSeed(uint64_t seed);
  void SetEio(uint32_t kinds, double probability, std::string path_substring);
  void ClearEio();
  // Counts one operation; true when it must fail with EIO. `path` (and
  // `other_path`, a rename's target) are mount-relative ("/a/b"); either may
  // be null for a file that was unlinked while open.
  bool CountAndInject(OpKind kind, const char* path, const char* other_path = nullptr);

  // --- Undo log (power loss) -----------------------------------------------
  // Every data mutation of a backing file goes through these, with the
  // backing descriptor `fd` it acts on. Before the mutation they save the
  // bytes it overwrites (within the size the file had at its last sync), so
  // that DropUnsynced can put them back. They return 0 or -errno.

  int Write(int fd, const void* data, size_t size, off_t offset, bool append, ssize_t* written);
  int Truncate(int fd, off_t size);
  int Fallocate(int fd, int mode, off_t offset, off_t length);
  // After a successful fsync/fdatasync of `fd`: its inode's data is durable.
  void Synced(int fd);
  // Power loss: every inode written since its last sync gets its old bytes
  // and its synced size back. Returns the files restored; errors (a file
  // that cannot be restored) are appended to `error`.
  uint64_t DropUnsynced(std::string* error);

  Counters counters();

 private:
  struct Undo {
    int fd = -1;                         // O_RDWR on the inode, reopened through /proc/self/fd
    off_t synced_size = 0;               // the size to come back to
    std::map<off_t, std::string> saved;  // non-overlapping old bytes by offset
  };
  using InodeKey = std::pair<dev_t, ino_t>;

  // The undo record of `fd`'s inode, made with `synced_size` = its current
  // size when there is none. Null (and *err set) when it cannot be opened.
  Undo* RecordFor(int fd, int* err);
  // Saves the old bytes of [offset, offset + length) that lie below the
  // synced size and are not saved yet.
  int SaveRange(Undo& undo, off_t offset, off_t length);

  std::mutex eio_mu_;
  std::mt19937_64 rng_{0};
  uint32_t eio_kinds_ = 0;
  double eio_probability_ = 0;
  std::string eio_substring_;

  std::mutex undo_mu_;  // held across each logged mutation and the replay
  std::map<InodeKey, Undo> undo_;

  std::atomic<uint64_t> ops_{0};
  std::atomic<uint64_t> eio_injected_{0};
  uint64_t bytes_undone_ = 0;  // under undo_mu_
  uint64_t files_undone_ = 0;  // under undo_mu_
};

}  // namespace longhaul::faultfs

#endif  // LONGHAUL_TESTS_CHAOS_FAULTFS_FAULT_STATE_H_
