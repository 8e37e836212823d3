#include "storage/file_system.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/errno_status.h"
#include "storage/posix_util.h"

namespace longhaul::storage {

using internal::JoinPath;
using internal::ScopedFd;

namespace {

FileInfo InfoOf(const struct stat& st) {
  FileInfo info;
  if (S_ISREG(st.st_mode)) {
    info.type = FileInfo::Type::kRegular;
  } else if (S_ISDIR(st.st_mode)) {
    info.type = FileInfo::Type::kDirectory;
  } else if (S_ISLNK(st.st_mode)) {
    info.type = FileInfo::Type::kSymlink;
  }
  info.size = static_cast<uint64_t>(st.st_size);
  info.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  info.mode = st.st_mode & 07777;
  info.device = st.st_dev;
  info.inode = st.st_ino;
  return info;
}

class PosixDirectory : public Directory {
 public:
  PosixDirectory(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  const std::string& path() const override { return path_; }
  int fd() const { return fd_.get(); }

 private:
  ScopedFd fd_;
  std::string path_;
};

int FdOf(Directory& dir) { return static_cast<PosixDirectory&>(dir).fd(); }

class PosixFile : public File {
 public:
  PosixFile(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}
  const std::string& path() const override { return path_; }
  int fd() const override { return fd_.get(); }

  absl::Status WriteAt(uint64_t offset, absl::Span<const uint8_t> data) override {
    while (!data.empty()) {
      ssize_t n = pwrite(fd_.get(), data.data(), data.size(), static_cast<off_t>(offset));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoError(errno, "cannot write", path_);
      data.remove_prefix(static_cast<size_t>(n));
      offset += static_cast<uint64_t>(n);
    }
    return absl::OkStatus();
  }

  absl::StatusOr<size_t> ReadAt(uint64_t offset, absl::Span<uint8_t> data) override {
    size_t done = 0;
    while (done < data.size()) {
      ssize_t n = pread(fd_.get(), data.data() + done, data.size() - done,
                        static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return ErrnoError(errno, "cannot read", path_);
      if (n == 0) break;
      done += static_cast<size_t>(n);
    }
    return done;
  }

  absl::Status Sync() override { return internal::FsyncFd(fd_.get(), path_); }

  absl::Status SyncData() override {
    while (fdatasync(fd_.get()) != 0) {
      if (errno != EINTR) return ErrnoError(errno, "cannot fdatasync", path_);
    }
    return absl::OkStatus();
  }

  absl::Status Reserve(uint64_t size) override {
    struct stat st;
    if (fstat(fd_.get(), &st) != 0) return ErrnoError(errno, "cannot stat", path_);
    if (static_cast<uint64_t>(st.st_size) == size) return absl::OkStatus();
    if (st.st_size == 0 && size > 0) {
      if (fallocate(fd_.get(), 0, 0, static_cast<off_t>(size)) == 0) return absl::OkStatus();
      if (errno != EOPNOTSUPP && errno != ENOSYS) {
        return ErrnoError(errno, absl::StrCat("cannot reserve ", size, " bytes for"), path_);
      }
    }
    if (ftruncate(fd_.get(), static_cast<off_t>(size)) != 0) {
      return ErrnoError(errno, absl::StrCat("cannot size to ", size, " bytes"), path_);
    }
    return absl::OkStatus();
  }

  absl::Status Resize(uint64_t size) override {
    struct stat st;
    if (fstat(fd_.get(), &st) != 0) return ErrnoError(errno, "cannot stat", path_);
    if (static_cast<uint64_t>(st.st_size) == size) return absl::OkStatus();
    if (ftruncate(fd_.get(), static_cast<off_t>(size)) != 0) {
      return ErrnoError(errno, absl::StrCat("cannot size to ", size, " bytes"), path_);
    }
    return absl::OkStatus();
  }

  absl::Status SetMtime(int64_t mtime_ns) override {
    struct timespec times[2];
    times[0].tv_sec = 0;
    times[0].tv_nsec = UTIME_OMIT;
    times[1].tv_sec = mtime_ns / 1000000000;
    times[1].tv_nsec = mtime_ns % 1000000000;
    if (times[1].tv_nsec < 0) {
      times[1].tv_nsec += 1000000000;
      times[1].tv_sec -= 1;
    }
    if (futimens(fd_.get(), times) != 0) return ErrnoError(errno, "cannot set mtime of", path_);
    return absl::OkStatus();
  }

  absl::Status SetMode(uint32_t mode) override {
    if (fchmod(fd_.get(), mode & 07777) != 0) return ErrnoError(errno, "cannot chmod", path_);
    return absl::OkStatus();
  }

  absl::StatusOr<FileInfo> Stat() override {
    struct stat st;
    if (fstat(fd_.get(), &st) != 0) return ErrnoError(errno, "cannot stat", path_);
    return InfoOf(st);
  }

  absl::StatusOr<bool> EnableDirectIo() override {
    if (direct_fd_.get() >= 0) return true;
    // tmpfs takes O_DIRECT since Linux 6.6 but its pages are the storage:
    // there is no cache to bypass, so it counts as refusing.
    struct statfs fs;
    if (fstatfs(fd_.get(), &fs) != 0) return ErrnoError(errno, "cannot statfs", path_);
    if (fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC) return false;
    // Re-opening the open file through its /proc magic link reaches this
    // very inode, whatever has been renamed or replaced at path_ since.
    const std::string self = absl::StrCat("/proc/self/fd/", fd_.get());
    int fd = open(self.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
    if (fd < 0) {
      if (errno == EINVAL) return false;
      return ErrnoError(errno, "cannot open with O_DIRECT", path_);
    }
    direct_fd_ = ScopedFd(fd);
    return true;
  }

  int direct_fd() const override { return direct_fd_.get(); }

 private:
  ScopedFd fd_;
  ScopedFd direct_fd_;
  std::string path_;
};

// Refines an ELOOP/ENOTDIR from an O_NOFOLLOW open into what the name is.
absl::Status OpenError(int err, int dir_fd, const std::string& name, const std::string& path,
                       std::string_view what) {
  if (err == ELOOP || err == ENOTDIR) {
    struct stat st;
    if (fstatat(dir_fd, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISLNK(st.st_mode)) {
      return absl::PermissionDeniedError(
          absl::StrCat(path, " is a symlink; longhaul does not follow symlinks under an export"));
    }
    if (err == ENOTDIR) {
      return absl::FailedPreconditionError(absl::StrCat(path, " exists and is not a directory"));
    }
  }
  return ErrnoError(err, what, path);
}

class Posix : public FileSystem {
 public:
  absl::StatusOr<std::unique_ptr<Directory>> OpenRoot(const std::string& path) override {
    int fd = open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ErrnoError(errno, "cannot open directory", path);
    return std::make_unique<PosixDirectory>(fd, path);
  }

  absl::StatusOr<std::unique_ptr<Directory>> OpenDir(Directory& dir, const std::string& name,
                                                     bool create, uint32_t mode) override {
    const std::string path = JoinPath(dir.path(), name);
    const int dfd = FdOf(dir);
    int fd = openat(dfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    bool made = false;
    if (fd < 0 && errno == ENOENT && create) {
      // The process umask can only clear bits of `mode`, so until the
      // fchmod below the directory is never more open than asked for.
      if (mkdirat(dfd, name.c_str(), mode & 0777) == 0) {
        made = true;
      } else if (errno != EEXIST) {
        return ErrnoError(errno, "cannot create directory", path);
      }
      fd = openat(dfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    }
    if (fd < 0) {
      if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, " does not exist"));
      return OpenError(errno, dfd, name, path, "cannot open directory");
    }
    auto opened = std::make_unique<PosixDirectory>(fd, path);
    if (made && fchmod(fd, mode & 0777) != 0) return ErrnoError(errno, "cannot chmod", path);
    return opened;
  }

  absl::StatusOr<std::optional<FileInfo>> Stat(Directory& dir, const std::string& name) override {
    struct stat st;
    if (fstatat(FdOf(dir), name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno == ENOENT) return std::nullopt;
      return ErrnoError(errno, "cannot stat", JoinPath(dir.path(), name));
    }
    return InfoOf(st);
  }

  absl::StatusOr<std::unique_ptr<File>> OpenFile(Directory& dir, const std::string& name,
                                                 OpenMode mode) override {
    const std::string path = JoinPath(dir.path(), name);
    int flags = O_NOFOLLOW | O_CLOEXEC;
    switch (mode) {
      case OpenMode::kRead:
        flags |= O_RDONLY | O_NONBLOCK;  // a FIFO in a file's place must not block
        break;
      case OpenMode::kReadWrite:
        flags |= O_RDWR;
        break;
      case OpenMode::kCreateOrOpen:
        flags |= O_RDWR | O_CREAT;
        break;
      case OpenMode::kCreateExclusive:
        flags |= O_RDWR | O_CREAT | O_EXCL;
        break;
    }
    int fd = openat(FdOf(dir), name.c_str(), flags, 0600);
    if (fd < 0) {
      if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, " does not exist"));
      if (errno == EEXIST) return absl::AlreadyExistsError(absl::StrCat(path, " already exists"));
      return OpenError(errno, FdOf(dir), name, path, "cannot open");
    }
    return std::make_unique<PosixFile>(fd, path);
  }

  absl::Status Rename(Directory& from_dir, const std::string& from, Directory& to_dir,
                      const std::string& to, RenameMode mode) override {
    unsigned flags = 0;
    if (mode == RenameMode::kNoReplace) flags = RENAME_NOREPLACE;
    if (mode == RenameMode::kExchange) flags = RENAME_EXCHANGE;
    if (renameat2(FdOf(from_dir), from.c_str(), FdOf(to_dir), to.c_str(), flags) == 0) {
      return absl::OkStatus();
    }
    const int err = errno;
    const std::string what =
        absl::StrCat("cannot rename ", JoinPath(from_dir.path(), from), " to");
    if (err == EEXIST || err == ENOTEMPTY) {
      return absl::AlreadyExistsError(absl::StrCat(JoinPath(to_dir.path(), to), " exists"));
    }
    if (err == EINVAL && flags != 0) {
      // The file system has no RENAME_NOREPLACE / RENAME_EXCHANGE.
      return absl::UnimplementedError(absl::StrCat(what, " ", JoinPath(to_dir.path(), to),
                                                   ": the file system does not support it"));
    }
    if (err == ENOENT) return absl::NotFoundError(absl::StrCat(what, " ", to, ": not found"));
    return ErrnoError(err, what, JoinPath(to_dir.path(), to));
  }

  absl::Status Link(Directory& from_dir, const std::string& from, Directory& to_dir,
                    const std::string& to) override {
    if (linkat(FdOf(from_dir), from.c_str(), FdOf(to_dir), to.c_str(), 0) == 0) {
      return absl::OkStatus();
    }
    if (errno == EEXIST) {
      return absl::AlreadyExistsError(absl::StrCat(JoinPath(to_dir.path(), to), " exists"));
    }
    return ErrnoError(errno, absl::StrCat("cannot link ", JoinPath(from_dir.path(), from), " as"),
                      JoinPath(to_dir.path(), to));
  }

  absl::Status Symlink(const std::string& target, Directory& dir,
                       const std::string& name) override {
    if (symlinkat(target.c_str(), FdOf(dir), name.c_str()) == 0) return absl::OkStatus();
    if (errno == EEXIST) {
      return absl::AlreadyExistsError(absl::StrCat(JoinPath(dir.path(), name), " exists"));
    }
    return ErrnoError(errno, "cannot create symlink", JoinPath(dir.path(), name));
  }

  absl::StatusOr<std::string> ReadLink(Directory& dir, const std::string& name) override {
    std::string target(4096, '\0');
    const ssize_t n = readlinkat(FdOf(dir), name.c_str(), target.data(), target.size());
    const std::string path = JoinPath(dir.path(), name);
    if (n < 0) {
      if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, " does not exist"));
      if (errno == EINVAL)
        return absl::FailedPreconditionError(absl::StrCat(path, " is not a symlink"));
      return ErrnoError(errno, "cannot read symlink", path);
    }
    target.resize(static_cast<size_t>(n));
    return target;
  }

  absl::Status Unlink(Directory& dir, const std::string& name) override {
    return Remove(dir, name, 0);
  }

  absl::Status RemoveDir(Directory& dir, const std::string& name) override {
    return Remove(dir, name, AT_REMOVEDIR);
  }

  absl::StatusOr<std::vector<std::string>> List(Directory& dir) override {
    return internal::ListDirAt(FdOf(dir), dir.path());
  }

  absl::Status SyncDir(Directory& dir) override { return internal::FsyncFd(FdOf(dir), dir.path()); }

 private:
  static absl::Status Remove(Directory& dir, const std::string& name, int flags) {
    if (unlinkat(FdOf(dir), name.c_str(), flags) == 0) return absl::OkStatus();
    const std::string path = JoinPath(dir.path(), name);
    if (errno == ENOENT) return absl::NotFoundError(absl::StrCat(path, " does not exist"));
    return ErrnoError(errno, "cannot remove", path);
  }
};

}  // namespace

FileSystem& PosixFileSystem() {
  static Posix* fs = new Posix();
  return *fs;
}

absl::StatusOr<std::unique_ptr<Directory>> OpenDirBeneath(FileSystem& fs, Directory& base,
                                                          std::string_view relative, bool create,
                                                          uint32_t mode) {
  std::unique_ptr<Directory> cur;
  for (absl::string_view comp : absl::StrSplit(internal::Av(relative), '/', absl::SkipEmpty())) {
    if (comp == ".") continue;
    if (comp == "..") {
      return absl::PermissionDeniedError(
          absl::StrCat("path ", JoinPath(base.path(), relative), " has a \"..\" component"));
    }
    Directory& parent = cur ? *cur : base;
    const std::string name(comp);
    std::optional<FileInfo> before;
    if (create) {
      absl::StatusOr<std::optional<FileInfo>> st = fs.Stat(parent, name);
      if (!st.ok()) return st.status();
      before = *st;
    }
    absl::StatusOr<std::unique_ptr<Directory>> next = fs.OpenDir(parent, name, create, mode);
    if (!next.ok()) return next.status();
    // A directory made here must survive a crash once something below it is.
    if (create && !before.has_value()) {
      if (absl::Status s = fs.SyncDir(parent); !s.ok()) return s;
    }
    cur = std::move(*next);
  }
  if (!cur) return fs.OpenDir(base, ".", /*create=*/false, mode);
  return cur;
}

absl::Status RemoveTree(FileSystem& fs, Directory& dir, const std::string& name) {
  absl::StatusOr<std::optional<FileInfo>> st = fs.Stat(dir, name);
  if (!st.ok()) return st.status();
  if (!st->has_value()) return absl::OkStatus();
  if (!(*st)->is_directory()) {
    absl::Status s = fs.Unlink(dir, name);
    return absl::IsNotFound(s) ? absl::OkStatus() : s;
  }
  absl::StatusOr<std::unique_ptr<Directory>> sub = fs.OpenDir(dir, name, /*create=*/false, kDirMode);
  if (!sub.ok()) return sub.status();
  absl::StatusOr<std::vector<std::string>> names = fs.List(**sub);
  if (!names.ok()) return names.status();
  for (const std::string& n : *names) {
    if (absl::Status s = RemoveTree(fs, **sub, n); !s.ok()) return s;
  }
  sub->reset();
  absl::Status s = fs.RemoveDir(dir, name);
  return absl::IsNotFound(s) ? absl::OkStatus() : s;
}

absl::StatusOr<std::string> ReadSmallFile(FileSystem& fs, Directory& dir, const std::string& name) {
  absl::StatusOr<std::unique_ptr<File>> file = fs.OpenFile(dir, name, OpenMode::kRead);
  if (!file.ok()) return file.status();
  std::string out;
  uint8_t buf[4096];
  while (true) {
    absl::StatusOr<size_t> n = (*file)->ReadAt(out.size(), absl::MakeSpan(buf, sizeof(buf)));
    if (!n.ok()) return n.status();
    if (*n == 0) break;
    out.append(reinterpret_cast<const char*>(buf), *n);
    if (out.size() > (1 << 20)) {
      return absl::DataLossError(absl::StrCat(JoinPath(dir.path(), name), " is too large"));
    }
  }
  return out;
}

absl::Status WriteFileAtomically(FileSystem& fs, Directory& dir, const std::string& name,
                                 std::string_view contents) {
  const std::string tmp = name + ".tmp";
  {
    absl::StatusOr<std::unique_ptr<File>> file = fs.OpenFile(dir, tmp, OpenMode::kCreateOrOpen);
    if (!file.ok()) return file.status();
    if (absl::Status s = (*file)->Reserve(contents.size()); !s.ok()) return s;
    absl::Span<const uint8_t> bytes(reinterpret_cast<const uint8_t*>(contents.data()),
                                    contents.size());
    if (absl::Status s = (*file)->WriteAt(0, bytes); !s.ok()) return s;
    if (absl::Status s = (*file)->Sync(); !s.ok()) return s;
  }
  if (absl::Status s = fs.Rename(dir, tmp, dir, name, RenameMode::kReplace); !s.ok()) return s;
  return fs.SyncDir(dir);
}

int OpenCheckedSource(const std::string& path) {
  struct open_how how = {};
  how.flags = O_RDONLY | O_CLOEXEC;
  how.resolve = RESOLVE_NO_SYMLINKS;
  return static_cast<int>(syscall(SYS_openat2, AT_FDCWD, path.c_str(), &how, sizeof(how)));
}

bool StoredMtimeMatches(int64_t stored_ns, int64_t wanted_ns) {
  constexpr int64_t kGranularities[] = {1, 1000, 1000000, 10000000, 1000000000, 2000000000};
  for (int64_t g : kGranularities) {
    int64_t truncated = wanted_ns - ((wanted_ns % g) + g) % g;  // floor, also before 1970
    if (stored_ns == truncated) return true;
  }
  return false;
}

}  // namespace longhaul::storage
