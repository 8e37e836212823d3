#include "tests/chaos/faultfs/passthrough.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace longhaul::faultfs {
namespace {

PassthroughContext& Context() {
  return *static_cast<PassthroughContext*>(fuse_get_context()->private_data);
}
int Root() { return Context().backing_fd; }
FaultState& State() { return *Context().state; }

// A mount-relative path ("/a/b") as a path relative to the backing fd.
const char* Rel(const char* path) {
  while (*path == '/') ++path;
  return *path == '\0' ? "." : path;
}

int Errno(int res) { return res < 0 ? -errno : res; }

// Counts the operation; -EIO when the fault policy picks it.
#define LH_FAULT(kind, ...) \
  if (State().CountAndInject(OpKind::kind, __VA_ARGS__)) return -EIO

// Files made through the mount belong to the caller, as on a local file
// system (the daemon under test may run as another user than this process).
int ChownToCaller(int dirfd, const char* name, int fd) {
  const fuse_context* ctx = fuse_get_context();
  if (ctx->uid == geteuid() && ctx->gid == getegid()) return 0;
  int res = fd >= 0 ? fchown(fd, ctx->uid, ctx->gid)
                    : fchownat(dirfd, name, ctx->uid, ctx->gid, AT_SYMLINK_NOFOLLOW);
  return Errno(res);
}

struct DirHandle {
  int fd = -1;
  DIR* dir = nullptr;
};
DirHandle* Dir(fuse_file_info* fi) { return reinterpret_cast<DirHandle*>(fi->fh); }

void* Init(fuse_conn_info* conn, fuse_config* cfg) {
  // Inode numbers pass through, so (device, inode) identities that longhaul
  // records stay stable.
  cfg->use_ino = 1;
  // Unlinked open files keep working through their descriptor.
  cfg->hard_remove = 1;
  // No kernel caching of names, attributes or data: a power loss changes the
  // backing files behind the kernel's back, and what it shows must be what
  // the backing files hold.
  cfg->entry_timeout = 0;
  cfg->attr_timeout = 0;
  cfg->negative_timeout = 0;
  cfg->direct_io = 1;
  cfg->kernel_cache = 0;
  // Requests must arrive in memory buffers so that a frozen one can be held.
  conn->want &= ~FUSE_CAP_SPLICE_READ;
  return &Context();
}

int GetAttr(const char* path, struct stat* st, fuse_file_info* fi) {
  // Not a `read`: every lookup is a getattr, and failing those would fail
  // path resolution rather than reads.
  State().CountAndInject(OpKind::kOther, path);
  if (fi != nullptr) return Errno(fstat(static_cast<int>(fi->fh), st));
  return Errno(fstatat(Root(), Rel(path), st, AT_SYMLINK_NOFOLLOW));
}

int ReadLink(const char* path, char* buf, size_t size) {
  State().CountAndInject(OpKind::kOther, path);
  ssize_t n = readlinkat(Root(), Rel(path), buf, size - 1);
  if (n < 0) return -errno;
  buf[n] = '\0';
  return 0;
}

int MkNod(const char* path, mode_t mode, dev_t rdev) {
  LH_FAULT(kCreate, path);
  if (mknodat(Root(), Rel(path), mode, rdev) != 0) return -errno;
  return ChownToCaller(Root(), Rel(path), -1);
}

int MkDir(const char* path, mode_t mode) {
  LH_FAULT(kMkdir, path);
  if (mkdirat(Root(), Rel(path), mode) != 0) return -errno;
  return ChownToCaller(Root(), Rel(path), -1);
}

int Unlink(const char* path) {
  LH_FAULT(kUnlink, path);
  return Errno(unlinkat(Root(), Rel(path), 0));
}

int RmDir(const char* path) {
  LH_FAULT(kUnlink, path);
  return Errno(unlinkat(Root(), Rel(path), AT_REMOVEDIR));
}

int SymLink(const char* target, const char* path) {
  LH_FAULT(kCreate, path);
  if (symlinkat(target, Root(), Rel(path)) != 0) return -errno;
  return ChownToCaller(Root(), Rel(path), -1);
}

int Rename(const char* from, const char* to, unsigned int flags) {
  LH_FAULT(kRename, from, to);
  return Errno(renameat2(Root(), Rel(from), Root(), Rel(to), flags));
}

int Link(const char* from, const char* to) {
  LH_FAULT(kCreate, to, from);
  return Errno(linkat(Root(), Rel(from), Root(), Rel(to), 0));
}

int ChMod(const char* path, mode_t mode, fuse_file_info* fi) {
  State().CountAndInject(OpKind::kOther, path);
  if (fi != nullptr) return Errno(fchmod(static_cast<int>(fi->fh), mode));
  return Errno(fchmodat(Root(), Rel(path), mode, 0));
}

int ChOwn(const char* path, uid_t uid, gid_t gid, fuse_file_info* fi) {
  State().CountAndInject(OpKind::kOther, path);
  if (fi != nullptr) return Errno(fchown(static_cast<int>(fi->fh), uid, gid));
  return Errno(fchownat(Root(), Rel(path), uid, gid, AT_SYMLINK_NOFOLLOW));
}

int Truncate(const char* path, off_t size, fuse_file_info* fi) {
  LH_FAULT(kWrite, path);
  if (fi != nullptr) return State().Truncate(static_cast<int>(fi->fh), size);
  int fd = openat(Root(), Rel(path), O_WRONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return -errno;
  int res = State().Truncate(fd, size);
  close(fd);
  return res;
}

int UTimeNs(const char* path, const struct timespec ts[2], fuse_file_info* fi) {
  State().CountAndInject(OpKind::kOther, path);
  if (fi != nullptr) return Errno(futimens(static_cast<int>(fi->fh), ts));
  return Errno(utimensat(Root(), Rel(path), ts, AT_SYMLINK_NOFOLLOW));
}

// Opens the backing file. O_TRUNC is applied through the undo log, and
// O_DIRECT is dropped: requests arrive in unaligned buffers.
int OpenBacking(const char* path, int flags, mode_t mode, fuse_file_info* fi) {
  const bool truncate = (flags & O_TRUNC) && (flags & O_ACCMODE) != O_RDONLY;
  int fd =
      openat(Root(), Rel(path), (flags & ~(O_TRUNC | O_DIRECT)) | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0) return -errno;
  if (truncate) {
    if (int res = State().Truncate(fd, 0); res != 0) {
      close(fd);
      return res;
    }
  }
  fi->fh = static_cast<uint64_t>(fd);
  return 0;
}

int Open(const char* path, fuse_file_info* fi) {
  LH_FAULT(kOpen, path);
  return OpenBacking(path, fi->flags & ~(O_CREAT | O_EXCL), 0, fi);
}

int Create(const char* path, mode_t mode, fuse_file_info* fi) {
  LH_FAULT(kCreate, path);
  int res = OpenBacking(path, fi->flags | O_CREAT, mode, fi);
  if (res != 0) return res;
  return ChownToCaller(Root(), Rel(path), static_cast<int>(fi->fh));
}

int Read(const char* path, char* buf, size_t size, off_t offset, fuse_file_info* fi) {
  LH_FAULT(kRead, path);
  return Errno(static_cast<int>(pread(static_cast<int>(fi->fh), buf, size, offset)));
}

int Write(const char* path, const char* buf, size_t size, off_t offset, fuse_file_info* fi) {
  LH_FAULT(kWrite, path);
  ssize_t written = 0;
  int res = State().Write(static_cast<int>(fi->fh), buf, size, offset, (fi->flags & O_APPEND) != 0,
                          &written);
  return res != 0 ? res : static_cast<int>(written);
}

int StatFs(const char* path, struct statvfs* st) {
  State().CountAndInject(OpKind::kOther, path);
  return Errno(fstatvfs(Root(), st));
}

int Flush(const char* path, fuse_file_info* fi) {
  State().CountAndInject(OpKind::kOther, path);
  return 0;  // nothing is buffered here: writes went to the backing file
}

int Release(const char* path, fuse_file_info* fi) {
  close(static_cast<int>(fi->fh));
  return 0;
}

int Fsync(const char* path, int datasync, fuse_file_info* fi) {
  LH_FAULT(kFsync, path);
  const int fd = static_cast<int>(fi->fh);
  if ((datasync ? fdatasync(fd) : fsync(fd)) != 0) return -errno;
  State().Synced(fd);
  return 0;
}

int OpenDir(const char* path, fuse_file_info* fi) {
  LH_FAULT(kOpen, path);
  int fd = openat(Root(), Rel(path), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return -errno;
  // The DIR reads a descriptor of its own; `fd` stays for fsyncdir.
  int dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
  DIR* dir = dup_fd < 0 ? nullptr : fdopendir(dup_fd);
  if (dir == nullptr) {
    int err = -errno;
    if (dup_fd >= 0) close(dup_fd);
    close(fd);
    return err;
  }
  fi->fh = reinterpret_cast<uint64_t>(new DirHandle{.fd = fd, .dir = dir});
  return 0;
}

int ReadDir(const char* path, void* buf, fuse_fill_dir_t filler, off_t offset, fuse_file_info* fi,
            fuse_readdir_flags flags) {
  LH_FAULT(kRead, path);
  // The whole directory in one call (offset 0); the library pages it.
  DIR* dir = Dir(fi)->dir;
  rewinddir(dir);
  errno = 0;
  while (dirent* entry = readdir(dir)) {
    struct stat st;
    std::memset(&st, 0, sizeof(st));
    st.st_ino = entry->d_ino;
    st.st_mode = static_cast<mode_t>(entry->d_type) << 12;
    if (filler(buf, entry->d_name, &st, 0, static_cast<fuse_fill_dir_flags>(0)) != 0) break;
  }
  return -errno;
}

int ReleaseDir(const char* path, fuse_file_info* fi) {
  DirHandle* handle = Dir(fi);
  closedir(handle->dir);
  close(handle->fd);
  delete handle;
  return 0;
}

int FsyncDir(const char* path, int datasync, fuse_file_info* fi) {
  LH_FAULT(kFsync, path);
  // Metadata is durable at once in this model; the backing sync is kept for
  // a faithful passthrough.
  return Errno(fsync(Dir(fi)->fd));
}

int Fallocate(const char* path, int mode, off_t offset, off_t length, fuse_file_info* fi) {
  LH_FAULT(kWrite, path);
  return State().Fallocate(static_cast<int>(fi->fh), mode, offset, length);
}

fuse_operations MakeOperations() {
  fuse_operations ops;
  std::memset(&ops, 0, sizeof(ops));
  ops.init = Init;
  ops.getattr = GetAttr;
  ops.readlink = ReadLink;
  ops.mknod = MkNod;
  ops.mkdir = MkDir;
  ops.unlink = Unlink;
  ops.rmdir = RmDir;
  ops.symlink = SymLink;
  ops.rename = Rename;
  ops.link = Link;
  ops.chmod = ChMod;
  ops.chown = ChOwn;
  ops.truncate = Truncate;
  ops.utimens = UTimeNs;
  ops.open = Open;
  ops.create = Create;
  ops.read = Read;
  ops.write = Write;
  ops.statfs = StatFs;
  ops.flush = Flush;
  ops.release = Release;
  ops.fsync = Fsync;
  ops.opendir = OpenDir;
  ops.readdir = ReadDir;
  ops.releasedir = ReleaseDir;
  ops.fsyncdir = FsyncDir;
  ops.fallocate = Fallocate;
  return ops;
}

}  // namespace

const fuse_operations& PassthroughOperations() {
  static const fuse_operations ops = MakeOperations();
  return ops;
}

}  // namespace longhaul::faultfs
