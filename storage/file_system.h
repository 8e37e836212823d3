// The file-system seam of storage/: every file operation of staging,
// publish and retention goes through a FileSystem, so tests can replace it
// with one that crashes at any step or loses what was not fsync'ed
// (tests/test_tools/fault_injection_fs.h). The real one is the POSIX one.
//
// The interface is directory-relative, like the *at(2) calls: a Directory is
// an open handle and every name is a single path component. Nothing here
// ever follows a symlink, except OpenRoot, whose path comes from the config.
#ifndef LONGHAUL_STORAGE_FILE_SYSTEM_H_
#define LONGHAUL_STORAGE_FILE_SYSTEM_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace longhaul::storage {

// What lstat(2) says about one name.
struct FileInfo {
  enum class Type { kRegular, kDirectory, kSymlink, kOther };
  Type type = Type::kOther;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  uint32_t mode = 0;  // permission bits (07777)
  // Identity: equal (device, inode) means the same file system object.
  uint64_t device = 0;
  uint64_t inode = 0;

  bool is_regular() const { return type == Type::kRegular; }
  bool is_directory() const { return type == Type::kDirectory; }
  bool SameObject(const FileInfo& o) const { return device == o.device && inode == o.inode; }
};

// An open directory. `path()` is for messages only.
class Directory {
 public:
  virtual ~Directory() = default;
  virtual const std::string& path() const = 0;
};

// An open regular file. Not thread-safe; owned by whoever opened it.
class File {
 public:
  virtual ~File() = default;
  virtual const std::string& path() const = 0;
  virtual absl::Status WriteAt(uint64_t offset, absl::Span<const uint8_t> data) = 0;
  // Reads up to data.size() bytes; fewer only at end of file.
  virtual absl::StatusOr<size_t> ReadAt(uint64_t offset, absl::Span<uint8_t> data) = 0;
  // fsync(2): the data and the file's own metadata are durable on return.
  virtual absl::Status Sync() = 0;
  // fdatasync(2): the data, and the size it needs to be read back, are
  // durable on return; other metadata (mtime) may not be. The chunk data
  // path's sync; it covers direct_fd() too.
  virtual absl::Status SyncData() { return Sync(); }
  // Makes the file `size` bytes long, reserving the space where the file
  // system can (fallocate), so a full disk shows up here and not mid-write.
  virtual absl::Status Reserve(uint64_t size) = 0;
  // Makes the file `size` bytes long without reserving space: bytes never
  // written read as zeros and, where the file system keeps holes, take no
  // disk space. A full disk then shows up in WriteAt.
  virtual absl::Status Resize(uint64_t size) = 0;
  virtual absl::Status SetMtime(int64_t mtime_ns) = 0;
  virtual absl::Status SetMode(uint32_t mode) = 0;
  virtual absl::StatusOr<FileInfo> Stat() = 0;
  // The OS descriptor for the chunk data path (FileIo, io_uring), or -1 when
  // the file system is not backed by one (tests use WriteAt/ReadAt then).
  virtual int fd() const = 0;
  // Opens a second descriptor of this file with O_DIRECT (direct_fd()), for
  // chunk data that should bypass the page cache. Returns true once it is
  // open (again on later calls), false where the file system refuses
  // O_DIRECT (EINVAL: some FUSE, tmpfs before Linux 6.6), keeps file data
  // in memory anyway (tmpfs, ramfs), or the file has no OS descriptor;
  // another failure is an error, and the file stays usable buffered.
  virtual absl::StatusOr<bool> EnableDirectIo() { return false; }
  // The O_DIRECT descriptor, or -1 before a successful EnableDirectIo. I/O
  // on it needs offsets, lengths and buffer addresses that are multiples of
  // kDirectIoAlignment. It is the same file as fd(): sizing, sync and
  // metadata go through fd(), and an fdatasync of fd() covers both.
  virtual int direct_fd() const { return -1; }
};

// The alignment direct I/O is done at: the page size and the block size of
// common file systems, a multiple of the logical block size of any device.
inline constexpr size_t kDirectIoAlignment = 4096;

// The mode of the directories longhaul makes for itself (staging, trash).
inline constexpr uint32_t kDirMode = 0755;

enum class OpenMode {
  kRead,            // existing file, read only
  kReadWrite,       // existing file
  kCreateOrOpen,    // read-write, created (mode 0600) if missing
  kCreateExclusive  // read-write, AlreadyExists if present
};

enum class RenameMode {
  kReplace,    // rename(2): the target, if any, is replaced
  kNoReplace,  // AlreadyExists if the target exists
  kExchange,   // both must exist and are swapped atomically; Unimplemented
               // where the file system has no RENAME_EXCHANGE
};

// Thread-safe.
class FileSystem {
 public:
  virtual ~FileSystem() = default;

  // Opens the directory at an absolute path taken from the configuration.
  virtual absl::StatusOr<std::unique_ptr<Directory>> OpenRoot(const std::string& path) = 0;
  // Opens the directory `name` in `dir`; with `create`, makes it if
  // missing, with permission bits `mode` (0777 at most) exactly, whatever
  // the process umask. PermissionDenied if it is a symlink,
  // FailedPrecondition if it is something else, NotFound if missing and
  // !create. `mode` is not applied to a directory that exists.
  virtual absl::StatusOr<std::unique_ptr<Directory>> OpenDir(Directory& dir, const std::string& name,
                                                             bool create, uint32_t mode) = 0;
  // lstat; nullopt when nothing has that name.
  virtual absl::StatusOr<std::optional<FileInfo>> Stat(Directory& dir, const std::string& name) = 0;
  // NotFound when missing (except kCreate*), PermissionDenied on a symlink.
  virtual absl::StatusOr<std::unique_ptr<File>> OpenFile(Directory& dir, const std::string& name,
                                                         OpenMode mode) = 0;
  virtual absl::Status Rename(Directory& from_dir, const std::string& from, Directory& to_dir,
                              const std::string& to, RenameMode mode) = 0;
  // A hard link `to` in `to_dir` of the regular file `from` in `from_dir`.
  virtual absl::Status Link(Directory& from_dir, const std::string& from, Directory& to_dir,
                            const std::string& to) = 0;
  // Creates the symlink `name` in `dir` with `target`, which is stored as
  // given and never resolved here. AlreadyExists when the name is taken.
  virtual absl::Status Symlink(const std::string& target, Directory& dir,
                               const std::string& name) = 0;
  // The target of the symlink `name` in `dir`. NotFound when missing,
  // FailedPrecondition when it is not a symlink.
  virtual absl::StatusOr<std::string> ReadLink(Directory& dir, const std::string& name) = 0;
  // Removes a non-directory. NotFound when missing.
  virtual absl::Status Unlink(Directory& dir, const std::string& name) = 0;
  // Removes an empty directory. NotFound when missing.
  virtual absl::Status RemoveDir(Directory& dir, const std::string& name) = 0;
  // The names in `dir` (not "." and ".."), unsorted.
  virtual absl::StatusOr<std::vector<std::string>> List(Directory& dir) = 0;
  // fsync(2) of the directory: the names created, renamed or removed in it
  // are durable on return.
  virtual absl::Status SyncDir(Directory& dir) = 0;
};

// The POSIX implementation. The returned reference lives for the process.
FileSystem& PosixFileSystem();

// ------------------------------------------------ helpers on any FileSystem ----

// Opens the directory `relative` ('/'-separated, clean; "" means `base`
// itself, duplicated) beneath `base` one component at a time, so a symlink
// anywhere is refused (PermissionDenied) rather than followed. With
// `create`, missing components are made with permission bits `mode` and
// their parents fsync'ed. NotFound when a component is missing and !create;
// ".." is PermissionDenied.
absl::StatusOr<std::unique_ptr<Directory>> OpenDirBeneath(FileSystem& fs, Directory& base,
                                                          std::string_view relative, bool create,
                                                          uint32_t mode = kDirMode);

// Removes `name` in `dir` and everything below it, never following a
// symlink. A missing name is not an error. Does not fsync.
absl::Status RemoveTree(FileSystem& fs, Directory& dir, const std::string& name);

// Reads a whole small file (a record such as staging's publish record).
absl::StatusOr<std::string> ReadSmallFile(FileSystem& fs, Directory& dir, const std::string& name);

// Writes `contents` to `name` in `dir` durably and atomically: into
// `name`.tmp, fsync, rename over `name`, fsync of `dir`.
absl::Status WriteFileAtomically(FileSystem& fs, Directory& dir, const std::string& name,
                                 std::string_view contents);

// Opens the source file at the canonical absolute `path` read-only,
// refusing a symlink anywhere on the path (openat2 RESOLVE_NO_SYMLINKS):
// sources are resolved and checked at submit, so a symlink found later was
// put there since. Returns the fd, or -1 with errno set (ELOOP for a
// symlink). The caller owns the fd.
int OpenCheckedSource(const std::string& path);

// True when `stored_ns`, an mtime read back from a file system, is what
// that file system keeps of `wanted_ns`: equal, or `wanted_ns` truncated to
// a coarser granularity (1 us, 1 ms, 10 ms, 1 s, 2 s), as on ext4 with
// 128-byte inodes, NFS, FAT or some FUSE file systems.
bool StoredMtimeMatches(int64_t stored_ns, int64_t wanted_ns);

}  // namespace longhaul::storage

#endif  // LONGHAUL_STORAGE_FILE_SYSTEM_H_
